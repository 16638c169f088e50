// optimize_model: constant folding, BatchNormalization folding, folding an Add
// of a constant bias into the Conv/ConvTranspose/Gemm before it, a scalar
// affine map into the linear layer after it, Identity and Dropout removal, the
// LayerNorm, Gelu and HardSwish fusions and dead-node removal, run until
// nothing changes. Every rewrite keeps the function the model computes.
#include <cmath>
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

// The per-channel values of a constant operand of an Add or Mul applied to the
// output of a Conv/ConvTranspose (channels on axis 1) or Gemm (the last axis):
// a scalar, or C values that line up with the channel axis when broadcast;
// nullopt else.
std::optional<std::vector<float>> channel_values(const onnx::NodeProto& layer, const vaiq::Tensor& operand,
                                                 int64_t channels, size_t weight_rank) {
    if (operand.type() != vaiq::DataType::Float) return std::nullopt;
    const auto values = operand.data<float>();
    // The output has rank 2 (Gemm) or the weight's rank (Conv: N, C, spatial...);
    // either way the channels are on axis 1.
    const size_t out_rank = layer.op_type() == "Gemm" ? 2 : weight_rank;
    const auto& shape = operand.shape();
    if (shape.size() > out_rank) return std::nullopt;  // it would broadcast the output to a higher rank
    if (values.size() == 1) return std::vector<float>(channels, values[0]);
    if (static_cast<int64_t>(values.size()) != channels) return std::nullopt;
    constexpr size_t channel_axis = 1;
    for (size_t d = 0; d < shape.size(); ++d) {
        const size_t axis = out_rank - shape.size() + d;
        if (shape[d] != 1 && axis != channel_axis) return std::nullopt;
    }
    return std::vector<float>(values.begin(), values.end());
}

// Folds every `op_type` node (Add or Mul) of a constant into the
// Conv/ConvTranspose/Gemm whose output it reads alone; `affine` turns the
// constant's per-channel values into the map folded.
bool fold_channel_op_into_layer(vaiq::Model& model, std::string_view op_type, std::string_view pass,
                                vaiq::ChannelAffine (*affine)(std::vector<float>)) {
    auto& graph = model.graph();
    const vaiq::GraphIndex index(graph);
    vaiq::UniqueNames names(graph);
    std::vector<int> folded;
    for (int n = 0; n < graph.node_size(); ++n) {
        const auto& node = graph.node(n);
        if (node.op_type() != op_type || !vaiq::is_default_domain(node) || node.input_size() != 2) continue;
        for (int slot = 0; slot < 2; ++slot) {
            const int producer = index.producer(node.input(slot));
            const auto operand = vaiq::constant_tensor(index, node.input(1 - slot));
            if (producer < 0 || !operand) continue;
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
            auto values = channel_values(layer, *operand, channels, weight->shape().size());
            if (values && vaiq::fold_affine_into_producer(graph, names, index, producer, node, affine(*values))) {
                folded.push_back(n);
                break;
            }
        }
    }
    if (folded.empty()) return false;
    vaiq::remove_nodes(graph, folded);
    vaiq::remove_unused_initializers(graph);
    vaiq::log_debug("{}: {} {}s of a constant folded into the layer before them", pass, folded.size(), op_type);
    return true;
}

// The one node reading `tensor` at input 0 when it is a Conv, Gemm or MatMul
// with a constant float weight (input 1) that is not also its data; -1 else.
int sole_linear_reader(const onnx::GraphProto& graph, const vaiq::GraphIndex& index, const std::string& tensor) {
    if (index.is_graph_output(tensor)) return -1;
    const auto& uses = index.consumers(tensor);
    if (uses.size() != 1 || uses[0].slot != 0) return -1;
    const auto& node = graph.node(uses[0].node);
    const auto& op = node.op_type();
    if ((op != "Conv" && op != "Gemm" && op != "MatMul") || !vaiq::is_default_domain(node)) return -1;
    if (node.input_size() < 2 || node.input(1) == tensor) return -1;
    const auto weight = vaiq::constant_tensor(index, node.input(1));
    if (!weight || weight->type() != vaiq::DataType::Float) return -1;
    return uses[0].node;
}

