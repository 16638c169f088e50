// What the phases share: the data readers a recipe asks for, report fragments, small checks.
#include <fmt/format.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>

#include "pipeline/run_state.hpp"
#include "recipe/schema.hpp"
#include "vaiq/log.hpp"
#include "vaiq/text.hpp"

namespace vaiq::phases {

namespace {

bool truthy(const nlohmann::json& v) {
    if (v.is_boolean()) return v.get<bool>();
    if (v.is_array() || v.is_object() || v.is_string()) return !v.empty();
    return false;
}

}  // namespace

// A default that would switch behaviour on, in a phase that does not have it yet.
void warn_unimplemented_defaults(const Recipe& recipe, Phase phase) {
    for (const auto& spec : recipe_keys()) {
        if (!spec.implemented && spec.phase == phase && recipe.setting(spec.path).is_default() &&
            recipe.in_effect(spec.path) && truthy(recipe.value(spec.path)))
            log_warn("{} is {} by default but not implemented yet; it has no effect", spec.path,
                     recipe.value(spec.path).dump());
    }
}

// Initializers listed as graph inputs can be overridden by a caller, so they are
// not constants; removing them from the inputs lets their values be quantized.
int remove_initializer_inputs(Model& model) {
    auto& graph = model.graph();
    std::set<std::string> constants;
    for (const auto& init : graph.initializer()) constants.insert(init.name());
    google::protobuf::RepeatedPtrField<onnx::ValueInfoProto> kept;
    int removed = 0;
    for (const auto& in : graph.input()) {
        if (constants.count(in.name()))
            ++removed;
        else
            *kept.Add() = in;
    }
    graph.mutable_input()->Swap(&kept);
    return removed;
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The process's peak resident memory so far, in MB (what a phase raised it to).
double peak_resident_mb() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_maxrss) / 1024.0;  // kilobytes on Linux
}

// Without held-out data, evaluation compares this many calibration batches by
// default: the quantized model runs once per batch compared, so hundreds of
// calibration batches would cost the run as much again as calibrating did.
constexpr int kDefaultEvaluationBatches = 32;

}  // namespace

// How many batches evaluation compares (0: all): evaluation_batches, or by default
// all of evaluation_data (or of labelled calibration data) and the first
// kDefaultEvaluationBatches of the calibration data.
int evaluation_batches(const RunSettings& settings) {
    if (settings.evaluation_batches) return static_cast<int>(*settings.evaluation_batches);
    const bool all = settings.evaluation_data || settings.evaluation_labels;
    return all ? 0 : kDefaultEvaluationBatches;
}

// A phase's entry in the report: its time and the peak memory at its end.
nlohmann::json phase_entry(Phase phase, std::chrono::steady_clock::time_point start) {
    return {
        {"name", std::string(phase_name(phase))}, {"seconds", seconds_since(start)}, {"peak_mb", peak_resident_mb()}};
}

// The readers the recipe asks for: files, or random data when none are given.
std::unique_ptr<DataReader> random_reader(const RunSetup& setup, const Model& model) {
    return setup.readers.open_random(model);
}

// Whether the run has calibration data: files the recipe names, or the caller's reader.
bool has_calibration_data(const RunSettings& settings, const RunOptions& options) {
    return options.calibration_reader || settings.calibration_data_reader.has_value();
}

std::unique_ptr<DataReader> calibration_reader(const RunSetup& setup, const Model& model) {
    if (setup.options.calibration_reader) return setup.options.calibration_reader(model);
    if (setup.settings.calibration_data_reader)
        return setup.readers.open(*setup.settings.calibration_data_reader, model, "calibration data");
    log_info("no calibration data given: calibrating on random data (a quick test, not an accurate model)");
    return random_reader(setup, model);
}

