// The plan phase: the nodes the recipe quantizes, the tensors planned for them,
// and the algorithms of the Plan stage.
#include <algorithm>

#include "pipeline/run_state.hpp"
#include "pipeline/selection.hpp"
#include "vaiq/error.hpp"
#include "vaiq/log.hpp"

namespace vaiq::phases {

bool data_decides_plan(const RunSetup& s) {
    return s.last >= Phase::Calibrate && s.options.calibration_files.empty() && !s.keep_tables &&
           (has_calibration_data(s.settings, s.options) || s.settings.given_params.empty());
}

void offer_draft_services(RunState& s, AlgorithmInputs& inputs) {
    auto& draft = s.planning.draft;
    inputs.draft = [&draft] {
        Draft out;
        for (const auto& t : draft.tensors)
            out.tensors.push_back(
                {t.tensor, t.role, t.spec, t.constant, t.observed() && t.share_with.empty() && t.range_from.empty()});
        out.kept_float = draft.kept_float;
        return out;
    };
    inputs.keep_float = [&draft](const std::string& tensor, const std::string& reason, bool sharers_on_own_range) {
        keep_float(draft, tensor, reason, sharers_on_own_range);
    };
    inputs.set_per_channel = [&s, &draft](const std::string& tensor, int axis) {
        const auto it = draft.index.find(tensor);
        if (it == draft.index.end() || draft.tensors[it->second].role != TensorRole::Weight) return false;
        constexpr int64_t kPerChannelOpset = 13;  // DequantizeLinear's axis
        if (s.floats.model.opset() < kPerChannelOpset) return false;
        QuantRequest request = s.setup.run;
        request.per_channel = true;
        try {
            s.setup.target->check(request);
        } catch (const InputError&) {
            return false;
        }
        auto& spec = draft.tensors[it->second].spec;
        spec.per_channel = true;
        spec.axis = axis;
        return true;
    };
    inputs.mark_mixed_scales = [&s](const std::string& tensor) { s.planning.mixed_scales.push_back(tensor); };
}

void plan_phase(RunState& state) {
    auto& s = state.setup;
    const auto& model = state.floats.model;
    auto& draft = state.planning.draft;
    auto& report = state.report;
    const auto decisions = decide_nodes(s.recipe, model, *s.target);
    draft = plan_tensors(s.settings, model, *s.target, decisions, s.calibrators);
    run_algorithms(state, AlgorithmStage::Plan);
    int selected = 0;
    for (const auto& d : decisions) selected += d.quantized;
    report["plan"] = {{"nodes", decisions.size()},
                      {"nodes_selected", selected},
                      {"tensors", draft.tensors.size()},
                      {"skipped", nlohmann::json::array()}};
    for (const auto& [node, why] : draft.skipped)
        report["plan"]["skipped"].push_back({{"node", node}, {"reason", why}});
    auto& kept = report["plan"]["kept_float"] = nlohmann::json::array();
    for (const auto& [tensor, why] : draft.kept_float) kept.push_back({{"tensor", tensor}, {"reason", why}});
    report["plan"]["mixed_scales"] = state.planning.mixed_scales;
    if (draft.tensors.empty()) {
        const bool bodies =
            std::any_of(model.graph().node().begin(), model.graph().node().end(), [](const onnx::NodeProto& n) {
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
