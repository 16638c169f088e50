// The recurrent ops as the ONNX spec defines them: RNN, GRU (z, r, h gates,
// linear_before_reset) and LSTM (i, o, f, c gates, peepholes, input_forget);
// forward, reverse or bidirectional; clip, sequence_lens, batch-major layout
// and configurable activations. LSTM and GRU run on whole products (every
// step's input products at once, then each step's recurrent ones) with
// Sigmoid and Tanh as ONNX Runtime computes them; RNN sums each gate in double.
#include <algorithm>
#include <cmath>
#include <functional>
#include <span>

#include "runtime/kernels/common.hpp"
#include "runtime/kernels/intrinsics.hpp"
#include "runtime/kernels/ort_float.hpp"

namespace vaiq::runtime {
namespace {

// The gates' sums: each product of two floats is exact in double, and the sum
// stays in double until the gate is rounded once to float.
double dot_portable(const float* a, const float* b, int64_t n) {
    double acc = 0;
    for (int64_t k = 0; k < n; ++k) acc += static_cast<double>(a[k]) * b[k];
    return acc;
}

// The same sum, eight products at a time in two chains of four double lanes.
[[gnu::target("avx2,fma")]] double dot_avx2(const float* a, const float* b, int64_t n) {
    __m256d even = _mm256_setzero_pd(), odd = _mm256_setzero_pd();
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) {
        even = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(a + k)), _mm256_cvtps_pd(_mm_loadu_ps(b + k)), even);
        odd = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(a + k + 4)), _mm256_cvtps_pd(_mm_loadu_ps(b + k + 4)), odd);
    }
    alignas(32) double lanes[4];
    _mm256_store_pd(lanes, _mm256_add_pd(even, odd));
    return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]) + dot_portable(a + k, b + k, n - k);
}

double dot(const float* a, const float* b, int64_t n) {
    static const bool avx2 = cpu_features().avx2 && cpu_features().fma;
    return avx2 ? dot_avx2(a, b, n) : dot_portable(a, b, n);
}

// An activation, one value at a time; a row at a time, Sigmoid and Tanh as
// ONNX Runtime's LSTM computes them (MLAS's logistic and tanh).
struct Activation {
    enum class Kind { Sigmoid, Tanh, Other } kind = Kind::Other;
    std::function<float(float)> fn;

    float operator()(float x) const { return fn(x); }
    void row(float* v, int64_t n) const {
        if (kind == Kind::Sigmoid) return ort_logistic(v, v, n);
        if (kind == Kind::Tanh) return ort_tanh(v, v, n);
        for (int64_t i = 0; i < n; ++i) v[i] = fn(v[i]);
    }
};

