// The pipeline: the phases in order, saving, the judgement of the outputs, and the entry points.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "pipeline/run_state.hpp"
#include "pipeline/selection.hpp"
#include "recipe/defaults.hpp"
#include "recipe/schema.hpp"
#include "report/dump.hpp"
#include "sdk/atomic_file.hpp"
#include "util/model_size.hpp"
#include "util/paths.hpp"
#include "util/progress.hpp"
#include "vaiq/error.hpp"
#include "vaiq/log.hpp"
#include "vaiq/tensor.hpp"
#include "vaiq/text.hpp"

namespace fs = std::filesystem;

namespace vaiq {

using namespace phases;

namespace {

// Appends formatted lines to a string.
struct Lines {
    std::string& text;
    template <typename... Args>
    void operator()(fmt::format_string<Args...> format, Args&&... args) {
        text += fmt::format(format, std::forward<Args>(args)...);
        text += '\n';
    }
};

constexpr Phase kAllPhases[] = {Phase::Setup,      Phase::Load, Phase::Prepare, Phase::Plan,     Phase::Calibrate,
                                Phase::Parameters, Phase::Emit, Phase::Check,   Phase::Evaluate, Phase::Save};

// The phases a run goes through, in order, each given the parts of the run it
// reads and writes; check runs whatever the last phase.
struct PhaseStep {
    Phase phase;
    void (*run)(RunState&);
};
constexpr PhaseStep kSteps[] = {
    {Phase::Setup, [](RunState& s) { setup_phase(s.setup, s.report); }},
    {Phase::Load, [](RunState& s) { load_phase(s.setup, s.floats, s.report); }},
    {Phase::Prepare, prepare_phase},
    {Phase::Plan, plan_phase},
    {Phase::Calibrate,
     [](RunState& s) { calibrate_phase(s.setup, s.floats, s.planning.draft, s.calibrated, s.report); }},
    {Phase::Parameters, parameters_phase},
    {Phase::Emit,
     [](RunState& s) {
         emit_phase(s.setup, s.floats.model, s.planning, s.written, s.report);
         run_algorithms(s, AlgorithmStage::Written);
     }},
    {Phase::Check, [](RunState& s) { check_phase(s.setup, s.written.quantized, s.report); }},
    {Phase::Evaluate, [](RunState& s) { evaluate_phase(s.setup, s.floats, s.calibrated, s.written, s.report); }},
};

// How the recipe saves the model at `output`.
SaveOptions save_options(const RunSettings& settings, const fs::path& output) {
    SaveOptions save;
    save.use_external_data_format = settings.use_external_data_format;
    save.external_data_file = settings.external_data_name;
    for (size_t at; (at = save.external_data_file.find("{model}")) != std::string::npos;)
        save.external_data_file.replace(at, 7, output.filename().string());
    save.external_data_size_threshold = static_cast<size_t>(settings.external_data_size_threshold);
    return save;
}

// `writes`: the run will be saved, so it needs an output path.
QuantizedRun quantize(const Recipe& recipe, PluginRegistry& registry, const RunOptions& options, bool writes = true,
                      bool keep_tables = false) {
    RunState s(recipe, registry, options);
    auto& setup = s.setup;
    setup.keep_tables = keep_tables;
    setup.nested = [&registry](const Recipe& nested, const RunOptions& nested_options) {
        return quantize(nested, registry, nested_options, /*writes=*/false);
    };
    if (auto unsupported = unsupported_settings(recipe, setup.last); !unsupported.empty())
        throw InputError(fmt::format("not supported yet by this vaiq: {}", join(unsupported, "; ")));
    const auto& input = setup.settings.model_input;
    const auto& output = setup.settings.model_output;
    if (!input) throw InputError("no model to quantize: set model_input in the recipe or pass --model");
    if (writes && !output) throw InputError("no output path: set model_output in the recipe or pass --output");
    setup.input = *input;
    if (output) setup.output = *output;
    // Checked now as well as when saving, so that a long run does not fail at its end.
    if (writes) {
        output_folder(setup.output);
        save_options(setup.settings, setup.output);
    }
    setup.report_path = setup.settings.report ? fs::path(*setup.settings.report)
                                              : fs::path(setup.output).replace_extension(".report.json");
    s.report = initial_report(recipe, setup.last);

    auto runs = [&](Phase p) { return p <= setup.last || p == Phase::Check; };
    int phases_run = 0;
    for (Phase p : kAllPhases) phases_run += runs(p);
    Progress progress(phases_run, options.progress);
    for (const auto& step : kSteps) {
        if (!runs(step.phase)) continue;
        // A run stopped before emit writes the model as it is then.
        if (step.phase == Phase::Check && setup.last < Phase::Emit) s.written.quantized = s.floats.model;
        progress.step(phase_name(step.phase));
        warn_unimplemented_defaults(recipe, step.phase);
        const auto start = std::chrono::steady_clock::now();
        step.run(s);
        s.report["phases"].push_back(phase_entry(step.phase, start));
        release_kept_large_blocks();  // what the phase's runs kept for each other
        log_debug("phase {} took {:.3f} s", phase_name(step.phase), s.report["phases"].back()["seconds"].get<double>());
    }
    progress.done();
    return {std::move(s.written.quantized),
            std::move(s.written.parked),
            std::move(s.report),
            setup.input,
            setup.output,
            std::move(setup.report_path),
            std::move(s.calibrated.tables),
            std::move(setup.reports)};
}

// Writes the model, the dump a recipe asks for, the report and what the report
// plugins render of it; returns the paths of their documents.
std::vector<fs::path> save_run(const RunSettings& settings, const RunOptions& options, QuantizedRun& run) {
    const auto start = std::chrono::steady_clock::now();
    // Rendered before anything is written: a report that cannot be rendered leaves nothing half-written.
    std::vector<std::pair<fs::path, std::string>> documents;
    for (const auto& writer : run.reports)
        documents.emplace_back(fs::path(run.report_path).replace_extension(writer->extension()),
                               writer->render(run.report));
    SaveOptions save = save_options(settings, run.output);
    save.check = false;  // the check phase just ran
    store_externally_if_oversize(run.quantized, save, run.output, "use_external_data_format");
    save_model(run.quantized, run.output, save, run.input);
    if (settings.dump_output_dir) {
        DumpOptions dump;
        if (options.calibration_reader)
            dump.reader = options.calibration_reader;
        else if (settings.calibration_data_reader)
            dump.data = *settings.calibration_data_reader;
        else
            dump.random_input_shapes = settings.random_input_shapes;
        dump.dump_float = settings.dump_float;
        dump.output_dir = *settings.dump_output_dir;
        const auto dumped = dump_model(run.output, dump);
        run.report["dump"] = {{"output_dir", dump.output_dir.string()},
                              {"quantized_tensors", dumped.quantized},
                              {"float_tensors", dumped.floats}};
    }
    run.report["phases"].push_back(phase_entry(Phase::Save, start));
    write_file_atomically(run.report_path, [&](std::ostream& out) { out << run.report.dump(2) << '\n'; });
    std::vector<fs::path> written;
    for (const auto& document : documents) {
        write_file_atomically(document.first, [&](std::ostream& out) { out << document.second; });
        written.push_back(document.first);
    }
    return written;
}

// The shipped accurate recipe for the run's target, as advice; empty when an
// algorithm of the run chooses precisions already.
std::string accurate_recipe_advice(const RunSettings& settings, const nlohmann::json& report) {
    for (const auto& p : report.value("plugins", nlohmann::json::array()))
        if (p.value("stage", "") == algorithm_stage_name(AlgorithmStage::Precision)) return {};
    static const std::map<std::string, std::string> kAccurate = {{"cpu", "cpu_accurate.yaml"},
                                                                 {"npu_cnn", "cnn_npu_accurate.yaml"},
                                                                 {"npu_transformer", "transformer_npu_accurate.yaml"}};
    const auto it = kAccurate.find(settings.target);
    if (it == kAccurate.end()) return {};
    return fmt::format("the accurate recipe for this target ({}: more bits where 8 cost the output most)",
                       it->second);
}

// The tensors the run found holding channels on different scales, left on one grid.
std::string mixed_scales_named(const nlohmann::json& report) {
    std::vector<std::string> named;
    for (const auto& m : report.value("plan", nlohmann::json::object()).value("mixed_scales", nlohmann::json::array()))
        named.push_back("'" + m.get<std::string>() + "'");
    if (named.empty()) return {};
    const size_t shown = std::min<size_t>(named.size(), 4);
    return fmt::format("; {}{} {} channels on scales far apart (the report's notes say what to try)",
                       join({named.begin(), named.begin() + static_cast<std::ptrdiff_t>(shown)}, ", "),
                       shown < named.size() ? fmt::format(" and {} more", named.size() - shown) : "",
                       named.size() == 1 ? "holds" : "hold");
}

// What to try for a poor output, most promising first: the accurate recipe,
// raising the tensors that cost most alone, the preparation that changed the
// function, then the general levers.
std::vector<std::string> what_to_try(const RunSettings& settings, const nlohmann::json& report) {
    std::vector<std::string> out;
    if (auto accurate = accurate_recipe_advice(settings, report); !accurate.empty()) out.push_back(accurate);
    std::vector<std::string> harmful;
    for (const auto& t : tensor_ranking(report))
        if (harmful.size() < 3 && t["output_sqnr_db"].is_number()) harmful.push_back("'" + t["tensor"].get<std::string>() + "'");
    if (!harmful.empty())
        out.push_back(fmt::format("16 bits for the tensors that cost the output most alone ({}; an override setting "
                                  "activation_type: QInt16, or exclude their nodes)",
                                  join(harmful, ", ")));
    else
        out.push_back("exclude that node (nodes_to_exclude) or give it 16 bits (an override setting activation_type: "
                      "QInt16) where the target allows");
    if (report.contains("preparation_error")) {
        const auto passes =
            report["preparation_error"].value("passes", nlohmann::json::array()).get<std::vector<std::string>>();
        if (!passes.empty())
            out.push_back(fmt::format("without the preparation that changed what the model computes ({}: the "
                                      "target's options switch it off)",
                                      join(passes, ", ")));
    }
    out.push_back("per_channel: true (depthwise convolutions need it)");
    out.push_back("include_cle, another calibrate_method, more calibration data");
    return out;
}

// Warns of each output below warn_output_sqnr_db, naming where the error
// starts, and records what to try in the report (its "advice", which the page
// shows first); fails (nothing is written yet) below min_output_sqnr_db.
// `recipe` says where min_output_sqnr_db is set.
void judge_outputs(const Recipe& recipe, const RunSettings& settings, nlohmann::json& report) {
    if (!report.contains("evaluation")) return;
    const auto& evaluation = report["evaluation"];
    const double warn_db = settings.warn_output_sqnr_db;
    const auto& floor = settings.min_output_sqnr_db;
    std::vector<std::string> failed;
    nlohmann::json poor = nlohmann::json::array();
    std::string where = "no single tensor falls below that on the first batch";
    if (evaluation.contains("first_divergence")) {
        const auto& d = evaluation["first_divergence"];
        const double db = d["sqnr_db"].get<double>();
        where = fmt::format("the error first reaches that at tensor '{}' (node '{}': {} on {})",
                            d["tensor"].get<std::string>(), d["node"].get<std::string>(),
                            std::isfinite(db) ? fmt::format("SQNR {:.2f} dB", db)
                                              : std::string("the quantized values hold NaN or infinity"),
                            d["data"].get<std::string>());
    }
    const auto to_try = what_to_try(settings, report);
    for (const auto& o : evaluation["outputs"]) {
        if (!o["sqnr_db"].is_number()) continue;  // "inf": exact
        const double db = o["sqnr_db"].get<double>();
        const auto name = o["name"].get<std::string>();
        if (db < warn_db) {
            poor.push_back({{"output", name}, {"sqnr_db", db}});
            log_warn("output '{}' is far from the float model's: SQNR {:.2f} dB (warn_output_sqnr_db {}), cosine "
                     "{:.4f}; {}{}. To try: {}; `vaiq explain RECIPE --model M` shows each node's settings",
                     name, db, warn_db, o["cosine_similarity"].get<double>(), where, mixed_scales_named(report),
                     join(to_try, "; "));
        }
        if (floor && db < *floor) failed.push_back(fmt::format("'{}' has {:.2f} dB", name, db));
    }
    if (!poor.empty())
        report["advice"] = {{"outputs", poor}, {"warn_output_sqnr_db", warn_db}, {"where", where}, {"try", to_try}};
    if (!failed.empty())
        throw InputError(fmt::format("{}: min_output_sqnr_db {}: output {} on the evaluation data; nothing was written",
                                     recipe.setting("min_output_sqnr_db").origin, *floor, join(failed, ", ")));
}

// The mean output SQNR of an evaluated run (an exact output reports "inf").
double mean_sqnr(const nlohmann::json& report) {
    double sum = 0;
    int n = 0;
    for (const auto& o : report["evaluation"]["outputs"]) {
        const auto& db = o["sqnr_db"];
        sum += db.is_number() ? db.get<double>() : std::numeric_limits<double>::infinity();
        ++n;
    }
    return n ? sum / n : 0.0;
}

}  // namespace

RunResult run_pipeline(const Recipe& recipe, PluginRegistry& registry, const RunOptions& options) {
    auto run = quantize(recipe, registry, options);
    // CLE is a heuristic that can cost accuracy (activations take the range weights give
    // up); with cle_guard the same recipe without it is quantized too and the better
    // output, on the evaluation data, is kept.
    const bool evaluated = !options.stop_after || *options.stop_after >= Phase::Evaluate;
    // Statistics files belong to one prepared model: the model without CLE has none.
    const auto settings = RunSettings::of(recipe);
    if (evaluated && settings.include_cle && settings.cle_guard && options.calibration_files.empty()) {
        Recipe plain = recipe;
        apply_setting(plain, "include_cle=false", {});
        // The equalization's own extra options (CLESteps, ...) do not apply without it.
        if (const auto* cle = registry.find(PluginKind::Pass, defaults::kEqualizationPass))
            for (const auto& o : cle->options) plain.settings.erase("extra_options." + o.name);
        auto without = quantize(plain, registry, options);
        const double with_db = mean_sqnr(run.report), without_db = mean_sqnr(without.report);
        const bool keep = with_db >= without_db;
        auto db = [](double v) { return std::isinf(v) ? nlohmann::json("inf") : nlohmann::json(v); };
        const nlohmann::json guard = {
            {"sqnr_db_with_cle", db(with_db)}, {"sqnr_db_without_cle", db(without_db)}, {"kept_cle", keep}};
        if (keep) {
            log_info("cle_guard: CLE kept ({:.2f} dB with it, {:.2f} dB without)", with_db, without_db);
        } else {
            log_warn(
                "cle_guard: CLE lowered the output SQNR ({:.2f} dB with it, {:.2f} dB without); the model is "
                "quantized without it (cle_guard: false keeps it)",
                with_db, without_db);
            without.report["recipe"] = run.report["recipe"];
            run = std::move(without);
        }
        run.report["cle_guard"] = guard;
    }
    judge_outputs(recipe, settings, run.report);
    auto documents = save_run(settings, options, run);
    return {run.output, run.report_path, std::move(documents), run.report};
}

CalibrationTables calibrate_pipeline(const Recipe& recipe, PluginRegistry& registry, const RunOptions& options) {
    RunOptions upto = options;
    upto.stop_after = Phase::Calibrate;
    auto run = quantize(recipe, registry, upto, /*writes=*/false, /*keep_tables=*/true);
    if (!run.tables) throw InternalError("calibration kept no statistics");
    run.tables->statistics["model_input"] = run.input.string();
    return std::move(*run.tables);
}

nlohmann::json analyze_pipeline(const Recipe& recipe, PluginRegistry& registry, const RunOptions& options) {
    Recipe analyzed = recipe;
    apply_setting(analyzed, "sensitivity_analysis=true", {});
    auto report = quantize(analyzed, registry, options, /*writes=*/false).report;
    judge_outputs(analyzed, RunSettings::of(analyzed), report);  // its advice, for the page
    return report;
}

std::string render_report(const PluginRegistry& registry, std::string_view name, const nlohmann::json& report) {
    const auto& info = registry.require(PluginKind::Report, name);
    return registry.create<ReportWriter>(name, registry.resolve_options(info, nullptr))->render(report);
}

std::string explain(const Recipe& recipe, const ResolvedPlugins& plugins, PluginRegistry& registry,
                    const Model* model) {
    std::string out;
    Lines line{out};
    std::vector<std::string> files;
    for (const auto& f : recipe.files) files.push_back(f.string());
    line("recipe: {}", join(files, " extends "));
    // Each plugin's options, with where the recipe sets them (extra_options, plugin_options, its entry).
    auto plugin = [&](const PluginChoice& choice, std::string_view note) {
        line("{:<11} {} {}  ({}){}", std::string(kind_name(choice.info->kind)) + ":", choice.info->name,
             choice.info->version, choice.info->library.filename().string(), note);
        for (const auto& [name, value] : choice.options.values()) {
            const auto set = choice.set_by.find(name);
            line("    {:<41} {:<28} {}", name, value.dump(), set == choice.set_by.end() ? "default" : set->second);
        }
    };
    for (const auto* choice : {&plugins.target, &plugins.format, &plugins.calibrator}) plugin(*choice, "");
    for (const auto& pass : plugins.passes) plugin(pass, "");
    if (plugins.equalization) plugin(*plugins.equalization, ", include_cle");
    for (const auto& algorithm : plugins.algorithms) plugin(algorithm, "");
    for (const auto& algorithm : plugins.tried) plugin(algorithm, ", which an algorithm may try");
    for (const auto& reader : plugins.readers) plugin(reader, ", for the data paths it claims most");
    for (const auto& report : plugins.reports) plugin(report, "");
    line("");
    line("settings (value, then where it comes from):");
    for (const auto& spec : recipe_keys()) {
        const auto& s = recipe.setting(spec.path);
        std::string note;
        if (!recipe.in_effect(spec.path))
            note = fmt::format("  [no effect: {} is off]", spec.enabled_by);
        else if (!spec.implemented && !s.is_default())
            note = "  [not supported yet]";
        line("  {:<45} {:<28} {}{}", spec.path, s.value.dump(), s.origin, note);
    }
    if (!model) return out;

    // The plan, its algorithms run as a run's would, without data.
    RunOptions upto;
    upto.stop_after = Phase::Plan;
    RunState s(recipe, registry, upto);
    setup_phase(s.setup, s.report);
    s.floats.model = *model;
    const auto decisions = decide_nodes(recipe, *model, *s.setup.target);
    int quantized = 0;
    line("");
    line("nodes ({} of the model):", decisions.size());
    line("  {:<32} {:<20} {:<10} {:<10} {}", "node", "op_type", "activation", "weight", "");
    for (const auto& d : decisions) {
        if (!d.quantized) {
            line("  {:<32} {:<20} {:<21} not quantized: {}", d.name, d.op_type, "-", d.reason);
            continue;
        }
        ++quantized;
        line("  {:<32} {:<20} {:<10} {:<10} {}", d.name, d.op_type,
             d.settings.at("activation_type").value.get<std::string>(),
             d.settings.at("weight_type").value.get<std::string>(), d.reason);
    }
    line("{} of {} nodes quantized", quantized, decisions.size());
    try {
        plan_phase(s);
    } catch (const InputError& e) {  // preparation would change the model first (an opset upgrade)
        line("");
        line("the plan on the model as given: {}", e.what());
        return out;
    }
    if (const auto& kept = s.planning.draft.kept_float; !kept.empty()) {
        line("");
        line("tensors left float by the plan:");
        for (const auto& [tensor, why] : kept) line("  {:<32} {}", tensor, why);
    }
    return out;
}

}  // namespace vaiq
