// Fusions that help quantization: a spelled-out LayerNorm or Gelu becomes one
// op, so its intermediate tensors (means, variances, erf) are never quantized.
// The patterns themselves are the SDK's (vaiq/patterns.hpp).
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

}  // namespace prepare_passes
