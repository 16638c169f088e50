// vaiq/graph.hpp - reading and editing an ONNX graph safely.
#pragma once

#include <onnx/onnx_pb.h>

#include <initializer_list>
#include <map>
#include <optional>

#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "vaiq/export.hpp"
#include "vaiq/model.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {

/// Where a tensor is read: node index and input slot.
struct Use {
    int node;
    int slot;
};

/// An index over a graph: who produces and who reads each tensor. It is a
/// snapshot; rebuild it after editing the graph.
class VAIQ_API GraphIndex {
  public:
    explicit GraphIndex(const onnx::GraphProto& graph);
    /// The same over a model's main graph, with the model's node marks.
    explicit GraphIndex(const Model& model);

    /// Whether the model carries `mark` on `node` (Model::mark); always false
    /// for an index built from a bare graph.
    bool marked(const onnx::NodeProto& node, std::string_view mark) const;

    /// Index of the node producing `tensor`, or -1 (graph input, initializer or unknown).
    int producer(std::string_view tensor) const;
    /// The nodes reading `tensor`, in node order.
    const std::vector<Use>& consumers(std::string_view tensor) const;
    /// The initializer named `tensor`, or nullptr.
    const onnx::TensorProto* initializer(std::string_view tensor) const;
    bool is_graph_input(std::string_view tensor) const;
    bool is_graph_output(std::string_view tensor) const;

  private:
    std::unordered_map<std::string, int> producer_;
    std::unordered_map<std::string, std::vector<Use>> consumers_;
    std::unordered_map<std::string, const onnx::TensorProto*> initializers_;
    std::unordered_set<std::string> inputs_;
    std::unordered_set<std::string> outputs_;
    const Model* model_ = nullptr;
};

/// Whether a node is in the default ONNX domain ("" or "ai.onnx").
inline bool is_default_domain(const onnx::NodeProto& node) {
    return node.domain().empty() || node.domain() == "ai.onnx";
}

/// A node's name, or its first output's where it has none (as logs name it).
VAIQ_API std::string node_label(const onnx::NodeProto& node);
/// "Op 'label'", as messages and reports name a node.
VAIQ_API std::string describe_node(const onnx::NodeProto& node);

/// A node's attribute by name, or nullptr.
VAIQ_API const onnx::AttributeProto* find_attribute(const onnx::NodeProto& node, std::string_view name);
/// An INT / FLOAT attribute, or `fallback` when the node does not set it.
VAIQ_API int64_t int_attribute(const onnx::NodeProto& node, std::string_view name, int64_t fallback);
VAIQ_API float float_attribute(const onnx::NodeProto& node, std::string_view name, float fallback);
/// An INTS attribute, or nullopt when the node does not set it.
VAIQ_API std::optional<std::vector<int64_t>> ints_attribute(const onnx::NodeProto& node, std::string_view name);

/// Node marks (Model::mark) the host reads:
/// - kFloatOnly: a node a pass built to compute in float what a device computes
///   in its own arithmetic (a simulation); it is never quantized.
/// - kDeviceRescale: a Mul by a constant that a pass inserted to model how a
///   device rescales the output of the op before it (an average's divisor as
///   the device computes it); its factor is not a weight and is not quantized.
inline constexpr std::string_view kFloatOnly = "float_only";
inline constexpr std::string_view kDeviceRescale = "device_rescale";

/// Clip's bounds from attributes (opset < 11) or constant inputs; nullopt when
/// a bound is not a constant. A missing bound is -inf / +inf.
VAIQ_API std::optional<std::pair<float, float>> clip_bounds(const onnx::NodeProto& node, const GraphIndex& index);

/// Whether a Pad fills with zeros (constant mode, value 0 or none).
VAIQ_API bool pads_with_zeros(const onnx::NodeProto& pad, const GraphIndex& index);

/// Calls `visit` on each graph a node holds in its attributes (If branches,
/// Loop and Scan bodies), or on each graph the nodes of `graph` hold. One level:
/// a visitor that needs every depth calls it again.
template <typename F>
void for_each_subgraph(const onnx::NodeProto& node, const F& visit) {
    for (const auto& attr : node.attribute()) {
        if (attr.has_g()) visit(attr.g());
        for (const auto& g : attr.graphs()) visit(g);
    }
}
template <typename F>
void for_each_subgraph(onnx::NodeProto& node, const F& visit) {
    for (auto& attr : *node.mutable_attribute()) {
        if (attr.has_g()) visit(*attr.mutable_g());
        for (auto& g : *attr.mutable_graphs()) visit(g);
    }
}
template <typename F>
void for_each_subgraph(const onnx::GraphProto& graph, const F& visit) {
    for (const auto& node : graph.node()) for_each_subgraph(node, visit);
}
template <typename F>
void for_each_subgraph(onnx::GraphProto& graph, const F& visit) {
    for (auto& node : *graph.mutable_node()) for_each_subgraph(node, visit);
}

