// Elementwise kernels: arithmetic, comparison and logic with numpy
// broadcasting, variadic folds, Where, and unary math.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "runtime/kernels/common.hpp"
#include "runtime/kernels/ort_float.hpp"
#include "runtime/layout.hpp"

namespace vaiq::runtime {
namespace {

template <typename Op>
void arithmetic(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& a = ctx.input(0);
    const auto& b = ctx.input(1);
    if (a.type() != b.type()) ctx.fail("the inputs have different element types");
    dispatch_numeric(a.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const auto op = [](T x, T y) { return static_cast<T>(Op{}(x, y)); };
        // Operands of one shape: the result goes into a donated one's buffer
        // (each element is read before it is written).
        for (size_t k = 0; k < ctx.donated.size() && k < 2 && a.shape() == b.shape(); ++k) {
            if (!ctx.donated[k]) continue;
            const auto x = view<T>(a);  // the buffers outlive the move below
            const auto y = view<T>(b);
            Tensor result = ctx.take_input(k);
            auto o = mutable_view<T>(result);
            const auto n = static_cast<int64_t>(o.size());
            parallel_for(n, n > kParallelGrain, [&](int64_t i) { o[i] = op(x[i], y[i]); });
            out[0] = std::move(result);
            return;
        }
        out[0] = broadcast_binary<T, T>(ctx, a, b, op);
    });
}

struct Divide {
    template <typename T>
    T operator()(T x, T y) const {
        if constexpr (std::is_integral_v<T>)
            return y == 0 ? T{0} : static_cast<T>(x / y);
        else
            return x / y;
    }
};

void pow_kernel(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& base = ctx.input(0);
    const auto& exponent = ctx.input(1);
    if (base.type() == DataType::Float && exponent.size() == 1) {
        // x^2 (variance in LayerNorm), x^0.5 and friends without pow().
        const double e = read_scalar(ctx, exponent);
        out[0] = Tensor(DataType::Float, base.shape());
        auto o = out[0].mutable_data<float>();
        const auto x = base.data<float>();
        const auto n = static_cast<int64_t>(o.size());
        if (e == 2.0) {
            parallel_for(n, n > kParallelGrain, [&](int64_t i) { o[i] = x[i] * x[i]; });
        } else if (e == 0.5) {
            parallel_for(n, n > kParallelGrain, [&](int64_t i) { o[i] = std::sqrt(x[i]); });
        } else {
            const float ef = static_cast<float>(e);
            parallel_for(n, n > kParallelGrain, [&](int64_t i) { o[i] = std::pow(x[i], ef); });
        }
        return;
    }
    dispatch_numeric(base.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        // The exponent may have its own type (opset 12): read it as double.
        Tensor e(DataType::Double, exponent.shape());
        dispatch(exponent.type(), ctx, [&](auto etag) {
            using E = typename decltype(etag)::type;
            auto src = view<E>(exponent);
            auto dst = e.mutable_data<double>();
            for (size_t i = 0; i < src.size(); ++i) dst[i] = static_cast<double>(src[i]);
        });
        Tensor b(DataType::Double, base.shape());
        auto bsrc = view<T>(base);
        auto bdst = b.mutable_data<double>();
        for (size_t i = 0; i < bsrc.size(); ++i) bdst[i] = static_cast<double>(bsrc[i]);
        Tensor d = broadcast_binary<double, double>(ctx, b, e, [](double x, double y) { return std::pow(x, y); });
        out[0] = make_tensor<T>(d.shape());
        auto o = mutable_view<T>(out[0]);
        auto r = d.data<double>();
        // 0 to a negative power is infinite: saturate (NaN becomes 0) rather than convert out of range.
        for (size_t i = 0; i < o.size(); ++i) {
            const double v = r[i];
            o[i] = std::isnan(v)                                                ? T{0}
                   : v >= static_cast<double>(std::numeric_limits<T>::max())    ? std::numeric_limits<T>::max()
                   : v <= static_cast<double>(std::numeric_limits<T>::lowest()) ? std::numeric_limits<T>::lowest()
                                                                               : static_cast<T>(v);
        }
    });
}

