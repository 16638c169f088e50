// Fusions of spelled-out normalisations into the single ops the DPU runs.
#include <set>

#include "passes.hpp"
#include "rewrite.hpp"

namespace dpu_passes {

namespace {

// Reads a graph through its producers, matching small patterns.
class Matcher {
  public:
    Matcher(const onnx::GraphProto& graph, const vaiq::GraphIndex& index) : graph_(graph), index_(index) {}

    // The node producing `tensor` if it is `op` (default domain), else nullptr; remembers it.
    const onnx::NodeProto* producer(const std::string& tensor, std::string_view op) {
        const int p = index_.producer(tensor);
        if (p < 0 || graph_.node(p).op_type() != op || !is_default_domain(graph_.node(p))) return nullptr;
        matched_.insert(p);
        return &graph_.node(p);
    }

    // A float scalar constant.
    std::optional<float> scalar(const std::string& tensor) const {
        const auto t = constant(index_, tensor);
        if (!t || t->type() != vaiq::DataType::Float || t->size() != 1) return std::nullopt;
        return t->data<float>()[0];
    }

    // Every matched node but `keep` has its only readers inside the match.
    bool self_contained(int keep) const {
        for (int n : matched_) {
            if (n == keep) continue;
            for (const auto& out : graph_.node(n).output()) {
                if (index_.is_graph_output(out)) return false;
                for (const auto& use : index_.consumers(out))
                    if (!matched_.count(use.node) && use.node != keep) return false;
            }
        }
        return true;
    }

    // Adds a node found another way (a reader rather than a producer).
    void include(int node) { matched_.insert(node); }
    const std::set<int>& matched() const { return matched_; }

