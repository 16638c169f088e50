// Fusions that help quantization: a spelled-out LayerNorm or Gelu becomes one
// op, so its intermediate tensors (means, variances, erf) are never quantized.
#include <cmath>

#include "passes.hpp"

namespace prepare_passes {

namespace {

// Matches a graph backwards from one node: each step names the op a tensor
// must come from, and remembers the nodes matched.
class Matcher {
  public:
    Matcher(const onnx::GraphProto& graph, const vaiq::GraphIndex& index) : graph_(graph), index_(index) {}

    // The node producing `tensor` if it is `op` and read only by the matched
    // pattern (`readers` nodes), else nullptr.
    const onnx::NodeProto* from(const std::string& tensor, std::string_view op, size_t readers = 1) {
        const int p = index_.producer(tensor);
        if (p < 0) return nullptr;
        const auto& node = graph_.node(p);
        if (node.op_type() != op || !(node.domain().empty() || node.domain() == "ai.onnx")) return nullptr;
        if (index_.consumers(tensor).size() != readers || index_.is_graph_output(tensor)) return nullptr;
        matched_.push_back(p);
        return &node;
    }

    // The only node reading `tensor`, if it is `op`.
    const onnx::NodeProto* only_reader(const std::string& tensor, std::string_view op) {
        const auto& uses = index_.consumers(tensor);
        if (uses.size() != 1 || index_.is_graph_output(tensor)) return nullptr;
        const auto& node = graph_.node(uses[0].node);
        if (node.op_type() != op) return nullptr;
        matched_.push_back(uses[0].node);
        return &node;
    }

    // A constant float scalar (any shape with one element).
    std::optional<float> scalar(const std::string& tensor) const {
        const auto t = vaiq::constant_tensor(index_, tensor);
        if (!t || t->type() != vaiq::DataType::Float || t->size() != 1) return std::nullopt;
        return t->data<float>()[0];
    }

    // The input of a binary node that is not `known`, or "" when neither or both are.
    static std::string other_input(const onnx::NodeProto& node, const std::string& known) {
        if (node.input_size() != 2) return {};
        if (node.input(0) == known && node.input(1) != known) return node.input(1);
        if (node.input(1) == known && node.input(0) != known) return node.input(0);
        return {};
    }

    const std::vector<int>& matched() const { return matched_; }

