#include "vaiq/patterns.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include "vaiq/fold.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {

namespace {

// Matches a graph backwards from one node: each step names the op a tensor
// must come from, and remembers the nodes matched.
class Matcher {
  public:
    Matcher(const onnx::GraphProto& graph, const GraphIndex& index) : graph_(graph), index_(index) {}

    // The node producing `tensor` if it is `op` and read only by the matched
    // pattern (`readers` nodes), else nullptr.
    const onnx::NodeProto* from(const std::string& tensor, std::string_view op, size_t readers = 1) {
        const int p = index_.producer(tensor);
        if (p < 0) return nullptr;
        const auto& node = graph_.node(p);
        if (node.op_type() != op || !is_default_domain(node)) return nullptr;
        if (index_.consumers(tensor).size() != readers || index_.is_graph_output(tensor)) return nullptr;
        matched_.push_back(p);
        return &node;
    }

    // The only node reading `tensor`, if it is `op`.
    const onnx::NodeProto* only_reader(const std::string& tensor, std::string_view op) {
        const auto& uses = index_.consumers(tensor);
        if (uses.size() != 1 || index_.is_graph_output(tensor)) return nullptr;
        const auto& node = graph_.node(uses[0].node);
        if (node.op_type() != op || !is_default_domain(node)) return nullptr;
        matched_.push_back(uses[0].node);
        return &node;
    }

    bool is_constant(const std::string& tensor) const { return constant_value(graph_, index_, tensor).has_value(); }

    // A constant float scalar (any shape with one element).
    std::optional<float> scalar(const std::string& tensor) const {
        return float_scalar(constant_value(graph_, index_, tensor));
    }

