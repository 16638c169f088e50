// The recurrent ops as the ONNX spec defines them: RNN, GRU (z, r, h gates,
// linear_before_reset) and LSTM (i, o, f, c gates, peepholes, input_forget);
// forward, reverse or bidirectional; clip, sequence_lens, batch-major layout
// and configurable activations.
#include <algorithm>
#include <cmath>
#include <functional>
#include <span>

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

// What every recurrent op shares: shapes, direction, layout, activations,
// sequence lengths, and where each step's values live.
struct Recurrence {
    std::string direction;
    int64_t dirs, seq, batch, in_size, hidden;
    bool batch_major;
    float clip;
    std::vector<Activation> act;  ///< `per_dir` functions for each direction
    std::vector<int64_t> lengths;
    std::span<const float> x, w, r, bias;
    Tensor y, y_h;

    Recurrence(KernelContext& ctx, int64_t gates, const std::vector<std::string>& default_acts) {
        const auto& x_in = ctx.input(0);
        if (x_in.type() != DataType::Float) ctx.fail("only float is supported");
        direction = ctx.attributes.get_string("direction", "forward");
        dirs = direction == "bidirectional" ? 2 : 1;
        batch_major = ctx.attributes.get_int("layout", 0) != 0;
        seq = x_in.shape()[batch_major ? 1 : 0];
        batch = x_in.shape()[batch_major ? 0 : 1];
        in_size = x_in.shape()[2];
        const auto& rt = ctx.input(2);
        hidden = ctx.attributes.get_int("hidden_size", rt.shape()[2]);
        clip = ctx.attributes.get_float("clip", 0.0f);
        if (ctx.input(1).shape() != std::vector<int64_t>{dirs, gates * hidden, in_size} ||
            rt.shape() != std::vector<int64_t>{dirs, gates * hidden, hidden})
            ctx.fail("W or R does not match hidden_size and the direction");
        std::vector<std::string> names;
        for (const auto& a : ctx.node.attribute())
            if (a.name() == "activations")
                for (const auto& n : a.strings()) names.push_back(n);
        if (names.empty())
            for (int64_t d = 0; d < dirs; ++d) names.insert(names.end(), default_acts.begin(), default_acts.end());
        if (names.size() != default_acts.size() * static_cast<size_t>(dirs))
            ctx.fail(fmt::format("activations must name {} functions per direction", default_acts.size()));
        const auto alphas = ctx.attributes.get_floats("activation_alpha");
        const auto betas = ctx.attributes.get_floats("activation_beta");
        size_t ai = 0, bi = 0;
        for (const auto& n : names) act.push_back(activation(ctx, n, alphas, betas, ai, bi));
        lengths.assign(static_cast<size_t>(batch), seq);
        if (ctx.has_input(4)) lengths = read_ints(ctx, ctx.input(4));
        x = x_in.data<float>();
        w = ctx.input(1).data<float>();
        r = rt.data<float>();
        if (ctx.has_input(3)) bias = ctx.input(3).data<float>();
        y = Tensor(DataType::Float, batch_major ? std::vector<int64_t>{batch, seq, dirs, hidden}
                                                : std::vector<int64_t>{seq, dirs, batch, hidden});
        y_h = Tensor(DataType::Float, state_shape());
    }

