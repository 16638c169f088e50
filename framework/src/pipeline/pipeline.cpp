#include "pipeline/pipeline.hpp"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>

#include "pipeline/algorithm_context.hpp"
#include "pipeline/calibration.hpp"
#include "pipeline/channel_ranges.hpp"
#include "pipeline/data_reader.hpp"
#include "pipeline/fragile_inputs.hpp"
#include "pipeline/diagnosis.hpp"
#include "pipeline/dump.hpp"
#include "pipeline/evaluation.hpp"
#include "pipeline/html_report.hpp"
#include "pipeline/joined_reference.hpp"
#include "pipeline/mixed_scale.hpp"
#include "pipeline/planner.hpp"
#include "pipeline/preprocess.hpp"
#include "pipeline/selection.hpp"
#include "pipeline/sensitivity.hpp"
#include "pipeline/statistics_file.hpp"
#include "recipe/defaults.hpp"
#include "util/atomic_file.hpp"
#include "util/model_size.hpp"
#include "util/npy.hpp"
#include "util/progress.hpp"
#include "util/spool.hpp"
#include "util/text.hpp"
#include "vaiq/error.hpp"
#include "vaiq/log.hpp"

namespace fs = std::filesystem;

namespace vaiq {

namespace {

constexpr Phase kAllPhases[] = {Phase::Setup,      Phase::Load, Phase::Prepare, Phase::Plan,     Phase::Calibrate,
                                Phase::Parameters, Phase::Emit, Phase::Check,   Phase::Evaluate, Phase::Save};

std::string who_needs(const Recipe& recipe, std::string_view key, const std::string& value) {
    const auto& origin = recipe.setting(key).origin;
    return origin == "default" ? fmt::format("{} {} (the default)", key, value)
                               : fmt::format("{}: {} {}", origin, key, value);
}

// A plugin option named like a documented extra option (CalibMovingAverage,
// DedicatedQDQPair, a device's AlignConcat: a capital first) takes the
// recipe's extra_options value, so a recipe moved from a Python call needs no
// second spelling of it.
// `given` holds the plugin's other options, `given_origin` says where each was set.
Options with_extra_options(const Recipe& recipe, const PluginRegistry& registry, const PluginInfo& info,
                           nlohmann::json given, const OptionOrigin& given_origin) {
    std::map<std::string, std::string> origins;
    for (const auto& spec : info.options) {
        if (!is_extra_option_name(spec.name)) continue;
        if (given.contains(spec.name))
            throw InputError(fmt::format("{}: {} is a documented extra option; set it under extra_options",
                                         given_origin(spec.name), spec.name));
        auto it = recipe.settings.find("extra_options." + spec.name);
        if (it == recipe.settings.end() || it->second.value.is_null()) continue;
        given[spec.name] = it->second.value;
        origins[spec.name] = it->second.origin;
    }
    return registry.resolve_options(info, given, [&](const std::string& option) {
        auto it = origins.find(option);
        return it != origins.end() ? it->second : given_origin(option);
    });
}

PluginChoice choose(const Recipe& recipe, const PluginRegistry& registry, PluginKind kind, const std::string& name,
                    std::string_view key) {
    const auto& info = registry.require(kind, name, who_needs(recipe, key, recipe.value(key).get<std::string>()));
    const std::string kind_str(kind_name(kind));
    return {&info,
            with_extra_options(recipe, registry, info, recipe.plugin_options(kind_str), [&](const std::string& option) {
                return recipe.plugin_option_origin(kind_str, option);
            })};
}

PluginChoice choose_algorithm(const Recipe& recipe, const PluginRegistry& registry,
                              const defaults::AlgorithmRequest& request) {
    const auto& info = registry.require(PluginKind::Algorithm, request.name, request.origin);
    return {&info, with_extra_options(recipe, registry, info, request.options,
                                      [&](const std::string&) { return request.origin; })};
}

// The recipe's algorithms in its order, after those its documented settings
// imply (weight_only_algorithm: gptq); an algorithm named twice runs once.
std::vector<PluginChoice> choose_algorithms(const Recipe& recipe, const PluginRegistry& registry) {
    std::vector<PluginChoice> out;
    auto add = [&](const defaults::AlgorithmRequest& request) {
        if (std::any_of(out.begin(), out.end(), [&](const PluginChoice& c) { return c.info->name == request.name; }))
            return;
        out.push_back(choose_algorithm(recipe, registry, request));
    };
    for (const auto& a : defaults::implied_algorithms(recipe)) add(a);
    for (const auto& a : recipe.value("algorithms"))
        add({a["name"].get<std::string>(), a["options"], a["origin"].get<std::string>()});
    return out;
}

bool truthy(const nlohmann::json& v) {
    if (v.is_boolean()) return v.get<bool>();
    if (v.is_array() || v.is_object() || v.is_string()) return !v.empty();
    return false;
}

// Appends formatted lines to a string.
struct Lines {
    std::string& text;
    template <typename... Args>
    void operator()(fmt::format_string<Args...> format, Args&&... args) {
        text += fmt::format(format, std::forward<Args>(args)...);
        text += '\n';
    }
};

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

// How many batches evaluation compares (0: all): evaluation_batches, or by default
// all of evaluation_data (or of labelled calibration data) and the first
// kDefaultEvaluationBatches of the calibration data.
int evaluation_batches(const Recipe& recipe) {
    const auto& v = recipe.value("evaluation_batches");
    if (!v.is_null()) return static_cast<int>(v.get<int64_t>());
    const bool all = !recipe.value("evaluation_data").is_null() || !recipe.value("evaluation_labels").is_null();
    return all ? 0 : kDefaultEvaluationBatches;
}

// A phase's entry in the report: its time and the peak memory at its end.
nlohmann::json phase_entry(Phase phase, std::chrono::steady_clock::time_point start) {
    return {{"name", std::string(phase_name(phase))}, {"seconds", seconds_since(start)}, {"peak_mb", peak_resident_mb()}};
}

}  // namespace

namespace {

bool declares(const PluginInfo& info, const std::string& option) {
    return std::any_of(info.options.begin(), info.options.end(), [&](const auto& o) { return o.name == option; });
}

// Every extra option the schema does not have must be an option of a chosen
// plugin. One of a plugin the recipe does not use has no effect (a warning, as
// for a switch that is off); one no plugin declares is a typo.
void check_extra_options(const Recipe& recipe, const PluginRegistry& registry, const ResolvedPlugins& chosen) {
    std::vector<const PluginInfo*> used = {chosen.target.info, chosen.format.info, chosen.calibrator.info};
    for (const auto& p : chosen.passes) used.push_back(p.info);
    for (const auto& a : chosen.algorithms) used.push_back(a.info);
    if (chosen.next_lever) used.push_back(chosen.next_lever->info);
    for (const auto& [name, setting] : recipe.plugin_extra_options()) {
        if (std::any_of(used.begin(), used.end(), [&n = name](const auto* info) { return declares(*info, n); }))
            continue;
        std::vector<std::string> owners, known;
        for (const auto* info : registry.list()) {
            if (declares(*info, name)) owners.push_back(fmt::format("{} '{}'", kind_name(info->kind), info->name));
            for (const auto& o : info->options)
                if (is_extra_option_name(o.name)) known.push_back(o.name);
        }
        if (!owners.empty()) {
            log_warn("{}: extra_options.{} has no effect: it is an option of {}, which this recipe does not use",
                     setting->origin, name, join(owners, ", "));
            continue;
        }
        for (const auto& k : keys_in_section("extra_options")) known.push_back(k);
        std::string hint = did_you_mean(name, known);
        throw InputError(fmt::format("{}: unknown key '{}' in extra_options{}", setting->origin, name,
                                     hint.empty() ? " (neither quantize_static nor a loaded plugin has it; "
                                                    "`vaiq plugins` lists the plugins' options)"
                                                  : hint));
    }
}

}  // namespace

ResolvedPlugins resolve_plugins(const Recipe& recipe, PluginRegistry& registry) {
    for (const auto& p : recipe.value("plugin_paths")) {
        try {
            registry.load_path(p.get<std::string>());
        } catch (const InputError& e) {
            throw InputError(fmt::format("{}: plugin_paths: {}", recipe.setting("plugin_paths").origin, e.what()));
        }
    }
    ResolvedPlugins out;
    out.target = choose(recipe, registry, PluginKind::Target, recipe.value("target").get<std::string>(), "target");
    out.format = choose(recipe, registry, PluginKind::Format, recipe.format_plugin(), "quant_format");
    out.calibrator = choose(recipe, registry, PluginKind::Calibrator, recipe.calibrator_plugin(), "calibrate_method");
    for (const auto& pass : recipe.value("passes")) {
        const auto name = pass["name"].get<std::string>();
        const auto origin = pass["origin"].get<std::string>();
        const auto& info = registry.require(PluginKind::Pass, name, origin);
        out.passes.push_back(
            {&info, registry.resolve_options(info, pass["options"], [&](const std::string&) { return origin; })});
    }
    out.algorithms = choose_algorithms(recipe, registry);
    if (const auto lever = defaults::next_lever(recipe)) out.next_lever = choose_algorithm(recipe, registry, *lever);
    check_extra_options(recipe, registry, out);
    return out;
}

std::vector<std::string> unsupported_settings(const Recipe& recipe, Phase last) {
    std::vector<std::string> out;
    for (const auto& spec : recipe_keys()) {
        const auto& s = recipe.setting(spec.path);
        if (spec.implemented || s.is_default() || spec.phase > last || !recipe.in_effect(spec.path)) continue;
        out.push_back(fmt::format("{} ({})", spec.path, s.origin));
    }
    return out;
}

namespace {

// The readers the recipe asks for: files, or random data when none are given.
std::unique_ptr<DataReader> random_reader(const Recipe& recipe, const Model& model) {
    return random_data_reader(model, recipe.value("random_data_reader_input_shape"),
                              recipe.value("extra_options.RandomDataReaderInputDataRange"), 1);
}

// How images in a data folder become inputs: the data_preprocess preset, with
// the image_preprocess keys set explicitly in its place.
ImagePipeline image_pipeline(const Recipe& recipe) {
    auto p = preset_image_pipeline(recipe.value("data_preprocess").get<std::string>());
    auto given = [&](const char* key) -> const nlohmann::json* {
        const auto& setting = recipe.setting(key);
        return setting.is_default() ? nullptr : &setting.value;
    };
    auto fail = [&](const char* key, const std::string& what) {
        throw InputError(fmt::format("{}: {} {}", recipe.setting(key).origin, key, what));
    };
    if (const auto* size = given("image_preprocess.size"); size && !size->empty()) {
        const auto& v = *size;
        if (v.size() != 2 || !(v[0] >= 1) || !(v[1] >= 1) || v[0] != std::floor(v[0].get<double>()) ||
            v[1] != std::floor(v[1].get<double>()))
            fail("image_preprocess.size", "must be [height, width], two positive integers");
        p.size = std::array<int64_t, 2>{v[0].get<int64_t>(), v[1].get<int64_t>()};
    }
    if (const auto* v = given("image_preprocess.resize"))
        p.resize = *v == "keep_aspect" ? ImagePipeline::Resize::KeepAspect : ImagePipeline::Resize::Stretch;
    if (const auto* v = given("image_preprocess.crop_fraction")) {
        p.crop_fraction = v->get<double>();
        if (!(p.crop_fraction > 0 && p.crop_fraction <= 1)) fail("image_preprocess.crop_fraction", "must be in (0, 1]");
    }
    if (const auto* v = given("image_preprocess.interpolation"))
        p.interpolation = *v == "area" ? ImagePipeline::Interpolation::Area : ImagePipeline::Interpolation::Bilinear;
    for (const char* key : {"image_preprocess.mean", "image_preprocess.std"}) {
        const auto* v = given(key);
        if (!v) continue;
        if (v->size() != 1 && v->size() != 3) fail(key, "takes one value or one per channel");
        auto& values = std::string(key) == "image_preprocess.mean" ? p.mean : p.std;
        values = v->get<std::vector<float>>();
    }
    for (float s : p.std)
        if (!(s > 0)) fail("image_preprocess.std", "values must be positive");
    if (const auto* v = given("image_preprocess.channel_order")) p.bgr = *v == "BGR";
    if (const auto* v = given("image_preprocess.layout")) p.nhwc = *v == "NHWC";
    return p;
}

// Whether the run has calibration data: files the recipe names, or the caller's reader.
bool has_calibration_data(const Recipe& recipe, const RunOptions& options) {
    return options.calibration_reader || !recipe.value("calibration_data_reader").is_null();
}

std::unique_ptr<DataReader> calibration_reader(const Recipe& recipe, const RunOptions& options, const Model& model) {
    if (options.calibration_reader) return options.calibration_reader(model);
    const auto& path = recipe.value("calibration_data_reader");
    if (!path.is_null()) {
        const auto images = image_pipeline(recipe);
        return open_data_reader(path.get<std::string>(), model, "calibration data", &images);
    }
    log_info("no calibration data given: calibrating on random data (a quick test, not an accurate model)");
    return random_reader(recipe, model);
}

nlohmann::json params_json(const TensorQuant& t, const std::map<std::string, TensorRange>& ranges) {
    nlohmann::json j = {{"tensor", t.tensor},
                        {"role", role_name(t.role)},
                        {"type", quant_type_name(t.params.type)},
                        {"symmetric", t.spec.symmetric}};
    if (t.spec.dynamic) {
        j["dynamic"] = true;  // DynamicQuantizeLinear's parameters, at run time
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

// A run up to, not including, saving: the quantized model and its report.
struct QuantizedRun {
    Model quantized;
    std::shared_ptr<TensorSpool> parked;  ///< holds the quantized model's large weights, when evaluation parked them
    nlohmann::json report;
    fs::path input, output, report_path;
    std::optional<CalibrationTables> tables;  ///< when asked for
};

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

// What a run carries from phase to phase.
struct RunState {
    RunState(const Recipe& r, PluginRegistry& reg, const RunOptions& o)
        : recipe(r),
          registry(reg),
          last(o.stop_after.value_or(Phase::Save)),
          options(o),
          calibrators([this](const std::string& method) {
              const auto choice = calibrator_choice(method);
              return registry.create<Calibrator>(choice.info->name, choice.options);
          }) {}

    // The run's calibrator with its resolved options; another method (an override's) resolved now.
    PluginChoice calibrator_choice(const std::string& method) const {
        return method == plugins.calibrator.info->name
                   ? plugins.calibrator
                   : choose(recipe, registry, PluginKind::Calibrator, method, "calibrate_method");
    }

    const Recipe& recipe;
    PluginRegistry& registry;
    const Phase last;
    const RunOptions& options;
    fs::path input, output, report_path;
    nlohmann::json report;
    ResolvedPlugins plugins;
    PluginInstance<Target> target;
    /// The instances of s.plugins.algorithms and of its next lever, created at setup.
    std::vector<PluginInstance<Algorithm>> algorithms;
    PluginInstance<Algorithm> next_lever;
    std::vector<PluginInstance<Algorithm>> tried;  ///< algorithms another tried that the run did not create
    CalibratorSet calibrators;         ///< the plan points into them
    QuantRequest run;                  ///< what the recipe asks of the whole run, for the target
    Model model;                       ///< the float model, prepared (and its biases corrected)
    std::optional<Model> uncorrected;  ///< the prepared model before a correction (set_initializers), when one ran
    /// The float model's outputs on the calibration data, by output index and part, for agreement().
    std::map<std::pair<int, BatchSet>, ReferenceBatches> agreement_references;
    bool function_kept = true;         ///< preparation changed only how the model computes, not what
    /// The float outputs on the calibration data as calibration computed them
    /// (the prepared model's, or the input model's joined into it), kept when
    /// evaluation will compare against them.
    std::unique_ptr<ReferenceOutputs> float_outputs;
    /// The prepared model's outputs on the calibration data, kept where preparation
    /// changed the function and evaluation, on that data, runs the input model apart.
    std::unique_ptr<ReferenceOutputs> prepared_outputs;
    bool float_outputs_from_input = false;  ///< they are the input model's, joined into calibration
    DraftPlan draft;
    std::unique_ptr<DataReader> data;
    CalibrationOutcome calibration;
    QuantPlan plan;
    std::map<std::string, TensorRange> ranges;
    Model quantized;
    std::shared_ptr<TensorSpool> parked;            ///< the file the quantized model's large weights wait in
    PluginInstance<Format> format;                  ///< created on first use
    std::map<std::string, Tensor> rounded_weights;  ///< fast finetune's grid values, written instead of the weights
    std::map<std::string, QuantParams> rounded_on;  ///< the quantization each was fitted to (see rounded_for)
    /// Parameters algorithms chose (AlgorithmContext::set_parameters), kept when the plan is recomputed.
    std::map<std::string, QuantParams> chosen_params;
    std::map<int, std::vector<TensorSensitivity>> sensitivity;  ///< by output index, computed once
    std::vector<ConstraintCount> refined;  ///< what the target's constraints changed in the last plan computed
    std::optional<CalibrationTables> tables;  ///< kept by calibrate when `keep_tables`
    /// Tensors whose channels differ in scale and that stay on one grid (mixed_scale.hpp):
    /// mixed precision raises them first.
    std::vector<std::string> mixed_scales;
    bool inputs_changed = false;  ///< preparation changed the model's inputs (NCHW to NHWC, float16 to float32)
    bool keep_tables = false;
    const int threads = 0;
};

void setup_phase(RunState& s) {
    s.plugins = resolve_plugins(s.recipe, s.registry);
    s.target = s.registry.create<Target>(s.plugins.target.info->name, s.plugins.target.options);
    for (const auto& a : s.plugins.algorithms)  // their options are checked before any work
        s.algorithms.push_back(s.registry.create<Algorithm>(a.info->name, a.options));
    if (const auto& lever = s.plugins.next_lever)
        s.next_lever = s.registry.create<Algorithm>(lever->info->name, lever->options);
    s.run = quant_request(s.recipe.quantize_config());
    s.run.power_of_two = s.calibrators.get(s.plugins.calibrator.info->name).scale_form() == ScaleForm::PowerOfTwo;
    s.target->check(s.run);
    s.report["plugins"] = nlohmann::json::array();
    std::vector<const PluginChoice*> chosen = {&s.plugins.target, &s.plugins.format, &s.plugins.calibrator};
    for (const auto& a : s.plugins.algorithms) chosen.push_back(&a);
    if (s.plugins.next_lever) chosen.push_back(&*s.plugins.next_lever);
    for (const auto* choice : chosen)
        s.report["plugins"].push_back({{"kind", kind_name(choice->info->kind)},
                                       {"name", choice->info->name},
                                       {"version", choice->info->version},
                                       {"library", choice->info->library.string()}});
}

void load_phase(RunState& s) {
    s.model = load_model(s.input);
    s.report["model"] = {{"input", s.input.string()},
                         {"output", s.output.string()},
                         {"opset", s.model.opset()},
                         {"nodes", s.model.graph().node_size()}};
}

void run_algorithms(RunState& s, AlgorithmStage stage);
void run_algorithm(RunState& s, Algorithm& algorithm, const std::string& name, AlgorithmStage stage);

// The documented preparation steps, then the target's transforms, CLE and the recipe's passes.
void prepare_phase(RunState& s) {
    const auto inputs_before = input_signature(s.model);
    // Per-channel weights need DequantizeLinear's axis (opset 13): older models are upgraded, as asked.
    constexpr int64_t kPerChannelOpset = 13;
    if (s.recipe.value("per_channel").get<bool>() && s.model.opset() < kPerChannelOpset) {
        const int64_t from = s.model.opset();
        s.model = convert_opset_with_shapes(s.model, kPerChannelOpset, s.registry);
        s.report["opset_converted"] = {{"from", from}, {"to", kPerChannelOpset}, {"why", "per_channel"}};
        log_info("per_channel: the model was converted from opset {} to {} (DequantizeLinear's axis)", from,
                 kPerChannelOpset);
    }
    if (s.recipe.value("extra_options.RemoveInputInit").get<bool>()) {
        const int removed = remove_initializer_inputs(s.model);
        if (removed > 0) log_info("RemoveInputInit: {} initializers are no longer graph inputs", removed);
        s.report["removed_initializer_inputs"] = removed;
    }
    std::vector<PluginChoice> passes;
    const std::string origin = "a transform the recipe or target asks for";
    for (const auto& p : defaults::preparation_passes(s.recipe))
        passes.push_back(pass_choice(s.registry, p.name, p.options, origin));
    for (const auto& name : s.target->legalization_passes(s.run))
        passes.push_back(pass_choice(s.registry, name, nullptr, origin));
    for (const auto& p : defaults::equalization_passes(s.recipe))
        passes.push_back(pass_choice(s.registry, p.name, p.options, origin));
    passes.insert(passes.end(), s.plugins.passes.begin(), s.plugins.passes.end());
    // Data-aware passes measure the model as it stands when they run, through a reader of its own
    // (an earlier pass may have changed the inputs the run's reader was opened for).
    const ChannelMeasurer measure = [&s](const Model& model, const std::vector<ChannelRangeRequest>& wanted) {
        const auto reader = calibration_reader(s.recipe, s.options, model);
        return measure_channel_ranges(model, *reader, wanted, s.threads);
    };
    s.function_kept = run_passes(passes, s.registry, s.model, s.report["passes"], measure);
    const auto& algorithm = s.recipe.value("weight_only_algorithm");
    if (s.recipe.value("weight_only").get<bool>() && algorithm != "rtn") {
        // AWQ and GPTQ change weights through float32 arithmetic on float32 tensors.
        for (const auto& init : s.model.graph().initializer())
            if (init.data_type() == onnx::TensorProto::FLOAT16)
                throw InputError(fmt::format(
                    "{}: weight_only_algorithm {} needs float32 weights and '{}' is float16: "
                    "use rtn, or convert the model first (convert_fp16_to_fp32: true)",
                    s.recipe.setting("weight_only_algorithm").origin, algorithm.get<std::string>(), init.name()));
    }
    run_algorithms(s, AlgorithmStage::Prepare);
    s.inputs_changed = input_signature(s.model) != inputs_before;
}

void plan_phase(RunState& s) {
    const auto decisions = decide_nodes(s.recipe, s.model, *s.target);
    s.draft = plan_tensors(s.recipe, s.model, *s.target, decisions, s.calibrators);
    int selected = 0;
    for (const auto& d : decisions) selected += d.quantized;
    s.report["plan"] = {{"nodes", decisions.size()},
                        {"nodes_selected", selected},
                        {"tensors", s.draft.tensors.size()},
                        {"skipped", nlohmann::json::array()}};
    for (const auto& [node, why] : s.draft.skipped)
        s.report["plan"]["skipped"].push_back({{"node", node}, {"reason", why}});
    auto& kept = s.report["plan"]["kept_float"] = nlohmann::json::array();
    for (const auto& [tensor, why] : s.draft.kept_float) kept.push_back({{"tensor", tensor}, {"reason", why}});
    if (s.draft.tensors.empty()) log_warn("the recipe selects nothing to quantize in this model");
}

// What the run's statistics belong to: the prepared model and its calibrators' options.
StatisticsIdentity statistics_identity(const RunState& s) {
    StatisticsIdentity id{model_fingerprint(s.model), {}};
    for (const auto& t : s.draft.tensors)
        if (t.observed() && !id.calibrators.count(t.calibrate_method))
            id.calibrators[t.calibrate_method] = s.calibrator_choice(t.calibrate_method).options.values();
    return id;
}

// Observers fed from statistics files, shard by shard; the data, if any, serves the later phases.
Observations observe_files(RunState& s, const StatisticsIdentity& identity) {
    auto observations = make_observers(s.draft);
    for (const auto& path : s.options.calibration_files) {
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
    if (has_calibration_data(s.recipe, s.options)) {
        s.data = calibration_reader(s.recipe, s.options, s.model);
    } else {
        log_info("calibrated from statistics files; with no calibration data, evaluation runs on random data");
        s.data = random_reader(s.recipe, s.model);
    }
    return observations;
}

// The prepared float model against the input model, where preparation changed
// what it computes (the DPU simulations): error no quantization setting removes.
void report_preparation_error(RunState& s, const Evaluation& e, const char* data) {
    if (e.outputs.empty()) return;
    auto& out = s.report["preparation_error"] = e.to_json();
    out["data"] = data;
    std::vector<std::string> changers;  // the passes that changed what the model computes
    for (const auto& p : s.report["passes"])
        if (p.value("changed", false) && !p.value("keeps_function", true)) changers.push_back(p["name"]);
    out["passes"] = changers;
    const auto line = fmt::format("the prepared float model against the input model ({} changed what it computes): {}",
                                  changers.empty() ? std::string("preparation") : join(changers, ", "),
                                  summary_line(e));
    const double warn_db = s.recipe.value("warn_output_sqnr_db").get<double>();
    if (std::none_of(e.outputs.begin(), e.outputs.end(), [&](const auto& o) { return o.sqnr_db < warn_db; }))
        return log_info("{}", line);
    log_warn("{}; below warn_output_sqnr_db {} before anything is quantized: the target's options switch those "
             "transforms off (`vaiq explain RECIPE` lists them)",
             line, warn_db);
}

// Observers fed the calibration data.
Observations observe_data(RunState& s) {
    const auto observed = s.draft.observed();
    if (!s.data && !has_calibration_data(s.recipe, s.options)) {
        // Given parameters are meant to replace calibration: random data must not fill the gaps.
        const bool given = !s.recipe.value("input_quantization_params").empty() ||
                           !s.recipe.value("output_quantization_params").empty();
        if (given && !observed.empty())
            throw InputError(
                fmt::format("these activations have neither given parameters nor calibration data: {} "
                            "(add them to input_quantization_params/output_quantization_params or set "
                            "calibration_data_reader)",
                            join(observed, ", ")));
        if (observed.empty()) {
            log_info("nothing to calibrate: activations are quantized at run time or have given parameters");
            s.data = random_reader(s.recipe, s.model);  // types the tensors; evaluation runs on it too
        }
    }
    if (!s.data) s.data = calibration_reader(s.recipe, s.options, s.model);
    // Evaluation on this data against a model whose function preparation kept can
    // compare against these outputs instead of running the given model again
    // (calibration runs every batch when it observes anything).
    OutputSink keep;
    const bool evaluated_here = s.last >= Phase::Evaluate && s.recipe.value("evaluation_data").is_null() &&
                                !observed.empty();
    // Where preparation changed the function, the given model's outputs are
    // computed beside, from what the two models share (see joined_reference.hpp).
    std::optional<JoinedReference> joined;
    bool given_apart = false;  // evaluation will run the input model on the same data
    if (evaluated_here && !s.function_kept) {
        const Model given = load_model(s.input);
        if (same_inputs(given, s.model)) joined = join_given_model(s.model, given);
        given_apart = !joined && same_inputs(given, s.model);
        if (joined)
            log_info("evaluation's reference, the input model, joins calibration: {} of its nodes shared, {} added",
                     joined->shared_nodes, joined->added_nodes);
    }
    // With the two joined, what preparation alone changed in the outputs comes for free.
    std::optional<OutputComparison> preparation;
    if (evaluated_here && (s.function_kept || joined)) {
        s.float_outputs = std::make_unique<ReferenceOutputs>();
        s.float_outputs_from_input = joined.has_value();
        const int outputs = joined ? joined->outputs_before : s.model.graph().output_size();
        for (int o = 0; o < outputs; ++o) s.float_outputs->names.push_back(s.model.graph().output(o).name());
        if (joined) preparation.emplace(s.float_outputs->names);
        keep = [&, limit = evaluation_batches(s.recipe)](const Batch& batch, std::vector<Tensor> values) {
            if (limit > 0 && static_cast<int>(s.float_outputs->sources.size()) >= limit) return;
            if (joined) {  // the input model's outputs, in the prepared model's order
                std::vector<Tensor> given;
                for (int index : joined->given_outputs)  // a shared output is copied: the prepared model's too
                    given.push_back(index < joined->outputs_before ? values.at(index) : std::move(values.at(index)));
                values.resize(given.size());
                preparation->add(given, values, batch.source);
                values = std::move(given);
            }
            s.float_outputs->add(batch.source, std::move(values));
        };
    } else if (given_apart) {  // what preparation alone changed, compared when the input model runs
        s.prepared_outputs = std::make_unique<ReferenceOutputs>();
        s.prepared_outputs->names = output_names(s.model);
        keep = [&, limit = evaluation_batches(s.recipe)](const Batch& batch, std::vector<Tensor> values) {
            if (limit > 0 && static_cast<int>(s.prepared_outputs->sources.size()) >= limit) return;
            s.prepared_outputs->add(batch.source, std::move(values));
        };
    }
    auto observations = make_observers(s.draft);
    try {
        observe(
            observations, s.model, s.draft, *s.data, s.threads,
            [&](int batch) { log_debug("calibration batch {} of {} files", batch, s.data->items()); }, keep);
    } catch (...) {
        if (joined) remove_joined(s.model, *joined);
        throw;
    }
    if (joined) remove_joined(s.model, *joined);
    if (preparation) {
        Evaluation e;
        e.batches = static_cast<int>(s.float_outputs->sources.size());
        for (auto rows : s.float_outputs->batch_samples) e.samples += rows;
        e.outputs = preparation->metrics();
        report_preparation_error(s, e, "calibration_data");
    }
    return observations;
}

// The first `limit` batches of another reader.
class FirstBatches final : public DataReader {
  public:
    FirstBatches(DataReader& all, size_t limit) : all_(all), limit_(limit) {}
    std::optional<Batch> next() override { return read_++ < limit_ ? all_.next() : std::nullopt; }
    void rewind() override {
        all_.rewind();
        read_ = 0;
    }
    size_t items() const override { return std::min(limit_, all_.items()); }

  private:
    DataReader& all_;
    size_t limit_, read_ = 0;
};

// Tensors whose channels live on different scales (mixed_scale.hpp), measured
// on the first calibration batches, and the heads' weights: split where the
// graph splits them, weights per channel where the target allows it, named
// with what to do elsewhere. Statistics files (sharded calibration) are made and
// read without the measurement, which would need the data before calibrating,
// so that the plan a shard observes is the plan the run reads them into.
void check_channel_scales(RunState& s, bool measure) {
    const double ratio = s.recipe.value("mixed_scale_ratio").get<double>();
    const auto batches = s.recipe.value("mixed_scale_batches").get<int64_t>();
    if (!(ratio > 0)) return;
    const auto requests =
        measure && batches > 0 ? mixed_scale_candidates(s.model, s.draft) : std::vector<ChannelRangeRequest>{};
    // Given parameters replace calibration: random data must not decide anything then.
    const bool given = !s.recipe.value("input_quantization_params").empty() ||
                       !s.recipe.value("output_quantization_params").empty();
    ChannelRanges ranges;
    if (!requests.empty() && (s.data || has_calibration_data(s.recipe, s.options) || !given)) {
        if (!s.data) s.data = calibration_reader(s.recipe, s.options, s.model);
        FirstBatches first(*s.data, static_cast<size_t>(batches));
        try {
            ranges = measure_channel_ranges(s.model, first, requests, s.threads);
        } catch (const InputError& e) {  // a check, like a diagnosis, never fails the run
            ranges.clear();
            if (std::string(e.what()).find("input '") != std::string::npos) {
                log_debug("the channel-scale check is skipped: {}", e.what());  // calibration reports the data
            } else {
                log_warn("the channel-scale check could not measure the model, and is skipped: {}", e.what());
                s.report["diagnoses_unavailable"].push_back(
                    {{"diagnosis", "the channel-scale check"}, {"error", e.what()}});
            }
        }
        s.data->rewind();
    }
    QuantRequest per_channel = s.run;
    per_channel.per_channel = true;
    bool per_channel_ok = true;
    try {
        s.target->check(per_channel);
    } catch (const InputError&) {
        per_channel_ok = false;
    }
    auto& out = s.report["mixed_scale_tensors"] = nlohmann::json::array();
    constexpr size_t kWarned = 3;  // a network of many concatenations names the rest in one line
    size_t warned = 0;
    std::vector<std::string> unwarned;
    for (const auto& m : split_mixed_scales(s.model, s.draft, requests, ranges, ratio, per_channel_ok)) {
        out.push_back(m.to_json());
        const double apart = m.widest / m.narrowest;
        if (m.action == "split")
            log_info("'{}' holds channels on scales {:.0f}x apart: it stays float and each Slice/Split reading it is "
                     "quantized on its own range",
                     m.tensor, apart);
        else if (m.action == "per_channel")
            log_info("the weight '{}' of '{}' holds output channels on scales {:.0f}x apart: quantized per channel",
                     m.tensor, m.node, apart);
        else if (warned++ < kWarned)
            log_warn("'{}' holds channels on scales {:.0f}x apart: {}", m.tensor, apart, m.advice);
        else
            unwarned.push_back(m.tensor);
        if (m.action.empty() && m.role == "activation") s.mixed_scales.push_back(m.tensor);
    }
    if (!unwarned.empty())
        log_warn("{} more tensors hold channels on scales {}x or more apart, each with what to try in the report's "
                 "mixed_scale_tensors: {}{}",
                 unwarned.size(), ratio,
                 join({unwarned.begin(), unwarned.begin() + std::min<std::ptrdiff_t>(6, std::ssize(unwarned))}),
                 unwarned.size() > 6 ? ", ..." : "");
}

// Observes the calibration data; where preparation changed the model's inputs,
// an input the data does not fit says that the data must fit the prepared model.
Observations observe_calibration(RunState& s, const std::optional<StatisticsIdentity>& identity) {
    try {
        return identity && !s.options.calibration_files.empty() ? observe_files(s, *identity) : observe_data(s);
    } catch (const InputError& e) {
        const std::string what = e.what();
        if (!s.inputs_changed || what.find("input '") == std::string::npos) throw;
        throw InputError(what + "; preparation changed the model's inputs (convert_nchw_to_nhwc channels-last, "
                                "convert_fp16_to_fp32 float): the calibration data must fit the prepared model "
                                "(--stop-after prepare writes it)");
    }
}

void calibrate_phase(RunState& s) {
    const bool from_files = !s.options.calibration_files.empty();
    check_channel_scales(s, !from_files && !s.keep_tables);
    std::optional<StatisticsIdentity> identity;
    if (from_files || s.keep_tables) identity = statistics_identity(s);
    const auto observations = observe_calibration(s, identity);
    s.calibration = conclude(s.draft, observations);
    if (s.keep_tables)
        s.tables = CalibrationTables{statistics_file(observations, s.draft, *identity),
                                     ort_calibration_json(s.calibration), tensorrt_calibration_cache(s.calibration)};
    s.report["calibration"] = {{"batches", s.calibration.batches},
                               {"observed_tensors", s.calibration.results.size()},
                               {"not_float", s.calibration.not_float}};
    if (from_files) s.report["calibration"]["statistics_files"] = s.options.calibration_files;
    drop_tensors(s.draft, s.calibration.not_float);
}

// The fitted weights that `plan` still quantizes as they were fitted: a weight
// whose parameters changed since (a recomputed plan refined anew, a tensor
// raised) is rounded to nearest on its new grid instead.
std::map<std::string, Tensor> rounded_for(const RunState& s, const QuantPlan& plan) {
    auto same = [](const QuantParams& a, const QuantParams& b) {
        return a.type == b.type && a.scale == b.scale && a.zero_point == b.zero_point && a.axis == b.axis &&
               a.block_size == b.block_size;
    };
    std::map<std::string, Tensor> out;
    for (const auto& [name, value] : s.rounded_weights) {
        const auto* t = plan.find(name);
        const auto fitted = s.rounded_on.find(name);
        if (t && fitted != s.rounded_on.end() && same(t->params, fitted->second)) out.emplace(name, value);
    }
    return out;
}

// The prepared float model with `plan` written into it by the run's format,
// the `rounded` weights in place of the float ones.
Model emit_plan(RunState& s, const QuantPlan& plan, const std::map<std::string, Tensor>& rounded) {
    if (!s.format) s.format = s.registry.create<Format>(s.plugins.format.info->name, s.plugins.format.options);
    Model out = s.model;
    for (auto& init : *out.graph().mutable_initializer())
        if (auto it = rounded.find(init.name()); it != rounded.end()) init = it->second.to_proto(init.name());
    s.format->emit(out, plan);
    return out;
}

// The same with the run's fitted weights that `plan` still applies to.
Model emit_plan(RunState& s, const QuantPlan& plan) { return emit_plan(s, plan, rounded_for(s, plan)); }

// What quantized candidates are measured against: the prepared float model.
const Model& float_reference(const RunState& s) { return s.uncorrected ? *s.uncorrected : s.model; }

// Every tensor of the plan measured on the calibration data (so that
// evaluation_data stays held out), most harmful first; computed once per output.
const std::vector<TensorSensitivity>& sensitivity_of(RunState& s, int output_index) {
    if (auto it = s.sensitivity.find(output_index); it != s.sensitivity.end()) return it->second;
    const int batches = static_cast<int>(s.recipe.value("sensitivity_batches").get<int64_t>());
    log_info("sensitivity analysis: {} tensors, each on {} batches", s.plan.tensors.size(),
             batches > 0 ? std::to_string(batches) : "all");
    size_t reported = 0;
    auto ranking = analyze_sensitivity(
        float_reference(s), s.plan, [&](const QuantPlan& plan) { return emit_plan(s, plan); }, *s.data, batches,
        output_index, s.threads, [&](size_t done, size_t total) {
            report_progress("tensor", static_cast<int64_t>(done), static_cast<int64_t>(total));
            if (done * 10 / total == reported) return;
            reported = done * 10 / total;
            log_info("sensitivity analysis: {} of {} tensors", done, total);
        });
    for (auto& t : ranking)
        t.mixed_scales = std::find(s.mixed_scales.begin(), s.mixed_scales.end(), t.tensor) != s.mixed_scales.end();
    return s.sensitivity.emplace(output_index, std::move(ranking)).first->second;
}

// The plan computed from the calibration and `draft`, with the parameters the
// algorithms chose and the target's constraints (counted in `refined`).
QuantPlan plan_of(RunState& s, const DraftPlan& draft, std::map<std::string, TensorRange>* ranges,
                  std::vector<ConstraintCount>* refined) {
    auto plan = compute_parameters(s.model, draft, s.calibration, ranges);
    for (auto& t : plan.tensors)
        if (auto it = s.chosen_params.find(t.tensor); it != s.chosen_params.end()) t.params = it->second;
    auto counts = s.target->refine(s.model, plan, s.run);
    if (refined) *refined = std::move(counts);
    return plan;
}

// The run's plan computed anew (after a change to its draft, parameters or float model).
void recompute_plan(RunState& s) {
    s.ranges.clear();
    s.plan = plan_of(s, s.draft, &s.ranges, &s.refined);
}

// The float model's outputs on the calibration data for AlgorithmContext::agreement(),
// computed once per output: every fourth batch is held out once there are four.
const ReferenceBatches& agreement_reference(RunState& s, int output_index, BatchSet batches) {
    auto key = std::make_pair(output_index, batches);
    if (auto it = s.agreement_references.find(key); it != s.agreement_references.end()) return it->second;
    if (batches == BatchSet::All) {
        auto all = reference_batches(float_reference(s), *s.data, 0, output_index, s.threads);
        return s.agreement_references.emplace(key, std::move(all)).first->second;
    }
    const auto& all = agreement_reference(s, output_index, BatchSet::All);
    ReferenceBatches part = all;
    part.feeds.clear(), part.outputs.clear();
    for (size_t b = 0; b < all.feeds.size(); ++b) {
        const bool held = all.feeds.size() >= 4 && b % 4 == 3;
        if (held != (batches == BatchSet::HeldOut)) continue;
        part.feeds.push_back(all.feeds[b]);
        part.outputs.push_back(all.outputs[b]);
    }
    return s.agreement_references.emplace(key, std::move(part)).first->second;
}

// Algorithm `algorithm` gives `tensor` new parameters: the same form as those
// calibration gave (type, count, axis), so the format and the target take them.
void choose_parameters(RunState& s, const std::string& algorithm, const std::string& tensor,
                       const QuantParams& params) {
    auto it = std::find_if(s.plan.tensors.begin(), s.plan.tensors.end(),
                           [&](const TensorQuant& t) { return t.tensor == tensor; });
    if (it == s.plan.tensors.end())
        throw InputError(fmt::format("algorithm '{}' chose parameters for '{}', which the plan does not quantize",
                                     algorithm, tensor));
    const auto& old = it->params;
    const bool same_form = params.type == old.type && params.scale.size() == old.scale.size() &&
                           params.zero_point.size() == old.zero_point.size() && params.axis == old.axis &&
                           params.block_size == old.block_size;
    const bool scales_ok =
        std::all_of(params.scale.begin(), params.scale.end(), [](float v) { return std::isfinite(v) && v > 0; });
    if (!same_form || !scales_ok)
        throw InputError(
            fmt::format("algorithm '{}' chose parameters for '{}' of another form than calibration's "
                        "({} {} scales, axis {}) or with a scale that is not finite and positive",
                        algorithm, tensor, quant_type_name(old.type), old.scale.size(), old.axis));
    it->params = params;
    s.chosen_params[tensor] = params;
}

// Runs one algorithm plugin of `stage` on the run as it stands; its report section goes under its name.
// The instance of algorithm `name` for try_algorithm(): the next lever created
// at setup, one of the recipe's, or one created now with the recipe's options.
Algorithm& algorithm_named(RunState& s, const std::string& name, const std::string& asked_by) {
    if (s.plugins.next_lever && s.plugins.next_lever->info->name == name) return *s.next_lever;
    for (size_t a = 0; a < s.algorithms.size(); ++a)
        if (s.plugins.algorithms[a].info->name == name) return *s.algorithms[a];
    const auto choice = choose_algorithm(s.recipe, s.registry,
                                         {name, nlohmann::json::object(), fmt::format("algorithm '{}'", asked_by)});
    s.tried.push_back(s.registry.create<Algorithm>(name, choice.options));
    return *s.tried.back();
}

// Runs algorithm `other` for algorithm `name` and keeps what it changed only if `keep()` says so.
bool try_algorithm(RunState& s, const std::string& name, const std::string& other, const std::function<bool()>& keep) {
    if (other == name) throw InternalError(fmt::format("algorithm '{}' tried itself", name));
    auto& algorithm = algorithm_named(s, other, name);
    if (algorithm.stage() != AlgorithmStage::Parameters)
        throw InputError(fmt::format("algorithm '{}' tried '{}', which does not work on the plan", name, other));
    const auto weights = s.rounded_weights;
    const auto on = s.rounded_on;
    const auto params = s.chosen_params;
    const auto draft = s.draft;
    const bool reported = s.report.contains(other);
    run_algorithm(s, algorithm, other, AlgorithmStage::Parameters);
    if (keep()) return true;
    s.rounded_weights = weights, s.rounded_on = on, s.chosen_params = params, s.draft = draft;
    recompute_plan(s);
    if (!reported) s.report.erase(other);
    return false;
}

// The services of the calibrated run (Parameters and Corrections stages).
void offer_plan_services(RunState& s, AlgorithmInputs& inputs, const std::string& name, AlgorithmStage stage) {
    inputs.agreement = [&s](const Model& quantized, int output_index, BatchSet batches) {
        return measure_output(quantized, agreement_reference(s, output_index, batches), s.threads);
    };
    inputs.measured_output = [&s](int output_index) {
        const auto& reference = agreement_reference(s, output_index, BatchSet::All);
        return MeasuredOutput{reference.output_name, reference.meaning.describe()};
    };
    inputs.sensitivity = [&s](int output_index) { return sensitivity_of(s, output_index); };
    if (stage == AlgorithmStage::Corrections) {
        inputs.replace_initializers = [&s](std::map<std::string, Tensor> values) {
            if (!s.uncorrected) s.uncorrected = s.model;
            for (auto& init : *s.model.graph().mutable_initializer())
                if (auto it = values.find(init.name()); it != values.end()) init = it->second.to_proto(init.name());
        };
        return;
    }
    inputs.target_runs = [&s](QuantType activation, QuantType weight) {
        QuantRequest request = s.run;
        request.activation_type = activation;
        request.weight_type = weight;
        try {
            s.target->check(request);
            return true;
        } catch (const InputError&) {
            return false;
        }
    };
    inputs.raised_plan = [&s](const std::set<std::string>& tensors, const Precision& precision, size_t* count) {
        return plan_of(s, raise_tensors(s.model, s.draft, tensors, precision, count), nullptr, nullptr);
    };
    inputs.set_precision = [&s](const std::set<std::string>& tensors, const Precision& precision) {
        s.draft = raise_tensors(s.model, s.draft, tensors, precision, nullptr);
        recompute_plan(s);
    };
    inputs.try_algorithm = [&s, name](const std::string& other, const std::function<bool()>& keep) {
        return try_algorithm(s, name, other, keep);
    };
}

void run_algorithm(RunState& s, Algorithm& algorithm, const std::string& name, AlgorithmStage stage) {
    const bool prepare = stage == AlgorithmStage::Prepare;
    // Before calibration the reader is opened for the model as preparation left it.
    if (prepare) s.data = calibration_reader(s.recipe, s.options, s.model);
    AlgorithmInputs inputs(s.model, s.plan, *s.data, s.threads);
    inputs.fitted_weights = [&s] { return rounded_for(s, s.plan); };
    inputs.emit = [&s](const QuantPlan& plan, const std::map<std::string, Tensor>& weights) {
        return emit_plan(s, plan, weights);
    };
    inputs.keep_fitted = [&s](std::map<std::string, Tensor> weights) {
        for (auto& [weight, value] : weights) {
            const auto* t = s.plan.find(weight);
            if (!t) continue;  // not quantized: nothing to fit
            s.rounded_on[weight] = t->params;
            s.rounded_weights[weight] = std::move(value);
        }
    };
    inputs.keep_parameters = [&s, name](const std::string& tensor, const QuantParams& params) {
        choose_parameters(s, name, tensor, params);
    };
    inputs.report = [&s, name](nlohmann::json section) { s.report[name] = std::move(section); };
    inputs.quantized_nodes = [&s] {
        std::set<std::string> out;
        for (const auto& d : decide_nodes(s.recipe, s.model, *s.target))
            if (d.quantized) out.insert(d.name);
        return out;
    };
    inputs.default_spec = [&s](TensorRole role) { return s.target->default_spec(role, s.run); };
    if (prepare)
        inputs.replace_model = [&s, name](Model model) {
            if (input_signature(model) != input_signature(s.model))
                throw InternalError(fmt::format("algorithm '{}' changed the model's inputs", name));
            s.model = std::move(model);
            s.function_kept = false;  // kept in exact arithmetic, but counted as not, as CLE is
        };
    else
        offer_plan_services(s, inputs, name, stage);
    HostAlgorithmContext context(std::move(inputs));
    algorithm.run(context);
}

// The algorithm plugins of `stage`, in the recipe's order.
void run_algorithms(RunState& s, AlgorithmStage stage) {
    for (size_t a = 0; a < s.algorithms.size(); ++a)
        if (s.algorithms[a]->stage() == stage)
            run_algorithm(s, *s.algorithms[a], s.plugins.algorithms[a].info->name, stage);
}

void parameters_phase(RunState& s) {
    recompute_plan(s);
    run_algorithms(s, AlgorithmStage::Parameters);
    if (!s.chosen_params.empty()) recompute_plan(s);  // the target's constraints on what they chose
    // Last: the corrections are for the weights' final types and values.
    run_algorithms(s, AlgorithmStage::Corrections);
    if (s.uncorrected) recompute_plan(s);
    if (!s.refined.empty()) s.report["constraints"] = constraints_json(s.refined, true);
    s.report["tensors"] = nlohmann::json::array();
    for (const auto& t : s.plan.tensors) s.report["tensors"].push_back(params_json(t, s.ranges));
}

void emit_phase(RunState& s) {
    s.quantized = emit_plan(s, s.plan);
    s.report["quantized"] = true;
    s.report["model"]["quantized_tensors"] = s.plan.tensors.size();
    s.report["model"]["nodes_after"] = s.quantized.graph().node_size();
}

// What refinement promised, checked on what was written.
void check_phase(RunState& s) {
    check_model(s.quantized);
    if (s.last < Phase::Emit) return;
    const auto checked = s.target->verify(s.quantized, s.run);
    if (checked.empty()) return;
    s.report["constraints_written"] = constraints_json(checked, false);
    std::vector<std::string> broken;
    for (const auto& c : checked)
        if (c.violated > 0) broken.push_back(fmt::format("{} on {} of {} nodes", c.name, c.violated, c.checked));
    if (!broken.empty())
        log_warn("the written model breaks device constraints: {} (see the report's constraints_written)",
                 join(broken, "; "));
    else
        log_info("device constraints hold in the written model ({} checks)", checked.size());
}

// Bins of a value histogram: fine enough to show a distribution's shape and
// where a range clips it, small enough for a report on a large model.
constexpr int kHistogramBins = 48;

// Every quantized activation's SQNR in the quantized model on one batch, and a
// histogram of its float values spanning the calibrated range, for the HTML report.
nlohmann::json tensor_errors_json(const Model& reference, const Model& quantized, const Batch& batch,
                                  const nlohmann::json& report, int threads) {
    std::map<std::string, std::array<double, 2>> ranges;
    const auto planned = report.find("tensors");
    if (planned != report.end())
        for (const auto& t : *planned)
            if (t.value("role", "") == "activation" && t.contains("range"))
                ranges[t["tensor"].get<std::string>()] = {t["range"][0].get<double>(), t["range"][1].get<double>()};
    std::set<std::string> wanted;
    for (const auto& [name, range] : ranges) wanted.insert(name);
    auto out = nlohmann::json::array();
    if (wanted.empty()) return out;
    compare_tensors(reference, quantized, batch.feeds, threads, wanted, [&](const TensorComparison& c) {
        const auto values = c.reference.data<float>();
        const auto& range = ranges.at(c.tensor);
        double lo = range[0], hi = range[1];
        for (float v : values)
            if (std::isfinite(v)) lo = std::min<double>(lo, v), hi = std::max<double>(hi, v);
        if (!(hi > lo)) hi = lo + 1;
        std::vector<int64_t> counts(kHistogramBins, 0);
        for (float v : values)
            if (std::isfinite(v))
                ++counts[std::clamp(static_cast<int>((v - lo) / (hi - lo) * kHistogramBins), 0, kHistogramBins - 1)];
        out.push_back({{"tensor", c.tensor},
                       {"node", c.node},
                       {"sqnr_db", std::isfinite(c.sqnr_db) ? nlohmann::json(c.sqnr_db) : nlohmann::json(nullptr)},
                       {"histogram", {{"min", lo}, {"max", hi}, {"counts", counts}}}});
        return true;
    });
    return out;
}

// Runs a diagnosis, which explains a result: one that cannot be computed is
// named in the log and in the report's `diagnoses_unavailable`, and the run goes
// on to write its model. Input errors of the run itself were raised before evaluation.
template <class Diagnosis>
void diagnose(RunState& s, const char* what, Diagnosis&& diagnosis) {
    try {
        diagnosis();
    } catch (const std::exception& e) {
        log_warn("{} could not be computed, and is left out of the report: {}", what, e.what());
        s.report["diagnoses_unavailable"].push_back({{"diagnosis", what}, {"error", e.what()}});
    }
}

// The quantized model against the float one on the evaluation (or calibration)
// data; with a low output SQNR, where the error starts.
void evaluate_phase(RunState& s) {
    // The quantized model's large weights wait on disk while the float model runs:
    // the two models' weights are never in memory together.
    s.parked = std::make_shared<TensorSpool>(0);
    if (const size_t parked = s.parked->park_initializers(s.quantized, size_t{1} << 20))
        log_debug("evaluation: {:.1f} MB of quantized weights parked in a temporary file", parked / 1e6);
    std::unique_ptr<DataReader> eval_data;
    if (!s.recipe.value("evaluation_data").is_null()) {
        const auto images = image_pipeline(s.recipe);
        eval_data =
            open_data_reader(s.recipe.value("evaluation_data").get<std::string>(), s.model, "evaluation data", &images);
    }
    std::optional<Tensor> labels;
    if (!s.recipe.value("evaluation_labels").is_null())
        labels = read_tensor_file(s.recipe.value("evaluation_labels").get<std::string>());
    // The reference is the model as given, so function-changing preparation (the DPU
    // simulations, ReplaceClip6Relu) counts as error; a model whose inputs preparation
    // changed (NHWC, float16) cannot take the same data and is compared as prepared.
    // When preparation kept the function, the prepared model's outputs calibration
    // computed stand for the given model's: it does not run again.
    // (Calibration keeps them only for a run evaluated on its data.)
    const bool from_calibration = s.float_outputs != nullptr;
    Model given;
    bool as_given = false;
    if (!from_calibration) {
        given = load_model(s.input);
        as_given = same_inputs(given, s.model);
        if (!as_given) {
            given = Model();
            log_info("evaluating against the prepared float model: preparation changed the model's inputs");
        }
    }
    const Model& reference = as_given ? given : float_reference(s);
    auto& data = eval_data ? *eval_data : *s.data;
    const int batches = evaluation_batches(s.recipe);
    const Tensor* label_tensor = labels ? &*labels : nullptr;
    if (!from_calibration) s.float_outputs = reference_outputs(reference, data, s.threads, batches);
    const auto evaluation = compare_outputs(*s.float_outputs, s.quantized, data, label_tensor, s.threads, batches);
    if (as_given && !s.function_kept) {  // the prepared model ran on this data in calibration, unless it is held out
        const auto e = s.prepared_outputs  // kept for the batches evaluation compares
                           ? compare_outputs(*s.float_outputs, *s.prepared_outputs)
                           : compare_outputs(*s.float_outputs, float_reference(s), data, nullptr, s.threads, batches);
        report_preparation_error(s, e, eval_data ? "evaluation_data" : "calibration_data");
    }
    s.float_outputs.reset();
    s.prepared_outputs.reset();
    auto& out = s.report["evaluation"] = evaluation.to_json();
    out["reference"] = from_calibration && s.float_outputs_from_input
                           ? "input model, joined into calibration"
                       : from_calibration ? "prepared model (its preparation keeps the function), as calibrated"
                       : as_given         ? "input model"
                                          : "prepared model";
    out["data"] = eval_data ? "evaluation_data" : "calibration_data";
    const bool limited = batches > 0 && evaluation.batches == batches;  // there may be more
    if (limited) out["batches_limit"] = batches;
    log_info("quantized vs float on {} data{}: {}", eval_data ? "evaluation" : "calibration",
             limited ? fmt::format(" (its first {} batches; evaluation_batches: 0 compares all)", batches) : "",
             summary_line(evaluation));
    const double warn_db = s.recipe.value("warn_output_sqnr_db").get<double>();
    const bool low = std::any_of(evaluation.outputs.begin(), evaluation.outputs.end(),
                                 [&](const auto& o) { return o.sqnr_db < warn_db; });
    if (s.recipe.value("sensitivity_analysis").get<bool>()) {
        diagnose(s, "the sensitivity analysis", [&] {
            // The output mixed precision measures (its option), else the first.
            const auto chosen = s.recipe.settings.find("extra_options.AutoMixprecision.OutputIndex");
            const bool given = chosen != s.recipe.settings.end() && chosen->second.value.is_number_integer();
            const int output_index = given ? chosen->second.value.get<int>() : 0;
            // Mixed precision measured the plan before it raised anything: that is what explains the choice.
            const auto& ranking = sensitivity_of(s, output_index);
            s.report["sensitivity"] = {{"data", "calibration_data"},
                                       {"batches", s.recipe.value("sensitivity_batches")},
                                       {"tensors", sensitivity_json(ranking)}};
        });
    }
    data.rewind();
    const bool per_tensor = s.recipe.value("report_html").get<bool>();
    auto batch = low || per_tensor ? data.next() : std::nullopt;
    if (batch && per_tensor)
        diagnose(s, "the per-tensor error", [&] {
            out["tensors"] = tensor_errors_json(reference, s.quantized, *batch, s.report, s.threads);
        });
    if (batch && low)
        diagnose(s, "the first diverging tensor", [&] {
            const auto d = first_divergence(reference, s.quantized, batch->feeds, warn_db, s.threads);
            if (d)
                out["first_divergence"] = {
                    {"tensor", d->tensor}, {"node", d->node}, {"sqnr_db", d->sqnr_db}, {"data", batch->source}};
        });
}

// The phases a run goes through, in order; check runs whatever the last phase.
struct PhaseStep {
    Phase phase;
    void (*run)(RunState&);
};
constexpr PhaseStep kSteps[] = {
    {Phase::Setup, setup_phase}, {Phase::Load, load_phase},           {Phase::Prepare, prepare_phase},
    {Phase::Plan, plan_phase},   {Phase::Calibrate, calibrate_phase}, {Phase::Parameters, parameters_phase},
    {Phase::Emit, emit_phase},   {Phase::Check, check_phase},         {Phase::Evaluate, evaluate_phase},
};

// How the recipe saves the model at `output`.
SaveOptions save_options(const Recipe& recipe, const fs::path& output) {
    SaveOptions save;
    save.use_external_data_format = recipe.value("use_external_data_format").get<bool>();
    save.external_data_file = recipe.value("external_data_name").get<std::string>();
    for (size_t at; (at = save.external_data_file.find("{model}")) != std::string::npos;)
        save.external_data_file.replace(at, 7, output.filename().string());
    const auto threshold = recipe.value("external_data_size_threshold").get<int64_t>();
    if (threshold < 0)
        throw InputError(fmt::format("{}: external_data_size_threshold must not be negative",
                                     recipe.setting("external_data_size_threshold").origin));
    save.external_data_size_threshold = static_cast<size_t>(threshold);
    return save;
}

// `writes`: the run will be saved, so it needs an output path.
QuantizedRun quantize(const Recipe& recipe, PluginRegistry& registry, const RunOptions& options, bool writes = true,
                      bool keep_tables = false) {
    RunState s(recipe, registry, options);
    s.keep_tables = keep_tables;
    if (auto unsupported = unsupported_settings(recipe, s.last); !unsupported.empty())
        throw InputError(fmt::format("not supported yet by this vaiq: {}", join(unsupported, "; ")));
    const auto& input = recipe.value("model_input");
    const auto& output = recipe.value("model_output");
    if (input.is_null()) throw InputError("no model to quantize: set model_input in the recipe or pass --model");
    if (writes && output.is_null()) throw InputError("no output path: set model_output in the recipe or pass --output");
    s.input = input.get<std::string>();
    if (!output.is_null()) s.output = output.get<std::string>();
    // Checked now as well as when saving, so that a long run does not fail at its end.
    if (writes) {
        const fs::path dir = s.output.has_parent_path() ? s.output.parent_path() : fs::path(".");
        std::error_code ec;
        if (!fs::is_directory(dir, ec))
            throw InputError(fmt::format("{}: the output folder {} does not exist", s.output.string(), dir.string()));
        save_options(recipe, s.output);
    }
    s.report_path = recipe.value("report").is_null() ? fs::path(s.output).replace_extension(".report.json")
                                                     : fs::path(recipe.value("report").get<std::string>());
    s.report = initial_report(recipe, s.last);

    auto runs = [&](Phase p) { return p <= s.last || p == Phase::Check; };
    int phases_run = 0;
    for (Phase p : kAllPhases) phases_run += runs(p);
    Progress progress(phases_run, options.progress);
    for (const auto& step : kSteps) {
        if (!runs(step.phase)) continue;
        // A run stopped before emit writes the model as it is then.
        if (step.phase == Phase::Check && s.last < Phase::Emit) s.quantized = s.model;
        progress.step(phase_name(step.phase));
        warn_unimplemented_defaults(recipe, step.phase);
        const auto start = std::chrono::steady_clock::now();
        step.run(s);
        s.report["phases"].push_back(phase_entry(step.phase, start));
        log_debug("phase {} took {:.3f} s", phase_name(step.phase), s.report["phases"].back()["seconds"].get<double>());
    }
    progress.done();
    return {std::move(s.quantized),   std::move(s.parked), std::move(s.report), s.input, s.output,
            std::move(s.report_path), std::move(s.tables)};
}

// Writes the model, the dump a recipe asks for, and the report.
void save_run(const Recipe& recipe, const RunOptions& options, QuantizedRun& run) {
    const auto start = std::chrono::steady_clock::now();
    // Made before anything is written: a page that cannot be made leaves nothing half-written.
    const std::string html = recipe.value("report_html").get<bool>() ? html_report(run.report) : std::string();
    SaveOptions save = save_options(recipe, run.output);
    save.check = false;  // the check phase just ran
    store_externally_if_oversize(run.quantized, save, run.output, "use_external_data_format");
    save_model(run.quantized, run.output, save, run.input);
    if (const auto& dir = recipe.value("dump_output_dir"); !dir.is_null()) {
        DumpOptions dump;
        if (options.calibration_reader)
            dump.reader = options.calibration_reader;
        else if (const auto& data = recipe.value("calibration_data_reader"); !data.is_null())
            dump.data = data.get<std::string>();
        else
            dump.random_input_shapes = recipe.value("random_data_reader_input_shape");
        dump.dump_float = recipe.value("dump_float").get<bool>();
        dump.output_dir = dir.get<std::string>();
        const auto dumped = dump_model(run.output, dump);
        run.report["dump"] = {{"output_dir", dump.output_dir.string()},
                              {"quantized_tensors", dumped.quantized},
                              {"float_tensors", dumped.floats}};
    }
    run.report["phases"].push_back(phase_entry(Phase::Save, start));
    write_file_atomically(run.report_path, [&](std::ostream& out) { out << run.report.dump(2) << '\n'; });
    if (!html.empty())
        write_file_atomically(fs::path(run.report_path).replace_extension(".html"),
                              [&](std::ostream& out) { out << html; });
}

// Warns about every output below warn_output_sqnr_db, naming where the error
// starts; fails (nothing is written yet) below min_output_sqnr_db.
// The shipped accurate recipe for the run's target, as advice; empty when the
// run searches mixed precision already.
std::string accurate_recipe_advice(const Recipe& recipe, const nlohmann::json& report) {
    if (report.contains("mixed_precision")) return {};
    static const std::map<std::string, std::string> kAccurate = {{"cpu", "cpu_accurate.yaml"},
                                                                 {"npu_cnn", "cnn_npu_accurate.yaml"},
                                                                 {"npu_transformer", "transformer_npu_accurate.yaml"}};
    const auto it = kAccurate.find(recipe.value("target").get<std::string>());
    if (it == kAccurate.end()) return {};
    return fmt::format("the accurate recipe for this target ({}: more bits where 8 cost the output most), ", it->second);
}

// The tensors the run found holding channels on different scales, left on one grid.
std::string mixed_scales_named(const nlohmann::json& report) {
    std::vector<std::string> named;
    for (const auto& m : report.value("mixed_scale_tensors", nlohmann::json::array()))
        if (m["action"] == "named") named.push_back("'" + m["tensor"].get<std::string>() + "'");
    if (named.empty()) return {};
    const size_t shown = std::min<size_t>(named.size(), 4);
    return fmt::format("; {}{} {} channels on scales far apart (the report's mixed_scale_tensors)",
                       join({named.begin(), named.begin() + static_cast<std::ptrdiff_t>(shown)}, ", "),
                       shown < named.size() ? fmt::format(" and {} more", named.size() - shown) : "",
                       named.size() == 1 ? "holds" : "hold");
}

void judge_outputs(const Recipe& recipe, const nlohmann::json& report) {
    if (!report.contains("evaluation")) return;
    const auto& evaluation = report["evaluation"];
    const double warn_db = recipe.value("warn_output_sqnr_db").get<double>();
    const auto& floor = recipe.value("min_output_sqnr_db");
    std::vector<std::string> failed;
    for (const auto& o : evaluation["outputs"]) {
        if (!o["sqnr_db"].is_number()) continue;  // "inf": exact
        const double db = o["sqnr_db"].get<double>();
        const auto name = o["name"].get<std::string>();
        if (db < warn_db) {
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
            log_warn(
                "output '{}' is far from the float model's: SQNR {:.2f} dB (warn_output_sqnr_db {}), cosine "
                "{:.4f}; {}{}. To try: {}per_channel: true (depthwise convolutions need it), exclude that node "
                "(nodes_to_exclude) or give it 16 bits (an override setting activation_type: QInt16) where the "
                "target allows, include_cle, another calibrate_method, more "
                "calibration data; `vaiq explain RECIPE --model M` shows each node's settings",
                name, db, warn_db, o["cosine_similarity"].get<double>(), where, mixed_scales_named(report),
                accurate_recipe_advice(recipe, report));
        }
        if (!floor.is_null() && db < floor.get<double>()) failed.push_back(fmt::format("'{}' has {:.2f} dB", name, db));
    }
    if (!failed.empty())
        throw InputError(fmt::format("{}: min_output_sqnr_db {}: output {} on the evaluation data; nothing was written",
                                     recipe.setting("min_output_sqnr_db").origin, floor.get<double>(),
                                     join(failed, ", ")));
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
    if (evaluated && recipe.value("include_cle").get<bool>() && recipe.value("cle_guard").get<bool>() &&
        options.calibration_files.empty()) {
        Recipe plain = recipe;
        apply_setting(plain, "include_cle=false", {});
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
    judge_outputs(recipe, run.report);
    save_run(recipe, options, run);
    return {run.output, run.report_path, run.report};
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
    return quantize(analyzed, registry, options, /*writes=*/false).report;
}

std::string explain(const Recipe& recipe, const ResolvedPlugins& plugins, const PluginRegistry& registry,
                    const Model* model) {
    std::string out;
    Lines line{out};
    std::vector<std::string> files;
    for (const auto& f : recipe.files) files.push_back(f.string());
    line("recipe: {}", join(files, " extends "));
    for (const auto* choice : {&plugins.target, &plugins.format, &plugins.calibrator}) {
        line("{:<11} {} {}  ({})", std::string(kind_name(choice->info->kind)) + ":", choice->info->name,
             choice->info->version, choice->info->library.filename().string());
        const std::string kind(kind_name(choice->info->kind));
        for (const auto& [name, value] : choice->options.values()) {
            // Where the value comes from: extra_options, plugin_options, or the plugin's default.
            auto extra = recipe.settings.find("extra_options." + name);
            std::string origin = recipe.plugin_option_origin(kind, name);
            if (is_extra_option_name(name) && extra != recipe.settings.end()) origin = extra->second.origin;
            line("    {:<41} {:<28} {}", name, value.dump(), origin.empty() ? "default" : origin);
        }
    }
    for (const auto& pass : plugins.passes) {
        line("pass:       {} {}", pass.info->name, pass.info->version);
        for (const auto& [name, value] : pass.options.values()) line("    {}: {}", name, value.dump());
    }
    std::vector<const PluginChoice*> algorithms;
    for (const auto& a : plugins.algorithms) algorithms.push_back(&a);
    if (plugins.next_lever) algorithms.push_back(&*plugins.next_lever);
    for (const auto* algorithm : algorithms) {
        line("algorithm:  {} {}  ({}){}", algorithm->info->name, algorithm->info->version,
             algorithm->info->library.filename().string(),
             algorithm == algorithms.back() && plugins.next_lever ? ", if mixed precision misses its target" : "");
        for (const auto& [name, value] : algorithm->options.values()) {
            auto extra = recipe.settings.find("extra_options." + name);
            const bool set = is_extra_option_name(name) && extra != recipe.settings.end();
            line("    {:<41} {:<28} {}", name, value.dump(), set ? extra->second.origin : "");
        }
    }
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

    auto target = registry.create<Target>(plugins.target.info->name, plugins.target.options);
    const auto decisions = decide_nodes(recipe, *model, *target);
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
    const auto kept = recipe.value("float_fragile_inputs").get<bool>() ? fragile_inputs(*model)
                                                                         : std::vector<FragileInput>{};
    if (!kept.empty()) {
        line("");
        line("tensors left float (float_fragile_inputs):");
        for (const auto& k : kept) line("  {:<32} {}", k.tensor, k.reason);
    }
    return out;
}

}  // namespace vaiq
