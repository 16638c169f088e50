// The calibrate phase: ranges observed on the data (or read from statistics files), channel scales checked.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "data/statistics_file.hpp"
#include "pipeline/calibration_cache.hpp"
#include "pipeline/joined_reference.hpp"
#include "pipeline/run_state.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/log.hpp"
#include "vaiq/text.hpp"

namespace vaiq::phases {

namespace {

// What the calibrate phase reads and writes.
struct Parts {
    RunSetup& setup;
    FloatModel& floats;
    DraftPlan& draft;
    Calibrated& out;
    nlohmann::json& report;
};

// What the run's statistics belong to: the prepared model (`fingerprint`, of
// s.floats.model) and its calibrators' options.
StatisticsIdentity statistics_identity(const Parts& s, std::string fingerprint) {
    StatisticsIdentity id{std::move(fingerprint), {}};
    for (const auto& t : s.draft.tensors)
        if (t.observed() && !id.calibrators.count(t.calibrate_method))
            id.calibrators[t.calibrate_method] = s.setup.calibrator_choice(t.calibrate_method).options.values();
    return id;
}

// Observers fed from statistics files, shard by shard; the data, if any, serves the later phases.
Observations observe_files(Parts& s, const StatisticsIdentity& identity) {
    auto observations = make_observers(s.draft);
    for (const auto& path : s.setup.options.calibration_files) {
        std::ifstream in(path);
        if (!in) throw InputError(fmt::format("{}: cannot read the statistics file", path.string()));
        nlohmann::json file;
        try {
            file = nlohmann::json::parse(in);
        } catch (const nlohmann::json::exception& e) {
            throw InputError(fmt::format("{}: not JSON: {}", path.string(), e.what()));
        }
        merge_statistics_file(observations, s.draft, identity, file, path);
    }
    if (has_calibration_data(s.setup.settings, s.setup.options)) {
        s.out.data = calibration_reader(s.setup, s.floats.model);
    } else {
        log_info("calibrated from statistics files; with no calibration data, evaluation runs on random data");
        s.out.data = random_reader(s.setup, s.floats.model);
    }
    return observations;
}

}  // namespace

// The prepared float model against the input model, where preparation changed
// what it computes (the DPU simulations): error no quantization setting removes.
void report_preparation_error(double warn_db, const Evaluation& e, const char* data, nlohmann::json& report) {
    if (e.outputs.empty()) return;
    auto& out = report["preparation_error"] = e.to_json();
    out["data"] = data;
    std::vector<std::string> changers;  // the passes that changed what the model computes
    for (const auto& p : report["passes"])
        if (p.value("changed", false) && !p.value("keeps_function", true)) changers.push_back(p["name"]);
    out["passes"] = changers;
    const auto line =
        fmt::format("the prepared float model against the input model ({} changed what it computes): {}",
                    changers.empty() ? std::string("preparation") : join(changers, ", "), summary_line(e));
    if (std::none_of(e.outputs.begin(), e.outputs.end(), [&](const auto& o) { return o.sqnr_db < warn_db; }))
        return log_info("{}", line);
    log_warn(
        "{}; below warn_output_sqnr_db {} before anything is quantized: the target's options switch those "
        "transforms off (`vaiq explain RECIPE` lists them)",
        line, warn_db);
}

namespace {

// Observers fed the calibration data.
Observations observe_data(Parts& s) {
    const auto observed = s.draft.observed();
    if (!s.out.data && !has_calibration_data(s.setup.settings, s.setup.options)) {
        // Given parameters are meant to replace calibration: random data must not fill the gaps.
        const bool given = !s.setup.settings.given_params.empty();
        if (given && !observed.empty())
            throw InputError(
                fmt::format("these activations have neither given parameters nor calibration data: {} "
                            "(add them to input_quantization_params/output_quantization_params or set "
                            "calibration_data_reader)",
                            join(observed, ", ")));
        if (observed.empty()) {
            log_info("nothing to calibrate: activations are quantized at run time or have given parameters");
            s.out.data = random_reader(s.setup, s.floats.model);  // types the tensors; evaluation runs on it too
        }
    }
    if (!s.out.data) s.out.data = calibration_reader(s.setup, s.floats.model);
    // Evaluation on this data against a model whose function preparation kept can
    // compare against these outputs instead of running the given model again
    // (calibration runs every batch when it observes anything).
    OutputSink keep;
    const bool evaluated_here =
        s.setup.last >= Phase::Evaluate && !s.setup.settings.evaluation_data && !observed.empty();
    // Where preparation changed the function, the given model's outputs are
    // computed beside, from what the two models share (see joined_reference.hpp).
    std::optional<JoinedReference> joined;
    bool given_apart = false;  // evaluation will run the input model on the same data
    if (evaluated_here && !s.floats.function_kept) {
        const Model given = load_model(s.setup.input);
        if (same_inputs(given, s.floats.model)) joined = join_given_model(s.floats.model, given);
        given_apart = !joined && same_inputs(given, s.floats.model);
        if (joined)
            log_info("evaluation's reference, the input model, joins calibration: {} of its nodes shared, {} added",
                     joined->shared_nodes, joined->added_nodes);
    }
    // With the two joined, what preparation alone changed in the outputs comes for free.
    std::optional<OutputComparison> preparation;
    if (evaluated_here && (s.floats.function_kept || joined)) {
        s.out.float_outputs = std::make_shared<ReferenceOutputs>();
        s.out.float_outputs_from_input = joined.has_value();
        const int outputs = joined ? joined->outputs_before : s.floats.model.graph().output_size();
        for (int o = 0; o < outputs; ++o) s.out.float_outputs->names.push_back(s.floats.model.graph().output(o).name());
        if (joined) preparation.emplace(s.out.float_outputs->names);
        keep = [&, limit = evaluation_batches(s.setup.settings)](const Batch& batch, std::vector<Tensor> values) {
            if (limit > 0 && static_cast<int>(s.out.float_outputs->sources.size()) >= limit) return;
            if (joined) {  // the input model's outputs, in the prepared model's order
                std::vector<Tensor> given;
                for (int index : joined->given_outputs)  // a shared output is copied: the prepared model's too
                    given.push_back(index < joined->outputs_before ? values.at(index) : std::move(values.at(index)));
                values.resize(given.size());
                preparation->add(given, values, batch.source);
                values = std::move(given);
            }
            s.out.float_outputs->add(batch.source, std::move(values));
        };
    } else if (given_apart) {  // what preparation alone changed, compared when the input model runs
        s.out.prepared_outputs = std::make_shared<ReferenceOutputs>();
        s.out.prepared_outputs->names = output_names(s.floats.model);
        keep = [&, limit = evaluation_batches(s.setup.settings)](const Batch& batch, std::vector<Tensor> values) {
            if (limit > 0 && static_cast<int>(s.out.prepared_outputs->sources.size()) >= limit) return;
            s.out.prepared_outputs->add(batch.source, std::move(values));
        };
    }
    auto observations = make_observers(s.draft);
    try {
        observe(
            observations, s.floats.model, s.draft, *s.out.data, s.setup.threads,
            [&](int batch) { log_debug("calibration batch {} of {} files", batch, s.out.data->items()); }, keep);
    } catch (...) {
        if (joined) remove_joined(s.floats.model, *joined);
        throw;
    }
    if (joined) remove_joined(s.floats.model, *joined);
    if (preparation) {
        Evaluation e;
        e.batches = static_cast<int>(s.out.float_outputs->sources.size());
        for (auto rows : s.out.float_outputs->batch_samples) e.samples += rows;
        e.outputs = preparation->metrics();
        report_preparation_error(s.setup.settings.warn_output_sqnr_db, e, "calibration_data", s.report);
    }
    return observations;
}

// Observes the calibration data; where preparation changed the model's inputs,
// an input the data does not fit says that the data must fit the prepared model.
Observations observe_calibration(Parts& s, const std::optional<StatisticsIdentity>& identity) {
    try {
        return identity && !s.setup.options.calibration_files.empty() ? observe_files(s, *identity) : observe_data(s);
    } catch (const InputError& e) {
        const std::string what = e.what();
        if (!s.floats.inputs_changed || what.find("input '") == std::string::npos) throw;
        throw InputError(what +
                         "; preparation changed the model's inputs (convert_nchw_to_nhwc channels-last, "
                         "convert_fp16_to_fp32 float): the calibration data must fit the prepared model "
                         "(--stop-after prepare writes it)");
    }
}

// Small float constants of the plan (a mask's -inf fill) that hold an infinity
// or NaN: no range holds them either. A large weight is not decoded here; one
// with an infinity is refused when it is quantized.
std::vector<std::string> constants_not_finite(const Model& model, const DraftPlan& draft) {
    constexpr int64_t kSmallConstant = 4096;
    std::vector<std::string> out;
    const GraphIndex index(model);
    for (const auto& t : draft.tensors) {
        const auto* init = t.constant ? index.initializer(t.tensor) : nullptr;
        if (!init) continue;
        const auto type = static_cast<DataType>(init->data_type());
        if (element_count({init->dims().data(), static_cast<size_t>(init->dims_size())}) > kSmallConstant ||
            (type != DataType::Float && type != DataType::Float16 && type != DataType::BFloat16))
            continue;
        const auto values = convert_float_type(Tensor::from_proto(*init), DataType::Float);
        const auto data = values.data<float>();
        if (!std::all_of(data.begin(), data.end(), [](float v) { return std::isfinite(v); })) out.push_back(t.tensor);
    }
    return out;
}

// The settings that decide what calibration reads (recipe keys and the groups they begin);
// the readers' options count too (how files become inputs, random data's shapes).
constexpr const char* kCalibrationDataSettings[] = {"calibration_data_reader", "evaluation_"};

// What decides every value the calibrate phase computes: the input and prepared
// models, the tensors observed and their calibrators, the data and whether
// evaluation's float outputs are kept.
std::string calibration_key(const Parts& s, const std::string& fingerprint) {
    const auto id = statistics_identity(s, fingerprint);
    nlohmann::json data = nlohmann::json::object();
    for (const auto& [path, setting] : s.setup.recipe.settings)
        for (const char* prefix : kCalibrationDataSettings)
            if (path.starts_with(prefix)) data[path] = setting.value;
    for (const auto& reader : s.setup.plugins.readers)
        for (const auto& [option, value] : reader.options.values()) data[reader.info->name + "." + option] = value;
    return nlohmann::json{{"input", s.setup.input.string()},
                          {"model", id.model_fingerprint},
                          {"calibrators", id.calibrators},
                          {"observed", s.draft.observed()},
                          {"data", data},
                          {"evaluate", s.setup.last >= Phase::Evaluate}}
        .dump();
}

// The observations an earlier run kept under the same key, merged into this
// run's observers; nullopt (and the run calibrates) where they do not fit.
std::optional<Observations> reuse_calibration(Parts& s, const CachedCalibration& kept,
                                              const StatisticsIdentity& identity) {
    auto observations = make_observers(s.draft);
    try {
        merge_statistics_file(observations, s.draft, identity, kept.statistics, "an earlier run's calibration");
    } catch (const InputError& e) {
        log_debug("the calibration of an earlier run does not fit this one ({}): calibrating", e.what());
        return std::nullopt;
    }
    s.out.data = calibration_reader(s.setup, s.floats.model);
    s.out.float_outputs = kept.float_outputs;
    s.out.prepared_outputs = kept.prepared_outputs;
    s.out.float_outputs_from_input = kept.float_outputs_from_input;
    if (!kept.preparation_error.is_null()) s.report["preparation_error"] = kept.preparation_error;
    log_info("calibration: an earlier run's, of the same model, data and calibrators ({} batches)",
             observations.batches);
    return observations;
}

// Keeps this run's calibration for later runs (a calibrator that cannot save
// its statistics keeps the run from being kept).
void keep_calibration(const Parts& s, CalibrationCache& cache, const std::string& key, const Observations& observations,
                      const StatisticsIdentity& identity) {
    CachedCalibration kept;
    try {
        kept.statistics = statistics_file(observations, s.draft, identity);
    } catch (const InputError& e) {
        log_debug("this run's calibration is not kept for later runs: {}", e.what());
        return;
    }
    kept.float_outputs = s.out.float_outputs;
    kept.prepared_outputs = s.out.prepared_outputs;
    kept.float_outputs_from_input = s.out.float_outputs_from_input;
    if (s.report.contains("preparation_error")) kept.preparation_error = s.report["preparation_error"];
    cache.entries[key] = std::move(kept);
}

}  // namespace

void calibrate_phase(RunSetup& setup, FloatModel& floats, DraftPlan& draft, Calibrated& out, nlohmann::json& report) {
    Parts s{setup, floats, draft, out, report};
    const bool from_files = !s.setup.options.calibration_files.empty();
    // A calibration an earlier run of the process kept (vaiq tune's trials), on calibration data.
    auto* cache = from_files || s.setup.keep_tables || !has_calibration_data(s.setup.settings, s.setup.options) ||
                          s.draft.observed().empty()
                      ? nullptr
                      : s.setup.options.calibration_cache.get();
    const auto fingerprint =
        from_files || s.setup.keep_tables || cache ? model_fingerprint(s.floats.model) : std::string();
    std::string key;
    const CachedCalibration* kept = nullptr;
    if (cache) {
        key = calibration_key(s, fingerprint);
        if (const auto it = cache->entries.find(key); it != cache->entries.end()) kept = &it->second;
    }
    std::optional<StatisticsIdentity> identity;
    if (from_files || s.setup.keep_tables || cache) identity = statistics_identity(s, fingerprint);
    std::optional<Observations> reused;
    if (kept) reused = reuse_calibration(s, *kept, *identity);
    if (reused) ++cache->reused;
    const auto observations = reused ? std::move(*reused) : observe_calibration(s, identity);
    if (cache && !reused) keep_calibration(s, *cache, key, observations, *identity);
    s.out.outcome = conclude(s.draft, observations);
    for (auto& name : constants_not_finite(s.floats.model, s.draft))
        s.out.outcome.not_finite.push_back(std::move(name));
    if (s.setup.keep_tables)
        s.out.tables =
            CalibrationTables{statistics_file(observations, s.draft, *identity), ort_calibration_json(s.out.outcome),
                              tensorrt_calibration_cache(s.out.outcome)};
    s.report["calibration"] = {{"batches", s.out.outcome.batches},
                               {"observed_tensors", s.out.outcome.results.size()},
                               {"not_float", s.out.outcome.not_float},
                               {"not_finite", s.out.outcome.not_finite},
                               {"empty", s.out.outcome.empty}};
    if (from_files) s.report["calibration"]["statistics_files"] = s.setup.options.calibration_files;
    if (reused) s.report["calibration"]["reused"] = true;
    if (!s.out.outcome.not_finite.empty())
        log_warn(
            "{} tensor(s) held an infinity or NaN on the calibration data and stay float (an attention mask's "
            "-inf, a log of 0): {}",
            s.out.outcome.not_finite.size(), join(s.out.outcome.not_finite, ", "));
    drop_tensors(s.draft, s.out.outcome.not_float);
    if (!s.out.outcome.empty.empty())
        log_warn("{} tensor(s) held no value in any calibration batch and stay float (a decoder's empty past): {}",
                 s.out.outcome.empty.size(), join(s.out.outcome.empty, ", "));
    drop_tensors(s.draft, s.out.outcome.not_finite);
    drop_tensors(s.draft, s.out.outcome.empty);
}

}  // namespace vaiq::phases
