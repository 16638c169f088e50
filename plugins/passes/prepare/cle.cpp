// Cross Layer Equalization: for two weighted layers in a row (Conv or Gemm,
// depthwise included) joined by ops that commute with a positive per-channel
// scale (Relu, LeakyRelu, pools, a zero Pad), scale the first layer's output
// channel c by s and the second's input channel c by 1/s, with
// s = sqrt(r1 / r0) (r0, r1 the channel's largest |weight| in each), so both
// ranges become sqrt(r0 r1). The model computes the same function; per-tensor
// quantization loses less on the equalized weights.
//
// Activation-aware (vaiq's CLEActivationAware): the weights alone ignore the
// tensor between the layers, which is quantized per tensor too and takes the
// first layer's factor. With its per-channel range a (measured on the
// calibration data), the first layer's range becomes sqrt(r0 * rho * a), rho =
// max r0 / max a bringing a to the weights' scale: s = sqrt(r1 / sqrt(r0 rho a))
// balances the activation with the two weights instead of only the weights.
#include <algorithm>
#include <cmath>

#include "cle.hpp"

namespace prepare_passes {

namespace {

using vaiq::is_default_domain;

// A layer's weight viewed by channel: `channels` groups along one axis.
struct WeightView {
    int64_t outer = 1, channels = 0, inner = 1;
    float& at(std::vector<float>& w, int64_t o, int64_t c, int64_t i) const {
        return w[(o * channels + c) * inner + i];
    }
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
    if (index.marked(node, vaiq::kDeviceRescale)) return true;  // a scalar
    if (!is_default_domain(node)) return false;
    const auto& op = node.op_type();
    if (op == "Flatten") return after_global_pool;
    return op == "Relu" || op == "LeakyRelu" || op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool" ||
           op == "GlobalMaxPool" || (op == "Pad" && vaiq::pads_with_zeros(node, index));
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

// The reference's CLEWeightThreshold (with CLEScaleUseThreshold, both fixed there).
constexpr double kWeightThreshold = 0.5;

// Equalizes a chain of layers sharing channel c: a pair, or a layer, a
// depthwise layer and the layer after it (a triple). Each layer's range on
// channel c becomes the geometric mean of the chain's ranges: the first
// layer's output channel is multiplied by t0 = g / m0, each depthwise layer by
// g / m_i (its output then carries the product t_i of the factors so far, and
// so does its bias), and the last layer's input channel is divided by the
// product. Returns the mean |change| of the weights it touched.
double equalize(onnx::GraphProto& graph, const vaiq::GraphIndex& index, const std::vector<int>& chain,
                bool append_bias, vaiq::ChannelRanges* activations) {
    std::vector<Layer> layers;
    std::vector<WeightView> views;
    for (size_t i = 0; i < chain.size(); ++i) {
        auto l = layer(graph, index, chain[i]);
        if (!l) return 0.0;
        const auto& node = graph.node(chain[i]);
        views.push_back(i + 1 == chain.size() ? input_view(*l, node) : output_view(*l, node));
        layers.push_back(std::move(*l));
        if (views.back().channels != views.front().channels) return 0.0;
    }
    const size_t channels = views.front().channels, last = chain.size() - 1;
    std::vector<std::vector<float>> ranges;
    for (size_t i = 0; i < chain.size(); ++i) ranges.push_back(channel_max(layers[i].weight, views[i]));
    if (append_bias && layers[0].bias.size() == channels) {
        const float shrink = bias_shrink(layers[0].bias, ranges[0]);
        for (size_t c = 0; c < channels; ++c)
            ranges[0][c] = std::max(ranges[0][c], std::abs(layers[0].bias[c]) / shrink);
    }
    // acts[i]: the measured ranges of the tensor layer i writes for layer i + 1, if any.
    std::vector<std::vector<float>*> acts(chain.size() - 1, nullptr);
    for (size_t i = 0; activations && i + 1 < chain.size(); ++i)
        if (auto it = activations->find(graph.node(chain[i + 1]).input(0));
            it != activations->end() && it->second.size() == channels)
            acts[i] = &it->second;
    for (size_t i = 0; i + 1 < chain.size(); ++i) {
        const auto* a = acts[i];
        if (!a) continue;
        const float a_max = *std::max_element(a->begin(), a->end());
        const float r_max = *std::max_element(ranges[i].begin(), ranges[i].end());
        if (!(a_max > 0) || !(r_max > 0)) continue;
        for (size_t c = 0; c < channels; ++c)
            ranges[i][c] = std::sqrt(ranges[i][c] * (*a)[c] * (r_max / a_max));
    }
    // factor[i][c]: what layer i's weights on channel c are multiplied by.
    std::vector<std::vector<float>> factor(chain.size(), std::vector<float>(channels, 1.0f));
    for (size_t c = 0; c < channels; ++c) {
        double log_sum = 0, sum = 0;
        bool usable = true;
        for (const auto& r : ranges) {
            usable = usable && r[c] > 0;
            log_sum += usable ? std::log(double(r[c])) : 0.0;
            sum += r[c];
        }
        // Channels whose weights are all small stay as they are: scaling them
        // up would only magnify noise (and their activations).
        if (!usable || sum < kWeightThreshold) continue;
        const double g = std::exp(log_sum / double(chain.size()));
        double carried = 1;  // what channel c's activation is multiplied by so far
        for (size_t i = 0; i < last; ++i) {
            factor[i][c] = static_cast<float>(g / ranges[i][c]);
            carried *= g / ranges[i][c];
            if (!layers[i].bias.empty()) layers[i].bias[c] *= static_cast<float>(carried);
            if (acts[i]) (*acts[i])[c] *= static_cast<float>(carried);  // for the next sweep
        }
        factor[last][c] = static_cast<float>(1.0 / carried);
    }

    double change = 0;
    size_t count = 0;
    for (size_t i = 0; i < chain.size(); ++i) {
        const auto& v = views[i];
        auto& w = layers[i].weight;
        for (int64_t o = 0; o < v.outer; ++o)
            for (int64_t c = 0; c < v.channels; ++c)
                for (int64_t k = 0; k < v.inner; ++k) {
                    float& x = v.at(w, o, c, k);
                    const float y = x * factor[i][c];
                    change += std::abs(double(y) - x);
                    x = y;
                }
        count += w.size();
    }
    auto store = [&](const std::string& name, const std::vector<int64_t>& shape, const std::vector<float>& values) {
        for (auto& init : *graph.mutable_initializer())
            if (init.name() == name) init = vaiq::Tensor::from_values<float>(shape, values).to_proto(name);
    };
    for (size_t i = 0; i < chain.size(); ++i) {
        store(layers[i].weight_name, layers[i].shape, layers[i].weight);
        if (i < last && !layers[i].bias_name.empty())
            store(layers[i].bias_name, {static_cast<int64_t>(layers[i].bias.size())}, layers[i].bias);
    }
    return count ? change / count : 0.0;
}

// Pairs, with a depthwise layer between two pairs joined into one triple.
std::vector<std::vector<int>> chains(const onnx::GraphProto& graph, const vaiq::GraphIndex& index,
                                     const std::vector<Pair>& pairs) {
    std::map<int, size_t> by_head;
    for (size_t i = 0; i < pairs.size(); ++i) by_head[pairs[i].head] = i;
    std::vector<bool> used(pairs.size(), false);
    std::vector<std::vector<int>> out;
    for (size_t i = 0; i < pairs.size(); ++i) {
        if (used[i]) continue;
        const auto middle = layer(graph, index, pairs[i].tail);
        const auto next = by_head.find(pairs[i].tail);
        if (middle && middle->depthwise && next != by_head.end() && !used[next->second]) {
            used[next->second] = true;
            out.push_back({pairs[i].head, pairs[i].tail, pairs[next->second].tail});
        } else {
            out.push_back({pairs[i].head, pairs[i].tail});
        }
        used[i] = true;
    }
    return out;
}

}  // namespace

void CrossLayerEqualization::configure(const vaiq::Options& options) {
    steps_ = static_cast<int>(options.get_int("CLESteps"));
    threshold_ = options.get_float("CLETotalLayerDiffThreshold");
    append_bias_ = options.get_bool("CLEScaleAppendBias");
    activation_aware_ = options.get_bool("CLEActivationAware");
    if (steps_ == 0 || steps_ < -1)
        throw vaiq::InputError(fmt::format("CLESteps must be -1 (adaptive) or at least 1, not {}", steps_));
}

std::vector<vaiq::ChannelRangeRequest> CrossLayerEqualization::channel_ranges_wanted(const vaiq::Model& model) const {
    if (!activation_aware_) return {};
    const auto& graph = model.graph();
    const vaiq::GraphIndex index(model);
    std::vector<vaiq::ChannelRangeRequest> out;
    for (const auto& chain : chains(graph, index, find_pairs(graph, index)))
        for (size_t i = 1; i < chain.size(); ++i) out.push_back({graph.node(chain[i]).input(0), 1});
    return out;
}

bool CrossLayerEqualization::run(vaiq::Model& model) {
    auto& graph = model.graph();
    const vaiq::GraphIndex index(model);
    const auto found = chains(graph, index, find_pairs(graph, index));
    if (found.empty()) {
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
        for (const auto& chain : found)
            total += equalize(graph, index, chain, append_bias_, activation_aware_ ? &activations_ : nullptr);
        changed |= total > 0;
        if (steps_ == -1 && total < threshold_) {
            ++done;
            break;
        }
    }
    vaiq::log_info("cross_layer_equalization: {} pairs and triples, {} steps (last total change {:.3g}){}",
                   found.size(), done, total,
                   activation_aware_ ? fmt::format(", {} activations measured", activations_.size()) : "");
    return changed;
}

}  // namespace prepare_passes