    // The same, stored as an initializer (not a Constant node's).
    std::optional<float> stored_scalar(const std::string& tensor) const {
        return float_scalar(constant_tensor(index_, tensor));
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
    static std::optional<float> float_scalar(const std::optional<Tensor>& t) {
        if (!t || t->type() != DataType::Float || t->size() != 1) return std::nullopt;
        return t->data<float>()[0];
    }

    const onnx::GraphProto& graph_;
    const GraphIndex& index_;
    std::vector<int> matched_;
};

bool near(std::optional<float> v, double want) { return v && std::abs(*v - want) <= 1e-4 * std::abs(want); }

// Equal to `want` within float rounding.
bool equal(std::optional<float> v, float want) { return v && std::abs(*v - want) <= 1e-6f * std::abs(want); }

// ReduceMean over the last axis only, keeping it.
bool mean_over_last_axis(const onnx::NodeProto& node, const onnx::GraphProto& graph, const GraphIndex& index) {
    if (int_attribute(node, "keepdims", 1) != 1) return false;
    auto axes = ints_attribute(node, "axes");
    if (!axes && node.input_size() > 1) {
        const auto t = constant_value(graph, index, node.input(1));  // opset 18: axes as an input
        if (t && t->type() == DataType::Int64) axes.emplace(t->data<int64_t>().begin(), t->data<int64_t>().end());
    }
    return axes && *axes == std::vector<int64_t>{-1};
}

// A pattern's nodes may not overlap an earlier match.
bool overlaps(const std::vector<PatternMatch>& found, const std::vector<int>& nodes) {
    for (const auto& f : found)
        for (int n : nodes)
            if (std::find(f.nodes.begin(), f.nodes.end(), n) != f.nodes.end()) return true;
    return false;
}

}  // namespace

std::vector<PatternMatch> find_layer_norms(const onnx::GraphProto& graph) {
    const GraphIndex index(graph);
    std::vector<PatternMatch> found;
    for (int n = 0; n < graph.node_size(); ++n) {
        const auto& div = graph.node(n);
        if (div.op_type() != "Div" || !is_default_domain(div) || div.input_size() != 2) continue;
        Matcher m(graph, index);
        const auto* sub = m.from(div.input(0), "Sub", 2);
        const auto* sqrt = m.from(div.input(1), "Sqrt");
        if (!sub || !sqrt) continue;
        const auto* mean = m.from(sub->input(1), "ReduceMean");
        const auto* add_eps = m.from(sqrt->input(0), "Add");
        if (!mean || !add_eps || mean->input(0) != sub->input(0) || !mean_over_last_axis(*mean, graph, index)) continue;
        const auto* variance = m.from(add_eps->input(0), "ReduceMean");
        const auto eps = m.scalar(add_eps->input(1));
        if (!variance || !eps || !mean_over_last_axis(*variance, graph, index)) continue;
        const auto* square = m.from(variance->input(0), "Pow");
        if (!square || square->input(0) != sub->output(0) || !near(m.scalar(square->input(1)), 2.0)) continue;
        // The Pow and the Div are the Sub's two readers.
        std::string out = div.output(0), scale, bias;
        PatternMatch match{m.matched(), n, {}};
        match.nodes.push_back(n);
        // Then optionally * gamma, and then + beta, each a constant.
        auto extend = [&](std::string_view op, std::string& constant) {
            const auto* next = m.only_reader(out, op);
            if (!next || !m.is_constant(Matcher::other_input(*next, out))) return false;
            constant = Matcher::other_input(*next, out);
            out = next->output(0);
            match.last = m.matched().back();
            match.nodes.push_back(match.last);
            return true;
        };
        if (extend("Mul", scale)) extend("Add", bias);
        if (overlaps(found, match.nodes)) continue;
        match.fused.set_op_type("LayerNormalization");
        match.fused.add_input(sub->input(0));
        if (!scale.empty()) match.fused.add_input(scale);
        if (!bias.empty()) match.fused.add_input(bias);
        match.fused.add_output(out);
        set_attribute(match.fused, "axis", -1);
        auto* epsilon = match.fused.add_attribute();
        epsilon->set_name("epsilon");
        epsilon->set_type(onnx::AttributeProto::FLOAT);
        epsilon->set_f(*eps);
        found.push_back(std::move(match));
    }
    return found;
}

std::vector<PatternMatch> find_gelus(const onnx::GraphProto& graph) {
    const GraphIndex index(graph);
    std::vector<PatternMatch> found;
    for (int n = 0; n < graph.node_size(); ++n) {
        const auto& erf = graph.node(n);
        if (erf.op_type() != "Erf" || !is_default_domain(erf)) continue;
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
        const int product_node = m.matched().back();
        const auto other = Matcher::other_input(*product, plus_one->output(0));
        std::string out;
        int last = -1;
        if (other == x) {  // (x * (1 + erf)) * 0.5
            const auto* half = m.only_reader(product->output(0), "Mul");
            if (half && near(m.scalar(Matcher::other_input(*half, product->output(0))), 0.5)) {
                out = half->output(0);
                last = m.matched().back();
            }
        } else if (near(m.scalar(other), 0.5)) {  // x * ((1 + erf) * 0.5)
            const auto* times_x = m.only_reader(product->output(0), "Mul");
            if (times_x && Matcher::other_input(*times_x, product->output(0)) == x) {
                out = times_x->output(0);
                last = m.matched().back();
            }
        } else if (const auto* half = m.from(other, "Mul")) {  // (x * 0.5) * (1 + erf)
            const auto factor = Matcher::other_input(*half, x);
            if (!factor.empty() && near(m.scalar(factor), 0.5)) {
                out = product->output(0);
                last = product_node;
            }
        }
        if (out.empty()) continue;
        PatternMatch match{m.matched(), last, {}};
        match.nodes.push_back(n);
        if (overlaps(found, match.nodes)) continue;
        match.fused.set_op_type("Gelu");
        match.fused.set_domain("com.microsoft");
        match.fused.add_input(x);
        match.fused.add_output(out);
        found.push_back(std::move(match));
    }
    return found;
}

std::vector<PatternMatch> find_hard_swishes(const onnx::GraphProto& graph) {
    const GraphIndex index(graph);
    // The pattern ending at node n, its product on input `slot` of n and its Clip on input `side` of the product.
    auto match_at = [&](int n, int slot, int side) -> std::optional<PatternMatch> {
        const auto& last = graph.node(n);
        Matcher m(graph, index);
        if (!equal(m.stored_scalar(last.input(1 - slot)), last.op_type() == "Div" ? 6.0f : 1.0f / 6.0f)) return {};
        const auto* product = m.from(last.input(slot), "Mul");
        if (!product || product->input_size() != 2) return {};
        const auto* clip = m.from(product->input(side), "Clip");
        const auto bounds = clip ? clip_bounds(*clip, index) : std::nullopt;
        if (!bounds || bounds->first != 0.0f || bounds->second != 6.0f) return {};
        const auto* add = m.from(clip->input(0), "Add");
        const auto& x = product->input(1 - side);
        if (!add || !equal(m.stored_scalar(Matcher::other_input(*add, x)), 3.0f)) return {};
        PatternMatch match{m.matched(), n, {}};
        match.nodes.push_back(n);
        match.fused.set_op_type("HardSwish");
        match.fused.add_input(x);
        match.fused.add_output(last.output(0));
        return match;
    };
    std::vector<PatternMatch> found;
    for (int n = 0; n < graph.node_size(); ++n) {
        const auto& last = graph.node(n);
        if (!is_default_domain(last) || last.input_size() != 2 || last.output_size() != 1 ||
            (last.op_type() != "Div" && last.op_type() != "Mul"))
            continue;
        // The product / 6 (the divisor second), or * 1/6 either way; the Clip either side of the product.
        const int slots = last.op_type() == "Div" ? 1 : 2;
        std::optional<PatternMatch> match;
        for (int slot = 0; slot < slots && !match; ++slot)
            for (int side = 0; side < 2 && !match; ++side) {
                match = match_at(n, slot, side);
                if (match && overlaps(found, match->nodes)) match.reset();
            }
        if (match) found.push_back(std::move(*match));
    }
    return found;
}

}  // namespace vaiq