void mod_kernel(KernelContext& ctx, std::vector<Tensor>& out) {
    const bool fmod = ctx.attributes.get_int("fmod", 0) != 0;
    const auto& a = ctx.input(0);
    dispatch_numeric(a.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (std::is_floating_point_v<T>) {
            if (!fmod) ctx.fail("floating-point Mod needs fmod=1");
            out[0] = broadcast_binary<T, T>(ctx, a, ctx.input(1), [](T x, T y) { return std::fmod(x, y); });
        } else {
            out[0] = broadcast_binary<T, T>(ctx, a, ctx.input(1), [fmod](T x, T y) -> T {
                if (y == 0) return 0;
                T r = static_cast<T>(x % y);
                // Python's modulo takes the divisor's sign; fmod the dividend's.
                if (!fmod && r != 0 && ((r < 0) != (y < 0))) r = static_cast<T>(r + y);
                return r;
            });
        }
    });
}

template <typename Op>
void comparison(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& a = ctx.input(0);
    if (a.type() != ctx.input(1).type()) ctx.fail("the inputs have different element types");
    dispatch(a.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        out[0] = broadcast_binary<T, bool>(ctx, a, ctx.input(1), [](T x, T y) { return Op{}(x, y); });
    });
}

template <typename Op>
void logical(KernelContext& ctx, std::vector<Tensor>& out) {
    if (ctx.input(0).type() != DataType::Bool || ctx.input(1).type() != DataType::Bool) ctx.fail("inputs must be bool");
    out[0] = broadcast_binary<bool, bool>(ctx, ctx.input(0), ctx.input(1), [](bool x, bool y) { return Op{}(x, y); });
}

struct NotEqual {
    bool operator()(bool x, bool y) const { return x != y; }
};

void not_kernel(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    if (x.type() != DataType::Bool) ctx.fail("input must be bool");
    out[0] = map_elements<bool>(x, [](bool v) { return !v; });
}

// Max, Min, Sum, Mean over any number of inputs, broadcasting pairwise.
template <typename Fold, bool kMean = false>
void variadic(KernelContext& ctx, std::vector<Tensor>& out) {
    if (ctx.input_count() == 0) ctx.fail("needs at least one input");
    dispatch_numeric(ctx.input(0).type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        Tensor acc = ctx.input(0);
        for (size_t i = 1; i < ctx.input_count(); ++i)
            acc = broadcast_binary<T, T>(ctx, acc, ctx.input(i), [](T x, T y) { return static_cast<T>(Fold{}(x, y)); });
        if constexpr (kMean) {
            auto v = mutable_view<T>(acc);
            for (auto& x : v) x = static_cast<T>(x / static_cast<T>(ctx.input_count()));
        }
        out[0] = std::move(acc);
    });
}

// Max and Min, propagating NaN as the spec requires.
template <bool kMax>
struct Extreme {
    template <typename T>
    T operator()(T x, T y) const {
        if constexpr (std::is_floating_point_v<T>)
            if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<T>::quiet_NaN();
        return kMax ? std::max(x, y) : std::min(x, y);
    }
};

void where_kernel(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& c = ctx.input(0);
    const auto& x = ctx.input(1);
    const auto& y = ctx.input(2);
    if (c.type() != DataType::Bool) ctx.fail("the condition must be bool");
    if (x.type() != y.type())
        ctx.fail(fmt::format("the two choices have different element types ({} and {})", data_type_name(x.type()),
                             data_type_name(y.type())));
    const auto shape = broadcast_shapes(ctx, broadcast_shapes(ctx, c.shape(), x.shape()), y.shape());
    const auto ic = broadcast_index(c.shape(), shape);
    const auto ix = broadcast_index(x.shape(), shape);
    const auto iy = broadcast_index(y.shape(), shape);
    dispatch(x.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        out[0] = make_tensor<T>(shape);
        auto o = mutable_view<T>(out[0]);
        auto cv = view<bool>(c);
        auto xv = view<T>(x);
        auto yv = view<T>(y);
        for (size_t i = 0; i < o.size(); ++i) o[i] = cv[ic[i]] ? xv[ix[i]] : yv[iy[i]];
    });
}

