#include "tune/tune.hpp"

#include <fmt/format.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "pipeline/calibration_cache.hpp"
#include "pipeline/run_settings.hpp"
#include "sdk/atomic_file.hpp"
#include "util/paths.hpp"
#include "util/yaml_json.hpp"
#include "vaiq/error.hpp"
#include "vaiq/log.hpp"
#include "vaiq/text.hpp"

namespace fs = std::filesystem;

namespace vaiq {

namespace {

constexpr const char* kMeasures[] = {"accuracy", "accuracy_drop", "perplexity",     "perplexity_increase",
                                     "sqnr_db",  "cosine",        "top1_agreement", "metric"};

// The settings a candidate that starts from another recipe takes from the run's:
// what to quantize and on what data.
constexpr const char* kCarriedSettings[] = {"model_input", "calibration_data_reader", "data_preprocess",
                                            "evaluation_data", "evaluation_labels"};

// "key.path=value" assignments for a YAML map of settings; nested maps become dotted keys.
void flatten_settings(const nlohmann::json& map, const std::string& prefix, std::vector<std::string>& out) {
    for (const auto& [key, value] : map.items()) {
        const auto path = prefix.empty() ? key : prefix + "." + key;
        if (value.is_object() && !value.empty())
            flatten_settings(value, path, out);
        else
            out.push_back(path + "=" + value.dump());  // JSON is YAML, as apply_setting reads it
    }
}

// The grid of `dimensions`: combinations ordered by the sum of their values' positions.
std::vector<TuneCandidate> grid(const nlohmann::json& dimensions, const std::string& where) {
    std::vector<std::pair<std::string, std::vector<nlohmann::json>>> axes;
    for (const auto& [key, values] : dimensions.items()) {
        if (!values.is_array() || values.empty())
            throw InputError(fmt::format("{}: dimensions.{} is a list of values, cheapest first", where, key));
        axes.emplace_back(key, std::vector<nlohmann::json>(values.begin(), values.end()));
    }
    std::vector<std::vector<size_t>> combinations{{}};
    for (const auto& [key, values] : axes) {
        std::vector<std::vector<size_t>> next;
        for (const auto& c : combinations)
            for (size_t v = 0; v < values.size(); ++v) {
                next.push_back(c);
                next.back().push_back(v);
            }
        combinations = std::move(next);
        if (combinations.size() > 4096)
            throw InputError(fmt::format("{}: the dimensions make over 4096 candidates", where));
    }
    std::stable_sort(combinations.begin(), combinations.end(), [](const auto& a, const auto& b) {
        return std::accumulate(a.begin(), a.end(), size_t{0}) < std::accumulate(b.begin(), b.end(), size_t{0});
    });
    std::vector<TuneCandidate> out;
    for (const auto& c : combinations) {
        TuneCandidate candidate;
        std::vector<std::string> changed;
        for (size_t a = 0; a < axes.size(); ++a) {
            nlohmann::json one;
            one[axes[a].first] = axes[a].second[c[a]];
            flatten_settings(one, "", candidate.assignments);
            if (c[a] > 0) changed.push_back(axes[a].first + "=" + axes[a].second[c[a]].dump());
        }
        candidate.name = changed.empty() ? "first values" : join(changed);
        out.push_back(std::move(candidate));
    }
    return out;
}

// Moves the kept trial's files where the run's recipe puts them.
void keep_trial(const fs::path& dir, const fs::path& report_name, const fs::path& output, const fs::path& report) {
    const auto html_name = fs::path(report_name).replace_extension(".html");
    for (const auto& entry : fs::directory_iterator(dir)) {
        const auto name = entry.path().filename();
        fs::path to = output.parent_path() / name;
        if (name == report_name) to = report;
        if (name == html_name) to = fs::path(report).replace_extension(".html");
        fs::rename(entry.path(), to);
    }
}

}  // namespace

TuneTarget TuneTarget::parse(std::string_view text) {
    const auto at = text.find_first_of("<>");
    if (at == std::string_view::npos || at + 1 >= text.size() || text[at + 1] != '=')
        throw InputError(
            fmt::format("target '{}': write MEASURE>=VALUE or MEASURE<=VALUE (e.g. accuracy_drop<=0.01)", text));
    TuneTarget t;
    t.measure = std::string(text.substr(0, at));
    t.at_least = text[at] == '>';
    const std::string bound(text.substr(at + 2));
    try {
        size_t used = 0;
        t.bound = std::stod(bound, &used);
        if (used != bound.size()) throw std::invalid_argument(bound);
    } catch (const std::exception&) {
        throw InputError(fmt::format("target '{}': '{}' is not a number", text, bound));
    }
    if (std::find(std::begin(kMeasures), std::end(kMeasures), t.measure) == std::end(kMeasures))
        throw InputError(
            fmt::format("target '{}': unknown measure '{}' (accuracy, accuracy_drop, perplexity, "
                        "perplexity_increase, sqnr_db, cosine, top1_agreement, or metric: the "
                        "caller's own)",
                        text, t.measure));
    return t;
}

std::string TuneTarget::text() const { return fmt::format("{}{}{}", measure, at_least ? ">=" : "<=", bound); }

double TuneTarget::score(const nlohmann::json& report, const fs::path& model) const {
    if (measure == "metric") {
        if (!metric)
            throw InputError("the target's measure is metric, and no metric was given (vaiq.tune(metric=...))");
        return metric(model, report);
    }
    const auto& e = report.value("evaluation", nlohmann::json::object());
    auto pair = [&](const char* key, const char* needs) -> const nlohmann::json& {
        if (!e.contains(key))
            throw InputError(
                fmt::format("the target's measure {} needs {}, and the report has no {}", measure, needs, key));
        return e.at(key);
    };
    if (measure == "accuracy" || measure == "accuracy_drop") {
        const auto& a = pair("accuracy", "evaluation_labels of classes");
        const double quantized = a.at("quantized").get<double>();
        return measure == "accuracy" ? quantized : a.at("float").get<double>() - quantized;
    }
    if (measure == "perplexity" || measure == "perplexity_increase") {
        const auto& p = pair("perplexity", "evaluation_labels of tokens");
        const double quantized = p.at("quantized").get<double>();
        return measure == "perplexity" ? quantized : quantized / p.at("float").get<double>() - 1;
    }
    const auto& outputs = e.value("outputs", nlohmann::json::array());
    const char* key = measure == "cosine" ? "cosine_similarity" : measure.c_str();
    if (outputs.empty() || !outputs[0].contains(key))
        throw InputError(fmt::format("the target's measure {} is not in the report's evaluation", measure));
    const auto& v = outputs[0].at(key);
    return v.is_null() ? std::numeric_limits<double>::infinity() : v.get<double>();  // SQNR of an exact output
}

std::vector<TuneCandidate> load_tune_space(const fs::path& given) {
    fs::path file = given;
    std::error_code ec;
    // A name not found here is a shipped space (`--space cpu.yaml` anywhere).
    if (!fs::exists(file, ec) && file.is_relative())
        for (const auto& dir : recipe_search_path())
            if (fs::exists(dir / "spaces" / file, ec)) {
                file = dir / "spaces" / file;
                break;
            }
    if (!fs::is_regular_file(file, ec))
        throw InputError(fmt::format("{}: no such space file here or among the shipped spaces", given.string()));
    nlohmann::json space;
    try {
        space = yaml_to_json(YAML::LoadFile(file.string()));
    } catch (const YAML::Exception& e) {
        throw InputError(fmt::format("{}: {}", file.string(), e.what()));
    }
    const auto where = file.string();
    if (!space.is_object()) throw InputError(fmt::format("{}: a space is a map with candidates and dimensions", where));
    std::vector<TuneCandidate> out;
    for (const auto& [key, value] : space.items()) {
        if (key == "dimensions") {
            if (!value.is_object()) throw InputError(fmt::format("{}: dimensions map settings to values", where));
        } else if (key != "candidates") {
            throw InputError(fmt::format("{}: unknown key '{}' (candidates, dimensions)", where, key));
        }
    }
    for (const auto& c : space.value("candidates", nlohmann::json::array())) {
        if (!c.is_object()) throw InputError(fmt::format("{}: each candidate is a map of name, recipe, set", where));
        TuneCandidate candidate;
        for (const auto& [key, value] : c.items())
            if (key != "name" && key != "recipe" && key != "set")
                throw InputError(fmt::format("{}: unknown candidate key '{}' (name, recipe, set)", where, key));
        if (c.contains("recipe")) {
            fs::path recipe = c.at("recipe").get<std::string>();
            // Relative to the space file when it is there, else a shipped recipe's name.
            if (recipe.is_relative() && fs::exists(file.parent_path() / recipe)) recipe = file.parent_path() / recipe;
            candidate.recipe = recipe;
        }
        const auto set = c.value("set", nlohmann::json::object());
        if (!set.is_object()) throw InputError(fmt::format("{}: a candidate's set is a map of settings", where));
        flatten_settings(set, "", candidate.assignments);
        candidate.name = c.contains("name") ? c.at("name").get<std::string>()
                         : candidate.recipe ? candidate.recipe->filename().string() +
                                                  (set.empty() ? "" : " + " + join(candidate.assignments))
                                            : (set.empty() ? "as written" : join(candidate.assignments));
        out.push_back(std::move(candidate));
    }
    if (space.contains("dimensions"))
        for (auto& candidate : grid(space.at("dimensions"), where)) out.push_back(std::move(candidate));
    if (out.empty()) throw InputError(fmt::format("{}: the space has no candidates", where));
    return out;
}

nlohmann::json TuneResult::to_json(const TuneTarget& target) const {
    nlohmann::json j = {{"target", target.text()}, {"met", met}, {"trials", nlohmann::json::array()}};
    for (const auto& t : trials) {
        nlohmann::json trial = {{"name", t.name},
                                {"recipe", t.recipe},
                                {"settings", t.assignments},
                                {"seconds", t.seconds},
                                {"calibration_reused", t.calibration_reused},
                                {"met", t.met}};
        if (t.score) trial["score"] = std::isfinite(*t.score) ? nlohmann::json(*t.score) : nlohmann::json(nullptr);
        if (!t.error.empty()) trial["error"] = t.error;
        j["trials"].push_back(std::move(trial));
    }
    if (kept) {
        j["kept"] = trials[*kept].name;
        j["output"] = output.string();
        j["report"] = report.string();
    }
    return j;
}

TuneResult tune(const fs::path& recipe, const std::vector<std::string>& assignments,
                const std::vector<TuneCandidate>& candidates, const TuneTarget& target, PluginRegistry& registry,
                const RunOptions& options) {
    const Recipe base = load_recipe(recipe, assignments);
    const auto settings = RunSettings::of(base);
    if (!settings.model_output) throw InputError("no output path: set model_output in the recipe or pass --output");
    TuneResult result;
    result.output = *settings.model_output;
    result.report =
        settings.report ? fs::path(*settings.report) : fs::path(result.output).replace_extension(".report.json");
    result.tune_report = fs::path(result.output).replace_extension(".tune.json");
    const fs::path out_dir = output_folder(result.output);
    std::error_code ec;
    std::vector<std::string> carried;
    for (const char* key : kCarriedSettings)
        if (!base.setting(key).is_default()) carried.push_back(std::string(key) + "=" + base.value(key).dump());

    // Trials write into a folder of their own beside the output; the kept one's files move out.
    const fs::path work = out_dir / fmt::format(".vaiq-tune-{}", getpid());
    fs::remove_all(work, ec);
    fs::create_directories(work);
    struct Cleanup {
        fs::path dir;
        ~Cleanup() {
            std::error_code ignored;
            fs::remove_all(dir, ignored);
        }
    } cleanup{work};

    // The command line's settings, then the candidate's (it varies them), then where the trial writes.
    auto trial_recipe = [&](const TuneCandidate& c, const fs::path& dir) {
        std::vector<std::string> all = c.recipe ? carried : std::vector<std::string>{};
        all.insert(all.end(), assignments.begin(), assignments.end());
        all.insert(all.end(), c.assignments.begin(), c.assignments.end());
        all.push_back("model_output=" + nlohmann::json((dir / result.output.filename()).string()).dump());
        all.push_back("report=" + nlohmann::json((dir / result.report.filename()).string()).dump());
        return load_recipe(c.recipe ? *c.recipe : recipe, all);
    };
    auto trial_dir = [&](size_t i) { return work / fmt::format("trial{}", i); };
    // Trials that calibrate the same tensors of the same prepared model on the same
    // data with the same calibrators calibrate once.
    RunOptions trial_options = options;
    trial_options.calibration_cache = std::make_shared<CalibrationCache>();
    std::optional<size_t> best;  // its files stay until a better trial replaces them
    std::string first_error;
    for (size_t i = 0; i < candidates.size(); ++i) {
        const auto& c = candidates[i];
        TuneTrial trial;
        trial.name = c.name;
        trial.recipe = (c.recipe ? *c.recipe : recipe).string();
        trial.assignments = c.assignments;
        fs::create_directories(trial_dir(i));
        log_info("tune: trial {} of {}: {}", i + 1, candidates.size(), c.name);
        const auto start = std::chrono::steady_clock::now();
        nlohmann::json report;
        try {
            report = run_pipeline(trial_recipe(c, trial_dir(i)), registry, trial_options).report_json;
            trial.calibration_reused = report.contains("calibration") && report["calibration"].value("reused", false);
        } catch (const InputError& e) {
            trial.error = e.what();
            if (first_error.empty()) first_error = fmt::format("trial '{}': {}", c.name, e.what());
            log_warn("tune: trial '{}' failed: {}", c.name, e.what());
        }
        trial.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        bool better = false;
        if (trial.error.empty()) {
            // A measure the report lacks is the user's error: stop.
            trial.score = target.score(report, trial_dir(i) / result.output.filename());
            trial.met = target.met(*trial.score);
            log_info("tune: '{}': {} {:.6g} ({}), {:.1f} s", c.name, target.measure, *trial.score,
                     trial.met ? "meets " + target.text() : "short of " + target.text(), trial.seconds);
            better = !best || (target.at_least ? *trial.score > *result.trials[*best].score
                                               : *trial.score < *result.trials[*best].score);
        }
        const bool met = trial.met;
        result.trials.push_back(std::move(trial));
        if (met || better) {
            if (best) fs::remove_all(trial_dir(*best), ec);
            best = i;
        } else {
            fs::remove_all(trial_dir(i), ec);
        }
        if (met) break;
    }
    if (!best) throw InputError(fmt::format("no trial ran: {}", first_error));
    result.kept = best;
    result.met = result.trials[*best].met;
    keep_trial(trial_dir(*best), result.report.filename(), result.output, result.report);
    const auto json = result.to_json(target);
    write_file_atomically(result.tune_report, [&](std::ostream& os) { os << json.dump(2) << '\n'; });
    return result;
}

}  // namespace vaiq