  private:
    const onnx::GraphProto& graph_;
    const vaiq::GraphIndex& index_;
    std::set<int> matched_;
};

// x^2 as Pow(x, 2) or Mul(x, x): the x, or "" when it is not.
std::string squared(Matcher& m, const std::string& tensor) {
    if (const auto* pow = m.producer(tensor, "Pow"); pow && m.scalar(pow->input(1)) == 2.0f) return pow->input(0);
    if (const auto* mul = m.producer(tensor, "Mul"); mul && mul->input(0) == mul->input(1)) return mul->input(0);
    return {};
}

// Replaces node `n` by `op` on `inputs` (`configure` sets its attributes),
// removes the rest of the match.
template <typename Configure>
void replace_match(onnx::GraphProto& graph, const Matcher& m, int n, const std::string& op,
                   const std::vector<std::string>& inputs, Configure&& configure) {
    onnx::NodeProto node = graph.node(n);  // keeps its name and output
    node.set_op_type(op);
    node.clear_input();
    node.clear_attribute();
    for (const auto& in : inputs) node.add_input(in);
    configure(node);
    vaiq::fuse_nodes(graph, {m.matched().begin(), m.matched().end()}, n, std::move(node));
}

}  // namespace

// (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) over the spatial axes,
// optionally times gamma plus beta (per channel): InstanceNormalization.
bool fuse_instance_norm(vaiq::Model& model) {
    vaiq::RewriteContext context(model);
    auto& graph = context.graph();
    const auto shapes = context.shapes();  // of the tensors as given, which fusion keeps
    bool changed = false;
    for (bool again = true; again; context.changed()) {
        again = false;
        const auto& index = context.index();
        vaiq::UniqueNames names(graph);
        for (int n = 0; n < graph.node_size() && !again; ++n) {
            const auto& div = graph.node(n);
            if (div.op_type() != "Div" || !is_default_domain(div)) continue;
            Matcher m(graph, index);
            const auto* sub = m.producer(div.input(0), "Sub");
            const auto* sqrt = m.producer(div.input(1), "Sqrt");
            if (!sub || !sqrt) continue;
            const auto* mean = m.producer(sub->input(1), "ReduceMean");
            const auto* add_eps = m.producer(sqrt->input(0), "Add");
            if (!mean || !add_eps || mean->input(0) != sub->input(0)) continue;
            const auto eps = m.scalar(add_eps->input(1));
            const auto* var = m.producer(add_eps->input(0), "ReduceMean");
            if (!eps || !var || squared(m, var->input(0)) != div.input(0)) continue;
            const std::string x = sub->input(0);
            const auto shape = shapes.find(x);
            if (shape == shapes.end() || shape->second.size() < 3 || shape->second[1] <= 0) continue;
            const size_t rank = shape->second.size();
            std::vector<int64_t> spatial;
            for (size_t a = 2; a < rank; ++a) spatial.push_back(static_cast<int64_t>(a));
            bool axes_ok = true;
            for (const auto* r : {mean, var}) {
                const auto axes = ints_from(*r, index, "axes", 1);
                axes_ok =
                    axes_ok && axes && normalized_axes(*axes, rank) == spatial && int_attribute(*r, "keepdims", 1);
            }
            if (!axes_ok) continue;
            // Optional affine part: Mul by gamma then Add beta, both [C] after squeezing.
            const int64_t c = shape->second[1];
            std::vector<float> gamma(c, 1.0f), beta(c, 0.0f);
            int last = n;
            auto per_channel = [&](const std::string& t, std::vector<float>& into) {
                const auto v = constant(index, t);
                if (!v || v->type() != vaiq::DataType::Float || v->size() != c) return false;
                into.assign(v->data<float>().begin(), v->data<float>().end());
                return true;
            };
            if (const auto& uses = index.consumers(div.output(0)); uses.size() == 1) {
                const auto& mul = graph.node(uses[0].node);
                if (mul.op_type() == "Mul" && per_channel(mul.input(1 - uses[0].slot), gamma)) {
                    const auto& next = index.consumers(mul.output(0));
                    if (next.size() == 1 && graph.node(next[0].node).op_type() == "Add" &&
                        per_channel(graph.node(next[0].node).input(1 - next[0].slot), beta)) {
                        last = next[0].node;
                    } else {
                        last = uses[0].node;
                    }
                    m.include(uses[0].node);
                    m.include(last);
                    m.include(n);
                }
            }
            if (!m.self_contained(last)) continue;
            const auto g = vaiq::add_initializer(graph, names, graph.node(last).name() + "_scale",
                                                 vaiq::Tensor::from_values<float>({c}, gamma));
            const auto b = vaiq::add_initializer(graph, names, graph.node(last).name() + "_bias",
                                                 vaiq::Tensor::from_values<float>({c}, beta));
            replace_match(graph, m, last, "InstanceNormalization", {x, g, b},
                          [&](onnx::NodeProto& node) { set_attribute(node, "epsilon", *eps); });
            again = changed = true;
        }
    }
    if (changed) vaiq::remove_unused_initializers(graph);
    return changed;
}

// x / sqrt(sum(x^2, axis)) (or ReduceL2), with an optional epsilon guard:
// LpNormalization(p=2) over that axis.
bool fuse_l2_norm(vaiq::Model& model) {
    vaiq::RewriteContext context(model);
    auto& graph = context.graph();
    const auto shapes = context.shapes();  // of the tensors as given, which fusion keeps
    bool changed = false;
    for (bool again = true; again; context.changed()) {
        again = false;
        const auto& index = context.index();
        for (int n = 0; n < graph.node_size() && !again; ++n) {
            const auto& div = graph.node(n);
            if (div.op_type() != "Div" || !is_default_domain(div)) continue;
            Matcher m(graph, index);
            std::string norm = div.input(1);
            for (const char* guard : {"Max", "Add", "Clip"})  // max(norm, eps), norm + eps, clip(norm, eps)
                if (const auto* g = m.producer(norm, guard)) {
                    norm = g->input(0);
                    break;
                }
            const onnx::NodeProto* reduce = m.producer(norm, "ReduceL2");
            if (!reduce) {
                const auto* sqrt = m.producer(norm, "Sqrt");
                reduce = sqrt ? m.producer(sqrt->input(0), "ReduceSum") : nullptr;
                if (!reduce || squared(m, reduce->input(0)) != div.input(0)) continue;
            } else if (reduce->input(0) != div.input(0)) {
                continue;
            }
            const auto shape = shapes.find(div.input(0));
            const auto axes = ints_from(*reduce, index, "axes", 1);
            if (shape == shapes.end() || !axes || axes->size() != 1 || !int_attribute(*reduce, "keepdims", 1)) continue;
            if (!m.self_contained(n)) continue;
            const int64_t axis = normalized_axes(*axes, shape->second.size())[0];
            replace_match(graph, m, n, "LpNormalization", {div.input(0)}, [&](onnx::NodeProto& node) {
                set_attribute(node, "axis", axis);
                set_attribute(node, "p", int64_t{2});
            });
            again = changed = true;
        }
    }
    if (changed) vaiq::remove_unused_initializers(graph);
    return changed;
}

}  // namespace dpu_passes
