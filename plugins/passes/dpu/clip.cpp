// Clip rewrites. ConvertClipToRelu turns only the Clips a Relu computes
// exactly (min 0, no max); the anchors also drop a finite max, which changes
// the function, so Clip(0, 6) stays unless ReplaceClip6Relu asks for that.
// ReplaceClip6Relu exists for Cross Layer Equalization, which scales through a
// Relu but not through a Clip: it turns the ReLU6 activations of weighted
// layers, and nothing else. A Clip(0, 6) elsewhere is part of a formula (the
// x * clip(x + 3, 0, 6) / 6 of a spelled-out HardSwish), and a Relu there
// makes the function grow without bound (to infinity in PP-LCNet backbones).
#include <limits>
#include <set>

#include "passes.hpp"
#include "rewrite.hpp"

namespace dpu_passes {

namespace {

// Rewrites every Clip whose bounds (and place) satisfy `wanted` into a Relu.
template <typename Wanted>
bool clips_to_relu(vaiq::Model& model, const char* pass, Wanted&& wanted) {
    auto& graph = model.graph();
    const vaiq::GraphIndex index(graph);
    int changed = 0;
    for (auto& node : *graph.mutable_node()) {
        if (node.op_type() != "Clip" || !is_default_domain(node)) continue;
        const auto bounds = vaiq::clip_bounds(node, index);
        if (!bounds || !wanted(bounds->first, bounds->second, node, index)) continue;
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
    return clips_to_relu(model, "convert_clip_to_relu", [](float lo, float hi, const auto&, const auto&) {
        return lo == 0.0f && hi >= std::numeric_limits<float>::max();
    });
}

bool replace_clip6_relu(vaiq::Model& model) {
    static const std::set<std::string, std::less<>> kLayers = {"Conv", "ConvTranspose", "Gemm", "MatMul",
                                                               "BatchNormalization"};
    const auto& graph = model.graph();
    return clips_to_relu(model, "replace_clip6_relu",
                         [&](float lo, float hi, const onnx::NodeProto& clip, const vaiq::GraphIndex& index) {
                             const int producer = index.producer(clip.input(0));
                             return lo == 0.0f && hi == 6.0f && producer >= 0 &&
                                    kLayers.count(graph.node(producer).op_type()) > 0 &&
                                    is_default_domain(graph.node(producer));
                         });
}

}  // namespace dpu_passes