// Unary float kernels. `make` reads the node's attributes once and returns the
// per-element function (computed in double, stored as T).
template <typename Make>
KernelFn unary_float(Make make) {
    return [make](KernelContext& ctx, std::vector<Tensor>& out) {
        const auto& x = ctx.input(0);
        const auto f = make(ctx.attributes);
        dispatch_float(x.type(), ctx, [&](auto tag) {
            using T = typename decltype(tag)::type;
            // Transcendental functions pay for threads on smaller tensors.
            out[0] = map_elements<T>(
                x, [&](T v) { return static_cast<T>(f(static_cast<double>(v))); }, kParallelGrain / 8);
        });
    };
}

// HardSigmoid in the input's precision (float16 in float): alpha * x, rounded,
// plus beta, rounded, as ONNX Runtime computes it (one rounding in double
// differs on near ties that a following QuantizeLinear then sees), clamped to [0, 1].
void hard_sigmoid(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const float alpha = ctx.attributes.get_float("alpha", 0.2f), beta = ctx.attributes.get_float("beta", 0.5f);
    dispatch_float(x.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
        // Captured by value and clamped as max(0, r) then min(1, r) (std::clamp's
        // branches, NaN kept), so that the loop vectorises (see map_range).
        out[0] = map_input<T>(ctx, 0, [alpha, beta](T v) {
            const C product = static_cast<C>(alpha) * static_cast<C>(v);
            C r = product + static_cast<C>(beta);
            r = C{0} > r ? C{0} : r;
            r = C{1} < r ? C{1} : r;
            return static_cast<T>(r);
        });
    });
}

// LeakyRelu. On float it multiplies in float, in place where the input is
// donated: the product of two floats is exact in double, so rounding it once
// to float gives the same bits as the double path, whose conversions (on
// threads, as for a transcendental function) cost more than the multiply.
void leaky_relu(KernelContext& ctx, std::vector<Tensor>& out) {
    const float alpha = ctx.attributes.get_float("alpha", 0.01f);
    if (ctx.input(0).type() == DataType::Float) {
        out[0] = map_input<float>(ctx, 0, [alpha](float v) { return v < 0 ? v * alpha : v; });
        return;
    }
    dispatch_float(ctx.input(0).type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        out[0] = map_elements<T>(ctx.input(0), [alpha](T v) {
            const double x = static_cast<double>(v);
            return static_cast<T>(x < 0 ? x * alpha : x);
        });
    });
}

// For functions without attributes.
template <typename F>
KernelFn unary_float_fn(F f) {
    return unary_float([f](const Attributes&) { return f; });
}

template <typename F>
KernelFn unary_numeric(F f) {
    return [f](KernelContext& ctx, std::vector<Tensor>& out) {
        dispatch_numeric(ctx.input(0).type(), ctx, [&](auto tag) {
            using T = typename decltype(tag)::type;
            out[0] = map_input<T>(ctx, 0, f);
        });
    };
}

void identity(KernelContext& ctx, std::vector<Tensor>& out) { out[0] = ctx.take_input(0); }

void is_nan(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    dispatch_float(x.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        out[0] = map_elements<T, bool>(x, [](T v) { return std::isnan(v); });
    });
}

void is_inf(KernelContext& ctx, std::vector<Tensor>& out) {
    const bool neg = ctx.attributes.get_int("detect_negative", 1) != 0;
    const bool pos = ctx.attributes.get_int("detect_positive", 1) != 0;
    const auto& x = ctx.input(0);
    dispatch_float(x.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        out[0] = map_elements<T, bool>(x, [&](T v) { return std::isinf(v) && ((v > 0 && pos) || (v < 0 && neg)); });
    });
}

void clip(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    dispatch_numeric(x.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        T lo = std::numeric_limits<T>::lowest();
        T hi = std::numeric_limits<T>::max();
        if (ctx.opset < 11) {
            lo = static_cast<T>(ctx.attributes.get_float("min", -std::numeric_limits<float>::max()));
            hi = static_cast<T>(ctx.attributes.get_float("max", std::numeric_limits<float>::max()));
        } else {
            if (ctx.has_input(1)) lo = view<T>(ctx.input(1))[0];
            if (ctx.has_input(2)) hi = view<T>(ctx.input(2))[0];
        }
        out[0] = map_input<T>(ctx, 0, [lo, hi](T v) { return std::min(std::max(v, lo), hi); });
    });
}