/// Tensors a node's subgraphs (If branches, Loop and Scan bodies) read from
/// the enclosing scope, sorted.
VAIQ_API std::vector<std::string> outer_scope_reads(const onnx::NodeProto& node);

/// Node indices in an order where every node follows its producers.
/// Throws InputError naming a node on a cycle or reading an undefined tensor.
VAIQ_API std::vector<int> topological_order(const onnx::GraphProto& graph);

/// Hands out names not used in a graph (nodes, tensors, initializers, value
/// infos) nor handed out before: `base`, else `base_1`, `base_2`, ...
class VAIQ_API UniqueNames {
  public:
    explicit UniqueNames(const onnx::GraphProto& graph);
    std::string fresh(std::string_view base);

  private:
    std::unordered_set<std::string> used_;
};

// --- the rewrite toolkit: what passes and graph rewrites share ---------------

/// Sets attribute `name` of a node to a typed value: replaces it where it is,
/// or appends it when the node has none.
VAIQ_API void set_attribute(onnx::NodeProto& node, const std::string& name, int64_t value);
inline void set_attribute(onnx::NodeProto& node, const std::string& name, int value) {
    set_attribute(node, name, static_cast<int64_t>(value));
}
VAIQ_API void set_attribute(onnx::NodeProto& node, const std::string& name, float value);
VAIQ_API void set_attribute(onnx::NodeProto& node, const std::string& name, const std::vector<int64_t>& values);
VAIQ_API void set_attribute(onnx::NodeProto& node, const std::string& name, const std::string& value);
/// Removes attribute `name`; returns whether the node had it.
VAIQ_API bool remove_attribute(onnx::NodeProto& node, std::string_view name);

/// Adds `value` as an initializer under a fresh name built from `base`; returns the name.
VAIQ_API std::string add_initializer(onnx::GraphProto& graph, UniqueNames& names, std::string_view base,
                                     const Tensor& value);

/// Appends a node `op` reading `inputs` and writing `outputs`, named freshly
/// from `name`. `domain`, when given, is written even when empty (the default
/// domain spelt out); without it the node has no domain field.
VAIQ_API onnx::NodeProto& make_node(onnx::GraphProto& graph, UniqueNames& names, const std::string& op,
                                    std::vector<std::string> inputs, std::vector<std::string> outputs,
                                    std::string_view name, const std::optional<std::string>& domain = std::nullopt);

/// Replaces the nodes at `nodes` by `fused`, which takes the place of node `at`
/// (one of them, usually the last, so the graph stays in order); the others go.
VAIQ_API void fuse_nodes(onnx::GraphProto& graph, const std::vector<int>& nodes, int at, onnx::NodeProto fused);

/// The integer (QOperator) form of an op as ONNX Runtime names it: QLinearConv,
/// com.microsoft QGemm, QLinearAdd, ...; nullopt for an op that has none.
struct QLinearForm {
    std::string_view op;
    std::string_view domain;  ///< "" or com.microsoft
};
VAIQ_API std::optional<QLinearForm> qlinear_form(std::string_view op);

/// A model being rewritten: the index over its graph and its inferred shapes,
/// computed when first asked for and dropped when a rewrite says it changed
/// the graph, so a pass never reads a stale index.
class VAIQ_API RewriteContext {
  public:
    explicit RewriteContext(Model& model) : model_(model) {}
    Model& model() { return model_; }
    onnx::GraphProto& graph() { return model_.graph(); }
    /// Over the model (with its node marks).
    const GraphIndex& index();
    /// infer_shapes() of the model.
    const std::map<std::string, std::vector<int64_t>>& shapes();
    /// Call after editing the graph: the index and shapes are recomputed on next use.
    void changed();

  private:
    Model& model_;
    std::optional<GraphIndex> index_;
    std::optional<std::map<std::string, std::vector<int64_t>>> shapes_;
};

/// Imports `domain` at `version` unless the model imports it already.
VAIQ_API void import_opset(onnx::ModelProto& model, const std::string& domain, int64_t version);

/// Reorders the nodes so that every node follows its producers (after edits
/// that appended nodes). Throws like topological_order.
VAIQ_API void sort_nodes(onnx::GraphProto& graph);

/// Makes every node (and subgraph) reading `from` read `to` instead. Graph
/// outputs are the model's interface and keep their names: when `from` is a graph
/// output nothing changes and it returns false.
VAIQ_API bool replace_all_uses(onnx::GraphProto& graph, std::string_view from, std::string_view to);

/// Removes the nodes at the given indices, keeping the order of the rest.
VAIQ_API void remove_nodes(onnx::GraphProto& graph, std::vector<int> indices);

/// Removes initializers that no node, subgraph or output reads. Returns how many.
VAIQ_API int remove_unused_initializers(onnx::GraphProto& graph);

}  // namespace vaiq
