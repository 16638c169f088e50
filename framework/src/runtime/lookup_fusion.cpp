#include "runtime/lookup_fusion.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "runtime/executor.hpp"
#include "runtime/layout.hpp"
#include "vaiq/error.hpp"
#include "vaiq/fold.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/model.hpp"

namespace vaiq::runtime {

namespace {

// Float ops that compute each output element from the same element of their
// inputs alone, with kernels exact to the last bit in any position (no
// vectorised approximations): what a table may stand for.
const std::set<std::string> kLookupOps = {"Add",  "Sub", "Mul", "Div",       "Max",         "Min",      "Relu",
                                          "Clip", "Neg", "Abs", "LeakyRelu", "HardSigmoid", "HardSwish"};

constexpr size_t kMostNodes = 32;  // a group larger than this is not what exporters write

bool is_8_bit(int elem_type) { return elem_type == onnx::TensorProto::UINT8 || elem_type == onnx::TensorProto::INT8; }

// The element type of a Q or DQ node whose scale and zero point are constant
// single values, 8-bit; else nullopt.
std::optional<int> per_tensor_8_bit(const onnx::NodeProto& node, const GraphIndex& index) {
    if (node.input_size() != 3) return std::nullopt;
    const auto* scale = index.initializer(node.input(1));
    const auto* zero_point = index.initializer(node.input(2));
    if (!scale || !zero_point || scale->data_type() != onnx::TensorProto::FLOAT || !is_8_bit(zero_point->data_type()))
        return std::nullopt;
    auto one = [](const onnx::TensorProto& t) {
        int64_t n = 1;
        for (auto d : t.dims()) n *= d;
        return n == 1;
    };
    if (!one(*scale) || !one(*zero_point)) return std::nullopt;
    return zero_point->data_type();
}

// The group behind one QuantizeLinear: the DequantizeLinear it starts from, the
// ops in between, the constants they read and the largest rank among those.
struct Group {
    int dequantize = -1;
    std::vector<int> ops;
    std::set<std::string> constants;
    int64_t constant_rank = 0;
};

std::optional<Group> group_of(const onnx::GraphProto& graph, const GraphIndex& index, int quantize) {
    Group g;
    std::set<int> ops;
    std::vector<std::string> pending = {graph.node(quantize).input(0)};
    while (!pending.empty()) {
        const std::string tensor = pending.back();
        pending.pop_back();
        const int p = index.producer(tensor);
        if (p < 0) return std::nullopt;  // a graph input or an initializer: not computed from one integer
        const auto& node = graph.node(p);
        if (!is_default_domain(node)) return std::nullopt;
        if (node.op_type() == "DequantizeLinear") {
            if (g.dequantize >= 0 && g.dequantize != p) return std::nullopt;
            if (!per_tensor_8_bit(node, index) || constant_tensor(index, node.input(0))) return std::nullopt;
            g.dequantize = p;
            continue;
        }
        if (!kLookupOps.count(node.op_type()) || node.output_size() != 1) return std::nullopt;
        if (!ops.insert(p).second) continue;
        if (ops.size() > kMostNodes) return std::nullopt;
        for (const auto& in : node.input()) {
            if (in.empty()) continue;
            if (const auto value = constant_tensor(index, in)) {
                if (value->size() != 1 || value->type() != DataType::Float || value->shape().size() > 1)
                    return std::nullopt;
                g.constants.insert(in);
                g.constant_rank = std::max<int64_t>(g.constant_rank, static_cast<int64_t>(value->shape().size()));
                continue;
            }
            pending.push_back(in);
        }
    }
    if (g.dequantize < 0 || ops.empty()) return std::nullopt;
    // The ops' results must be needed by the group alone.
    for (int op : ops) {
        const auto& out = graph.node(op).output(0);
        if (index.is_graph_output(out)) return std::nullopt;
        for (const auto& use : index.consumers(out))
            if (use.node != quantize && !ops.count(use.node)) return std::nullopt;
    }
    g.ops.assign(ops.begin(), ops.end());
    return g;
}

// The group as a model of its own, the DequantizeLinear's input a graph input of
// 256 elements, and its QuantizeLinear's output the graph output.
Model group_model(const onnx::ModelProto& model, const GraphIndex& index, const Group& g, int quantize, int input_type,
                  int output_type) {
    const auto& graph = model.graph();
    onnx::ModelProto out;
    out.set_ir_version(model.ir_version());
    *out.mutable_opset_import() = model.opset_import();
    auto& sub = *out.mutable_graph();
    sub.set_name("lookup");
    auto value_info = [](onnx::ValueInfoProto& v, const std::string& name, int type) {
        v.set_name(name);
        auto& t = *v.mutable_type()->mutable_tensor_type();
        t.set_elem_type(type);
        t.mutable_shape()->add_dim()->set_dim_value(256);
    };
    const auto& dq = graph.node(g.dequantize);
    value_info(*sub.add_input(), dq.input(0), input_type);
    value_info(*sub.add_output(), graph.node(quantize).output(0), output_type);
    std::vector<int> nodes = g.ops;
    nodes.push_back(g.dequantize);
    nodes.push_back(quantize);
    std::set<std::string> needed(g.constants.begin(), g.constants.end());
    for (int n : {g.dequantize, quantize}) needed.insert({graph.node(n).input(1), graph.node(n).input(2)});
    for (const auto& name : needed) {
        if (const auto* init = index.initializer(name)) {
            *sub.add_initializer() = *init;
        } else {
            nodes.push_back(index.producer(name));  // a Constant node's output
        }
    }
    std::sort(nodes.begin(), nodes.end());
    for (int n : nodes) *sub.add_node() = graph.node(n);
    return Model(std::move(out));
}

// The 256 results of the group, indexed by the input's bits as an unsigned byte.
std::optional<Tensor> table_of(const Model& group, const std::string& input, int input_type) {
    Tensor feed = input_type == onnx::TensorProto::UINT8 ? Tensor::uninitialized(DataType::UInt8, {256})
                                                         : Tensor::uninitialized(DataType::Int8, {256});
    auto bytes = feed.mutable_bytes();
    for (size_t i = 0; i < 256; ++i) bytes[i] = static_cast<std::byte>(i);
    try {
        Executor executor(group, {.threads = 1, .optimize_layout = false, .fuse_patterns = false, .fuse_qdq = false});
        auto results = executor.run({{input, feed}});
        if (results.size() != 1 || results[0].size() != 256) return std::nullopt;
        return std::move(results[0]);
    } catch (const InputError&) {
        return std::nullopt;  // left as it is: running the group reports the problem
    }
}

}  // namespace

bool fuse_lookup_tables(onnx::ModelProto& model, std::vector<std::string>& gone) {
    auto& graph = *model.mutable_graph();
    const GraphIndex index(graph);
    std::map<int, onnx::NodeProto> replaced;
    std::set<int> removed;
    for (int n = 0; n < graph.node_size(); ++n) {
        const auto& q = graph.node(n);
        if (!is_default_domain(q) || q.op_type() != "QuantizeLinear") continue;
        const auto output_type = per_tensor_8_bit(q, index);
        if (!output_type) continue;
        const auto group = group_of(graph, index, n);
        if (!group) continue;
        const auto& dq = graph.node(group->dequantize);
        const int input_type = index.initializer(dq.input(2))->data_type();
        const auto table =
            table_of(group_model(model, index, *group, n, input_type, *output_type), dq.input(0), input_type);
        if (!table) continue;
        onnx::NodeProto lookup;
        lookup.set_op_type("LookupTable");
        lookup.set_domain(kInternalDomain);
        lookup.set_name(q.name().empty() ? q.output(0) + "/lookup" : q.name() + "/lookup");
        lookup.add_input(dq.input(0));
        lookup.add_output(q.output(0));
        auto& attribute = *lookup.add_attribute();
        attribute.set_name("table");
        attribute.set_type(onnx::AttributeProto::TENSOR);
        *attribute.mutable_t() = table->to_proto("table");
        if (group->constant_rank > 0) set_attribute(lookup, "rank", group->constant_rank);
        replaced[n] = std::move(lookup);
        for (int op : group->ops) {
            removed.insert(op);
            gone.push_back(graph.node(op).output(0));
        }
    }
    if (replaced.empty()) return false;
    google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
    for (int n = 0; n < graph.node_size(); ++n) {
        if (removed.count(n)) continue;
        auto it = replaced.find(n);
        *nodes.Add() = it != replaced.end() ? it->second : graph.node(n);
    }
    graph.mutable_node()->Swap(&nodes);
    return true;
}

}  // namespace vaiq::runtime