void prelu(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    dispatch_numeric(x.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        out[0] =
            broadcast_binary<T, T>(ctx, x, ctx.input(1), [](T v, T s) { return v < 0 ? static_cast<T>(v * s) : v; });
    });
}

Tensor numeric_cast(const Tensor& x, DataType to, const KernelContext& ctx) {
    Tensor result;
    dispatch(x.type(), ctx, [&](auto from_tag) {
        using From = typename decltype(from_tag)::type;
        dispatch(to, ctx, [&](auto to_tag) {
            using To = typename decltype(to_tag)::type;
            result = map_elements<From, To>(x, [](From v) {
                if constexpr (std::is_same_v<To, bool>) {
                    return v != From{0};
                } else if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
                    // ONNX leaves NaN and out-of-range values undefined (so is C++'s conversion):
                    // NaN becomes 0, the rest saturates.
                    if (std::isnan(v)) return To{0};
                    if (v <= static_cast<From>(std::numeric_limits<To>::min())) return std::numeric_limits<To>::min();
                    if (v >= static_cast<From>(std::numeric_limits<To>::max())) return std::numeric_limits<To>::max();
                    return static_cast<To>(v);
                } else {
                    return static_cast<To>(v);
                }
            });
        });
    });
    return result;
}

bool is_16_bit_float(DataType t) { return t == DataType::Float16 || t == DataType::BFloat16; }

// Cast between numeric types and bool; float16 and bfloat16 go through float,
// as ONNX Runtime converts them. CastLike takes the target type from its second input.
void cast(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto to =
        ctx.node.op_type() == "CastLike" ? ctx.input(1).type() : static_cast<DataType>(ctx.attributes.get_int("to", 0));
    if (!is_16_bit_float(x.type()) && !is_16_bit_float(to)) {
        out[0] = numeric_cast(x, to, ctx);
        return;
    }
    const Tensor as_float =
        is_16_bit_float(x.type()) ? x.convert_float(DataType::Float) : numeric_cast(x, DataType::Float, ctx);
    out[0] = is_16_bit_float(to) ? as_float.convert_float(to) : numeric_cast(as_float, to, ctx);
}

double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x)); }

using A = const Attributes&;

// Runs a float kernel over a tensor in chunks across threads. Chunks are whole
// 16-lane blocks, so a kernel that treats the last n % 16 elements apart (MLAS's
// GELU) sees the same tail as in one call.
template <typename F>
Tensor chunked_float(const Tensor& x, F kernel) {
    Tensor y = Tensor::uninitialized(DataType::Float, x.shape());
    const float* in = x.data<float>().data();
    float* o = y.mutable_data<float>().data();
    const int64_t n = x.size();
    constexpr int64_t kChunk = kParallelGrain;
    static_assert(kChunk % 16 == 0);
    parallel_for_pieces(n, kChunk, n > 2 * kChunk,
                        [&](int64_t start, int64_t end) { kernel(in + start, o + start, end - start); });
    return y;
}

// Erf as ONNX Runtime computes it (MLAS's polynomial), for float; doubles exactly.
void erf(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    if (x.type() == DataType::Float) {
        out[0] = chunked_float(x, ort_erf);
        return;
    }
    unary_float_fn([](double v) { return std::erf(v); })(ctx, out);
}

// Sigmoid as ONNX Runtime computes it (MLAS's polynomial), for float; doubles exactly.
void sigmoid_kernel(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    if (x.type() == DataType::Float) {
        out[0] = chunked_float(x, ort_logistic);
        return;
    }
    unary_float_fn([](double v) { return sigmoid(v); })(ctx, out);
}

// Gelu (com.microsoft, and ONNX from opset 20 without the tanh approximation):
// 0.5 x (1 + erf(x / sqrt 2)), as ONNX Runtime computes it.
void gelu(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    if (x.type() != DataType::Float)
        ctx.fail("element type " + data_type_name(x.type()) + " is not supported (float is)");
    if (ctx.attributes.get_string("approximate", "none") != "none") ctx.fail("approximate='tanh' is not supported");
    out[0] = chunked_float(x, ort_gelu);
}

