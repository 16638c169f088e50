// Cross Layer Equalization: for two weighted layers in a row (Conv or Gemm,
// depthwise included) joined by ops that commute with a positive per-channel
// scale (Relu, LeakyRelu, pools, a zero Pad), scale the first layer's output
// channel c by s and the second's input channel c by 1/s, with
// s = sqrt(r1 / r0) (r0, r1 the channel's largest |weight| in each), so both
// ranges become sqrt(r0 r1). The model computes the same function; per-tensor
// quantization loses less on the equalized weights.
#include <cmath>

#include "cle.hpp"

namespace prepare_passes {

namespace {

bool is_default_domain(const onnx::NodeProto& n) { return n.domain().empty() || n.domain() == "ai.onnx"; }

// A layer's weight viewed by channel: `channels` groups along one axis.
struct WeightView {
    int64_t outer = 1, channels = 0, inner = 1;
    float& at(std::vector<float>& w, int64_t o, int64_t c, int64_t i) const { return w[(o * channels + c) * inner + i]; }
};

// The weighted layer at node `n`: its weights (owned by it alone) and bias.
struct Layer {
    int node = -1;
    std::string weight_name, bias_name;
    std::vector<int64_t> shape;
    std::vector<float> weight, bias;
    bool depthwise = false;
};

std::optional<Layer> layer(const onnx::GraphProto& graph, const vaiq::GraphIndex& index, int n) {
    const auto& node = graph.node(n);
    if (!is_default_domain(node) || node.input_size() < 2) return std::nullopt;
    const bool conv = node.op_type() == "Conv", gemm = node.op_type() == "Gemm";
    if (!conv && !gemm) return std::nullopt;
    const auto w = vaiq::constant_tensor(index, node.input(1));
    if (!w || w->type() != vaiq::DataType::Float || index.consumers(node.input(1)).size() != 1) return std::nullopt;
    Layer l;
    l.node = n;
    l.weight_name = node.input(1);
    l.shape = w->shape();
    l.weight.assign(w->data<float>().begin(), w->data<float>().end());
    if (gemm && (l.shape.size() != 2 || vaiq::float_attribute(node, "alpha", 1.0f) != 1.0f ||
                 vaiq::float_attribute(node, "beta", 1.0f) != 1.0f))
        return std::nullopt;
    if (conv) {
        const auto group = vaiq::int_attribute(node, "group", 1);
        l.depthwise = group > 1 && l.shape.size() >= 2 && l.shape[1] == 1 && group == l.shape[0];
        if (group != 1 && !l.depthwise) return std::nullopt;
    }
    if (node.input_size() > 2 && !node.input(2).empty()) {
        const auto b = vaiq::constant_tensor(index, node.input(2));
        if (!b || b->type() != vaiq::DataType::Float || index.consumers(node.input(2)).size() != 1) return std::nullopt;
        l.bias_name = node.input(2);
        l.bias.assign(b->data<float>().begin(), b->data<float>().end());
    }
    return l;
}

int64_t trailing(const std::vector<int64_t>& shape, size_t from) {
    int64_t n = 1;
    for (size_t i = from; i < shape.size(); ++i) n *= shape[i];
    return n;
}

// The weight by output channel.
WeightView output_view(const Layer& l, const onnx::NodeProto& node) {
    if (node.op_type() == "Gemm" && !vaiq::int_attribute(node, "transB", 0)) return {l.shape[0], l.shape[1], 1};
    return {1, l.shape[0], trailing(l.shape, 1)};
}

// The weight by input channel (a depthwise layer's input channel is its output channel).
WeightView input_view(const Layer& l, const onnx::NodeProto& node) {
    if (node.op_type() == "Gemm") {
        if (vaiq::int_attribute(node, "transB", 0)) return {l.shape[0], l.shape[1], 1};
        return {1, l.shape[0], l.shape[1]};
    }
    if (l.depthwise) return {1, l.shape[0], trailing(l.shape, 1)};
    return {l.shape[0], l.shape[1], trailing(l.shape, 2)};
}

std::vector<float> channel_max(const std::vector<float>& w, const WeightView& v) {
    std::vector<float> r(v.channels, 0.0f);
    for (int64_t o = 0; o < v.outer; ++o)
        for (int64_t c = 0; c < v.channels; ++c)
            for (int64_t i = 0; i < v.inner; ++i)
                r[c] = std::max(r[c], std::abs(w[(o * v.channels + c) * v.inner + i]));
    return r;
}

bool is_global_pool(const onnx::NodeProto& node) {
    return node.op_type() == "GlobalAveragePool" || node.op_type() == "GlobalMaxPool";
}

// Ops between the two layers that commute with a positive per-channel scale
// (a Flatten only after a global pool, where channel c stays feature c).
bool commutes(const onnx::NodeProto& node, const vaiq::GraphIndex& index, bool after_global_pool) {
    if (vaiq::dpu::is_rescale(node)) return true;  // a scalar
    if (!is_default_domain(node)) return false;
    const auto& op = node.op_type();
    if (op == "Flatten") return after_global_pool;
    return op == "Relu" || op == "LeakyRelu" || op == "MaxPool" || op == "AveragePool" ||
           op == "GlobalAveragePool" || op == "GlobalMaxPool" ||
           (op == "Pad" && vaiq::dpu::pads_with_zeros(node, index));
}

// The first layer's output reaches the second's data input through
// single-reader links only.
struct Pair {
    int head, tail;
};

std::vector<Pair> find_pairs(const onnx::GraphProto& graph, const vaiq::GraphIndex& index) {
    std::vector<Pair> pairs;
    for (int n = 0; n < graph.node_size(); ++n) {
        const auto& head = graph.node(n);
        if (head.op_type() != "Conv" && head.op_type() != "Gemm") continue;
        std::string t = head.output(0);
        bool after_global_pool = false;
        for (int hops = 0; hops < 8; ++hops) {
            const auto& uses = index.consumers(t);
            if (uses.size() != 1 || index.is_graph_output(t) || uses[0].slot != 0) break;
            const auto& next = graph.node(uses[0].node);
            if (next.op_type() == "Conv" || next.op_type() == "Gemm") {
                pairs.push_back({n, uses[0].node});
                break;
            }
            if (!commutes(next, index, after_global_pool) || next.output_size() < 1) break;
            after_global_pool |= is_global_pool(next);
            t = next.output(0);
        }
    }
    return pairs;
}

// |b| / shrink joins the head's range when asked: the shrink is the smallest
// of 1, 2, 5, 10, 20 that brings the median |b| / max|w| ratio to at most 1,
// so a bias much larger than its weights does not dominate the scale.
float bias_shrink(const std::vector<float>& bias, const std::vector<float>& weight_max) {
    std::vector<float> ratios;
    for (size_t c = 0; c < bias.size(); ++c)
        if (weight_max[c] > 0) ratios.push_back(std::abs(bias[c]) / weight_max[c]);
    if (ratios.empty()) return 1.0f;
    std::nth_element(ratios.begin(), ratios.begin() + ratios.size() / 2, ratios.end());
    const float median = ratios[ratios.size() / 2];
    for (float shrink : {1.0f, 2.0f, 5.0f, 10.0f, 20.0f})
        if (median / shrink <= 1.0f) return shrink;
    return 20.0f;
}

// Equalizes one pair; returns the mean |change| of the weights it touched.
double equalize(onnx::GraphProto& graph, const vaiq::GraphIndex& index, const Pair& pair, bool append_bias) {
    auto head = layer(graph, index, pair.head);
    auto tail = layer(graph, index, pair.tail);
    if (!head || !tail) return 0.0;
    const auto hv = output_view(*head, graph.node(pair.head));
    const auto tv = input_view(*tail, graph.node(pair.tail));
    if (hv.channels != tv.channels) return 0.0;
    auto r0 = channel_max(head->weight, hv);
    const auto r1 = channel_max(tail->weight, tv);
    if (append_bias && head->bias.size() == r0.size()) {
        const float shrink = bias_shrink(head->bias, r0);
        for (size_t c = 0; c < r0.size(); ++c) r0[c] = std::max(r0[c], std::abs(head->bias[c]) / shrink);
    }
    std::vector<float> s(r0.size(), 1.0f);
    for (size_t c = 0; c < s.size(); ++c)
        if (r0[c] > 0 && r1[c] > 0) s[c] = static_cast<float>(std::sqrt(double(r1[c]) / r0[c]));

    double change = 0;
    auto scale = [&](std::vector<float>& w, const WeightView& v, bool inverse) {
        for (int64_t o = 0; o < v.outer; ++o)
            for (int64_t c = 0; c < v.channels; ++c)
                for (int64_t i = 0; i < v.inner; ++i) {
                    float& x = v.at(w, o, c, i);
                    const float y = inverse ? x / s[c] : x * s[c];
                    change += std::abs(double(y) - x);
                    x = y;
                }
    };
    scale(head->weight, hv, false);
    scale(tail->weight, tv, true);
    for (size_t c = 0; c < head->bias.size(); ++c) head->bias[c] *= s[c];
    const size_t count = head->weight.size() + tail->weight.size();

    auto store = [&](const std::string& name, const std::vector<int64_t>& shape, const std::vector<float>& values) {
        for (auto& init : *graph.mutable_initializer())
            if (init.name() == name) init = vaiq::Tensor::from_values<float>(shape, values).to_proto(name);
    };
    store(head->weight_name, head->shape, head->weight);
    store(tail->weight_name, tail->shape, tail->weight);
    if (!head->bias_name.empty()) store(head->bias_name, {static_cast<int64_t>(head->bias.size())}, head->bias);
    return count ? change / count : 0.0;
}

}  // namespace

void CrossLayerEqualization::configure(const vaiq::Options& options) {
    steps_ = static_cast<int>(options.get_int("steps"));
    threshold_ = options.get_float("total_layer_diff_threshold");
    append_bias_ = options.get_bool("scale_append_bias");
    if (steps_ == 0 || steps_ < -1)
        throw vaiq::InputError(fmt::format("CLESteps must be -1 (adaptive) or at least 1, not {}", steps_));
}

bool CrossLayerEqualization::run(vaiq::Model& model) {
    auto& graph = model.graph();
    const vaiq::GraphIndex index(graph);
    const auto pairs = find_pairs(graph, index);
    if (pairs.empty()) {
        vaiq::log_info("cross_layer_equalization: no pair of layers to equalize");
        return false;
    }
    // Adaptive (-1): sweep until the summed mean change falls below the threshold.
    constexpr int kMaxAdaptiveSteps = 200;
    const int steps = steps_ == -1 ? kMaxAdaptiveSteps : steps_;
    int done = 0;
    double total = 0;
    bool changed = false;
    for (; done < steps; ++done) {
        total = 0;
        for (const auto& pair : pairs) total += equalize(graph, index, pair, append_bias_);
        changed |= total > 0;
        if (steps_ == -1 && total < threshold_) {
            ++done;
            break;
        }
    }
    vaiq::log_info("cross_layer_equalization: {} pairs, {} steps (last total change {:.3g})", pairs.size(), done,
                   total);
    return changed;
}

}  // namespace prepare_passes
