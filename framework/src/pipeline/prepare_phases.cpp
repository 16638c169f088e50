// The phases before calibration: setup (plugins), load, prepare (passes, Prepare-stage algorithms) and plan.
#include "pipeline/run_state.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>

#include "data/data_reader.hpp"
#include "data/statistics_file.hpp"
#include "pipeline/algorithm_context.hpp"
#include "pipeline/calibration.hpp"
#include "pipeline/channel_ranges.hpp"
#include "pipeline/fragile_inputs.hpp"
#include "pipeline/joined_reference.hpp"
#include "pipeline/mixed_scale.hpp"
#include "pipeline/planner.hpp"
#include "pipeline/preprocess.hpp"
#include "pipeline/selection.hpp"
#include "recipe/defaults.hpp"
#include "report/diagnosis.hpp"
#include "report/dump.hpp"
#include "report/evaluation.hpp"
#include "report/html_report.hpp"
#include "report/sensitivity.hpp"
#include "sdk/atomic_file.hpp"
#include "sdk/npy.hpp"
#include "sdk/text.hpp"
#include "util/model_size.hpp"
#include "util/progress.hpp"
#include "util/spool.hpp"
#include "vaiq/error.hpp"
#include "vaiq/log.hpp"

namespace fs = std::filesystem;

namespace vaiq::phases {

void setup_phase(RunState& s) {
    s.plugins = resolve_plugins(s.recipe, s.registry);
    s.target = s.registry.create<Target>(s.plugins.target.info->name, s.plugins.target.options);
    for (const auto& a : s.plugins.algorithms)  // their options are checked before any work
        s.algorithms.push_back(s.registry.create<Algorithm>(a.info->name, a.options));
    s.run = s.settings.request;
    s.run.power_of_two = s.calibrators.get(s.plugins.calibrator.info->name).scale_form() == ScaleForm::PowerOfTwo;
    s.target->check(s.run);
    s.report["plugins"] = nlohmann::json::array();
    auto add = [&](const PluginChoice& choice) -> nlohmann::json& {
        return s.report["plugins"].emplace_back(nlohmann::json{{"kind", kind_name(choice.info->kind)},
                                                               {"name", choice.info->name},
                                                               {"version", choice.info->version},
                                                               {"library", choice.info->library.string()}});
    };
    for (const auto* choice : {&s.plugins.target, &s.plugins.format, &s.plugins.calibrator}) add(*choice);
    // When each algorithm works (advice reads it: a run that chooses precisions).
    for (size_t a = 0; a < s.algorithms.size(); ++a)
        add(s.plugins.algorithms[a])["stage"] = algorithm_stage_name(s.algorithms[a]->stage());
    for (const auto& a : s.plugins.tried) add(a);
}

void load_phase(RunState& s) {
    nlohmann::json converted;
    s.model = load_model_to_quantize(s.input, s.registry, &converted);
    if (!converted.is_null()) s.report["opset_converted"] = converted;
    s.report["model"] = {{"input", s.input.string()},
                         {"output", s.output.string()},
                         {"opset", s.model.opset()},
                         {"nodes", s.model.graph().node_size()}};
}

// The documented preparation steps, then the target's transforms, CLE and the recipe's passes.
void prepare_phase(RunState& s) {
    const auto inputs_before = input_signature(s.model);
    // Per-channel weights need DequantizeLinear's axis (opset 13): older models are upgraded, as asked.
    constexpr int64_t kPerChannelOpset = 13;
    if (s.settings.per_channel && s.model.opset() < kPerChannelOpset) {
        const int64_t from = s.model.opset();
        s.model = convert_opset_with_shapes(s.model, kPerChannelOpset, s.registry);
        s.report["opset_converted"] = {{"from", from}, {"to", kPerChannelOpset}, {"why", "per_channel"}};
        log_info("per_channel: the model was converted from opset {} to {} (DequantizeLinear's axis)", from,
                 kPerChannelOpset);
    }
    if (s.settings.remove_input_init) {
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
    if (s.plugins.equalization) passes.push_back(*s.plugins.equalization);
    passes.insert(passes.end(), s.plugins.passes.begin(), s.plugins.passes.end());
    // Data-aware passes measure the model as it stands when they run, through a reader of its own
    // (an earlier pass may have changed the inputs the run's reader was opened for).
    const ChannelMeasurer measure = [&s](const Model& model, const std::vector<ChannelRangeRequest>& wanted) {
        const auto reader = calibration_reader(s.settings, s.options, model);
        return measure_channel_ranges(model, *reader, wanted, s.threads);
    };
    s.function_kept = run_passes(passes, s.registry, s.model, s.report["passes"], measure);
    run_algorithms(s, AlgorithmStage::Prepare);
    s.inputs_changed = input_signature(s.model) != inputs_before;
}

void plan_phase(RunState& s) {
    const auto decisions = decide_nodes(s.recipe, s.model, *s.target);
    s.draft = plan_tensors(s.settings, s.model, *s.target, decisions, s.calibrators);
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
    if (s.draft.tensors.empty()) {
        const bool bodies =
            std::any_of(s.model.graph().node().begin(), s.model.graph().node().end(), [](const onnx::NodeProto& n) {
                return n.op_type() == "If" || n.op_type() == "Loop" || n.op_type() == "Scan";
            });
        if (!bodies)
            log_warn("the recipe selects nothing to quantize in this model");
        else if (s.settings.enable_subgraph)
            log_info(
                "nothing to quantize outside the model's If, Loop and Scan bodies, which EnableSubgraph "
                "quantizes next");
        else
            log_warn(
                "the recipe selects nothing to quantize outside the model's If, Loop and Scan bodies: "
                "extra_options.EnableSubgraph: true quantizes them");
    }
}

}  // namespace vaiq::phases
