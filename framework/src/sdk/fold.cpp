#include "vaiq/fold.hpp"

#include <cmath>

namespace vaiq {

std::optional<Tensor> constant_tensor(const GraphIndex& index, const std::string& name) {
    if (name.empty() || index.is_graph_input(name)) return std::nullopt;
    const auto* init = index.initializer(name);
    if (!init) return std::nullopt;
    return Tensor::from_proto(*init);
}

std::optional<Tensor> constant_value(const onnx::GraphProto& graph, const GraphIndex& index, const std::string& name) {
    if (auto t = constant_tensor(index, name)) return t;
    const int producer = name.empty() ? -1 : index.producer(name);
    if (producer < 0) return std::nullopt;
    const auto& node = graph.node(producer);
    if (node.op_type() != "Constant" || !is_default_domain(node)) return std::nullopt;
    for (const auto& a : node.attribute()) {
        if (a.name() == "value" && a.has_t()) return Tensor::from_proto(a.t());
        if (a.name() == "value_float") return Tensor::from_values<float>({}, std::vector<float>{a.f()});
    }
    return std::nullopt;
}

std::optional<ChannelAffine> batch_norm_affine(const onnx::NodeProto& bn, const GraphIndex& index) {
    if (bn.op_type() != "BatchNormalization" || !is_default_domain(bn) || bn.input_size() < 5) return std::nullopt;
    for (int o = 1; o < bn.output_size(); ++o)
        if (!bn.output(o).empty()) return std::nullopt;  // training mode
    std::optional<Tensor> p[4];
    for (int i = 0; i < 4; ++i) {
        p[i] = constant_tensor(index, bn.input(i + 1));
        if (!p[i] || p[i]->type() != DataType::Float || p[i]->size() != p[0]->size()) return std::nullopt;
    }
    const float eps = float_attribute(bn, "epsilon", 1e-5f);
    ChannelAffine a;
    for (int64_t c = 0; c < p[0]->size(); ++c) {
        const float scale = p[0]->data<float>()[c] / std::sqrt(p[3]->data<float>()[c] + eps);
        a.scale.push_back(scale);
        a.shift.push_back(p[1]->data<float>()[c] - p[2]->data<float>()[c] * scale);
    }
    return a;
}

namespace {

// For each weight element, the output channel it feeds.
struct ChannelLayout {
    int64_t outer = 1;     // blocks before the channel axis
    int64_t channels = 0;  // output channels along that axis
    int64_t inner = 1;     // elements after it
};

std::optional<ChannelLayout> output_channel_layout(const onnx::NodeProto& node, const std::vector<int64_t>& shape) {
    const auto& op = node.op_type();
    if (op == "Conv" && !shape.empty()) {
        ChannelLayout l{1, shape[0], 1};
        for (size_t i = 1; i < shape.size(); ++i) l.inner *= shape[i];
        return l;
    }
    if (op == "ConvTranspose" && shape.size() >= 2 && int_attribute(node, "group", 1) == 1) {
        ChannelLayout l{shape[0], shape[1], 1};
        for (size_t i = 2; i < shape.size(); ++i) l.inner *= shape[i];
        return l;
    }
    if (op == "Gemm" && shape.size() == 2 && float_attribute(node, "alpha", 1.0f) == 1.0f &&
        float_attribute(node, "beta", 1.0f) == 1.0f) {
        if (int_attribute(node, "transB", 0)) return ChannelLayout{1, shape[0], shape[1]};
        return ChannelLayout{shape[0], shape[1], 1};
    }
    return std::nullopt;
}

}  // namespace

bool fold_affine_into_producer(onnx::GraphProto& graph, UniqueNames& names, const GraphIndex& index, int producer,
                               const onnx::NodeProto& consumer, const ChannelAffine& affine) {
    auto& node = *graph.mutable_node(producer);
    if (!is_default_domain(node) || node.input_size() < 2 || node.output_size() != 1) return false;
    const auto& out = node.output(0);
    if (index.consumers(out).size() != 1 || index.is_graph_output(out)) return false;
    const auto weight = constant_tensor(index, node.input(1));
    if (!weight || weight->type() != DataType::Float) return false;
    const auto layout = output_channel_layout(node, weight->shape());
    const auto channels = static_cast<int64_t>(affine.scale.size());
    if (!layout || layout->channels != channels) return false;
    std::vector<float> bias(affine.scale.size(), 0.0f);
    if (node.input_size() > 2 && !node.input(2).empty()) {
        const auto given = constant_tensor(index, node.input(2));
        if (!given || given->type() != DataType::Float || given->size() != channels) return false;
        bias.assign(given->data<float>().begin(), given->data<float>().end());
    }
    std::vector<float> w(weight->data<float>().begin(), weight->data<float>().end());
    for (int64_t o = 0; o < layout->outer; ++o)
        for (int64_t c = 0; c < channels; ++c)
            for (int64_t i = 0; i < layout->inner; ++i) w[(o * channels + c) * layout->inner + i] *= affine.scale[c];
    for (int64_t c = 0; c < channels; ++c) bias[c] = bias[c] * affine.scale[c] + affine.shift[c];

    const auto wname = names.fresh(node.input(1) + "_folded");
    *graph.add_initializer() = Tensor::from_values<float>(weight->shape(), w).to_proto(wname);
    const auto bname = names.fresh(node.name().empty() ? std::string("bias_folded") : node.name() + "_bias_folded");
    *graph.add_initializer() = Tensor::from_values<float>({channels}, bias).to_proto(bname);
    node.set_input(1, wname);
    if (node.input_size() > 2)
        node.set_input(2, bname);
    else
        node.add_input(bname);
    node.set_output(0, consumer.output(0));
    return true;
}

}  // namespace vaiq