  private:
    const onnx::GraphProto& graph_;
    const vaiq::GraphIndex& index_;
    std::vector<int> matched_;
};

bool near(std::optional<float> v, double want) { return v && std::abs(*v - want) <= 1e-4 * std::abs(want); }

// ReduceMean over the last axis only, keeping it.
bool mean_over_last_axis(const onnx::NodeProto& node, const vaiq::GraphIndex& index) {
    if (vaiq::int_attribute(node, "keepdims", 1) != 1) return false;
    auto axes = vaiq::ints_attribute(node, "axes");
    if (!axes && node.input_size() > 1) {
        const auto t = vaiq::constant_tensor(index, node.input(1));
        if (t && t->type() == vaiq::DataType::Int64) axes.emplace(t->data<int64_t>().begin(), t->data<int64_t>().end());
    }
    return axes && *axes == std::vector<int64_t>{-1};
}

struct Fusion {
    std::vector<int> removed;
    onnx::NodeProto node;
};

void apply(onnx::GraphProto& graph, std::vector<Fusion>& fusions) {
    std::vector<int> removed;
    for (auto& f : fusions) {
        removed.insert(removed.end(), f.removed.begin(), f.removed.end());
        *graph.add_node() = std::move(f.node);
    }
    std::sort(removed.begin(), removed.end());
    removed.erase(std::unique(removed.begin(), removed.end()), removed.end());
    vaiq::remove_nodes(graph, removed);
    vaiq::remove_unused_initializers(graph);
    vaiq::sort_nodes(graph);
}

// A pattern's nodes may not overlap an earlier match.
bool overlaps(const std::vector<Fusion>& found, const std::vector<int>& nodes) {
    for (const auto& f : found)
        for (int n : nodes)
            if (std::find(f.removed.begin(), f.removed.end(), n) != f.removed.end()) return true;
    return false;
}

}  // namespace

// (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) [* gamma] [+ beta] over the last axis.
bool fuse_layer_norm(vaiq::Model& model) {
    if (model.opset() < 17) return false;  // LayerNormalization is an opset-17 op
    auto& graph = model.graph();
    const vaiq::GraphIndex index(graph);
    vaiq::UniqueNames names(graph);
    std::vector<Fusion> found;
    for (int n = 0; n < graph.node_size(); ++n) {
        const auto& div = graph.node(n);
        if (div.op_type() != "Div" || div.input_size() != 2) continue;
        Matcher m(graph, index);
        const auto* sub = m.from(div.input(0), "Sub", 2);
        const auto* sqrt = m.from(div.input(1), "Sqrt");
        if (!sub || !sqrt) continue;
        const auto* mean = m.from(sub->input(1), "ReduceMean");
        const auto* add_eps = m.from(sqrt->input(0), "Add");
        if (!mean || !add_eps || mean->input(0) != sub->input(0) || !mean_over_last_axis(*mean, index)) continue;
        const auto* variance = m.from(add_eps->input(0), "ReduceMean");
        const auto eps = m.scalar(add_eps->input(1));
        if (!variance || !eps || !mean_over_last_axis(*variance, index)) continue;
        const auto* square = m.from(variance->input(0), "Pow");
        if (!square || square->input(0) != sub->output(0) || !near(m.scalar(square->input(1)), 2.0)) continue;
        // The Pow and the Div are the Sub's two readers.
        std::string out = div.output(0), scale, bias;
        std::vector<int> nodes = m.matched();
        nodes.push_back(n);
        if (const auto* mul = m.only_reader(out, "Mul")) {
            const auto gamma = Matcher::other_input(*mul, out);
            if (vaiq::constant_tensor(index, gamma)) {
                scale = gamma;
                out = mul->output(0);
                nodes.push_back(m.matched().back());
                if (const auto* add = m.only_reader(out, "Add")) {
                    const auto beta = Matcher::other_input(*add, out);
                    if (vaiq::constant_tensor(index, beta)) {
                        bias = beta;
                        out = add->output(0);
                        nodes.push_back(m.matched().back());
                    }
                }
            }
        }
        if (overlaps(found, nodes)) continue;
        if (scale.empty()) {
            // LayerNormalization needs a scale: ones over the last axis, when its size is known.
            const auto shapes = vaiq::infer_shapes(model);
            const auto it = shapes.find(sub->input(0));
            if (it == shapes.end() || it->second.empty() || it->second.back() <= 0) continue;
            scale = names.fresh(div.name() + "_ones");
            *graph.add_initializer() =
                vaiq::Tensor::from_values<float>({it->second.back()}, std::vector<float>(it->second.back(), 1.0f))
                    .to_proto(scale);
        }
        Fusion f{nodes, {}};
        f.node.set_op_type("LayerNormalization");
        f.node.set_name(names.fresh(div.name().empty() ? std::string("LayerNorm") : div.name() + "_layer_norm"));
        f.node.add_input(sub->input(0));
        f.node.add_input(scale);
        if (!bias.empty()) f.node.add_input(bias);
        f.node.add_output(out);
        auto* axis = f.node.add_attribute();
        axis->set_name("axis");
        axis->set_type(onnx::AttributeProto::INT);
        axis->set_i(-1);
        auto* epsilon = f.node.add_attribute();
        epsilon->set_name("epsilon");
        epsilon->set_type(onnx::AttributeProto::FLOAT);
        epsilon->set_f(*eps);
        found.push_back(std::move(f));
    }
    if (found.empty()) return false;
    vaiq::log_debug("fuse_layer_norm: {} LayerNormalization nodes", found.size());
    apply(graph, found);
    return true;
}

// x * 0.5 * (1 + erf(x / sqrt 2)) in any of the orders exporters write it, to
// ONNX Runtime's com.microsoft Gelu.
bool fuse_gelu(vaiq::Model& model) {
    auto& graph = model.graph();
    const vaiq::GraphIndex index(graph);
    vaiq::UniqueNames names(graph);
    std::vector<Fusion> found;
    for (int n = 0; n < graph.node_size(); ++n) {
        const auto& erf = graph.node(n);
        if (erf.op_type() != "Erf") continue;
        Matcher m(graph, index);
        std::string x;
        if (const auto* div = m.from(erf.input(0), "Div"); div && near(m.scalar(div->input(1)), std::sqrt(2.0)))
            x = div->input(0);
        else if (const auto* mul = m.from(erf.input(0), "Mul")) {
            for (int i = 0; i < 2; ++i)
                if (near(m.scalar(mul->input(1 - i)), std::sqrt(0.5))) x = mul->input(i);
        }
        if (x.empty()) continue;
        const auto* plus_one = m.only_reader(erf.output(0), "Add");
        if (!plus_one || !near(m.scalar(Matcher::other_input(*plus_one, erf.output(0))), 1.0)) continue;
        const auto* product = m.only_reader(plus_one->output(0), "Mul");
        if (!product) continue;
        const auto other = Matcher::other_input(*product, plus_one->output(0));
        std::string out;
        if (other == x) {  // (x * (1 + erf)) * 0.5
            const auto* half = m.only_reader(product->output(0), "Mul");
            if (half && near(m.scalar(Matcher::other_input(*half, product->output(0))), 0.5)) out = half->output(0);
        } else if (near(m.scalar(other), 0.5)) {  // x * ((1 + erf) * 0.5)
            const auto* times_x = m.only_reader(product->output(0), "Mul");
            if (times_x && Matcher::other_input(*times_x, product->output(0)) == x) out = times_x->output(0);
        } else if (const auto* half = m.from(other, "Mul")) {  // (x * 0.5) * (1 + erf)
            const auto factor = Matcher::other_input(*half, x);
            if (!factor.empty() && near(m.scalar(factor), 0.5)) out = product->output(0);
        }
        if (out.empty()) continue;
        std::vector<int> nodes = m.matched();
        nodes.push_back(n);
        if (overlaps(found, nodes)) continue;
        Fusion f{nodes, {}};
        f.node.set_op_type("Gelu");
        f.node.set_domain("com.microsoft");
        f.node.set_name(names.fresh(erf.name().empty() ? std::string("Gelu") : erf.name() + "_gelu"));
        f.node.add_input(x);
        f.node.add_output(out);
        found.push_back(std::move(f));
    }
    if (found.empty()) return false;
    bool imported = false;
    for (const auto& o : model.proto().opset_import()) imported |= o.domain() == "com.microsoft";
    if (!imported) {
        auto* o = model.proto().add_opset_import();
        o->set_domain("com.microsoft");
        o->set_version(1);
    }
    vaiq::log_debug("fuse_gelu: {} Gelu nodes", found.size());
    apply(graph, found);
    return true;
}

}  // namespace prepare_passes