nlohmann::json params_json(const TensorQuant& t, const std::map<std::string, TensorRange>& ranges) {
    nlohmann::json j = {{"tensor", t.tensor},
                        {"role", role_name(t.role)},
                        {"type", quant_type_name(t.params.type)},
                        {"symmetric", t.spec.symmetric}};
    if (t.spec.dynamic) {
        j["dynamic"] = true;  // DynamicQuantizeLinear's parameters, at run time
    } else if (is_block_float(t.params.type)) {  // a shared exponent per block, at run time
        j["block_axis"] = t.params.shared_exponent.axis;
        j["block_size"] = t.params.shared_exponent.size;
    } else if (t.params.axis >= 0) {
        j["axis"] = t.params.axis;
        j["channels"] = t.params.scale.size();
        j["scale_min"] = *std::min_element(t.params.scale.begin(), t.params.scale.end());
        j["scale_max"] = *std::max_element(t.params.scale.begin(), t.params.scale.end());
    } else {
        j["scale"] = t.params.scale[0];
        j["zero_point"] = t.params.zero_point[0];
    }
    if (auto it = ranges.find(t.tensor); it != ranges.end()) j["range"] = {it->second.min, it->second.max};
    return j;
}

// Per constraint: nodes checked, adjusted by refinement, still violated.
nlohmann::json constraints_json(const std::vector<ConstraintCount>& counts, bool refined) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& c : counts) {
        out.push_back({{"name", c.name}, {"checked", c.checked}, {"violated", c.violated}});
        if (refined) out.back()["adjusted"] = c.adjusted;
    }
    return out;
}

// The inputs a model takes (names, element types, dimensions), comparable.
std::vector<std::string> input_signature(const Model& m) {
    std::set<std::string> initializers;
    for (const auto& t : m.graph().initializer()) initializers.insert(t.name());
    std::vector<std::string> out;
    for (const auto& v : m.graph().input())
        if (!initializers.count(v.name())) out.push_back(v.SerializeAsString());
    return out;
}

// Whether two models take the same inputs.
bool same_inputs(const Model& a, const Model& b) { return input_signature(a) == input_signature(b); }

std::string summary_line(const Evaluation& e) {
    std::vector<std::string> parts;
    for (const auto& o : e.outputs) {
        std::string part = fmt::format("{}: SQNR {} dB, cosine {:.5f}, max |error| {:.4g}", o.name,
                                       std::isinf(o.sqnr_db) ? std::string("inf") : fmt::format("{:.2f}", o.sqnr_db),
                                       o.cosine, o.max_abs_error);
        if (o.top1_agreement) part += fmt::format(", top-1 agreement {:.2f}%", 100 * *o.top1_agreement);
        parts.push_back(part);
    }
    std::string line = fmt::format("{} samples; {}", e.samples, join(parts, "; "));
    if (e.float_accuracy)
        line += fmt::format("; accuracy float {:.2f}%, quantized {:.2f}%", 100 * *e.float_accuracy,
                            100 * *e.quantized_accuracy);
    if (e.float_perplexity)
        line +=
            fmt::format("; perplexity float {:.3f}, quantized {:.3f}", *e.float_perplexity, *e.quantized_perplexity);
    return line;
}

// The report before any phase ran: versions, the recipe's explicit settings.
nlohmann::json initial_report(const Recipe& recipe, Phase last) {
    nlohmann::json report = {
        {"vaiq_version", std::string(version())},
        {"recipe",
         {{"files", nlohmann::json::array()}, {"name", recipe.value("name")}, {"settings", nlohmann::json::object()}}},
        {"quantized", false},
        {"stopped_after", std::string(phase_name(last))},
        {"phases", nlohmann::json::array()},
        {"passes", nlohmann::json::array()},
    };
    for (const auto& f : recipe.files) report["recipe"]["files"].push_back(f.string());
    for (const auto& key : recipe.explicit_keys())
        report["recipe"]["settings"][key] = {{"value", recipe.value(key)}, {"origin", recipe.setting(key).origin}};
    return report;
}

}  // namespace vaiq::phases
