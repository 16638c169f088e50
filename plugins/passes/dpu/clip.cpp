// Clip rewrites. ConvertClipToRelu turns only the Clips a Relu computes
// exactly (min 0, no max); the anchors also drop a finite max, which changes
// the function, so Clip(0, 6) stays unless ReplaceClip6Relu asks for that.
#include <limits>

#include "passes.hpp"
#include "rewrite.hpp"

namespace dpu_passes {

namespace {

// Rewrites every Clip whose bounds satisfy `wanted` into a Relu.
template <typename Wanted>
bool clips_to_relu(vaiq::Model& model, const char* pass, Wanted&& wanted) {
    auto& graph = model.graph();
    const vaiq::GraphIndex index(graph);
    int changed = 0;
    for (auto& node : *graph.mutable_node()) {
        if (node.op_type() != "Clip" || !is_default_domain(node)) continue;
        const auto bounds = vaiq::dpu::clip_bounds(node, index);
        if (!bounds || !wanted(bounds->first, bounds->second)) continue;
        const std::string x = node.input(0);
        node.set_op_type("Relu");
        node.clear_input();
        node.add_input(x);
        node.clear_attribute();
        ++changed;
    }
    if (changed) {
        vaiq::remove_unused_initializers(graph);
        vaiq::log_debug("{}: {} Clip nodes now Relu", pass, changed);
    }
    return changed > 0;
}

}  // namespace

bool convert_clip_to_relu(vaiq::Model& model) {
    return clips_to_relu(model, "convert_clip_to_relu", [](float lo, float hi) {
        return lo == 0.0f && hi >= std::numeric_limits<float>::max();
    });
}

bool replace_clip6_relu(vaiq::Model& model) {
    return clips_to_relu(model, "replace_clip6_relu", [](float lo, float hi) { return lo == 0.0f && hi == 6.0f; });
}

}  // namespace dpu_passes
