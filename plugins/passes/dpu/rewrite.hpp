// Helpers the DPU transforms share beyond the SDK's rewrite toolkit: shapes,
// constants and the rescale Mul the simulation passes insert.
#pragma once

#include <vaiq/vaiq.hpp>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dpu_arithmetic.hpp"

namespace dpu_passes {

using Shapes = std::map<std::string, std::vector<int64_t>>;

using vaiq::is_default_domain;

using vaiq::find_attribute;
using vaiq::float_attribute;
using vaiq::int_attribute;
using vaiq::ints_attribute;

using vaiq::set_attribute;

/// A constant tensor (initializer, not a graph input), or nullopt.
inline std::optional<vaiq::Tensor> constant(const vaiq::GraphIndex& index, const std::string& name) {
    return vaiq::constant_tensor(index, name);
}

/// An int64 list from an attribute (older opsets) or a constant input (newer ones).
inline std::optional<std::vector<int64_t>> ints_from(const onnx::NodeProto& n, const vaiq::GraphIndex& index,
                                                     std::string_view attr, int slot) {
    if (auto a = ints_attribute(n, attr)) return a;
    if (slot >= n.input_size() || n.input(slot).empty()) return std::nullopt;
    const auto t = constant(index, n.input(slot));
    if (!t || t->type() != vaiq::DataType::Int64) return std::nullopt;
    return std::vector<int64_t>(t->data<int64_t>().begin(), t->data<int64_t>().end());
}

/// The outputs of the ReduceMeans in spelled-out LayerNorms. A LayerNorm is no
/// pooling and the DPU does not run it: its means are neither pools nor DPU
/// arithmetic, and left as they are the planner keeps its statistics float.
inline std::set<std::string> layer_norm_means(const onnx::GraphProto& graph) {
    std::set<std::string> out;
    for (const auto& match : vaiq::find_layer_norms(graph))
        for (int n : match.nodes)
            if (graph.node(n).op_type() == "ReduceMean") out.insert(graph.node(n).output(0));
    return out;
}

/// Axes in [0, rank).
inline std::vector<int64_t> normalized_axes(std::vector<int64_t> axes, size_t rank) {
    for (auto& a : axes)
        if (a < 0) a += static_cast<int64_t>(rank);
    std::sort(axes.begin(), axes.end());
    return axes;
}

/// Whether the node's only reader is already the device's rescale (`index`
/// built from the model, with its marks).
inline bool rescaled(const onnx::NodeProto& n, const onnx::GraphProto& graph, const vaiq::GraphIndex& index) {
    const auto& uses = index.consumers(n.output(0));
    return uses.size() == 1 && index.marked(graph.node(uses[0].node), vaiq::kDeviceRescale);
}

/// Multiplies node `n`'s output by `factor` with a Mul, marked
/// vaiq::kDeviceRescale, that takes over the output's name, as the device
/// rescales it. Its doc string says so to a reader of the model.
inline void insert_rescale(vaiq::Model& model, vaiq::UniqueNames& names, int n, double factor) {
    auto& graph = model.graph();
    const std::string out = graph.node(n).output(0);
    const std::string op = graph.node(n).op_type();
    const auto raw = names.fresh(out + "_before_dpu_rescale");
    graph.mutable_node(n)->set_output(0, raw);
    const float f = static_cast<float>(factor);
    const auto k =
        vaiq::add_initializer(graph, names, out + "_dpu_factor", vaiq::Tensor::from_values<float>({}, {&f, 1}));
    auto& mul = vaiq::make_node(graph, names, "Mul", {raw, k}, {out}, out + "_dpu_rescale");
    mul.set_doc_string("vaiq: DPU rescale");
    model.mark(mul, vaiq::kDeviceRescale);
    vaiq::log_debug("{} '{}' rescaled by {} as the DPU computes it", op, graph.node(n).name(), factor);
}

}  // namespace dpu_passes