// A spelled-out HardSwish fused (runtime/layout.hpp): the float operations of
// x * Clip(x + offset, 0, 6), then / divisor or * factor, in their order and
// with the constants the nodes hold, so that it gives what they give, bit for
// bit, in one pass over memory.
void spelled_hard_swish(KernelContext& ctx, std::vector<Tensor>& out) {
    if (ctx.input(0).type() != DataType::Float) ctx.fail("only float is supported");
    const float offset = ctx.attributes.get_float("offset", 3.0f);
    const float divisor = ctx.attributes.get_float("divisor", 0.0f), factor = ctx.attributes.get_float("factor", 0.0f);
    if ((divisor == 0.0f) == (factor == 0.0f)) ctx.fail("needs one of the attributes divisor and factor");
    out[0] = map_input<float>(ctx, 0, [offset, divisor, factor](float x) {
        const float product = x * std::min(std::max(x + offset, 0.0f), 6.0f);
        return divisor != 0.0f ? product / divisor : product * factor;
    });
}

// Every kernel here shares its work only through parallel_for.hpp.
const KernelRegistrations kKernels(always_in_team, {
    {"com.microsoft", "Gelu", 1, 1, gelu},
    {"", "Gelu", 20, kLatest, gelu},
    {kInternalDomain, "Gelu", 0, 1, gelu},  // fused (runtime/layout.hpp)
    {"", "Add", 7, kLatest, arithmetic<std::plus<>>},
    {"", "Sub", 7, kLatest, arithmetic<std::minus<>>},
    {"", "Mul", 7, kLatest, arithmetic<std::multiplies<>>},
    {"", "Div", 7, kLatest, arithmetic<Divide>},
    {"", "Pow", 7, kLatest, pow_kernel},
    {"", "Mod", 10, kLatest, mod_kernel},
    {"", "Equal", 7, kLatest, comparison<std::equal_to<>>},
    {"", "Less", 7, kLatest, comparison<std::less<>>},
    {"", "Greater", 7, kLatest, comparison<std::greater<>>},
    {"", "LessOrEqual", 12, kLatest, comparison<std::less_equal<>>},
    {"", "GreaterOrEqual", 12, kLatest, comparison<std::greater_equal<>>},
    {"", "And", 7, kLatest, logical<std::logical_and<>>},
    {"", "Or", 7, kLatest, logical<std::logical_or<>>},
    {"", "Xor", 7, kLatest, logical<NotEqual>},
    {"", "Not", 1, kLatest, not_kernel},
    {"", "Max", 8, kLatest, variadic<Extreme<true>>},
    {"", "Min", 8, kLatest, variadic<Extreme<false>>},
    {"", "Sum", 8, kLatest, variadic<std::plus<>>},
    {"", "Mean", 8, kLatest, variadic<std::plus<>, true>},
    {"", "Where", 9, kLatest, where_kernel},
    {"", "Identity", 1, kLatest, identity},
    {"", "Cast", 6, kLatest, cast},
    {"", "CastLike", 15, kLatest, cast},
    {"", "IsNaN", 9, kLatest, is_nan},
    {"", "IsInf", 10, kLatest, is_inf},
    {"", "Clip", 6, kLatest, clip},
    {"", "PRelu", 9, kLatest, prelu},
    {"", "Relu", 6, kLatest, unary_numeric([](auto v) { return v < 0 ? decltype(v){0} : v; })},
    {"", "Neg", 6, kLatest, unary_numeric([](auto v) { return static_cast<decltype(v)>(-v); })},
    {"", "Abs", 6, kLatest, unary_numeric([](auto v) {
         if constexpr (std::is_unsigned_v<decltype(v)>)
             return v;
         else if constexpr (std::is_floating_point_v<decltype(v)>)
             return std::abs(v);  // -0 becomes +0, as ONNX Runtime computes it
         else
             return static_cast<decltype(v)>(v < 0 ? -v : v);
     })},
    {"", "Sign", 9, kLatest, unary_numeric([](auto v) {
         using T = decltype(v);
         return static_cast<T>(v > T{0} ? 1 : (v < T{0} ? -1 : 0));
     })},
    {"", "Exp", 6, kLatest, unary_float_fn([](double v) { return std::exp(v); })},
    {"", "Log", 6, kLatest, unary_float_fn([](double v) { return std::log(v); })},
    {"", "Sqrt", 6, kLatest, unary_float_fn([](double v) { return std::sqrt(v); })},
    {"", "Reciprocal", 6, kLatest, unary_float_fn([](double v) { return 1.0 / v; })},
    {"", "Floor", 6, kLatest, unary_float_fn([](double v) { return std::floor(v); })},
    {"", "Ceil", 6, kLatest, unary_float_fn([](double v) { return std::ceil(v); })},
    {"", "Round", 11, kLatest, unary_float_fn([](double v) { return std::nearbyint(v); })},
    {"", "Erf", 9, kLatest, erf},
    {"", "Tanh", 6, kLatest, unary_float_fn([](double v) { return std::tanh(v); })},
    {"", "Sigmoid", 6, kLatest, sigmoid_kernel},
    {"", "Sin", 7, kLatest, unary_float_fn([](double v) { return std::sin(v); })},
    {"", "Cos", 7, kLatest, unary_float_fn([](double v) { return std::cos(v); })},
    {"", "Tan", 7, kLatest, unary_float_fn([](double v) { return std::tan(v); })},
    {"", "Asin", 7, kLatest, unary_float_fn([](double v) { return std::asin(v); })},
    {"", "Acos", 7, kLatest, unary_float_fn([](double v) { return std::acos(v); })},
    {"", "Atan", 7, kLatest, unary_float_fn([](double v) { return std::atan(v); })},
    {"", "Sinh", 9, kLatest, unary_float_fn([](double v) { return std::sinh(v); })},
    {"", "Cosh", 9, kLatest, unary_float_fn([](double v) { return std::cosh(v); })},
    {"", "Asinh", 9, kLatest, unary_float_fn([](double v) { return std::asinh(v); })},
    {"", "Acosh", 9, kLatest, unary_float_fn([](double v) { return std::acosh(v); })},
    {"", "Atanh", 9, kLatest, unary_float_fn([](double v) { return std::atanh(v); })},
    {"", "Softplus", 1, kLatest,
     unary_float_fn([](double v) { return v > 0 ? v + std::log1p(std::exp(-v)) : std::log1p(std::exp(v)); })},
    {"", "Softsign", 1, kLatest, unary_float_fn([](double v) { return v / (1.0 + std::abs(v)); })},
    {"", "LeakyRelu", 6, kLatest, leaky_relu},
    {"", "Elu", 6, kLatest, unary_float([](A a) {
         const double alpha = a.get_float("alpha", 1.0f);
         return [alpha](double v) { return v < 0 ? alpha * std::expm1(v) : v; };
     })},
    {"", "Celu", 12, kLatest, unary_float([](A a) {
         const double alpha = a.get_float("alpha", 1.0f);
         return [alpha](double v) { return std::max(0.0, v) + std::min(0.0, alpha * std::expm1(v / alpha)); };
     })},
    {"", "Selu", 6, kLatest, unary_float([](A a) {
         const double alpha = a.get_float("alpha", 1.67326319217681884765625f);
         const double gamma = a.get_float("gamma", 1.05070102214813232421875f);
         return [alpha, gamma](double v) { return gamma * (v > 0 ? v : alpha * std::expm1(v)); };
     })},
    {"", "ThresholdedRelu", 10, kLatest, unary_float([](A a) {
         const double alpha = a.get_float("alpha", 1.0f);
         return [alpha](double v) { return v > alpha ? v : 0.0; };
     })},
    {"", "HardSigmoid", 6, kLatest, hard_sigmoid},
    {"", "HardSwish", 14, kLatest, unary_float_fn([](double v) { return v * std::clamp(v / 6.0 + 0.5, 0.0, 1.0); })},
    {kInternalDomain, "HardSwish", 0, 1, spelled_hard_swish},  // fused (runtime/layout.hpp)
});

}  // namespace
}  // namespace vaiq::runtime
