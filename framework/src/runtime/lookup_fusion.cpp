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
constexpr size_t kMostRank = 8;    // the LookupTable kernel's `rank`

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
// With a BatchNormalization among the ops, its values depend on the channel
// too (axis 1): `channels` tables, and `parameters`, the DequantizeLinears of
// its quantized weights.
struct Group {
    int dequantize = -1;
    std::vector<int> ops;
    std::set<std::string> constants;
    int64_t constant_rank = 0;
    int64_t channels = 0;
    std::vector<int> parameters;
};

// A BatchNormalization's per-channel input: its channel count when it is a
// constant of one dimension, or the DequantizeLinear of stored values (its node
// joins `parameters`); 0 otherwise.
int64_t per_channel_parameter(const GraphIndex& index, const onnx::GraphProto& graph, const std::string& name,
                              std::set<std::string>& constants, std::vector<int>& parameters) {
    if (const auto value = constant_tensor(index, name)) {
        if (value->type() != DataType::Float || value->shape().size() != 1) return 0;
        constants.insert(name);
        return value->size();
    }
    const int p = index.producer(name);
    if (p < 0) return 0;
    const auto& dq = graph.node(p);
    if (!is_default_domain(dq) || dq.op_type() != "DequantizeLinear" || dq.input_size() < 2) return 0;
    const auto* stored = index.initializer(dq.input(0));
    for (const auto& in : dq.input())
        if (!in.empty() && !index.initializer(in)) return 0;
    if (!stored || stored->dims_size() != 1) return 0;
    constants.insert(dq.input().begin(), dq.input().end());
    parameters.push_back(p);
    return stored->dims(0);
}

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
        if (node.op_type() == "BatchNormalization" && node.input_size() == 5 && node.output_size() == 1 &&
            int_attribute(node, "training_mode", 0) == 0 && g.channels == 0) {
            for (int i = 1; i < 5; ++i) {
                const int64_t c = per_channel_parameter(index, graph, node.input(i), g.constants, g.parameters);
                if (c <= 0 || (g.channels != 0 && c != g.channels)) return std::nullopt;
                g.channels = c;
            }
            ops.insert(p);
            pending.push_back(node.input(0));
            continue;
        }
        if (!kLookupOps.count(node.op_type()) || node.output_size() != 1) return std::nullopt;
        if (!ops.insert(p).second) continue;
        if (ops.size() > kMostNodes) return std::nullopt;
        for (const auto& in : node.input()) {
            if (in.empty()) continue;
            if (const auto value = constant_tensor(index, in)) {
                // One value of any rank the table's kernel pads to (a TensorFlow export's
                // maximum(x, -0.4) reads a [1, 1, 1, 1] constant).
                if (value->size() != 1 || value->type() != DataType::Float || value->shape().size() > kMostRank)
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

// The shape a group is run in to make its tables: 256 values, or 256 in each of
// `channels` channels (axis 1).
std::vector<int64_t> table_shape(int64_t channels) {
    return channels > 0 ? std::vector<int64_t>{1, channels, 256} : std::vector<int64_t>{256};
}

// Nodes of the model (with the initializers among `constants` they read, and the
// Constant nodes that make the others) as a model of their own: one input, 256
// elements of `input_type`, and one output.
Model sub_model(const onnx::ModelProto& model, const GraphIndex& index, std::vector<int> nodes,
                const std::set<std::string>& constants, const std::string& input, int input_type,
                const std::string& output, int output_type, const std::vector<int64_t>& shape = {256}) {
    const auto& graph = model.graph();
    onnx::ModelProto out;
    out.set_ir_version(model.ir_version());
    *out.mutable_opset_import() = model.opset_import();
    auto& sub = *out.mutable_graph();
    sub.set_name("lookup");
    auto value_info = [&shape](onnx::ValueInfoProto& v, const std::string& name, int type) {
        v.set_name(name);
        auto& t = *v.mutable_type()->mutable_tensor_type();
        t.set_elem_type(type);
        for (int64_t d : shape) t.mutable_shape()->add_dim()->set_dim_value(d);
    };
    value_info(*sub.add_input(), input, input_type);
    value_info(*sub.add_output(), output, output_type);
    for (const auto& name : constants) {
        if (name.empty()) continue;
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

// The group as a model of its own (see sub_model), from the DequantizeLinear's input to the QuantizeLinear's output.
Model group_model(const onnx::ModelProto& model, const GraphIndex& index, const Group& g, int quantize, int input_type,
                  int output_type) {
    const auto& graph = model.graph();
    std::vector<int> nodes = g.ops;
    nodes.insert(nodes.end(), g.parameters.begin(), g.parameters.end());
    nodes.push_back(g.dequantize);
    nodes.push_back(quantize);
    std::set<std::string> needed(g.constants.begin(), g.constants.end());
    for (int n : {g.dequantize, quantize}) needed.insert({graph.node(n).input(1), graph.node(n).input(2)});
    return sub_model(model, index, nodes, needed, graph.node(g.dequantize).input(0), input_type,
                     graph.node(quantize).output(0), output_type, table_shape(g.channels));
}

// The 256 results of the group (per channel: `channels` rows of them), indexed
// by the input's bits as an unsigned byte.
std::optional<Tensor> table_of(const Model& group, const std::string& input, int input_type, int64_t channels = 0) {
    const auto shape = table_shape(channels);
    Tensor feed =
        Tensor::uninitialized(input_type == onnx::TensorProto::UINT8 ? DataType::UInt8 : DataType::Int8, shape);
    auto bytes = feed.mutable_bytes();
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i % 256);
    try {
        Executor executor(group, {.threads = 1, .optimize_layout = false, .fuse_patterns = false, .fuse_qdq = false});
        auto results = executor.run({{input, feed}});
        if (results.size() != 1 || results[0].size() != feed.size()) return std::nullopt;
        if (channels > 0) results[0].reshape({channels, 256});
        return std::move(results[0]);
    } catch (const InputError&) {
        return std::nullopt;  // left as it is: running the group reports the problem
    }
}

onnx::NodeProto lookup_node(const onnx::NodeProto& replacing, const std::string& input, const Tensor& table,
                            int64_t rank) {
    onnx::NodeProto lookup;
    lookup.set_op_type("LookupTable");
    lookup.set_domain(kInternalDomain);
    lookup.set_name((replacing.name().empty() ? replacing.output(0) : replacing.name()) + "/lookup");
    lookup.add_input(input);
    lookup.add_output(replacing.output(0));
    auto& attribute = *lookup.add_attribute();
    attribute.set_name("table");
    attribute.set_type(onnx::AttributeProto::TENSOR);
    *attribute.mutable_t() = table.to_proto("table");
    if (rank > 0) set_attribute(lookup, "rank", rank);
    return lookup;
}

// The graph's nodes with `replaced` in place and `removed` left out.
void rewrite_nodes(onnx::GraphProto& graph, const std::map<int, onnx::NodeProto>& replaced,
                   const std::set<int>& removed) {
    google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
    for (int n = 0; n < graph.node_size(); ++n) {
        if (removed.count(n)) continue;
        auto it = replaced.find(n);
        *nodes.Add() = it != replaced.end() ? it->second : graph.node(n);
    }
    graph.mutable_node()->Swap(&nodes);
}

bool is_lookup(const onnx::NodeProto& node) {
    return node.domain() == kInternalDomain && node.op_type() == "LookupTable";
}

// One pass of fold_into_tables: a QLinearMul whose data inputs are an 8-bit tensor
// x, LookupTables of x that nothing else reads, or constant single values, a
// QLinearSigmoid or QLinearLeakyRelu of x (or of such a LookupTable), and a
// LookupTable of such a LookupTable, compute a function of x alone: one table.
// A swish, x * QLinearSigmoid(x), becomes one table in two passes.
// (QLinearMul computes the same whatever its operands' shapes; QLinearAdd folds
// a single value differently from a tensor, so it is left as it is.)
bool fold_pass(onnx::ModelProto& model, std::vector<std::string>& gone) {
    auto& graph = *model.mutable_graph();
    const GraphIndex index(graph);
    std::map<int, onnx::NodeProto> replaced;
    std::set<int> removed;
    for (int n = 0; n < graph.node_size(); ++n) {
        if (removed.count(n)) continue;
        const auto& node = graph.node(n);
        const bool contrib = node.domain() == "com.microsoft" && node.output_size() == 1;
        const bool product = contrib && node.op_type() == "QLinearMul" && node.input_size() == 8;
        const bool unary = contrib && (node.op_type() == "QLinearSigmoid" || node.op_type() == "QLinearLeakyRelu") &&
                           node.input_size() == 5;
        if (!product && !unary && !(is_lookup(node) && find_attribute(node, "table"))) continue;
        const std::vector<int> data = product ? std::vector<int>{0, 3} : std::vector<int>{0};
        std::set<std::string> constants;  // the scales and zero points, constant
        bool fixed = true;
        std::vector<int> parameters;  // the scales and zero points
        if (product) parameters = {1, 2, 4, 5, 6, 7};
        if (unary) parameters = {1, 2, 3, 4};
        for (int i : parameters) {
            fixed = fixed && index.initializer(node.input(i));
            constants.insert(node.input(i));
        }
        if (!fixed) continue;
        std::string source;
        int source_type = onnx::TensorProto::UINT8;  // a table reads the bits alone
        std::vector<int> tables;
        std::set<int> unread_dequantizers;  // go with the tables they read
        int64_t rank = 0;
        bool foldable = true;
        for (int i : data) {
            const auto& in = node.input(i);
            if (const auto* init = product ? index.initializer(in) : nullptr) {
                const Tensor value = Tensor::from_proto(*init);
                foldable = foldable && value.size() == 1 && value.shape().size() <= 1;
                rank = std::max<int64_t>(rank, static_cast<int64_t>(value.shape().size()));
                constants.insert(in);
                continue;
            }
            std::string from = in;
            const int p = index.producer(in);
            // Its readers: this node, and DequantizeLinears the QDQ fusion left with nothing to read them.
            std::vector<int> dead;
            bool only_here = !index.is_graph_output(in);
            for (const auto& use : index.consumers(in)) {
                if (use.node == n) continue;
                const auto& reader = graph.node(use.node);
                const bool unread = is_default_domain(reader) && reader.op_type() == "DequantizeLinear" &&
                                    index.consumers(reader.output(0)).empty() &&
                                    !index.is_graph_output(reader.output(0));
                only_here = only_here && unread;
                dead.push_back(use.node);
            }
            // (Not one this pass rewrote or folded already: the next pass sees it as it is now.)
            if (p >= 0 && is_lookup(graph.node(p)) && only_here && !removed.count(p) && !replaced.count(p)) {
                from = graph.node(p).input(0);
                if (std::find(tables.begin(), tables.end(), p) == tables.end()) tables.push_back(p);
                unread_dequantizers.insert(dead.begin(), dead.end());
                rank = std::max(rank, int_attribute(graph.node(p), "rank", 0));
            } else if (product || unary) {
                source_type = index.initializer(node.input(i + 2))->data_type();  // its zero point's
            }
            foldable = foldable && (source.empty() || source == from);
            source = from;
        }
        if (!foldable || source.empty() || (tables.empty() && !product && !unary)) continue;
        const int output_type = product ? index.initializer(node.input(7))->data_type()
                                : unary ? index.initializer(node.input(4))->data_type()
                                        : find_attribute(node, "table")->t().data_type();
        auto eight_bit = [](int t) { return t == onnx::TensorProto::UINT8 || t == onnx::TensorProto::INT8; };
        if (unary && !(eight_bit(source_type) && eight_bit(output_type))) continue;
        std::vector<int> nodes = tables;
        nodes.push_back(n);
        const auto table =
            table_of(sub_model(model, index, nodes, constants, source, source_type, node.output(0), output_type),
                     source, source_type);
        if (!table) continue;
        replaced[n] = lookup_node(node, source, *table, rank);
        for (int t : tables) {
            removed.insert(t);
            gone.push_back(graph.node(t).output(0));
        }
        for (int d : unread_dequantizers) {
            removed.insert(d);
            gone.push_back(graph.node(d).output(0));
        }
    }
    if (replaced.empty()) return false;
    rewrite_nodes(graph, replaced, removed);
    return true;
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
        const auto table = table_of(group_model(model, index, *group, n, input_type, *output_type), dq.input(0),
                                    input_type, group->channels);
        if (!table) continue;
        replaced[n] = lookup_node(q, dq.input(0), *table, group->constant_rank);
        if (group->channels > 0) {
            replaced[n].set_op_type("ChannelLookupTable");
            set_attribute(replaced[n], "axis", int64_t{1});
        }
        for (int op : group->ops) {
            removed.insert(op);
            gone.push_back(graph.node(op).output(0));
        }
    }
    if (replaced.empty()) return false;
    rewrite_nodes(graph, replaced, removed);
    return true;
}

bool fold_into_tables(onnx::ModelProto& model, std::vector<std::string>& gone) {
    bool changed = false;
    for (int pass = 0; pass < 8 && fold_pass(model, gone); ++pass) changed = true;
    return changed;
}

}  // namespace vaiq::runtime