// Builds activation `name`, taking its alpha/beta from the lists as the spec orders them.
Activation activation(const KernelContext& ctx, const std::string& name, const std::vector<float>& alphas,
                      const std::vector<float>& betas, size_t& ai, size_t& bi) {
    auto take = [](const std::vector<float>& v, size_t& i, float fallback) { return i < v.size() ? v[i++] : fallback; };
    using Kind = Activation::Kind;
    if (name == "Sigmoid") return {Kind::Sigmoid, [](float x) { return 1.0f / (1.0f + std::exp(-x)); }};
    if (name == "Tanh") return {Kind::Tanh, [](float x) { return std::tanh(x); }};
    if (name == "Relu") return {Kind::Other, [](float x) { return std::max(x, 0.0f); }};
    if (name == "Softsign") return {Kind::Other, [](float x) { return x / (1.0f + std::abs(x)); }};
    if (name == "Softplus") return {Kind::Other, [](float x) { return std::log1p(std::exp(x)); }};
    if (name == "HardSigmoid") {
        const float a = take(alphas, ai, 0.2f), b = take(betas, bi, 0.5f);
        return {Kind::Other, [a, b](float x) { return std::clamp(a * x + b, 0.0f, 1.0f); }};
    }
    if (name == "LeakyRelu") {
        const float a = take(alphas, ai, 0.01f);
        return {Kind::Other, [a](float x) { return x < 0 ? a * x : x; }};
    }
    if (name == "ThresholdedRelu") {
        const float a = take(alphas, ai, 1.0f);
        return {Kind::Other, [a](float x) { return x > a ? x : 0.0f; }};
    }
    if (name == "Elu") {
        const float a = take(alphas, ai, 1.0f);
        return {Kind::Other, [a](float x) { return x < 0 ? a * std::expm1(x) : x; }};
    }
    if (name == "Affine") {
        const float a = take(alphas, ai, 1.0f), b = take(betas, bi, 0.0f);
        return {Kind::Other, [a, b](float x) { return a * x + b; }};
    }
    if (name == "ScaledTanh") {
        const float a = take(alphas, ai, 1.0f), b = take(betas, bi, 1.0f);
        return {Kind::Other, [a, b](float x) { return a * std::tanh(b * x); }};
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

    // `x_in`, `wt`, `rt`: the input and weights as float (the node's own, or their dequantized values).
    Recurrence(KernelContext& ctx, int64_t gates, const std::vector<std::string>& default_acts, const Tensor& x_in,
               const Tensor& wt, const Tensor& rt) {
        if (x_in.type() != DataType::Float) ctx.fail("only float is supported");
        if (x_in.shape().size() != 3 || rt.shape().size() != 3) ctx.fail("X and R must have 3 dimensions");
        direction = ctx.attributes.get_string("direction", "forward");
        dirs = direction == "bidirectional" ? 2 : 1;
        batch_major = ctx.attributes.get_int("layout", 0) != 0;
        seq = x_in.shape()[batch_major ? 1 : 0];
        batch = x_in.shape()[batch_major ? 0 : 1];
        in_size = x_in.shape()[2];
        hidden = ctx.attributes.get_int("hidden_size", rt.shape()[2]);
        clip = ctx.attributes.get_float("clip", 0.0f);
        if (wt.shape() != std::vector<int64_t>{dirs, gates * hidden, in_size} ||
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
        if (static_cast<int64_t>(lengths.size()) != batch ||
            std::any_of(lengths.begin(), lengths.end(), [&](int64_t n) { return n < 0 || n > seq; }))
            ctx.fail(fmt::format("sequence_lens must hold {} lengths within [0, {}]", batch, seq));
        if (ctx.has_input(3) && (ctx.input(3).type() != DataType::Float || ctx.input(3).size() != dirs * 2 * gates * hidden))
            ctx.fail(fmt::format("B must hold {} float values", dirs * 2 * gates * hidden));
        for (size_t slot : {size_t{5}, size_t{6}})
            if (ctx.has_input(slot) &&
                (ctx.input(slot).type() != DataType::Float || ctx.input(slot).size() != dirs * batch * hidden))
                ctx.fail(fmt::format("an initial state must hold {} float values", dirs * batch * hidden));
        x = x_in.data<float>();
        w = wt.data<float>();
        r = rt.data<float>();
        if (ctx.has_input(3)) bias = ctx.input(3).data<float>();
        y = Tensor(DataType::Float, batch_major ? std::vector<int64_t>{batch, seq, dirs, hidden}
                                                : std::vector<int64_t>{seq, dirs, batch, hidden});
        y_h = Tensor(DataType::Float, state_shape());
    }

    Recurrence(KernelContext& ctx, int64_t gates, const std::vector<std::string>& default_acts)
        : Recurrence(ctx, gates, default_acts, ctx.input(0), ctx.input(1), ctx.input(2)) {}

    std::vector<int64_t> state_shape() const {
        return batch_major ? std::vector<int64_t>{batch, dirs, hidden} : std::vector<int64_t>{dirs, batch, hidden};
    }
    int64_t x_index(int64_t t, int64_t b) const { return batch_major ? b * seq + t : t * batch + b; }
    const float* x_row(int64_t t, int64_t b) const { return x.data() + x_index(t, b) * in_size; }
    int64_t y_index(int64_t t, int64_t d, int64_t b, int64_t k) const {
        return batch_major ? ((b * seq + t) * dirs + d) * hidden + k : ((t * dirs + d) * batch + b) * hidden + k;
    }
    int64_t state_index(int64_t d, int64_t b, int64_t k) const {
        return batch_major ? (b * dirs + d) * hidden + k : (d * batch + b) * hidden + k;
    }
    bool reversed(int64_t d) const { return direction == "reverse" || d == 1; }
    float clipped(float v) const { return clip > 0 ? std::clamp(v, -clip, clip) : v; }
    // A gate row through activation `a`, the clip bounding what enters it.
    void activate(const Activation& a, float* row) const {
        if (clip > 0)
            for (int64_t k = 0; k < hidden; ++k) row[k] = clipped(row[k]);
        a.row(row, hidden);
    }
    // Every batch row's initial state (input `slot`, or zeros) of direction d, [batch, hidden].
    std::vector<float> initial_rows(KernelContext& ctx, size_t slot, int64_t d) const {
        std::vector<float> rows;
        for (int64_t b = 0; b < batch; ++b) {
            const auto s = initial(ctx, slot, d, b);
            rows.insert(rows.end(), s.begin(), s.end());
        }
        return rows;
    }
    // Initial state input `slot` (or zeros) for direction d, batch b.
    std::vector<float> initial(KernelContext& ctx, size_t slot, int64_t d, int64_t b) const {
        std::vector<float> s(static_cast<size_t>(hidden), 0.0f);
        if (ctx.has_input(slot))
            for (int64_t k = 0; k < hidden; ++k) s[k] = ctx.input(slot).data<float>()[state_index(d, b, k)];
        return s;
    }
    // x_t W_g^T for gate row gi of direction d.
    double input_term(int64_t d, int64_t gates, int64_t gi, int64_t t, int64_t b) const {
        return dot(x_row(t, b), w.data() + (d * gates * hidden + gi) * in_size, in_size);
    }
    // h R_g^T for gate row gi of direction d.
    double recurrent_term(int64_t d, int64_t gates, int64_t gi, const std::vector<float>& h) const {
        return dot(h.data(), r.data() + (d * gates * hidden + gi) * hidden, hidden);
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

// Rows of `m` ([rows, cols], row-major) as columns: [cols, rows].
std::vector<float> transposed(const float* m, int64_t rows, int64_t cols) {
    std::vector<float> t(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) t[static_cast<size_t>(c * rows + r)] = m[r * cols + c];
    return t;
}

// An LSTM's W and R of each direction as the columns its products read
// ([inputs, 4 x hidden] and [hidden, 4 x hidden]); kept across runs when
// they are constants.
struct LstmColumns {
    std::vector<std::vector<float>> w, r;
};

LstmColumns lstm_columns(const Recurrence& rc) {
    LstmColumns out;
    const int64_t width = 4 * rc.hidden;
    for (int64_t d = 0; d < rc.dirs; ++d) {
        out.w.push_back(transposed(rc.w.data() + d * width * rc.in_size, width, rc.in_size));
        out.r.push_back(transposed(rc.r.data() + d * width * rc.hidden, width, rc.hidden));
    }
    return out;
}

// What `make` builds, from the node's state when `constant` (built on its first run).
template <typename T, typename Make>
const T& cached(KernelContext& ctx, bool constant, T& fresh, const Make& make) {
    if (!constant) return fresh = make();
    auto state = std::static_pointer_cast<T>(ctx.state);
    if (!state) {
        state = std::make_shared<T>(make());
        ctx.state = state;
    }
    return *state;
}

// A GRU's W and R of each direction as the columns its products read: W's
// [inputs, 3 x hidden], R's update and reset rows [hidden, 2 x hidden] and its
// hidden rows [hidden, hidden] (which read the reset state unless
// linear_before_reset).
struct GruColumns {
    std::vector<std::vector<float>> w, update_reset, hidden;
};

GruColumns gru_columns(const Recurrence& rc) {
    GruColumns out;
    const int64_t n = rc.hidden, width = 3 * n;
    for (int64_t d = 0; d < rc.dirs; ++d) {
        const float* r = rc.r.data() + d * width * n;
        out.w.push_back(transposed(rc.w.data() + d * width * rc.in_size, width, rc.in_size));
        out.update_reset.push_back(transposed(r, 2 * n, n));
        out.hidden.push_back(transposed(r + 2 * n * n, n, n));
    }
    return out;
}

// The GRU on whole products: every step's input products at once, then each
// step's recurrent ones; the gates' activations a row at a time.
void gru(KernelContext& ctx, std::vector<Tensor>& out) {
    Recurrence rc(ctx, 3, {"Sigmoid", "Tanh"});
    const bool linear_before_reset = ctx.attributes.get_int("linear_before_reset", 0) != 0;
    const int64_t n = rc.hidden, width = 3 * n;
    GruColumns fresh;
    const auto& columns = cached(ctx, ctx.is_constant(1) && ctx.is_constant(2), fresh, [&] { return gru_columns(rc); });
    auto yv = rc.y.mutable_data<float>();
    int64_t longest = 0;
    for (auto l : rc.lengths) longest = std::max(longest, l);
    const auto rows = static_cast<size_t>(rc.batch);
    std::vector<float> input_products(static_cast<size_t>(rc.seq * rc.batch * width));
    std::vector<float> states(rows * n), update_reset(rows * 2 * n), hidden(rows * n), reset_states(rows * n);
    std::vector<float> gates(rows * 2 * n), candidate(static_cast<size_t>(n));
    for (int64_t d = 0; d < rc.dirs; ++d) {
        const Activation &f = rc.act[2 * d], &g = rc.act[2 * d + 1];
        ort_sgemm(rc.x.data(), columns.w[d].data(), input_products.data(), rc.seq * rc.batch, rc.in_size, width);
        states = rc.initial_rows(ctx, 5, d);
        for (int64_t step = 0; step < longest; ++step) {
            ort_sgemm(states.data(), columns.update_reset[d].data(), update_reset.data(), rc.batch, n, 2 * n);
            if (linear_before_reset) ort_sgemm(states.data(), columns.hidden[d].data(), hidden.data(), rc.batch, n, n);
            auto time = [&](int64_t b) { return rc.reversed(d) ? rc.lengths[b] - 1 - step : step; };
            // z and r of every row that still runs; r h for the hidden product that reads it.
            for (int64_t b = 0; b < rc.batch; ++b) {
                float* zr = gates.data() + b * 2 * n;
                const float* h = states.data() + b * n;
                if (step >= rc.lengths[b]) {
                    std::fill(reset_states.begin() + b * n, reset_states.begin() + (b + 1) * n, 0.0f);
                    continue;
                }
                const float* xr = input_products.data() + rc.x_index(time(b), b) * width;
                for (int64_t gi = 0; gi < 2 * n; ++gi)
                    zr[gi] = (xr[gi] + update_reset[b * 2 * n + gi]) + (rc.wb(d, 3, gi) + rc.rb(d, 3, gi));
                rc.activate(f, zr);
                rc.activate(f, zr + n);
                for (int64_t k = 0; k < n; ++k) reset_states[b * n + k] = zr[n + k] * h[k];
            }
            if (!linear_before_reset)
                ort_sgemm(reset_states.data(), columns.hidden[d].data(), hidden.data(), rc.batch, n, n);
            for (int64_t b = 0; b < rc.batch; ++b) {
                if (step >= rc.lengths[b]) continue;
                const int64_t t = time(b);
                const float* xr = input_products.data() + rc.x_index(t, b) * width + 2 * n;
                const float *z = gates.data() + b * 2 * n, *r = z + n, *hh = hidden.data() + b * n;
                float* h = states.data() + b * n;
                for (int64_t k = 0; k < n; ++k) {
                    const float rb = rc.rb(d, 3, 2 * n + k), wb = rc.wb(d, 3, 2 * n + k);
                    candidate[k] =
                        linear_before_reset ? (xr[k] + r[k] * (hh[k] + rb)) + wb : ((xr[k] + hh[k]) + rb) + wb;
                }
                rc.activate(g, candidate.data());
                for (int64_t k = 0; k < n; ++k) {
                    h[k] = (1.0f - z[k]) * candidate[k] + z[k] * h[k];
                    yv[rc.y_index(t, d, b, k)] = h[k];
                }
            }
        }
        for (int64_t b = 0; b < rc.batch; ++b)
            for (int64_t k = 0; k < n; ++k) rc.y_h.mutable_data<float>()[rc.state_index(d, b, k)] = states[b * n + k];
    }
    rc.finish(out);
}

// The LSTM as ONNX Runtime computes it: the input products of every step in one
// product, then each step's recurrent products, gate = (x W + h R) + (Wb + Rb),
// MLAS's logistic and tanh a gate row at a time. Time-major, so that every
// batch row's hidden state at a step is known before the next: `quantize_state`
// sees them together (the rows of one direction) before they enter the
// recurrent product (when given).
void run_lstm(KernelContext& ctx, Recurrence& rc, const LstmColumns& columns, std::vector<Tensor>& out,
              const std::function<void(std::span<float> states)>& quantize_state) {
    const bool input_forget = ctx.attributes.get_int("input_forget", 0) != 0;
    if (ctx.has_input(7) && (ctx.input(7).type() != DataType::Float || ctx.input(7).size() != rc.dirs * 3 * rc.hidden))
        ctx.fail(fmt::format("P must hold {} float values", rc.dirs * 3 * rc.hidden));
    const std::span<const float> peep = ctx.has_input(7) ? ctx.input(7).data<float>() : std::span<const float>();
    const int64_t n = rc.hidden, width = 4 * n;
    Tensor y_c(DataType::Float, rc.state_shape());
    auto yv = rc.y.mutable_data<float>();
    int64_t longest = 0;
    for (auto l : rc.lengths) longest = std::max(longest, l);
    std::vector<float> input_products(static_cast<size_t>(rc.seq * rc.batch * width));
    std::vector<float> recurrent_products(static_cast<size_t>(rc.batch * width)),
        states(static_cast<size_t>(rc.batch * n));
    std::vector<float> gates(static_cast<size_t>(width)), squashed(static_cast<size_t>(n)),
        bias(static_cast<size_t>(width));
    for (int64_t d = 0; d < rc.dirs; ++d) {
        const Activation &f = rc.act[3 * d], &g = rc.act[3 * d + 1], &h = rc.act[3 * d + 2];
        ort_sgemm(rc.x.data(), columns.w[d].data(), input_products.data(), rc.seq * rc.batch, rc.in_size, width);
        for (int64_t gi = 0; gi < width; ++gi) bias[gi] = rc.wb(d, 4, gi) + rc.rb(d, 4, gi);
        auto hs = rc.initial_rows(ctx, 5, d), cs = rc.initial_rows(ctx, 6, d);
        const float* peep_i = peep.empty() ? nullptr : peep.data() + d * 3 * n;
        for (int64_t step = 0; step < longest; ++step) {
            states = hs;  // the state the recurrent product reads
            if (quantize_state) quantize_state(states);
            ort_sgemm(states.data(), columns.r[d].data(), recurrent_products.data(), rc.batch, n, width);
            for (int64_t b = 0; b < rc.batch; ++b) {
                if (step >= rc.lengths[b]) continue;
                const int64_t t = rc.reversed(d) ? rc.lengths[b] - 1 - step : step;
                const float* xr = input_products.data() + rc.x_index(t, b) * width;
                const float* hr = recurrent_products.data() + b * width;
                for (int64_t gi = 0; gi < width; ++gi) gates[gi] = (xr[gi] + hr[gi]) + bias[gi];
                float *in_gate = gates.data(), *out_gate = in_gate + n, *forget = in_gate + 2 * n,
                      *cell = in_gate + 3 * n;
                float* c = cs.data() + b * n;
                if (peep_i)
                    for (int64_t k = 0; k < n; ++k) {
                        in_gate[k] += peep_i[k] * c[k];
                        forget[k] += peep_i[2 * n + k] * c[k];
                    }
                rc.activate(f, in_gate);
                if (input_forget)
                    for (int64_t k = 0; k < n; ++k) forget[k] = 1.0f - in_gate[k];
                else
                    rc.activate(f, forget);
                rc.activate(g, cell);
                for (int64_t k = 0; k < n; ++k) c[k] = c[k] * forget[k] + in_gate[k] * cell[k];
                if (peep_i)
                    for (int64_t k = 0; k < n; ++k) out_gate[k] += peep_i[n + k] * c[k];
                rc.activate(f, out_gate);
                std::copy(c, c + n, squashed.begin());
                h.row(squashed.data(), n);
                for (int64_t k = 0; k < n; ++k) {
                    hs[b * n + k] = out_gate[k] * squashed[k];
                    yv[rc.y_index(t, d, b, k)] = hs[b * n + k];
                }
            }
        }
        for (int64_t b = 0; b < rc.batch; ++b)
            for (int64_t k = 0; k < n; ++k) {
                rc.y_h.mutable_data<float>()[rc.state_index(d, b, k)] = hs[b * n + k];
                y_c.mutable_data<float>()[rc.state_index(d, b, k)] = cs[b * n + k];
            }
    }
    rc.finish(out);
    if (out.size() > 2) out[2] = std::move(y_c);
}

void lstm(KernelContext& ctx, std::vector<Tensor>& out) {
    Recurrence rc(ctx, 4, {"Sigmoid", "Tanh", "Tanh"});
    LstmColumns fresh;
    run_lstm(ctx, rc, cached(ctx, ctx.is_constant(1) && ctx.is_constant(2), fresh, [&] { return lstm_columns(rc); }),
             out, {});
}

// ONNX Runtime's run-time quantization of a GEMM input: uint8 over the
// block's range widened to include 0, round half to even. Values are replaced
// by what the integers stand for.
void fake_quantize_u8(std::span<float> block) {
    float lo = 0.0f, hi = 0.0f;
    for (float v : block) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
    }
    const float scale = hi == lo ? 1.0f : (hi - lo) / 255.0f;
    const float zero_point = std::nearbyint(std::clamp(0.0f - lo / scale, 0.0f, 255.0f));
    for (float& v : block) v = (std::clamp(std::nearbyint(v / scale) + zero_point, 0.0f, 255.0f) - zero_point) * scale;
}

// A DynamicQuantizeLSTM weight ([dirs, cols, rows] integers, transposed) as the
// float [dirs, rows, cols] an LSTM reads, with its per-direction or per-row parameters.
template <typename T>
Tensor dequantized_weight(const Tensor& q, const Tensor& scale, const Tensor& zero_point) {
    const auto& s = q.shape();
    const int64_t dirs = s[0], cols = s[1], rows = s[2];
    const auto sv = scale.data<float>();
    const auto zv = zero_point.data<T>();
    const bool per_row = static_cast<int64_t>(sv.size()) == dirs * rows;
    Tensor out(DataType::Float, {dirs, rows, cols});
    auto o = out.mutable_data<float>();
    const auto v = q.data<T>();
    for (int64_t d = 0; d < dirs; ++d)
        for (int64_t r = 0; r < rows; ++r) {
            const auto p = static_cast<size_t>(per_row ? d * rows + r : d);
            for (int64_t c = 0; c < cols; ++c)
                o[static_cast<size_t>((d * rows + r) * cols + c)] =
                    static_cast<float>(static_cast<int32_t>(v[static_cast<size_t>((d * cols + c) * rows + r)]) -
                                       static_cast<int32_t>(zv[p])) *
                    sv[p];
        }
    return out;
}

// com.microsoft DynamicQuantizeLSTM as ONNX Runtime computes it: X quantized
// as one block for the input products, each step's hidden states (all batch
// rows of a direction) as one block for the recurrent product; weights
// dequantized exactly.
void dynamic_quantize_lstm(KernelContext& ctx, std::vector<Tensor>& out) {
    auto weight = [&](int values, int scale, int zero_point) {
        const auto& q = ctx.input(values);
        if (q.shape().size() != 3) ctx.fail("W and R must have rank 3");
        const auto& s = ctx.input(scale);
        const auto& z = ctx.input(zero_point);
        if (s.size() != q.shape()[0] && s.size() != q.shape()[0] * q.shape()[2])
            ctx.fail("a weight scale holds one value per direction or per gate row");
        if (z.size() != s.size() || z.type() != q.type()) ctx.fail("a weight zero point must match its scale and type");
        if (q.type() == DataType::Int8) return dequantized_weight<int8_t>(q, s, z);
        if (q.type() == DataType::UInt8) return dequantized_weight<uint8_t>(q, s, z);
        ctx.fail("W and R must be int8 or uint8");
    };
    const Tensor w = weight(1, 8, 9), r = weight(2, 10, 11);
    if (ctx.input(0).type() != DataType::Float) ctx.fail("X must be float");
    Tensor x = ctx.input(0);
    fake_quantize_u8(x.mutable_data<float>());
    Recurrence rc(ctx, 4, {"Sigmoid", "Tanh", "Tanh"}, x, w, r);
    bool constant = true;
    for (size_t slot : {1, 2, 8, 9, 10, 11}) constant = constant && ctx.is_constant(slot);
    LstmColumns fresh;
    run_lstm(ctx, rc, cached(ctx, constant, fresh, [&] { return lstm_columns(rc); }), out, fake_quantize_u8);
}

const KernelRegistration kKernels[] = {
    {"", "RNN", 7, 21, rnn},
    {"", "GRU", 7, 21, gru},
    {"", "LSTM", 7, 21, lstm},
    {"com.microsoft", "DynamicQuantizeLSTM", 1, 1, dynamic_quantize_lstm},
};

}  // namespace
}  // namespace vaiq::runtime