// Gives node `layer` a copy of its weight times `factor` (the weight may be shared).
void scale_weight(onnx::GraphProto& graph, vaiq::UniqueNames& names, const vaiq::GraphIndex& index, int layer,
                  float factor) {
    auto& node = *graph.mutable_node(layer);
    const auto weight = vaiq::constant_tensor(index, node.input(1));
    std::vector<float> w(weight->data<float>().begin(), weight->data<float>().end());
    for (auto& v : w) v *= factor;
    const auto name = names.fresh(node.input(1) + "_scaled");
    *graph.add_initializer() = vaiq::Tensor::from_values<float>(weight->shape(), w).to_proto(name);
    node.set_input(1, name);
}

// Whether a Conv pads its input (explicitly or by auto_pad SAME_*).
bool conv_pads(const onnx::NodeProto& conv) {
    const auto* auto_pad = vaiq::find_attribute(conv, "auto_pad");
    if (auto_pad && auto_pad->s() != "NOTSET" && auto_pad->s() != "VALID") return true;
    const auto pads = vaiq::ints_attribute(conv, "pads");
    return pads && std::any_of(pads->begin(), pads->end(), [](int64_t p) { return p != 0; });
}

}  // namespace

std::optional<float> scalar_constant(const vaiq::GraphIndex& index, const std::string& name, size_t max_rank) {
    const auto t = vaiq::constant_tensor(index, name);
    if (!t || t->type() != vaiq::DataType::Float || t->size() != 1 || t->shape().size() > max_rank) return std::nullopt;
    const float v = t->data<float>()[0];
    if (!std::isfinite(v)) return std::nullopt;
    return v;
}

bool fold_bias_add(vaiq::Model& model) {
    return fold_channel_op_into_layer(model, "Add", "fold_bias_add", [](std::vector<float> v) {
        const size_t channels = v.size();
        return vaiq::ChannelAffine{std::vector<float>(channels, 1.0f), std::move(v)};
    });
}

// Not part of optimize_model: measured on the PP-OCRv4 recognizer, folding its
// learnable scales into the Convs before them cost a16w8.yaml 72 % -> 0 % of
// lines read and cnn_npu.yaml 46 % -> 58 % character errors (ONNX Runtime),
// though the float model is the same. A recipe may still name it in `passes:`.
bool fold_scale_mul(vaiq::Model& model) {
    return fold_channel_op_into_layer(model, "Mul", "fold_scale_mul", [](std::vector<float> v) {
        const size_t channels = v.size();
        return vaiq::ChannelAffine{std::move(v), std::vector<float>(channels, 0.0f)};
    });
}

