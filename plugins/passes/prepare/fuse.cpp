// Fusions that help quantization: a spelled-out LayerNorm or Gelu becomes one
// op, so its intermediate tensors (means, variances, erf) are never quantized;
// a spelled-out HardSwish becomes x * HardSigmoid(x). The LayerNorm and Gelu
// patterns are the SDK's (vaiq/patterns.hpp).
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

namespace {

// A scalar float constant equal to `value` (within float rounding).
bool is_scalar(const vaiq::GraphIndex& index, const std::string& name, float value) {
    const auto v = scalar_constant(index, name);
    return v && std::abs(*v - value) <= 1e-6f * std::abs(value);
}

// The node producing `tensor` when it is a default-domain `op` whose output
// only `reader` reads; -1 else.
int private_producer(const onnx::GraphProto& graph, const vaiq::GraphIndex& index, const std::string& tensor,
                     std::string_view op) {
    const int n = index.producer(tensor);
    if (n < 0 || graph.node(n).op_type() != op || !vaiq::is_default_domain(graph.node(n))) return -1;
    if (index.consumers(tensor).size() != 1 || index.is_graph_output(tensor)) return -1;
    return n;
}

// Of a binary node, the input that is not the constant `value`; "" when neither is.
std::string other_than(const vaiq::GraphIndex& index, const onnx::NodeProto& node, float value) {
    if (node.input_size() != 2) return "";
    if (is_scalar(index, node.input(1), value)) return node.input(0);
    if (is_scalar(index, node.input(0), value)) return node.input(1);
    return "";
}

}  // namespace

// x * Clip(x + 3, 0, 6) / 6 (or * 1/6), as PP-LCNet and MobileNetV3 exports
// spell HardSwish before opset 14, becomes x * HardSigmoid(x) (alpha 1/6, beta
// 1/2): two quantized tensors instead of four, none of them the product
// x * Clip(...), whose range is six times the result's and costs 8-bit
// activations two and a half bits. It is also the form the DPU computes.
bool fuse_hard_swish(vaiq::Model& model) {
    auto& graph = model.graph();
    const vaiq::GraphIndex index(graph);
    vaiq::UniqueNames names(graph);
    std::vector<int> removed;
    std::set<int> used;
    for (int d = 0; d < graph.node_size(); ++d) {
        const auto& div = graph.node(d);
        if (!vaiq::is_default_domain(div) || div.output_size() != 1) continue;
        const std::string product = div.op_type() == "Div" ? (is_scalar(index, div.input(1), 6.0f) ? div.input(0) : "")
                                    : div.op_type() == "Mul" ? other_than(index, div, 1.0f / 6.0f)
                                                             : "";
        if (product.empty()) continue;
        const int m = private_producer(graph, index, product, "Mul");
        if (m < 0 || graph.node(m).input_size() != 2) continue;
        for (int slot = 0; slot < 2; ++slot) {
            const auto& mul = graph.node(m);
            const int c = private_producer(graph, index, mul.input(slot), "Clip");
            if (c < 0) continue;
            const auto bounds = vaiq::clip_bounds(graph.node(c), index);
            if (!bounds || bounds->first != 0.0f || bounds->second != 6.0f) continue;
            const int a = private_producer(graph, index, graph.node(c).input(0), "Add");
            if (a < 0) continue;
            const auto x = other_than(index, graph.node(a), 3.0f);
            if (x.empty() || x != mul.input(1 - slot)) continue;
            if (used.count(d) || used.count(m) || used.count(c) || used.count(a)) break;
            used.insert({d, m, c, a});
            // The Clip becomes the HardSigmoid, the Mul reads it and writes the Div's output.
            const auto gate = names.fresh(graph.node(c).output(0) + "_hard_sigmoid");
            auto& hs = *graph.mutable_node(c);
            hs.set_op_type("HardSigmoid");
            hs.clear_input();
            hs.add_input(x);
            hs.clear_attribute();
            vaiq::set_attribute(hs, "alpha", 1.0f / 6.0f);
            vaiq::set_attribute(hs, "beta", 0.5f);
            hs.set_output(0, gate);
            auto& out = *graph.mutable_node(m);
            out.set_input(0, x);
            out.set_input(1, gate);
            out.set_output(0, graph.node(d).output(0));
            removed.insert(removed.end(), {a, d});
            break;
        }
    }
    if (removed.empty()) return false;
    std::sort(removed.begin(), removed.end());
    vaiq::remove_nodes(graph, removed);
    vaiq::remove_unused_initializers(graph);
    vaiq::log_debug("fuse_hard_swish: {} HardSwish patterns to x * HardSigmoid(x)", removed.size() / 2);
    return true;
}

}  // namespace prepare_passes
