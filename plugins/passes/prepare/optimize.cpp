// optimize_model: constant folding, BatchNormalization folding, folding an Add
// of a constant bias into the Conv/ConvTranspose/Gemm before it, Identity and
// Dropout removal, the LayerNorm and Gelu fusions and dead-node removal, run
// until nothing changes. Every rewrite keeps the function the model computes.
#include <set>

#include "passes.hpp"

namespace prepare_passes {

namespace {

using vaiq::is_default_domain;

// Ops never folded: random or stateful ones, and quantization, whose integer
// weights must stay what the model stores.
const std::set<std::string, std::less<>> kNeverFolded = {"RandomNormal",
                                                         "RandomNormalLike",
                                                         "RandomUniform",
                                                         "RandomUniformLike",
                                                         "Multinomial",
                                                         "Bernoulli",
                                                         "QuantizeLinear",
                                                         "DequantizeLinear",
                                                         "DynamicQuantizeLinear",
                                                         "If",
                                                         "Loop",
                                                         "Scan"};

// Folded outputs above this many bytes stay computed at run time (a Tile or
// Expand of a constant would otherwise bloat the file).
constexpr size_t kMaxFoldedBytes = size_t{64} << 20;

// A Constant node's value as a tensor, or nullopt for forms vaiq does not fold (strings, sparse).
std::optional<vaiq::Tensor> constant_value(const onnx::NodeProto& node) {
    for (const auto& a : node.attribute()) {
        if (a.name() == "value" && a.has_t()) return vaiq::Tensor::from_proto(a.t());
        if (a.name() == "value_float") return vaiq::Tensor::from_values<float>({}, std::vector<float>{a.f()});
        if (a.name() == "value_int") return vaiq::Tensor::from_values<int64_t>({}, std::vector<int64_t>{a.i()});
        if (a.name() == "value_floats")
            return vaiq::Tensor::from_values<float>({a.floats_size()},
                                                    std::vector<float>(a.floats().begin(), a.floats().end()));
        if (a.name() == "value_ints")
            return vaiq::Tensor::from_values<int64_t>({a.ints_size()},
                                                      std::vector<int64_t>(a.ints().begin(), a.ints().end()));
    }
    return std::nullopt;
}

// Shape of a tensor whose dimensions are all known.
std::optional<vaiq::Tensor> static_shape(const onnx::NodeProto& node,
                                         const std::map<std::string, std::vector<int64_t>>& shapes) {
    const auto it = shapes.find(node.input(0));
    if (it == shapes.end()) return std::nullopt;
    auto dims = it->second;
    for (auto d : dims)
        if (d < 0) return std::nullopt;
    const auto rank = static_cast<int64_t>(dims.size());
    auto clamp = [&](int64_t v) { return std::clamp(v < 0 ? v + rank : v, int64_t{0}, rank); };
    const auto start = clamp(vaiq::int_attribute(node, "start", 0));
    const auto end = clamp(vaiq::int_attribute(node, "end", rank));
    std::vector<int64_t> out(dims.begin() + start, dims.begin() + std::max(start, end));
    return vaiq::Tensor::from_values<int64_t>({static_cast<int64_t>(out.size())}, out);
}

bool has_subgraph(const onnx::NodeProto& node) {
    return std::any_of(node.attribute().begin(), node.attribute().end(),
                       [](const auto& a) { return a.has_g() || a.graphs_size() > 0; });
}

// Runs one node whose inputs are all constant, in a model of its own.
std::vector<vaiq::Tensor> evaluate_node(const vaiq::Model& model, const onnx::NodeProto& node,
                                        const vaiq::GraphIndex& index) {
    onnx::ModelProto proto;
    proto.set_ir_version(model.proto().ir_version());
    *proto.mutable_opset_import() = model.proto().opset_import();
    auto& graph = *proto.mutable_graph();
    graph.set_name("fold");
    *graph.add_node() = node;
    std::set<std::string> added;
    for (const auto& in : node.input())
        if (!in.empty() && added.insert(in).second) *graph.add_initializer() = *index.initializer(in);
    for (const auto& out : node.output()) graph.add_output()->set_name(out);
    return vaiq::evaluate(vaiq::Model(std::move(proto)));
}

}  // namespace

bool fold_constants(vaiq::Model& model) {
    auto& graph = model.graph();
    const auto shapes = vaiq::infer_shapes(model);
    std::vector<int> folded;
    std::vector<onnx::TensorProto> values;
    {
        // Constants this sweep has produced count as initializers for the nodes after them.
        vaiq::GraphIndex index(graph);
        std::map<std::string, onnx::TensorProto> made;
        auto is_constant = [&](const std::string& name) {
            return name.empty() || made.count(name) || (index.initializer(name) && !index.is_graph_input(name));
        };
        for (int n : vaiq::topological_order(graph)) {
            const auto& node = graph.node(n);
            if (!is_default_domain(node) || kNeverFolded.count(node.op_type()) || has_subgraph(node)) continue;
            std::vector<vaiq::Tensor> outputs;
            if (node.op_type() == "Constant") {
                auto v = constant_value(node);
                if (!v) continue;
                outputs.push_back(std::move(*v));
            } else if (node.op_type() == "Shape") {
                auto v = static_shape(node, shapes);
                if (!v) continue;
                outputs.push_back(std::move(*v));
            } else {
                if (node.input_size() == 0 || !std::all_of(node.input().begin(), node.input().end(), is_constant))
                    continue;
                // Read the constants made this sweep through a graph that has them.
                onnx::GraphProto scratch;
                for (const auto& in : node.input())
                    if (made.count(in)) *scratch.add_initializer() = made.at(in);
                for (const auto& in : node.input())
                    if (!in.empty() && !made.count(in)) *scratch.add_initializer() = *index.initializer(in);
                try {
                    outputs = evaluate_node(model, node, vaiq::GraphIndex(scratch));
                } catch (const vaiq::InputError& e) {
                    vaiq::log_debug("fold_constants: '{}' ({}) not folded: {}", node.name(), node.op_type(), e.what());
                    continue;
                }
            }
            size_t bytes = 0;
            for (const auto& t : outputs) bytes += t.bytes().size();
            if (bytes > kMaxFoldedBytes || outputs.size() != static_cast<size_t>(node.output_size())) continue;
            for (int o = 0; o < node.output_size(); ++o) {
                if (node.output(o).empty()) continue;
                made[node.output(o)] = outputs[o].to_proto(node.output(o));
                values.push_back(made[node.output(o)]);
            }
            folded.push_back(n);
        }
    }
    if (folded.empty()) return false;
    // A graph output computed from constants keeps its node: outputs are not initializers.
    const vaiq::GraphIndex index(graph);
    std::vector<int> removable;
    for (int n : folded) {
        const auto& node = graph.node(n);
        const bool feeds_output = std::any_of(node.output().begin(), node.output().end(),
                                              [&](const auto& o) { return index.is_graph_output(o); });
        if (!feeds_output) removable.push_back(n);
    }
    if (removable.empty()) return false;
    std::set<std::string> removed_outputs;
    for (int n : removable)
        for (const auto& o : graph.node(n).output()) removed_outputs.insert(o);
    for (auto& v : values)
        if (removed_outputs.count(v.name())) *graph.add_initializer() = std::move(v);
    vaiq::remove_nodes(graph, removable);
    vaiq::remove_unused_initializers(graph);
    vaiq::log_debug("fold_constants: {} nodes folded", removable.size());
    return true;
}

bool fold_batch_norm(vaiq::Model& model) {
    auto& graph = model.graph();
    const vaiq::GraphIndex index(graph);
    vaiq::UniqueNames names(graph);
    std::vector<int> folded;
    for (int n = 0; n < graph.node_size(); ++n) {
        const auto& bn = graph.node(n);
        const auto affine = vaiq::batch_norm_affine(bn, index);
        if (!affine) continue;
        const int producer = index.producer(bn.input(0));
        if (producer >= 0 && vaiq::fold_affine_into_producer(graph, names, index, producer, bn, *affine))
            folded.push_back(n);
    }
    if (folded.empty()) return false;
    vaiq::remove_nodes(graph, folded);
    vaiq::remove_unused_initializers(graph);
    return true;
}

namespace {

// The per-channel shift an Add of a constant applies to the output of a
// Conv/ConvTranspose (channels on axis 1) or Gemm (the last axis): a scalar,
// or C values that line up with the channel axis when broadcast; nullopt else.
std::optional<vaiq::ChannelAffine> channel_bias(const onnx::NodeProto& layer, const vaiq::Tensor& bias,
                                                int64_t channels, size_t weight_rank) {
    if (bias.type() != vaiq::DataType::Float) return std::nullopt;
    const auto values = bias.data<float>();
    vaiq::ChannelAffine a{std::vector<float>(channels, 1.0f), std::vector<float>(channels, 0.0f)};
    if (values.size() == 1) {
        if (bias.shape().size() > (layer.op_type() == "Gemm" ? 2 : weight_rank)) return std::nullopt;
        std::fill(a.shift.begin(), a.shift.end(), values[0]);
        return a;
    }
    if (static_cast<int64_t>(values.size()) != channels) return std::nullopt;
    // The output has rank 2 (Gemm) or the weight's rank (Conv: N, C, spatial...);
    // either way the channels are on axis 1.
    const size_t out_rank = layer.op_type() == "Gemm" ? 2 : weight_rank;
    constexpr size_t channel_axis = 1;
    const auto& shape = bias.shape();
    if (shape.size() > out_rank) return std::nullopt;
    for (size_t d = 0; d < shape.size(); ++d) {
        const size_t axis = out_rank - shape.size() + d;
        if (shape[d] != 1 && axis != channel_axis) return std::nullopt;
    }
    a.shift.assign(values.begin(), values.end());
    return a;
}

}  // namespace

bool fold_bias_add(vaiq::Model& model) {
    auto& graph = model.graph();
    const vaiq::GraphIndex index(graph);
    vaiq::UniqueNames names(graph);
    std::vector<int> folded;
    for (int n = 0; n < graph.node_size(); ++n) {
        const auto& add = graph.node(n);
        if (add.op_type() != "Add" || !vaiq::is_default_domain(add) || add.input_size() != 2) continue;
        for (int slot = 0; slot < 2; ++slot) {
            const int producer = index.producer(add.input(slot));
            const auto bias = vaiq::constant_tensor(index, add.input(1 - slot));
            if (producer < 0 || !bias) continue;
            const auto& layer = graph.node(producer);
            const auto& op = layer.op_type();
            if ((op != "Conv" && op != "ConvTranspose" && op != "Gemm") || !vaiq::is_default_domain(layer)) continue;
            const auto weight = vaiq::constant_tensor(index, layer.input_size() > 1 ? layer.input(1) : "");
            if (!weight || weight->shape().size() < 2) continue;
            const int64_t group = vaiq::int_attribute(layer, "group", 1);
            const int64_t channels = op == "Conv"                              ? weight->shape()[0]
                                     : op == "ConvTranspose"                   ? weight->shape()[1] * group
                                     : vaiq::int_attribute(layer, "transB", 0) ? weight->shape()[0]
                                                                               : weight->shape()[1];
            const auto affine = channel_bias(layer, *bias, channels, weight->shape().size());
            if (affine && vaiq::fold_affine_into_producer(graph, names, index, producer, add, *affine)) {
                folded.push_back(n);
                break;
            }
        }
    }
    if (folded.empty()) return false;
    vaiq::remove_nodes(graph, folded);
    vaiq::remove_unused_initializers(graph);
    vaiq::log_debug("fold_bias_add: {} Adds of a constant bias folded into the layer before them", folded.size());
    return true;
}

bool remove_dead_nodes(vaiq::Model& model) {
    vaiq::RewriteContext context(model);
    auto& graph = context.graph();
    int removed = 0;
    for (bool again = true; again; context.changed()) {
        const auto& index = context.index();
        std::vector<int> dead;
        for (int n = 0; n < graph.node_size(); ++n) {
            const auto& node = graph.node(n);
            const bool used = std::any_of(node.output().begin(), node.output().end(), [&](const auto& o) {
                return !o.empty() && (index.is_graph_output(o) || !index.consumers(o).empty());
            });
            if (!used) dead.push_back(n);
        }
        again = !dead.empty();
        removed += static_cast<int>(dead.size());
        vaiq::remove_nodes(graph, dead);
    }
    const int initializers = vaiq::remove_unused_initializers(graph);
    if (removed) vaiq::log_debug("remove_dead_nodes: {} nodes removed", removed);
    return removed > 0 || initializers > 0;
}

bool optimize_model(vaiq::Model& model) {
    // Protobuf cannot hold more than 2 GB; such models keep their graph as it is.
    constexpr size_t kProtobufLimit = size_t{2} << 30;
    if (model.proto().ByteSizeLong() >= kProtobufLimit) {
        vaiq::log_info("optimize_model: skipped, the model is over 2 GB");
        return false;
    }
    bool changed = false;
    for (int sweep = 0; sweep < 8; ++sweep) {
        bool now = false;
        for (auto* pass : {fold_constants, eliminate_identity, fold_batch_norm, fold_bias_add, fuse_layer_norm,
                           fuse_gelu, remove_dead_nodes})
            now |= pass(model);
        changed |= now;
        if (!now) break;
    }
    return changed;
}

}  // namespace prepare_passes