// x * a + b read by a linear layer (the learnable affine after an activation,
// as in PP-LCNetV3): the scale goes into the layer's weight; so does the shift
// when the layer is a Conv that does not pad (its bias takes b times each
// output channel's weight sum), else it stays as x + b / a, which zero padding
// then scales the same way. Fewer tensors are quantized; the function is the same.
bool fold_affine_into_next_layer(vaiq::Model& model) {
    auto& graph = model.graph();
    const vaiq::GraphIndex index(graph);
    vaiq::UniqueNames names(graph);
    std::vector<int> removed;
    std::set<int> touched;  // nodes rewritten this sweep; the index no longer describes them
    for (int n = 0; n < graph.node_size(); ++n) {
        const auto& node = graph.node(n);
        if (!vaiq::is_default_domain(node) || node.input_size() != 2 || node.output_size() != 1 || touched.count(n))
            continue;
        const bool is_mul = node.op_type() == "Mul";
        if (!is_mul && node.op_type() != "Add") continue;
        for (int slot = 0; slot < 2; ++slot) {
            const auto c = scalar_constant(index, node.input(1 - slot), 1);
            if (!c || index.initializer(node.input(slot)) || (is_mul && *c == 0.0f)) continue;
            const auto& out = node.output(0);
            if (is_mul) {
                if (const int layer = sole_linear_reader(graph, index, out); layer >= 0 && !touched.count(layer)) {
                    scale_weight(graph, names, index, layer, *c);
                    graph.mutable_node(layer)->set_input(0, node.input(slot));
                    removed.push_back(n);
                    touched.insert(layer);
                    break;
                }
                // Mul(a) -> Add(b) -> Conv: the Add becomes x + b / a and the Conv's weight takes a.
                const auto& uses = index.consumers(out);
                if (uses.size() != 1 || index.is_graph_output(out)) continue;
                const int add = uses[0].node;
                const auto& add_node = graph.node(add);
                if (add_node.op_type() != "Add" || !vaiq::is_default_domain(add_node) || add_node.input_size() != 2 ||
                    touched.count(add))
                    continue;
                const int b_slot = 1 - uses[0].slot;
                const auto b = scalar_constant(index, add_node.input(b_slot), 1);
                if (!b) continue;
                const int layer = sole_linear_reader(graph, index, add_node.output(0));
                if (layer < 0 || touched.count(layer) || graph.node(layer).op_type() != "Conv") continue;
                const auto shift = names.fresh(add_node.input(b_slot) + "_unscaled");
                *graph.add_initializer() =
                    vaiq::Tensor::from_values<float>({}, std::vector<float>{*b / *c}).to_proto(shift);
                // The sum now holds another value: a fresh name, so nothing compares it with the old one.
                const auto sum = names.fresh(add_node.output(0) + "_unscaled");
                auto& add_mut = *graph.mutable_node(add);
                add_mut.set_input(uses[0].slot, node.input(slot));
                add_mut.set_input(b_slot, shift);
                add_mut.set_output(0, sum);
                graph.mutable_node(layer)->set_input(0, sum);
                scale_weight(graph, names, index, layer, *c);
                removed.push_back(n);
                touched.insert({add, layer});
                break;
            }
            // Add(b) -> Conv without padding: the bias takes b * sum of each output channel's weights.
            const int layer = sole_linear_reader(graph, index, out);
            if (layer < 0 || touched.count(layer)) continue;
            const auto& conv = graph.node(layer);
            if (conv.op_type() != "Conv" || conv_pads(conv)) continue;
            const auto weight = vaiq::constant_tensor(index, conv.input(1));
            const int64_t channels = weight->shape().empty() ? 0 : weight->shape()[0];
            if (channels <= 0) continue;
            std::vector<float> bias(static_cast<size_t>(channels), 0.0f);
            if (conv.input_size() > 2 && !conv.input(2).empty()) {
                const auto given = vaiq::constant_tensor(index, conv.input(2));
                if (!given || given->type() != vaiq::DataType::Float || given->size() != channels) continue;
                bias.assign(given->data<float>().begin(), given->data<float>().end());
            }
            const auto w = weight->data<float>();
            const size_t per_channel = w.size() / static_cast<size_t>(channels);
            for (size_t o = 0; o < bias.size(); ++o) {
                double sum = 0.0;
                for (size_t i = 0; i < per_channel; ++i) sum += w[o * per_channel + i];
                bias[o] += static_cast<float>(*c * sum);
            }
            const auto bname =
                names.fresh(conv.name().empty() ? std::string("bias_shifted") : conv.name() + "_bias_shifted");
            *graph.add_initializer() = vaiq::Tensor::from_values<float>({channels}, bias).to_proto(bname);
            auto& conv_mut = *graph.mutable_node(layer);
            if (conv_mut.input_size() > 2)
                conv_mut.set_input(2, bname);
            else
                conv_mut.add_input(bname);
            conv_mut.set_input(0, node.input(slot));
            removed.push_back(n);
            touched.insert(layer);
            break;
        }
    }
    if (removed.empty()) return false;
    vaiq::remove_nodes(graph, removed);
    vaiq::remove_unused_initializers(graph);
    vaiq::log_debug("fold_affine_into_next_layer: {} scalar Mul/Adds folded into the layer after them", removed.size());
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
        // The fusions come before the folds into the next layer, which would
        // otherwise take a Gelu's 0.5 or a HardSwish's 1/6 into the MatMul after it.
        for (auto* pass : {fold_constants, eliminate_identity, fold_batch_norm, fold_bias_add, fuse_layer_norm,
                           fuse_gelu, fuse_hard_swish, fold_affine_into_next_layer, remove_dead_nodes})
            now |= pass(model);
        changed |= now;
        if (!now) break;
    }
    return changed;
}

}  // namespace prepare_passes