    std::vector<int64_t> state_shape() const {
        return batch_major ? std::vector<int64_t>{batch, dirs, hidden} : std::vector<int64_t>{dirs, batch, hidden};
    }
    float x_at(int64_t t, int64_t b, int64_t k) const {
        return batch_major ? x[(b * seq + t) * in_size + k] : x[(t * batch + b) * in_size + k];
    }
    int64_t y_index(int64_t t, int64_t d, int64_t b, int64_t k) const {
        return batch_major ? ((b * seq + t) * dirs + d) * hidden + k : ((t * dirs + d) * batch + b) * hidden + k;
    }
    int64_t state_index(int64_t d, int64_t b, int64_t k) const {
        return batch_major ? (b * dirs + d) * hidden + k : (d * batch + b) * hidden + k;
    }
    bool reversed(int64_t d) const { return direction == "reverse" || d == 1; }
    float clipped(float v) const { return clip > 0 ? std::clamp(v, -clip, clip) : v; }
    // Initial state input `slot` (or zeros) for direction d, batch b.
    std::vector<float> initial(KernelContext& ctx, size_t slot, int64_t d, int64_t b) const {
        std::vector<float> s(static_cast<size_t>(hidden), 0.0f);
        if (ctx.has_input(slot))
            for (int64_t k = 0; k < hidden; ++k) s[k] = ctx.input(slot).data<float>()[state_index(d, b, k)];
        return s;
    }
    // x_t W_g^T for gate row gi of direction d.
    double input_term(int64_t d, int64_t gates, int64_t gi, int64_t t, int64_t b) const {
        double acc = 0;
        const float* row = w.data() + (d * gates * hidden + gi) * in_size;
        for (int64_t k = 0; k < in_size; ++k) acc += static_cast<double>(x_at(t, b, k)) * row[k];
        return acc;
    }
    // h R_g^T for gate row gi of direction d.
    double recurrent_term(int64_t d, int64_t gates, int64_t gi, const std::vector<float>& h) const {
        double acc = 0;
        const float* row = r.data() + (d * gates * hidden + gi) * hidden;
        for (int64_t k = 0; k < hidden; ++k) acc += static_cast<double>(h[k]) * row[k];
        return acc;
    }
    float wb(int64_t d, int64_t gates, int64_t gi) const {
        return bias.empty() ? 0.0f : bias[d * 2 * gates * hidden + gi];
    }
    float rb(int64_t d, int64_t gates, int64_t gi) const {
        return bias.empty() ? 0.0f : bias[d * 2 * gates * hidden + gates * hidden + gi];
    }
    void finish(std::vector<Tensor>& out) {
        if (!out.empty()) out[0] = std::move(y);
        if (out.size() > 1) out[1] = std::move(y_h);
    }
};

void rnn(KernelContext& ctx, std::vector<Tensor>& out) {
    Recurrence rc(ctx, 1, {"Tanh"});
    auto yv = rc.y.mutable_data<float>();
    for (int64_t d = 0; d < rc.dirs; ++d)
        for (int64_t b = 0; b < rc.batch; ++b) {
            auto h = rc.initial(ctx, 5, d, b);
            std::vector<float> next(h.size());
            for (int64_t step = 0; step < rc.lengths[b]; ++step) {
                const int64_t t = rc.reversed(d) ? rc.lengths[b] - 1 - step : step;
                for (int64_t k = 0; k < rc.hidden; ++k) {
                    const double acc =
                        rc.input_term(d, 1, k, t, b) + rc.recurrent_term(d, 1, k, h) + rc.wb(d, 1, k) + rc.rb(d, 1, k);
                    next[k] = rc.act[d](rc.clipped(static_cast<float>(acc)));
                    yv[rc.y_index(t, d, b, k)] = next[k];
                }
                h.swap(next);
            }
            for (int64_t k = 0; k < rc.hidden; ++k) rc.y_h.mutable_data<float>()[rc.state_index(d, b, k)] = h[k];
        }
    rc.finish(out);
}

