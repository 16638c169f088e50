// LSTM as the ONNX spec defines it: gates in i, o, f, c order; forward,
// reverse or bidirectional; optional peepholes, input_forget, clip,
// sequence_lens, batch-major layout and configurable activations.
#include <cmath>
#include <functional>

#include "runtime/kernels/common.hpp"

namespace vaiq::runtime {
namespace {

using Activation = std::function<float(float)>;

// Builds activation `name`, taking its alpha/beta from the lists as the spec orders them.
Activation activation(const KernelContext& ctx, const std::string& name, const std::vector<float>& alphas,
                      const std::vector<float>& betas, size_t& ai, size_t& bi) {
    auto take = [](const std::vector<float>& v, size_t& i, float fallback) { return i < v.size() ? v[i++] : fallback; };
    if (name == "Sigmoid") return [](float x) { return 1.0f / (1.0f + std::exp(-x)); };
    if (name == "Tanh") return [](float x) { return std::tanh(x); };
    if (name == "Relu") return [](float x) { return std::max(x, 0.0f); };
    if (name == "Softsign") return [](float x) { return x / (1.0f + std::abs(x)); };
    if (name == "Softplus") return [](float x) { return std::log1p(std::exp(x)); };
    if (name == "HardSigmoid") {
        const float a = take(alphas, ai, 0.2f), b = take(betas, bi, 0.5f);
        return [a, b](float x) { return std::clamp(a * x + b, 0.0f, 1.0f); };
    }
    if (name == "LeakyRelu") {
        const float a = take(alphas, ai, 0.01f);
        return [a](float x) { return x < 0 ? a * x : x; };
    }
    if (name == "ThresholdedRelu") {
        const float a = take(alphas, ai, 1.0f);
        return [a](float x) { return x > a ? x : 0.0f; };
    }
    if (name == "Elu") {
        const float a = take(alphas, ai, 1.0f);
        return [a](float x) { return x < 0 ? a * std::expm1(x) : x; };
    }
    if (name == "Affine") {
        const float a = take(alphas, ai, 1.0f), b = take(betas, bi, 0.0f);
        return [a, b](float x) { return a * x + b; };
    }
    if (name == "ScaledTanh") {
        const float a = take(alphas, ai, 1.0f), b = take(betas, bi, 1.0f);
        return [a, b](float x) { return a * std::tanh(b * x); };
    }
    ctx.fail("activation '" + name + "' is not supported");
}

void lstm(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x_in = ctx.input(0);
    const auto& w = ctx.input(1);
    const auto& r = ctx.input(2);
    if (x_in.type() != DataType::Float) ctx.fail("only float is supported");
    const std::string direction = ctx.attributes.get_string("direction", "forward");
    const int64_t dirs = direction == "bidirectional" ? 2 : 1;
    const bool batch_major = ctx.attributes.get_int("layout", 0) != 0;
    const int64_t seq = x_in.shape()[batch_major ? 1 : 0], batch = x_in.shape()[batch_major ? 0 : 1];
    const int64_t in_size = x_in.shape()[2];
    const int64_t hidden = ctx.attributes.get_int("hidden_size", r.shape()[2]);
    const float clip = ctx.attributes.get_float("clip", 0.0f);
    const bool input_forget = ctx.attributes.get_int("input_forget", 0) != 0;
    if (w.shape() != std::vector<int64_t>{dirs, 4 * hidden, in_size} || r.shape() != std::vector<int64_t>{dirs, 4 * hidden, hidden})
        ctx.fail("W or R does not match hidden_size and the direction");

    std::vector<std::string> names;
    for (const auto& a : ctx.node.attribute())
        if (a.name() == "activations")
            for (const auto& s : a.strings()) names.push_back(s);
    if (names.empty())
        for (int64_t d = 0; d < dirs; ++d) names.insert(names.end(), {"Sigmoid", "Tanh", "Tanh"});
    if (static_cast<int64_t>(names.size()) != 3 * dirs) ctx.fail("activations must name three functions per direction");
    const auto alphas = ctx.attributes.get_floats("activation_alpha");
    const auto betas = ctx.attributes.get_floats("activation_beta");
    size_t ai = 0, bi = 0;
    std::vector<Activation> act;
    for (const auto& n : names) act.push_back(activation(ctx, n, alphas, betas, ai, bi));

    // x as [seq, batch, input] whatever the layout.
    auto x_at = [&](int64_t t, int64_t b, int64_t k) {
        const auto xv = x_in.data<float>();
        return batch_major ? xv[(b * seq + t) * in_size + k] : xv[(t * batch + b) * in_size + k];
    };
    std::vector<int64_t> lengths(batch, seq);
    if (ctx.has_input(4)) lengths = read_ints(ctx, ctx.input(4));
    const auto wv = w.data<float>(), rv = r.data<float>();
    const std::span<const float> bias = ctx.has_input(3) ? ctx.input(3).data<float>() : std::span<const float>();
    const std::span<const float> peep = ctx.has_input(7) ? ctx.input(7).data<float>() : std::span<const float>();

    std::vector<int64_t> y_shape = batch_major ? std::vector<int64_t>{batch, seq, dirs, hidden}
                                               : std::vector<int64_t>{seq, dirs, batch, hidden};
    std::vector<int64_t> state_shape = batch_major ? std::vector<int64_t>{batch, dirs, hidden}
                                                   : std::vector<int64_t>{dirs, batch, hidden};
    Tensor y(DataType::Float, y_shape), y_h(DataType::Float, state_shape), y_c(DataType::Float, state_shape);
    auto yv = y.mutable_data<float>();
    auto y_index = [&](int64_t t, int64_t d, int64_t b, int64_t k) {
        return batch_major ? ((b * seq + t) * dirs + d) * hidden + k : ((t * dirs + d) * batch + b) * hidden + k;
    };
    auto state_index = [&](int64_t d, int64_t b, int64_t k) {
        return batch_major ? (b * dirs + d) * hidden + k : (d * batch + b) * hidden + k;
    };
    for (int64_t d = 0; d < dirs; ++d) {
        const bool reverse = direction == "reverse" || d == 1;
        const Activation &f = act[3 * d], &g = act[3 * d + 1], &h = act[3 * d + 2];
        for (int64_t b = 0; b < batch; ++b) {
            std::vector<float> hs(hidden, 0.0f), cs(hidden, 0.0f), gates(4 * hidden);
            for (int64_t k = 0; k < hidden; ++k) {
                if (ctx.has_input(5)) hs[k] = ctx.input(5).data<float>()[state_index(d, b, k)];
                if (ctx.has_input(6)) cs[k] = ctx.input(6).data<float>()[state_index(d, b, k)];
            }
            for (int64_t step = 0; step < lengths[b]; ++step) {
                const int64_t t = reverse ? lengths[b] - 1 - step : step;
                for (int64_t gi = 0; gi < 4 * hidden; ++gi) {
                    double acc = 0;
                    const float* wrow = wv.data() + (d * 4 * hidden + gi) * in_size;
                    for (int64_t k = 0; k < in_size; ++k) acc += static_cast<double>(x_at(t, b, k)) * wrow[k];
                    const float* rrow = rv.data() + (d * 4 * hidden + gi) * hidden;
                    for (int64_t k = 0; k < hidden; ++k) acc += static_cast<double>(hs[k]) * rrow[k];
                    if (!bias.empty()) acc += bias[d * 8 * hidden + gi] + bias[d * 8 * hidden + 4 * hidden + gi];
                    gates[gi] = static_cast<float>(acc);
                }
                for (int64_t k = 0; k < hidden; ++k) {
                    auto clipped = [&](float v) { return clip > 0 ? std::clamp(v, -clip, clip) : v; };
                    float gi_ = gates[k], go = gates[hidden + k], gf = gates[2 * hidden + k], gc = gates[3 * hidden + k];
                    if (!peep.empty()) {
                        gi_ += peep[d * 3 * hidden + k] * cs[k];
                        gf += peep[d * 3 * hidden + 2 * hidden + k] * cs[k];
                    }
                    const float it = f(clipped(gi_));
                    const float ft = input_forget ? 1.0f - it : f(clipped(gf));
                    const float ct = g(clipped(gc));
                    cs[k] = ft * cs[k] + it * ct;
                    if (!peep.empty()) go += peep[d * 3 * hidden + hidden + k] * cs[k];
                    const float ot = f(clipped(go));
                    hs[k] = ot * h(cs[k]);
                    yv[y_index(t, d, b, k)] = hs[k];
                }
            }
            for (int64_t k = 0; k < hidden; ++k) {
                y_h.mutable_data<float>()[state_index(d, b, k)] = hs[k];
                y_c.mutable_data<float>()[state_index(d, b, k)] = cs[k];
            }
        }
    }
    if (!out.empty()) out[0] = std::move(y);
    if (out.size() > 1) out[1] = std::move(y_h);
    if (out.size() > 2) out[2] = std::move(y_c);
}

const KernelRegistration kKernels[] = {
    {"", "LSTM", 7, 21, lstm},
};

}  // namespace
}  // namespace vaiq::runtime
