// The plan phase: the nodes the recipe quantizes, and the tensors planned for them.
#include <algorithm>

#include "pipeline/run_state.hpp"
#include "pipeline/selection.hpp"
#include "vaiq/log.hpp"

namespace vaiq::phases {

void plan_phase(RunSetup& s, const Model& model, DraftPlan& draft, nlohmann::json& report) {
    const auto decisions = decide_nodes(s.recipe, model, *s.target);
    draft = plan_tensors(s.settings, model, *s.target, decisions, s.calibrators);
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