void gru(KernelContext& ctx, std::vector<Tensor>& out) {
    Recurrence rc(ctx, 3, {"Sigmoid", "Tanh"});
    const bool linear_before_reset = ctx.attributes.get_int("linear_before_reset", 0) != 0;
    const int64_t n = rc.hidden;
    auto yv = rc.y.mutable_data<float>();
    for (int64_t d = 0; d < rc.dirs; ++d) {
        const Activation &f = rc.act[2 * d], &g = rc.act[2 * d + 1];
        for (int64_t b = 0; b < rc.batch; ++b) {
            auto h = rc.initial(ctx, 5, d, b);
            std::vector<float> z(n), r(n), gated(n), next(n);
            for (int64_t step = 0; step < rc.lengths[b]; ++step) {
                const int64_t t = rc.reversed(d) ? rc.lengths[b] - 1 - step : step;
                for (int64_t k = 0; k < n; ++k) {
                    z[k] =
                        f(rc.clipped(static_cast<float>(rc.input_term(d, 3, k, t, b) + rc.recurrent_term(d, 3, k, h) +
                                                        rc.wb(d, 3, k) + rc.rb(d, 3, k))));
                    r[k] = f(rc.clipped(static_cast<float>(rc.input_term(d, 3, n + k, t, b) +
                                                           rc.recurrent_term(d, 3, n + k, h) + rc.wb(d, 3, n + k) +
                                                           rc.rb(d, 3, n + k))));
                }
                for (int64_t k = 0; k < n; ++k) gated[k] = r[k] * h[k];
                for (int64_t k = 0; k < n; ++k) {
                    const int64_t gi = 2 * n + k;
                    const double recurrent = linear_before_reset
                                                 ? r[k] * (rc.recurrent_term(d, 3, gi, h) + rc.rb(d, 3, gi))
                                                 : rc.recurrent_term(d, 3, gi, gated) + rc.rb(d, 3, gi);
                    const float candidate =
                        g(rc.clipped(static_cast<float>(rc.input_term(d, 3, gi, t, b) + recurrent + rc.wb(d, 3, gi))));
                    next[k] = (1.0f - z[k]) * candidate + z[k] * h[k];
                    yv[rc.y_index(t, d, b, k)] = next[k];
                }
                h.swap(next);
            }
            for (int64_t k = 0; k < n; ++k) rc.y_h.mutable_data<float>()[rc.state_index(d, b, k)] = h[k];
        }
    }
    rc.finish(out);
}

void lstm(KernelContext& ctx, std::vector<Tensor>& out) {
    Recurrence rc(ctx, 4, {"Sigmoid", "Tanh", "Tanh"});
    const bool input_forget = ctx.attributes.get_int("input_forget", 0) != 0;
    const std::span<const float> peep = ctx.has_input(7) ? ctx.input(7).data<float>() : std::span<const float>();
    const int64_t n = rc.hidden;
    Tensor y_c(DataType::Float, rc.state_shape());
    auto yv = rc.y.mutable_data<float>();
    for (int64_t d = 0; d < rc.dirs; ++d) {
        const Activation &f = rc.act[3 * d], &g = rc.act[3 * d + 1], &h = rc.act[3 * d + 2];
        for (int64_t b = 0; b < rc.batch; ++b) {
            auto hs = rc.initial(ctx, 5, d, b), cs = rc.initial(ctx, 6, d, b);
            std::vector<float> gates(4 * n);
            for (int64_t step = 0; step < rc.lengths[b]; ++step) {
                const int64_t t = rc.reversed(d) ? rc.lengths[b] - 1 - step : step;
                for (int64_t gi = 0; gi < 4 * n; ++gi)
                    gates[gi] = static_cast<float>(rc.input_term(d, 4, gi, t, b) + rc.recurrent_term(d, 4, gi, hs) +
                                                   rc.wb(d, 4, gi) + rc.rb(d, 4, gi));
                for (int64_t k = 0; k < n; ++k) {
                    float gi_ = gates[k], go = gates[n + k], gf = gates[2 * n + k], gc = gates[3 * n + k];
                    if (!peep.empty()) {
                        gi_ += peep[d * 3 * n + k] * cs[k];
                        gf += peep[d * 3 * n + 2 * n + k] * cs[k];
                    }
                    const float it = f(rc.clipped(gi_));
                    const float ft = input_forget ? 1.0f - it : f(rc.clipped(gf));
                    const float ct = g(rc.clipped(gc));
                    cs[k] = ft * cs[k] + it * ct;
                    if (!peep.empty()) go += peep[d * 3 * n + n + k] * cs[k];
                    const float ot = f(rc.clipped(go));
                    hs[k] = ot * h(cs[k]);
                    yv[rc.y_index(t, d, b, k)] = hs[k];
                }
            }
            for (int64_t k = 0; k < n; ++k) {
                rc.y_h.mutable_data<float>()[rc.state_index(d, b, k)] = hs[k];
                y_c.mutable_data<float>()[rc.state_index(d, b, k)] = cs[k];
            }
        }
    }
    rc.finish(out);
    if (out.size() > 2) out[2] = std::move(y_c);
}

const KernelRegistration kKernels[] = {
    {"", "RNN", 7, 21, rnn},
    {"", "GRU", 7, 21, gru},
    {"", "LSTM", 7, 21, lstm},
};

}  // namespace
}  // namespace vaiq::runtime
