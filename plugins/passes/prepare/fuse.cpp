// Fusions that help quantization: a spelled-out LayerNorm or Gelu becomes one
// op, so its intermediate tensors (means, variances, erf) are never quantized;
// a spelled-out HardSwish becomes x * HardSigmoid(x). The patterns are the
// SDK's (vaiq/patterns.hpp).
#include <cmath>

#include "passes.hpp"

namespace prepare_passes {

namespace {

// Each match's nodes give way to its fused node, named after the node it replaces.
void apply(onnx::GraphProto& graph, std::vector<vaiq::PatternMatch>& matches, const std::string& suffix) {
    vaiq::UniqueNames names(graph);
    std::vector<int> removed;
    for (auto& match : matches) {
        const auto& last = graph.node(match.last);
        match.fused.set_name(names.fresh(last.name().empty() ? suffix : last.name() + "_" + suffix));
        removed.insert(removed.end(), match.nodes.begin(), match.nodes.end());
        *graph.add_node() = std::move(match.fused);
    }
    std::sort(removed.begin(), removed.end());
    removed.erase(std::unique(removed.begin(), removed.end()), removed.end());
    vaiq::remove_nodes(graph, removed);
    vaiq::remove_unused_initializers(graph);
    vaiq::sort_nodes(graph);
}

}  // namespace

bool fuse_layer_norm(vaiq::Model& model) {
    if (model.opset() < 17) return false;  // LayerNormalization is an opset-17 op
    auto& graph = model.graph();
    auto found = vaiq::find_layer_norms(graph);
    // LayerNormalization needs a scale: ones over the last axis, when its size is known.
    std::vector<vaiq::PatternMatch> usable;
    std::optional<std::map<std::string, std::vector<int64_t>>> shapes;
    vaiq::UniqueNames names(graph);
    for (auto& match : found) {
        if (match.fused.input_size() == 1) {
            if (!shapes) shapes = vaiq::infer_shapes(model);
            const auto it = shapes->find(match.fused.input(0));
            if (it == shapes->end() || it->second.empty() || it->second.back() <= 0) continue;
            const auto ones = names.fresh(match.fused.input(0) + "_layer_norm_ones");
            *graph.add_initializer() =
                vaiq::Tensor::from_values<float>({it->second.back()}, std::vector<float>(it->second.back(), 1.0f))
                    .to_proto(ones);
            match.fused.add_input(ones);
        }
        usable.push_back(std::move(match));
    }
    if (usable.empty()) return false;
    vaiq::log_debug("fuse_layer_norm: {} LayerNormalization nodes", usable.size());
    apply(graph, usable, "layer_norm");
    return true;
}

bool fuse_gelu(vaiq::Model& model) {
    auto& graph = model.graph();
    auto found = vaiq::find_gelus(graph);
    if (found.empty()) return false;
    vaiq::import_opset(model.proto(), "com.microsoft", 1);
    vaiq::log_debug("fuse_gelu: {} Gelu nodes", found.size());
    apply(graph, found, "gelu");
    return true;
}

// x * Clip(x + 3, 0, 6) / 6 (or * 1/6), as PP-LCNet and MobileNetV3 exports
// spell HardSwish before opset 14, becomes x * HardSigmoid(x) (alpha 1/6, beta
// 1/2): two quantized tensors instead of four, none of them the product
// x * Clip(...), whose range is six times the result's and costs 8-bit
// activations two and a half bits. It is also the form the DPU computes.
bool fuse_hard_swish(vaiq::Model& model) {
    auto& graph = model.graph();
    const auto found = vaiq::find_hard_swishes(graph);
    if (found.empty()) return false;
    vaiq::UniqueNames names(graph);
    std::vector<int> removed;
    for (const auto& match : found) {
        const int product = match.nodes[0], clip = match.nodes[1], add = match.nodes[2];
        const std::string x = match.fused.input(0);
        // The Clip becomes the HardSigmoid, the Mul reads it and writes the pattern's output.
        const auto gate = names.fresh(graph.node(clip).output(0) + "_hard_sigmoid");
        auto& hs = *graph.mutable_node(clip);
        hs.set_op_type("HardSigmoid");
        hs.clear_input();
        hs.add_input(x);
        hs.clear_attribute();
        vaiq::set_attribute(hs, "alpha", 1.0f / 6.0f);
        vaiq::set_attribute(hs, "beta", 0.5f);
        hs.set_output(0, gate);
        auto& out = *graph.mutable_node(product);
        out.set_input(0, x);
        out.set_input(1, gate);
        out.set_output(0, match.fused.output(0));
        removed.insert(removed.end(), {add, match.last});
    }
    vaiq::remove_nodes(graph, removed);
    vaiq::remove_unused_initializers(graph);
    vaiq::log_debug("fuse_hard_swish: {} HardSwish patterns to x * HardSigmoid(x)", found.size());
    return true;
}

}  // namespace prepare_passes
