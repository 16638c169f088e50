// The phases before planning: setup (the plugins), load, and prepare (passes,
// then the algorithms of the Prepare stage).
#include <fmt/format.h>

#include "pipeline/channel_ranges.hpp"
#include "pipeline/preprocess.hpp"
#include "pipeline/run_state.hpp"
#include "recipe/defaults.hpp"
#include "vaiq/log.hpp"

namespace vaiq::phases {

void setup_phase(RunSetup& s, nlohmann::json& report) {
    s.plugins = resolve_plugins(s.recipe, s.registry);
    s.target = s.registry.create<Target>(s.plugins.target.info->name, s.plugins.target.options);
    for (const auto& a : s.plugins.algorithms)  // their options are checked before any work
        s.algorithms.push_back(s.registry.create<Algorithm>(a.info->name, a.options));
    for (const auto& r : s.plugins.readers)
        s.readers.add(r.info->name, s.registry.create<Reader>(r.info->name, r.options));
    for (const auto& r : s.plugins.reports)
        s.reports.push_back(s.registry.create<ReportWriter>(r.info->name, r.options));
    s.run = s.settings.request;
    s.run.power_of_two = s.calibrators.get(s.plugins.calibrator.info->name).scale_form() == ScaleForm::PowerOfTwo;
    s.target->check(s.run);
    report["plugins"] = nlohmann::json::array();
    auto add = [&](const PluginChoice& choice) -> nlohmann::json& {
        return report["plugins"].emplace_back(nlohmann::json{{"kind", kind_name(choice.info->kind)},
                                                             {"name", choice.info->name},
                                                             {"version", choice.info->version},
                                                             {"library", choice.info->library.string()}});
    };
    for (const auto* choice : {&s.plugins.target, &s.plugins.format, &s.plugins.calibrator}) add(*choice);
    // When each algorithm works (advice reads it: a run that chooses precisions).
    for (size_t a = 0; a < s.algorithms.size(); ++a)
        add(s.plugins.algorithms[a])["stage"] = algorithm_stage_name(s.algorithms[a]->stage());
    for (const auto& a : s.plugins.tried) add(a);
    for (const auto& r : s.plugins.reports) add(r);
}

void load_phase(const RunSetup& setup, FloatModel& floats, nlohmann::json& report) {
    nlohmann::json converted;
    floats.model = load_model_to_quantize(setup.input, setup.registry, &converted);
    if (!converted.is_null()) report["opset_converted"] = converted;
    report["model"] = {{"input", setup.input.string()},
                       {"output", setup.output.string()},
                       {"opset", floats.model.opset()},
                       {"nodes", floats.model.graph().node_size()}};
}

namespace {

// The documented preparation steps, then the target's transforms, CLE and the recipe's passes.
void run_preparation(const RunSetup& setup, FloatModel& floats, nlohmann::json& report) {
    Model& model = floats.model;
    // Per-channel weights need DequantizeLinear's axis (opset 13): older models are upgraded, as asked.
    constexpr int64_t kPerChannelOpset = 13;
    if (setup.settings.per_channel && model.opset() < kPerChannelOpset) {
        const int64_t from = model.opset();
        model = convert_opset_with_shapes(model, kPerChannelOpset, setup.registry);
        report["opset_converted"] = {{"from", from}, {"to", kPerChannelOpset}, {"why", "per_channel"}};
        log_info("per_channel: the model was converted from opset {} to {} (DequantizeLinear's axis)", from,
                 kPerChannelOpset);
    }
    if (setup.settings.remove_input_init) {
        const int removed = remove_initializer_inputs(model);
        if (removed > 0) log_info("RemoveInputInit: {} initializers are no longer graph inputs", removed);
        report["removed_initializer_inputs"] = removed;
    }
    std::vector<PluginChoice> passes;
    const std::string origin = "a transform the recipe or target asks for";
    for (const auto& p : defaults::preparation_passes(setup.recipe))
        passes.push_back(pass_choice(setup.registry, p.name, p.options, origin));
    for (const auto& name : setup.target->legalization_passes(setup.run))
        passes.push_back(pass_choice(setup.registry, name, nullptr, origin));
    if (setup.plugins.equalization) passes.push_back(*setup.plugins.equalization);
    passes.insert(passes.end(), setup.plugins.passes.begin(), setup.plugins.passes.end());
    // Data-aware passes measure the model as it stands when they run, through a reader of its own
    // (an earlier pass may have changed the inputs the run's reader was opened for).
    const ChannelMeasurer measure = [&setup](const Model& m, const std::vector<ChannelRangeRequest>& wanted) {
        const auto reader = calibration_reader(setup, m);
        return measure_channel_ranges(m, *reader, wanted, setup.threads);
    };
    floats.function_kept = run_passes(passes, setup.registry, model, report["passes"], measure);
}

}  // namespace

void prepare_phase(RunState& s) {
    const auto inputs_before = input_signature(s.floats.model);
    run_preparation(s.setup, s.floats, s.report);
    run_algorithms(s, AlgorithmStage::Prepare);
    s.floats.inputs_changed = input_signature(s.floats.model) != inputs_before;
}

}  // namespace vaiq::phases
