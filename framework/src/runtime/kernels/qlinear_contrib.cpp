// The com.microsoft QLinear* ops ONNX Runtime's QOperator format writes:
// each dequantizes its inputs, computes in float, and requantizes the result
// (round half to even, saturate), as ONNX Runtime defines them.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "runtime/cpu_features.hpp"
#include "runtime/kernels/common.hpp"
#include "runtime/kernels/intrinsics.hpp"
#include "runtime/kernels/window.hpp"
#include "runtime/layout.hpp"

namespace vaiq::runtime {
namespace {

constexpr const char* kMicrosoft = "com.microsoft";

struct QuantizedInput {
    const Tensor* data;
    float scale;
    int32_t zero_point;
};

QuantizedInput quantized(KernelContext& ctx, size_t data, size_t scale, size_t zero_point) {
    QuantizedInput q{&ctx.input(data), ctx.input(scale).data<float>()[0], 0};
    if (ctx.has_input(zero_point)) q.zero_point = static_cast<int32_t>(read_scalar(ctx, ctx.input(zero_point)));
    return q;
}

std::vector<float> dequantized(KernelContext& ctx, const QuantizedInput& q) {
    std::vector<float> out(static_cast<size_t>(q.data->size()));
    dispatch_numeric(q.data->type(), ctx, [&](auto tag) {
        using Q = typename decltype(tag)::type;
        const auto v = view<Q>(*q.data);
        for (size_t i = 0; i < v.size(); ++i)
            out[i] = static_cast<float>(static_cast<int32_t>(v[i]) - q.zero_point) * q.scale;
    });
    return out;
}

// Quantizes float values with the output scale/zero point, in the zero point's type
// (or the first input's type when there is no zero point).
Tensor requantized(KernelContext& ctx, const std::vector<int64_t>& shape, const std::vector<float>& values,
                   size_t scale_input, size_t zero_point_input, DataType fallback) {
    const float scale = ctx.input(scale_input).data<float>()[0];
    const DataType type = ctx.has_input(zero_point_input) ? ctx.input(zero_point_input).type() : fallback;
    const double zp = ctx.has_input(zero_point_input) ? read_scalar(ctx, ctx.input(zero_point_input)) : 0.0;
    return quantized_tensor(ctx, type, shape, zp, [&](size_t i) { return values[i] / scale; });
}

// A buffer of n floats for one thread's chunk, kept between calls: chunks would
// otherwise allocate and zero-fill their own, for values written once and read once.
float* chunk_floats(size_t n) {
    thread_local std::vector<float> buffer;
    if (buffer.size() < n) buffer.resize(n);
    return buffer.data();
}

// Values already scaled and shifted by the zero point, rounded half to even and
// saturated into `out`, uint8 or int8 as `type` says.
void round_to_8_bit(const float* values, DataType type, uint8_t* out, size_t n) {
    if (type == DataType::UInt8)
        quantize_8_bit_divided(values, out, n, 1.0f, 0.0f);
    else
        quantize_8_bit_divided(values, reinterpret_cast<int8_t*>(out), n, 1.0f, 0.0f);
}

// Calls f with a value of each input's 8-bit type (uint8_t or int8_t).
template <typename F>
void with_8_bit_types(DataType a, DataType b, F&& f) {
    const bool a_u8 = a == DataType::UInt8, b_u8 = b == DataType::UInt8;
    if (a_u8 && b_u8)
        f(uint8_t{}, uint8_t{});
    else if (a_u8)
        f(uint8_t{}, int8_t{});
    else if (b_u8)
        f(int8_t{}, uint8_t{});
    else
        f(int8_t{}, int8_t{});
}

// f(first, count) over n elements in chunks of `chunk`, spread over the threads.
template <typename F>
void for_each_chunk(size_t n, size_t chunk, F&& f) {
    const auto count = static_cast<int64_t>(n), piece = static_cast<int64_t>(chunk);
    parallel_for_pieces(count, piece, count > piece, [&](int64_t begin, int64_t end) {
        f(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
    });
}

// n 8-bit outputs a chunk at a time, one chunk per thread at a time:
// fill(first, count, values) writes the chunk's float values, which are rounded
// into y (of `type`) while still in cache.
template <typename Fill>
void round_in_chunks(size_t n, DataType type, uint8_t* y, Fill&& fill) {
    for_each_chunk(n, size_t{1} << 14, [&](size_t first, size_t count) {
        float* values = chunk_floats(count);
        fill(first, count, values);
        round_to_8_bit(values, type, y + first, count);
    });
}

bool is_8_bit(DataType type) { return type == DataType::UInt8 || type == DataType::Int8; }

// The 256 values of an 8-bit type: byte b holds the value whose bits are b.
Tensor every_8_bit_value(DataType type) {
    Tensor every = Tensor::uninitialized(type, {256});
    auto bytes = every.mutable_bytes();
    for (size_t b = 0; b < 256; ++b) bytes[b] = static_cast<std::byte>(b);
    return every;
}

// QLinearLeakyRelu / QLinearSigmoid: (X, X_scale, X_zp, Y_scale, Y_zp). An 8-bit
// input has 256 values: each one's result is computed once, the same way as
// element by element, and looked up (ONNX Runtime's kernels keep such a table
// too; an exp per element made QLinearSigmoid most of a swish network's time).
template <bool kSigmoid>
void qlinear_unary(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto x = quantized(ctx, 0, 1, 2);
    const float alpha = ctx.attributes.get_float("alpha", 0.01f);
    auto compute = [&](const QuantizedInput& q, const std::vector<int64_t>& shape) {
        auto v = dequantized(ctx, q);
        for (auto& f : v) f = kSigmoid ? 1.0f / (1.0f + std::exp(-f)) : (f < 0 ? f * alpha : f);
        return requantized(ctx, shape, v, 3, 4, q.data->type());
    };
    const DataType y_type = ctx.has_input(4) ? ctx.input(4).type() : x.data->type();
    if (!is_8_bit(x.data->type()) || !is_8_bit(y_type)) {
        out[0] = compute(x, x.data->shape());
        return;
    }
    const Tensor every = every_8_bit_value(x.data->type());
    const Tensor table = compute({&every, x.scale, x.zero_point}, {256});
    std::array<uint8_t, 256> t{};
    std::memcpy(t.data(), table.bytes().data(), t.size());
    const auto* __restrict in = reinterpret_cast<const uint8_t*>(x.data->bytes().data());
    Tensor y = Tensor::uninitialized(table.type(), x.data->shape());
    auto* __restrict o = reinterpret_cast<uint8_t*>(y.mutable_bytes().data());
    for_each_chunk(static_cast<size_t>(x.data->size()), size_t{1} << 16, [&](size_t first, size_t count) {
        for (size_t i = first; i < first + count; ++i) o[i] = t[in[i]];
    });
    out[0] = std::move(y);
}

// The raw integer values of a quantized input as floats (zero point not subtracted).
Tensor raw_floats(KernelContext& ctx, const Tensor& t) {
    Tensor out = Tensor::uninitialized(DataType::Float, t.shape());
    auto o = out.mutable_data<float>();
    dispatch_numeric(t.type(), ctx, [&](auto tag) {
        using Q = typename decltype(tag)::type;
        const auto v = view<Q>(t);
        for (size_t i = 0; i < v.size(); ++i) o[i] = static_cast<float>(v[i]);
    });
    return out;
}

// a * ratio_a + (b * ratio_b + fixed) with two fused multiply-adds per element,
// for rows of 8-bit inputs; compiled for FMA so the loop vectorises (the
// fallback calls the C library's exact fmaf: the same results).
template <typename A, typename B>
[[gnu::always_inline]] inline void add_scaled_rows(const A* a, const B* b, float* out, size_t n, float ratio_a,
                                                   float ratio_b, float fixed) {
    for (size_t i = 0; i < n; ++i)
        out[i] = std::fma(static_cast<float>(a[i]), ratio_a, std::fma(static_cast<float>(b[i]), ratio_b, fixed));
}

template <typename A, typename B>
[[gnu::target("avx2,fma")]] void add_scaled_fma(const A* a, const B* b, float* out, size_t n, float ratio_a,
                                                float ratio_b, float fixed) {
    add_scaled_rows(a, b, out, n, ratio_a, ratio_b, fixed);
}

template <typename A, typename B>
void add_scaled(const A* a, const B* b, float* out, size_t n, float ratio_a, float ratio_b, float fixed) {
    if (cpu_features().avx2 && cpu_features().fma)
        add_scaled_fma(a, b, out, n, ratio_a, ratio_b, fixed);
    else
        add_scaled_rows(a, b, out, n, ratio_a, ratio_b, fixed);
}

// 16 8-bit values as float lanes.
[[gnu::target("avx512f"), gnu::always_inline]] inline __m512 float_lanes(const uint8_t* v) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v))));
}
[[gnu::target("avx512f"), gnu::always_inline]] inline __m512 float_lanes(const int8_t* v) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v))));
}

// add_scaled and then round_to_8_bit in one pass, sixteen values at a time on
// AVX-512: the same two fused multiply-adds and the same rounding (half to
// even by adding and taking off 1.5 * 2^23, within +-2^21, saturated), so the
// same integers, without the sums going through a buffer. A residual Add of
// resnet50's int8 model at batch 8 took 0.26 ns a value the two-pass way.
template <typename A, typename B, typename Y>
[[gnu::target("avx512f")]] void add_rounded_avx512(const A* a, const B* b, Y* y, size_t n, float ratio_a,
                                                   float ratio_b, float fixed) {
    const __m512 ra = _mm512_set1_ps(ratio_a), rb = _mm512_set1_ps(ratio_b), constant = _mm512_set1_ps(fixed);
    const __m512 lo = _mm512_set1_ps(-2097152.0f), hi = _mm512_set1_ps(2097152.0f);
    const __m512 round = _mm512_set1_ps(12582912.0f);
    const __m512i y_min = _mm512_set1_epi32(std::numeric_limits<Y>::min());
    const __m512i y_max = _mm512_set1_epi32(std::numeric_limits<Y>::max());
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_fmadd_ps(float_lanes(a + i), ra, _mm512_fmadd_ps(float_lanes(b + i), rb, constant));
        v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
        const __m512i q = _mm512_cvttps_epi32(_mm512_sub_ps(_mm512_add_ps(v, round), round));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                         _mm512_cvtepi32_epi8(_mm512_min_epi32(_mm512_max_epi32(q, y_min), y_max)));
    }
    for (; i < n; ++i)
        y[i] = quantize_8_bit<Y>(
            std::fma(static_cast<float>(a[i]), ratio_a, std::fma(static_cast<float>(b[i]), ratio_b, fixed)), 0.0f);
}

// x * ratio + constant with one fused multiply-add per element: an Add of a single
// value, whose share is folded into the constant (same FMA dispatch as add_scaled).
template <typename X>
[[gnu::always_inline]] inline void scale_add_rows(const X* x, float* out, size_t n, float ratio, float constant) {
    for (size_t i = 0; i < n; ++i) out[i] = std::fma(static_cast<float>(x[i]), ratio, constant);
}

template <typename X>
[[gnu::target("avx2,fma")]] void scale_add_fma(const X* x, float* out, size_t n, float ratio, float constant) {
    scale_add_rows(x, out, n, ratio, constant);
}

template <typename X>
void scale_add(const X* x, float* out, size_t n, float ratio, float constant) {
    if (cpu_features().avx2 && cpu_features().fma)
        scale_add_fma(x, out, n, ratio, constant);
    else
        scale_add_rows(x, out, n, ratio, constant);
}

// QLinearAdd with ONNX Runtime's x86 arithmetic: c = a * (sa/sc) + b * (sb/sc) +
// (zc - (sa/sc) za - (sb/sc) zb) in float, with fused multiply-adds where its
// kernels have them (a side that is one value per run is folded into the constant
// first), rounded half to even. The order matters for the rare exact ties.
void qlinear_add(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto a = quantized(ctx, 0, 1, 2);
    const auto b = quantized(ctx, 3, 4, 5);
    const float sc = ctx.input(6).data<float>()[0];
    const float ratio_a = a.scale / sc, ratio_b = b.scale / sc;
    const float zc = ctx.has_input(7) ? static_cast<float>(read_scalar(ctx, ctx.input(7))) : 0.0f;
    // Its AVX2 kernel is compiled with contraction on: the sum of the zero points' shares is one fused multiply-add.
    const float za = static_cast<float>(a.zero_point), zb = static_cast<float>(b.zero_point);
    const float fixed = zc - (cpu_features().avx2 && cpu_features().fma ? std::fma(ratio_a, za, ratio_b * zb)
                                                                        : ratio_a * za + ratio_b * zb);
    const auto& as = a.data->shape();
    const auto& bs = b.data->shape();
    // Which side ONNX Runtime's broadcaster hands its kernel as a scalar: one that
    // is a single value, or constant along the innermost axis while the other is not.
    const bool a_scalar = a.data->size() == 1 || (!as.empty() && as.back() == 1 && !bs.empty() && bs.back() != 1);
    const bool b_scalar =
        !a_scalar && (b.data->size() == 1 || (!bs.empty() && bs.back() == 1 && !as.empty() && as.back() != 1));
    const DataType type = ctx.has_input(7) ? ctx.input(7).type() : a.data->type();
    auto is_8_bit = [](DataType t) { return t == DataType::UInt8 || t == DataType::Int8; };
    // b repeated along a's leading dimensions (a bias), or the same shape (a residual).
    auto repeats_within = [](const std::vector<int64_t>& outer, const std::vector<int64_t>& inner) {
        if (inner.size() > outer.size()) return false;
        const size_t lead = outer.size() - inner.size();
        size_t first = 0;  // inner's leading 1s may stand for any of outer's dimensions
        while (first < inner.size() && inner[first] == 1) ++first;
        return std::equal(inner.begin() + first, inner.end(), outer.begin() + lead + first);
    };
    // Either side may be the one repeated (a bias before or after the product it is added to).
    const bool b_repeats = repeats_within(as, bs) && a.data->size() % std::max<int64_t>(b.data->size(), 1) == 0;
    const bool a_repeats =
        !b_repeats && repeats_within(bs, as) && b.data->size() % std::max<int64_t>(a.data->size(), 1) == 0;
    if (!a_scalar && !b_scalar && (a_repeats || b_repeats) && is_8_bit(a.data->type()) && is_8_bit(b.data->type()) &&
        is_8_bit(type)) {
        // Per chunk (one per thread at a time), one fused pass to floats and one to
        // the output type, while the chunk is in cache.
        const auto n = static_cast<size_t>(std::max(a.data->size(), b.data->size()));
        const auto row = static_cast<size_t>(std::min(a.data->size(), b.data->size()));
        Tensor y = Tensor::uninitialized(type, a_repeats ? bs : as);
        auto* y_bytes = reinterpret_cast<uint8_t*>(y.mutable_bytes().data());  // taken once, before the threads
        with_8_bit_types(a.data->type(), b.data->type(), [&](auto a_tag, auto b_tag) {
            using TA = decltype(a_tag);
            using TB = decltype(b_tag);
            const TA* av = a.data->data<TA>().data();
            const TB* bv = b.data->data<TB>().data();
            if (row == 0) return;
            // The chunk's pieces of rows of the repeated side: piece(at, length, a, b).
            auto pieces = [&](size_t first, size_t count, auto&& piece) {
                for (size_t done = 0; done < count;) {
                    const size_t at = first + done, offset = at % row, length = std::min(count - done, row - offset);
                    piece(at, length, av + (a_repeats ? offset : at), bv + (a_repeats ? at : offset));
                    done += length;
                }
            };
            if (cpu_features().avx512f) {
                for_each_chunk(n, size_t{1} << 14, [&](size_t first, size_t count) {
                    pieces(first, count, [&](size_t at, size_t length, const TA* ap, const TB* bp) {
                        if (type == DataType::UInt8)
                            add_rounded_avx512(ap, bp, y_bytes + at, length, ratio_a, ratio_b, fixed);
                        else
                            add_rounded_avx512(ap, bp, reinterpret_cast<int8_t*>(y_bytes) + at, length, ratio_a,
                                               ratio_b, fixed);
                    });
                });
                return;
            }
            round_in_chunks(n, type, y_bytes, [&](size_t first, size_t count, float* sum) {
                pieces(first, count, [&](size_t at, size_t length, const TA* ap, const TB* bp) {
                    add_scaled(ap, bp, sum + (at - first), length, ratio_a, ratio_b, fixed);
                });
            });
        });
        out[0] = std::move(y);
        return;
    }
    // One side a single value (a constant added, as in HardSwish's x + 3): its share
    // folds into the constant as the path below computes it, then one pass per chunk.
    const bool single_a = a_scalar && a.data->size() == 1, single_b = b_scalar && b.data->size() == 1;
    if ((single_a || single_b) && is_8_bit(a.data->type()) && is_8_bit(b.data->type()) && is_8_bit(type)) {
        const auto& lone = single_a ? a : b;
        const auto& other = single_a ? b : a;
        const Tensor lone_value = raw_floats(ctx, *lone.data);
        const float constant = fixed + lone_value.data<float>()[0] * (single_a ? ratio_a : ratio_b);
        const float ratio = single_a ? ratio_b : ratio_a;
        Tensor y = Tensor::uninitialized(type, broadcast_shapes(ctx, as, bs));
        auto* y_bytes = reinterpret_cast<uint8_t*>(y.mutable_bytes().data());  // taken once, before the threads
        const auto n = static_cast<size_t>(other.data->size());
        auto run = [&](auto tag) {
            using X = decltype(tag);
            const X* x = other.data->data<X>().data();
            round_in_chunks(n, type, y_bytes, [&](size_t first, size_t count, float* values) {
                scale_add(x + first, values, count, ratio, constant);
            });
        };
        if (other.data->type() == DataType::UInt8)
            run(uint8_t{});
        else
            run(int8_t{});
        out[0] = std::move(y);
        return;
    }
    const Tensor fa = raw_floats(ctx, *a.data), fb = raw_floats(ctx, *b.data);
    const Tensor sum = broadcast_binary<float, float>(ctx, fa, fb, [&](float x, float y) {
        if (a_scalar) return std::fma(y, ratio_b, fixed + x * ratio_a);
        if (b_scalar) return std::fma(x, ratio_a, fixed + y * ratio_b);
        return std::fma(x, ratio_a, std::fma(y, ratio_b, fixed));
    });
    const auto v = sum.data<float>();
    out[0] = quantized_tensor(ctx, type, sum.shape(), 0.0, [&](size_t i) { return v[i]; });
}

// How the smaller input of a broadcasting binary op meets the larger one's flat
// elements: one value per row of `row` elements (the same shape: rows of 1; a
// single value: one row; a channel's value over its plane), or the whole of it
// repeated every `row` elements (channels last). Other broadcasts: neither.
struct Repetition {
    enum Kind { PerRow, Repeated, Neither } kind = Neither;
    size_t row = 1;
};

Repetition repetition(const std::vector<int64_t>& big, const std::vector<int64_t>& small) {
    if (small.size() > big.size()) return {};
    std::vector<int64_t> padded(big.size() - small.size(), 1);
    padded.insert(padded.end(), small.begin(), small.end());
    const size_t rank = big.size();
    auto ones = [&](size_t from, size_t to) {
        return std::all_of(padded.begin() + static_cast<std::ptrdiff_t>(from),
                           padded.begin() + static_cast<std::ptrdiff_t>(to), [](int64_t d) { return d == 1; });
    };
    auto elements = [&](size_t from, size_t to) {
        size_t n = 1;
        for (size_t d = from; d < to; ++d) n *= static_cast<size_t>(big[d]);
        return n;
    };
    size_t prefix = 0;  // big's leading dimensions the smaller one has too
    while (prefix < rank && padded[prefix] == big[prefix]) ++prefix;
    if (ones(prefix, rank)) return {Repetition::PerRow, elements(prefix, rank)};
    size_t suffix = rank;  // and its trailing ones
    while (suffix > 0 && padded[suffix - 1] == big[suffix - 1]) --suffix;
    if (ones(0, suffix)) return {Repetition::Repeated, elements(suffix, rank)};
    return {};
}

// QLinearMul's value before rounding, (x - zx)(y - zy) (ratio) + zc, for rows of
// 8-bit inputs, y one value (kOne) or one per x. The centred values' product is
// an integer below 2^17, exact in float; the multiply and the add stay apart as
// in ONNX Runtime's kernel (AVX2 without FMA: nothing can fuse them).
template <bool kOne, typename X, typename Y>
[[gnu::always_inline]] inline void product_rows(const X* x, const Y* y, float* out, size_t n, float zx, float zy,
                                                float ratio, float zc) {
    for (size_t i = 0; i < n; ++i) {
        const float other = kOne ? static_cast<float>(*y) - zy : static_cast<float>(y[i]) - zy;
        out[i] = (static_cast<float>(x[i]) - zx) * other * ratio + zc;
    }
}

template <bool kOne, typename X, typename Y>
[[gnu::target("avx2")]] void product_avx2(const X* x, const Y* y, float* out, size_t n, float zx, float zy, float ratio,
                                          float zc) {
    product_rows<kOne>(x, y, out, n, zx, zy, ratio, zc);
}

template <bool kOne, typename X, typename Y>
void product_values(const X* x, const Y* y, float* out, size_t n, float zx, float zy, float ratio, float zc) {
    if (cpu_features().avx2)
        product_avx2<kOne>(x, y, out, n, zx, zy, ratio, zc);
    else
        product_rows<kOne>(x, y, out, n, zx, zy, ratio, zc);
}

// QLinearMul: (A, A_scale, A_zp, B, B_scale, B_zp, C_scale, C_zp), broadcasting,
// with ONNX Runtime's x86 arithmetic: the integer product of the centred inputs,
// times (sa * sb) / sc, plus zc, in float without a fused multiply-add, rounded
// half to even. (Multiplying the dequantized values instead is one step off now
// and then.) The product is symmetric, so the larger input leads; 8-bit inputs
// that repeat as Repetition says take one pass per chunk.
void qlinear_mul(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto a = quantized(ctx, 0, 1, 2);
    const auto b = quantized(ctx, 3, 4, 5);
    const float ratio = a.scale * b.scale / ctx.input(6).data<float>()[0];
    const float zc = ctx.has_input(7) ? static_cast<float>(read_scalar(ctx, ctx.input(7))) : 0.0f;
    const DataType type = ctx.has_input(7) ? ctx.input(7).type() : a.data->type();
    if (type != DataType::UInt8 && type != DataType::Int8) ctx.fail("the output must be int8 or uint8");
    const auto shape = broadcast_shapes(ctx, a.data->shape(), b.data->shape());
    const bool a_leads = a.data->shape() == shape;
    const auto& big = a_leads ? a : b;
    const auto& small = a_leads ? b : a;
    const auto how = big.data->shape() == shape ? repetition(shape, small.data->shape()) : Repetition{};
    auto is_8_bit = [](DataType t) { return t == DataType::UInt8 || t == DataType::Int8; };
    if (how.kind != Repetition::Neither && is_8_bit(big.data->type()) && is_8_bit(small.data->type())) {
        out[0] = Tensor::uninitialized(type, shape);
        auto* y_bytes = reinterpret_cast<uint8_t*>(out[0].mutable_bytes().data());  // taken once, before the threads
        const auto n = static_cast<size_t>(big.data->size());
        with_8_bit_types(big.data->type(), small.data->type(), [&](auto x_tag, auto y_tag) {
            using X = decltype(x_tag);
            using Y = decltype(y_tag);
            const X* x = big.data->data<X>().data();
            const Y* y = small.data->data<Y>().data();
            const auto zx = static_cast<float>(big.zero_point), zy = static_cast<float>(small.zero_point);
            round_in_chunks(n, type, y_bytes, [&](size_t first, size_t count, float* values) {
                if (how.kind == Repetition::PerRow && how.row == 1)
                    return product_values<false>(x + first, y + first, values, count, zx, zy, ratio, zc);
                for (size_t done = 0; done < count;) {  // the chunk's pieces of rows
                    const size_t at = first + done, offset = at % how.row;
                    const size_t length = std::min(count - done, how.row - offset);
                    if (how.kind == Repetition::PerRow)
                        product_values<true>(x + at, y + at / how.row, values + done, length, zx, zy, ratio, zc);
                    else
                        product_values<false>(x + at, y + offset, values + done, length, zx, zy, ratio, zc);
                    done += length;
                }
            });
        });
        return;
    }
    const auto za = static_cast<float>(a.zero_point), zb = static_cast<float>(b.zero_point);
    const Tensor fa = raw_floats(ctx, *a.data), fb = raw_floats(ctx, *b.data);
    // (x - za) * (y - zb) is an integer below 2^17: exact in float.
    const Tensor product =
        broadcast_binary<float, float>(ctx, fa, fb, [&](float x, float y) { return (x - za) * (y - zb) * ratio + zc; });
    const auto v = product.data<float>();
    out[0] = Tensor::uninitialized(type, product.shape());
    round_to_8_bit(v.data(), type, reinterpret_cast<uint8_t*>(out[0].mutable_bytes().data()), v.size());
}

// QLinearGlobalAveragePool: (X, x_scale, x_zp, y_scale, y_zp), NCHW or channels_last.
void qlinear_global_average_pool(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto x = quantized(ctx, 0, 1, 2);
    const auto& s = x.data->shape();
    if (s.size() < 3) ctx.fail("the input needs batch, channel and spatial dimensions");
    const bool channels_last = ctx.attributes.get_int("channels_last", 0) != 0;
    const int64_t n = s[0], c = channels_last ? s.back() : s[1];
    const int64_t plane = x.data->size() / (n * c);
    // As MLAS computes it: each channel's integer sum less the input zero point's
    // share, times x_scale / (y_scale * plane) in float, rounded half to even.
    std::vector<int32_t> sums(static_cast<size_t>(n * c), static_cast<int32_t>(-x.zero_point * plane));
    dispatch_numeric(x.data->type(), ctx, [&](auto tag) {
        using Q = typename decltype(tag)::type;
        const auto v = view<Q>(*x.data);
        if (!channels_last) {
            for (int64_t b = 0; b < n; ++b)
                for (int64_t ch = 0; ch < c; ++ch)
                    for (int64_t i = 0; i < plane; ++i)
                        sums[b * c + ch] += static_cast<int32_t>(v[(b * c + ch) * plane + i]);
            return;
        }
        // Channels-last: pixel after pixel, all channels at once (a vector loop),
        // each thread over its share of the pixels (the rows it made in the layer
        // before), into sums of its own added up after; integer sums are exact
        // in any order.
        const int64_t pixels = n * plane;
        std::vector<std::vector<int32_t>> partial(static_cast<size_t>(std::max(1, team_threads())));
        parallel_team(pixels * c > kParallelGrain, [&](int64_t t, int64_t team) {
            auto& mine = partial[static_cast<size_t>(t)];
            mine.assign(static_cast<size_t>(n * c), 0);
            const auto [first, last] = share_of(pixels, t, team);
            for (int64_t p = first; p < last; ++p) {
                int32_t* to = mine.data() + (p / plane) * c;
                const Q* from = v.data() + p * c;
                for (int64_t ch = 0; ch < c; ++ch) to[ch] += static_cast<int32_t>(from[ch]);
            }
        });
        for (const auto& mine : partial)
            for (size_t k = 0; k < mine.size(); ++k) sums[k] += mine[k];
    });
    const float scale = x.scale / (ctx.input(3).data<float>()[0] * static_cast<float>(plane));
    std::vector<int64_t> shape(s.size(), 1);
    shape[0] = n;
    shape[channels_last ? s.size() - 1 : 1] = c;
    const DataType type = ctx.has_input(4) ? ctx.input(4).type() : x.data->type();
    const double zp = ctx.has_input(4) ? read_scalar(ctx, ctx.input(4)) : 0.0;
    out[0] = quantized_tensor(ctx, type, shape, zp, [&](size_t i) { return static_cast<float>(sums[i]) * scale; });
}

// QLinearAveragePool: (X, x_scale, x_zp, y_scale, y_zp), 2-D, NCHW or
// channels_last. As ONNX Runtime computes it: dequantize, sum each window in
// float in row order, divide by the count, then round(y / y_scale + y_zp) with
// the zero point added before rounding.
void qlinear_average_pool(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto x = quantized(ctx, 0, 1, 2);
    const auto& s = x.data->shape();
    const bool channels_last = ctx.attributes.get_int("channels_last", 0) != 0;
    if (s.size() != 4) ctx.fail("only 2-D pooling is supported");
    const auto kernel = ctx.attributes.get_ints("kernel_shape");
    if (kernel.size() != 2) ctx.fail("kernel_shape must have 2 values");
    const int64_t n = s[0], c = channels_last ? s[3] : s[1], h = channels_last ? s[1] : s[2],
                  w = channels_last ? s[2] : s[3];
    const auto g = WindowGeometry::from(ctx, {h, w}, kernel, ctx.attributes.get_int("ceil_mode", 0) != 0);
    const bool include_pad = ctx.attributes.get_int("count_include_pad", 0) != 0;
    const auto v = dequantized(ctx, x);
    const float y_scale = ctx.input(3).data<float>()[0];
    const float y_zp = ctx.has_input(4) ? static_cast<float>(read_scalar(ctx, ctx.input(4))) : 0.0f;
    const int64_t oh = g.out[0], ow = g.out[1];
    // Each window's values summed in row order, each channel's apart; channels-last,
    // a window's channels side by side.
    std::vector<float> y(static_cast<size_t>(n * c * oh * ow));
    std::vector<float> sums(static_cast<size_t>(channels_last ? c : 1));
    for (int64_t b = 0; b < n; ++b)
        for (int64_t ch = 0; ch < (channels_last ? 1 : c); ++ch)
            for (int64_t i = 0; i < oh; ++i) {
                const int64_t h0 = std::max<int64_t>(i * g.strides[0] - g.pad_begin[0], 0);
                const int64_t h1 = std::min(i * g.strides[0] - g.pad_begin[0] + kernel[0], h);
                for (int64_t j = 0; j < ow; ++j) {
                    const int64_t w0 = std::max<int64_t>(j * g.strides[1] - g.pad_begin[1], 0);
                    const int64_t w1 = std::min(j * g.strides[1] - g.pad_begin[1] + kernel[1], w);
                    std::fill(sums.begin(), sums.end(), 0.0f);
                    for (int64_t r = h0; r < h1; ++r)
                        for (int64_t col = w0; col < w1; ++col) {
                            if (channels_last) {
                                const float* px = v.data() + ((b * h + r) * w + col) * c;
                                for (int64_t k = 0; k < c; ++k) sums[k] += px[k];
                            } else {
                                sums[0] += v[((b * c + ch) * h + r) * w + col];
                            }
                        }
                    const auto count = static_cast<float>(include_pad ? kernel[0] * kernel[1] : (h1 - h0) * (w1 - w0));
                    if (channels_last) {
                        float* py = y.data() + ((b * oh + i) * ow + j) * c;
                        for (int64_t k = 0; k < c; ++k) py[k] = sums[k] / count / y_scale + y_zp;
                    } else {
                        y[((b * c + ch) * oh + i) * ow + j] = sums[0] / count / y_scale + y_zp;
                    }
                }
            }
    const DataType type = ctx.has_input(4) ? ctx.input(4).type() : x.data->type();
    const std::vector<int64_t> shape =
        channels_last ? std::vector<int64_t>{n, oh, ow, c} : std::vector<int64_t>{n, c, oh, ow};
    out[0] = quantized_tensor(ctx, type, shape, 0.0, [&](size_t i) { return y[i]; });
}

// QLinearSoftmax's outputs for one row, sixteen at a time: round(e * y_scale /
// sum) + y_zp, clamped above by q_max (below, the zero point bounds them), in
// the same float32 operations as the scalar loop, which writes the ones after
// the whole vectors (returned: how many were written).
[[gnu::target("avx512f")]] int64_t softmax_outputs_avx512(const float* e, int64_t d, float y_scale, float sum,
                                                          int32_t y_zp, int32_t q_max, uint8_t* out) {
    const __m512 scale = _mm512_set1_ps(y_scale), total = _mm512_set1_ps(sum);
    const __m512i zp = _mm512_set1_epi32(y_zp), top = _mm512_set1_epi32(q_max);
    int64_t j = 0;
    for (; j + 16 <= d; j += 16) {
        const __m512 v = _mm512_div_ps(_mm512_mul_ps(_mm512_loadu_ps(e + j), scale), total);
        const __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(v), zp);  // rounds half to even
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j), _mm512_cvtepi32_epi8(_mm512_min_epi32(q, top)));
    }
    return j;
}

// softmax_outputs_avx512 eight at a time, for CPUs with AVX2 only.
[[gnu::target("avx2")]] int64_t softmax_outputs_avx2(const float* e, int64_t d, float y_scale, float sum,
                                                     int32_t y_zp, int32_t q_max, uint8_t* out) {
    const __m256 scale = _mm256_set1_ps(y_scale), total = _mm256_set1_ps(sum);
    const __m256i zp = _mm256_set1_epi32(y_zp), top = _mm256_set1_epi32(q_max);
    int64_t j = 0;
    for (; j + 8 <= d; j += 8) {
        const __m256 v = _mm256_div_ps(_mm256_mul_ps(_mm256_loadu_ps(e + j), scale), total);
        const __m256i q = _mm256_add_epi32(_mm256_cvtps_epi32(v), zp);  // rounds half to even
        store_low_bytes_avx2(_mm256_min_epi32(q, top), out + j);
    }
    return j;
}

// QLinearSoftmax: (X, X_scale, X_zp, Y_scale, Y_zp), attributes axis and opset,
// as ONNX Runtime computes it: exp from a 256-entry float table built in double
// (shifted so that sums stay finite), a float sum per row in order, then
// round(e * floor(1 / Y_scale) / sum) + Y_zp. The input zero point cancels out.
void qlinear_softmax(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const bool is_signed = x.type() == DataType::Int8;
    if (!is_signed && x.type() != DataType::UInt8) ctx.fail("the input must be int8 or uint8");
    const int64_t opset = ctx.attributes.get_int("opset", 13);
    const auto rank = static_cast<int64_t>(x.shape().size());
    const int64_t axis = normalize_axis(ctx, ctx.attributes.get_int("axis", opset < 13 ? 1 : -1), rank);
    // Rows of length d: the reduced axis (opset >= 13) or everything from it on.
    int64_t outer = 1, d = 1, inner = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= x.shape()[i];
    if (opset < 13) {
        for (int64_t i = axis; i < rank; ++i) d *= x.shape()[i];
    } else {
        d = x.shape()[axis];
        for (int64_t i = axis + 1; i < rank; ++i) inner *= x.shape()[i];
    }
    const double x_scale = ctx.input(1).data<float>()[0];
    // The largest float over the row length and its logarithm in float, as there
    // (float / size_t and log's float overload), widened after: in double the table
    // moves by an ulp here and there, and a rounding tie with it.
    double shift = std::log(std::numeric_limits<float>::max() / static_cast<float>(d));
    shift = std::max(0.0, shift - 5.0) / x_scale;
    float table[256];
    for (int i = 0; i < 256; ++i) {
        const auto index = static_cast<uint8_t>(is_signed ? i - 128 : i);
        table[index] = static_cast<float>(std::exp((static_cast<double>(i) - 255.0 + shift) * x_scale));
    }
    const float y_scale = std::floor(1.0f / ctx.input(3).data<float>()[0]);
    const int32_t y_zp = ctx.has_input(4) ? static_cast<int32_t>(read_scalar(ctx, ctx.input(4))) : 0;
    out[0] = Tensor(x.type(), x.shape());
    const auto* xv = reinterpret_cast<const uint8_t*>(x.bytes().data());
    auto* yv = reinterpret_cast<uint8_t*>(out[0].mutable_bytes().data());
    const bool wide = cpu_features().avx512f, avx2 = cpu_features().avx2;
    // Rows are independent: spread over the threads, each with its own buffers.
    const int64_t rows = outer * inner;
    parallel_team(rows * d > kParallelGrain, [&](int64_t thread, int64_t threads) {
        std::vector<uint8_t> in_row(static_cast<size_t>(d)), out_row(static_cast<size_t>(d));
        std::vector<float> e(static_cast<size_t>(d));
        for (int64_t r = rows * thread / threads; r < rows * (thread + 1) / threads; ++r) {
            const int64_t o = r / inner, in = r % inner;
            // The row's bytes, contiguous (copied out when the axis is not the last).
            const uint8_t* row = xv + o * d * inner + in;
            uint8_t* y = yv + o * d * inner + in;
            if (inner != 1) {
                for (int64_t j = 0; j < d; ++j) in_row[j] = row[j * inner];
                row = in_row.data();
                y = out_row.data();
            }
            // Table indices: values shifted so the row's maximum reads entry 255
            // (int8: bytes shifted so the maximum is 127).
            int32_t top = 0;
            if (is_signed) {
                top = -128;
                for (int64_t j = 0; j < d; ++j) top = std::max<int32_t>(top, static_cast<int8_t>(row[j]));
            } else {
                for (int64_t j = 0; j < d; ++j) top = std::max<int32_t>(top, row[j]);
            }
            float sum = 0.0f;  // in order, as there
            for (int64_t j = 0; j < d; ++j) {
                const int32_t v = is_signed ? static_cast<int8_t>(row[j]) : row[j];
                e[j] = table[static_cast<uint8_t>(is_signed ? 127 - top + v : 255 - top + v)];
                sum += e[j];
            }
            if (sum == 0.0f) {
                if (inner != 1) std::fill(out_row.begin(), out_row.end(), uint8_t{0});
            } else {
                const int32_t q_max = is_signed ? 127 : 255;
                const int64_t vectors = wide   ? softmax_outputs_avx512(e.data(), d, y_scale, sum, y_zp, q_max, y)
                                        : avx2 ? softmax_outputs_avx2(e.data(), d, y_scale, sum, y_zp, q_max, y)
                                               : 0;
                for (int64_t j = vectors; j < d; ++j) {
                    const int32_t q = static_cast<int32_t>(std::nearbyint(e[j] * y_scale / sum)) + y_zp;
                    y[j] = static_cast<uint8_t>(std::min(q, q_max));
                }
            }
            if (inner != 1)
                for (int64_t j = 0; j < d; ++j) yv[(o * d + j) * inner + in] = out_row[j];
        }
    });
}

// QLinearConcat: (Y_scale, Y_zp, X0, X0_scale, X0_zp, X1, ...), along `axis`.
// An 8-bit input's 256 values dequantized with `q`'s parameters and requantized
// with the output's (inputs `scale` and `zero_point`), by the same code that
// does it element by element.
Tensor requantization_table(KernelContext& ctx, const QuantizedInput& q, size_t scale, size_t zero_point,
                            DataType fallback) {
    const Tensor every = every_8_bit_value(q.data->type());
    return requantized(ctx, {256}, dequantized(ctx, {&every, q.scale, q.zero_point}), scale, zero_point, fallback);
}

void qlinear_concat(KernelContext& ctx, std::vector<Tensor>& out) {
    if (ctx.input_count() < 5 || (ctx.input_count() - 2) % 3 != 0)
        ctx.fail("expects Y_scale, Y_zp and triples of inputs");
    const auto& first = ctx.input(2).shape();
    const auto rank = static_cast<int64_t>(first.size());
    const int64_t axis = normalize_axis(ctx, ctx.attributes.get_int("axis", 0), rank);
    std::vector<QuantizedInput> inputs;
    std::vector<std::vector<int64_t>> shapes;
    auto shape = first;
    shape[axis] = 0;
    for (size_t i = 2; i < ctx.input_count(); i += 3) {
        inputs.push_back(quantized(ctx, i, i + 1, i + 2));
        shapes.push_back(inputs.back().data->shape());
        shape[axis] += shapes.back()[axis];
    }
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= shape[d];
    for (int64_t d = axis + 1; d < rank; ++d) inner *= shape[d];
    const DataType y_type = ctx.has_input(1) ? ctx.input(1).type() : ctx.input(2).type();
    const bool eight_bit = is_8_bit(y_type) && std::all_of(inputs.begin(), inputs.end(), [](const QuantizedInput& q) {
                               return is_8_bit(q.data->type());
                           });
    if (eight_bit) {  // each input's bytes through its table (a copy where the table is the identity)
        std::vector<std::array<uint8_t, 256>> tables(inputs.size());
        std::vector<bool> identity(inputs.size());
        for (size_t p = 0; p < inputs.size(); ++p) {
            const Tensor table = requantization_table(ctx, inputs[p], 0, 1, ctx.input(2).type());
            std::memcpy(tables[p].data(), table.bytes().data(), 256);
            identity[p] = inputs[p].data->type() == y_type;
            for (size_t b = 0; b < 256 && identity[p]; ++b) identity[p] = tables[p][b] == b;
        }
        Tensor y = Tensor::uninitialized(y_type, shape);
        auto* o = reinterpret_cast<uint8_t*>(y.mutable_bytes().data());
        for (int64_t r = 0; r < outer; ++r)
            for (size_t p = 0; p < inputs.size(); ++p) {
                const auto chunk = static_cast<size_t>(shapes[p][axis] * inner);
                const auto* in = reinterpret_cast<const uint8_t*>(inputs[p].data->bytes().data()) + r * chunk;
                if (identity[p]) {
                    std::memcpy(o, in, chunk);
                } else {
                    const auto& t = tables[p];
                    for (size_t i = 0; i < chunk; ++i) o[i] = t[in[i]];
                }
                o += chunk;
            }
        out[0] = std::move(y);
        return;
    }
    std::vector<std::vector<float>> parts;
    for (const auto& q : inputs) parts.push_back(dequantized(ctx, q));
    std::vector<float> values;
    values.reserve(static_cast<size_t>(element_count(shape)));
    for (int64_t o = 0; o < outer; ++o)
        for (size_t p = 0; p < parts.size(); ++p) {
            const int64_t chunk = shapes[p][axis] * inner;
            values.insert(values.end(), parts[p].begin() + o * chunk, parts[p].begin() + (o + 1) * chunk);
        }
    out[0] = requantized(ctx, shape, values, 0, 1, ctx.input(2).type());
}

// An 8-bit tensor's values repeated to `shape` (numpy broadcasting).
Tensor expand_to(const Tensor& t, const std::vector<int64_t>& shape) {
    Tensor out = Tensor::uninitialized(t.type(), shape);
    const auto index = broadcast_index(t.shape(), shape);
    const auto* in = reinterpret_cast<const uint8_t*>(t.bytes().data());
    auto* o = reinterpret_cast<uint8_t*>(out.mutable_bytes().data());
    for (size_t i = 0; i < index.size(); ++i) o[i] = in[index[i]];
    return out;
}

// The sum of two centred 8-bit values shifted onto the finer one's step, exact in
// int32, requantized by a shift onto the output's: right shifts round half to even
// (adding half less one, plus the kept part's lowest bit, before shifting).
template <typename A, typename B, typename Y>
[[gnu::always_inline]] inline void add_shifted(const A* __restrict a, const B* __restrict b, Y* __restrict y, size_t n,
                                               int32_t za, int32_t zb, int da, int db, int shift, int32_t zy,
                                               int32_t lo, int32_t hi) {
    if (shift >= 0) {
        // 2^10 steps already saturate any 8-bit output: clamping first keeps int32 from overflowing.
        const int left = std::min(shift, 10);
        for (size_t i = 0; i < n; ++i) {
            const int32_t s = ((static_cast<int32_t>(a[i]) - za) << da) + ((static_cast<int32_t>(b[i]) - zb) << db);
            const int32_t q = (std::clamp(s, -1024, 1024) << left) + zy;
            y[i] = static_cast<Y>(std::clamp(q, lo, hi));
        }
        return;
    }
    const int right = std::min(-shift, 30);  // |s| < 2^24: beyond that every value rounds to 0
    const int32_t half_less_one = (int32_t{1} << (right - 1)) - 1;
    for (size_t i = 0; i < n; ++i) {
        const int32_t s = ((static_cast<int32_t>(a[i]) - za) << da) + ((static_cast<int32_t>(b[i]) - zb) << db);
        const int32_t q = ((s + half_less_one + ((s >> right) & 1)) >> right) + zy;
        y[i] = static_cast<Y>(std::clamp(q, lo, hi));
    }
}

// add_shifted compiled for sixteen lanes (the widening and narrowing take one
// instruction each there), and as it is.
template <typename A, typename B, typename Y>
[[gnu::target("avx512f,avx512bw")]] void add_shifted_avx512(const A* a, const B* b, Y* y, size_t n, int32_t za,
                                                            int32_t zb, int da, int db, int shift, int32_t zy,
                                                            int32_t lo, int32_t hi) {
    add_shifted(a, b, y, n, za, zb, da, db, shift, zy, lo, hi);
}

template <typename A, typename B, typename Y>
void add_shifted_plain(const A* a, const B* b, Y* y, size_t n, int32_t za, int32_t zb, int da, int db, int shift,
                       int32_t zy, int32_t lo, int32_t hi) {
    add_shifted(a, b, y, n, za, zb, da, db, shift, zy, lo, hi);
}

void look_up(const uint8_t* x, uint8_t* y, size_t n, const uint8_t* table) {
    for (size_t i = 0; i < n; ++i) y[i] = table[x[i]];
}

// The same, 64 bytes at a time: two 128-byte permutes (the low seven bits of
// each byte index) and the top bit choosing between them.
[[gnu::target("avx512f,avx512bw,avx512vbmi")]] void look_up_vbmi(const uint8_t* x, uint8_t* y, size_t n,
                                                                 const uint8_t* table) {
    const __m512i t0 = _mm512_loadu_si512(table), t1 = _mm512_loadu_si512(table + 64),
                  t2 = _mm512_loadu_si512(table + 128), t3 = _mm512_loadu_si512(table + 192);
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const __m512i v = _mm512_loadu_si512(x + i);
        const __m512i low = _mm512_permutex2var_epi8(t0, v, t1), high = _mm512_permutex2var_epi8(t2, v, t3);
        _mm512_storeu_si512(y + i, _mm512_mask_blend_epi8(_mm512_movepi8_mask(v), low, high));
    }
    look_up(x + i, y + i, n - i, table);
}

// LookupTable (vaiq.internal, see lookup_fusion.hpp): y = table[x], x's bits
// read as an unsigned byte; `table` holds 256 8-bit values, `rank` (when set)
// is the least rank of y (constants of rank 1 in the group it stands for).
// The `table` attribute of a LookupTable or ChannelLookupTable, read once and
// kept in the kernel's state: rows of 256 8-bit values, with 3 bytes to spare
// after the last for 4-byte gathers.
struct LookupRows {
    DataType type;
    int64_t rows;
    std::vector<uint8_t> bytes;
};

const LookupRows& lookup_rows(KernelContext& ctx) {
    auto cached = std::static_pointer_cast<LookupRows>(ctx.state);
    if (!cached) {
        const auto* proto = ctx.attributes.get_tensor("table");
        if (!proto) ctx.fail("the table attribute is missing");
        const Tensor t = Tensor::from_proto(*proto);
        if (t.size() % 256 != 0 || t.size() == 0 || (t.type() != DataType::UInt8 && t.type() != DataType::Int8))
            ctx.fail("the table must hold rows of 256 uint8 or int8 values");
        const auto* bytes = reinterpret_cast<const uint8_t*>(t.bytes().data());
        cached = std::make_shared<LookupRows>(LookupRows{t.type(), t.size() / 256, {bytes, bytes + t.size()}});
        cached->bytes.resize(cached->bytes.size() + 3);
        ctx.state = cached;
    }
    return *cached;
}

void lookup_table(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    if (x.type() != DataType::UInt8 && x.type() != DataType::Int8) ctx.fail("the input must be uint8 or int8");
    const auto& table = lookup_rows(ctx);
    if (table.rows != 1) ctx.fail("the table must hold 256 uint8 or int8 values");
    auto shape = x.shape();
    const auto rank = ctx.attributes.get_int("rank", 0);
    if (rank < 0 || rank > 8) ctx.fail("rank must be from 0 to 8");
    while (static_cast<int64_t>(shape.size()) < rank) shape.insert(shape.begin(), 1);
    out[0] = Tensor::uninitialized(table.type, shape);
    const auto* in = reinterpret_cast<const uint8_t*>(x.bytes().data());
    const auto* values = table.bytes.data();
    auto* y = reinterpret_cast<uint8_t*>(out[0].mutable_bytes().data());
    const auto n = static_cast<size_t>(x.size());
    const bool permutes = cpu_features().avx512vbmi && cpu_features().avx512bw;
    for_each_chunk(n, size_t{1} << 16, [&](size_t first, size_t count) {
        (permutes ? look_up_vbmi : look_up)(in + first, y + first, count, values);
    });
}

// A row of c channels-last values, each through its channel's 256-entry row of
// `rows` (which has 3 bytes to spare at its end for the gathers' 4-byte reads).
void look_up_channels(const uint8_t* x, uint8_t* y, int64_t c, const uint8_t* rows) {
    for (int64_t k = 0; k < c; ++k) y[k] = rows[k * 256 + x[k]];
}

// The same, sixteen channels at a time: a gather of the four bytes at each
// value's entry, the first of which is kept.
[[gnu::target("avx512f")]] void look_up_channels_avx512(const uint8_t* x, uint8_t* y, int64_t c, const uint8_t* rows) {
    const __m512i lanes = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32(256));
    int64_t k = 0;
    for (; k + 16 <= c; k += 16) {
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + k)));
        const __m512i at = _mm512_add_epi32(_mm512_add_epi32(v, lanes), _mm512_set1_epi32(static_cast<int>(k * 256)));
        const __m512i got = _mm512_i32gather_epi32(at, rows, 1);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(y + k), _mm512_cvtepi32_epi8(got));
    }
    look_up_channels(x + k, y + k, c - k, rows + k * 256);
}

// ChannelLookupTable (vaiq.internal, see lookup_fusion.hpp): y = table[c][x] for
// x in channel c along `axis`; `table` holds one row of 256 8-bit values per
// channel. Channels-first, each plane goes through its row as LookupTable's
// values do; channels-last (the last axis), each value looks up its own.
void channel_lookup_table(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    if (x.type() != DataType::UInt8 && x.type() != DataType::Int8) ctx.fail("the input must be uint8 or int8");
    const auto rank = static_cast<int64_t>(x.shape().size());
    const int64_t axis = normalize_axis(ctx, ctx.attributes.get_int("axis", 1), rank);
    const auto& table = lookup_rows(ctx);
    const int64_t c = x.shape()[axis];
    if (table.rows != c) ctx.fail(fmt::format("the table has {} rows for {} channels", table.rows, c));
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= x.shape()[d];
    for (int64_t d = axis + 1; d < rank; ++d) inner *= x.shape()[d];
    out[0] = Tensor::uninitialized(table.type, x.shape());
    const auto* in = reinterpret_cast<const uint8_t*>(x.bytes().data());
    const uint8_t* rows = table.bytes.data();
    auto* y = reinterpret_cast<uint8_t*>(out[0].mutable_bytes().data());
    const bool permutes = cpu_features().avx512vbmi && cpu_features().avx512bw;
    const bool gathers = cpu_features().avx512f;
    const int64_t piece = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, c * inner));
    parallel_for_pieces(outer, piece, x.size() >= (int64_t{1} << 16), [&](int64_t begin, int64_t end) {
        for (int64_t o = begin; o < end; ++o) {
            const int64_t base = o * c * inner;
            if (inner == 1) {
                (gathers ? look_up_channels_avx512 : look_up_channels)(in + base, y + base, c, rows);
                continue;
            }
            for (int64_t k = 0; k < c; ++k)
                (permutes ? look_up_vbmi : look_up)(in + base + k * inner, y + base + k * inner,
                                                    static_cast<size_t>(inner), rows + k * 256);
        }
    });
}

// PowerOfTwoQLinearAdd, the executor's form of an Add between power-of-two
// DequantizeLinears and a QuantizeLinear (through a Relu/Clip, as output bounds;
// see qdq_fusion.hpp): QLinearAdd's inputs, computed exactly in integers, which is
// what the float Add computes when the fusion's bound holds.
void power_of_two_qlinear_add(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto a = quantized(ctx, 0, 1, 2);
    const auto b = quantized(ctx, 3, 4, 5);
    int ea = 0, eb = 0, ey = 0;
    std::frexp(a.scale, &ea);
    std::frexp(b.scale, &eb);
    std::frexp(ctx.input(6).data<float>()[0], &ey);
    const int finer = std::min(ea, eb);
    // 255 steps of the coarser input must stay within int32 and below 2^24 finer steps (the fusion's bound).
    if (ea - finer > 16 || eb - finer > 16) ctx.fail("the input scales are too far apart to add exactly");
    const auto zy = static_cast<int32_t>(read_scalar(ctx, ctx.input(7)));
    const DataType type = ctx.input(7).type();
    const auto& as = a.data->shape();
    const auto& bs = b.data->shape();
    // A broadcast pair is expanded first (values only move); then one elementwise pass.
    Tensor a_full, b_full;
    const Tensor* av = a.data;
    const Tensor* bv = b.data;
    if (as != bs) {
        const auto shape = broadcast_shapes(ctx, as, bs);
        a_full = expand_to(*a.data, shape), b_full = expand_to(*b.data, shape);
        av = &a_full, bv = &b_full;
    }
    dispatch_numeric(type, ctx, [&](auto y_tag) {
        using Y = typename decltype(y_tag)::type;
        if constexpr (sizeof(Y) != 1 || std::is_same_v<Y, bool>) {
            ctx.fail("the output must be int8 or uint8");
        } else {
            // Plain variables: clang does not let a lambda capture structured bindings.
            const auto bounds = output_bounds<Y>(ctx);
            const auto lo = bounds.first, hi = bounds.second;
            out[0] = make_tensor<Y>(av->shape());
            Y* y = mutable_view<Y>(out[0]).data();
            const bool wide = cpu_features().avx512f && cpu_features().avx512bw;
            with_8_bit_types(av->type(), bv->type(), [&](auto a_tag, auto b_tag) {
                using A = decltype(a_tag);
                using B = decltype(b_tag);
                const auto* ap = reinterpret_cast<const A*>(av->bytes().data());
                const auto* bp = reinterpret_cast<const B*>(bv->bytes().data());
                for_each_chunk(static_cast<size_t>(out[0].size()), size_t{1} << 14, [&](size_t first, size_t count) {
                    (wide ? add_shifted_avx512<A, B, Y>
                          : add_shifted_plain<A, B, Y>)(ap + first, bp + first, y + first, count, a.zero_point,
                                                        b.zero_point, ea - finer, eb - finer, finer - ey, zy, lo, hi);
                });
            });
        }
    });
}

const KernelRegistration kKernels[] = {
    {kMicrosoft, "QLinearAdd", 1, 1, qlinear_add, always_in_team},
    {kMicrosoft, "QLinearMul", 1, 1, qlinear_mul, always_in_team},
    {kMicrosoft, "QLinearLeakyRelu", 1, 1, qlinear_unary<false>, always_in_team},
    {kMicrosoft, "QLinearSigmoid", 1, 1, qlinear_unary<true>, always_in_team},
    {kMicrosoft, "QLinearGlobalAveragePool", 1, 1, qlinear_global_average_pool, always_in_team},
    {kMicrosoft, "QLinearConcat", 1, 1, qlinear_concat, always_in_team},
    {kMicrosoft, "QLinearAveragePool", 1, 1, qlinear_average_pool, always_in_team},
    {kMicrosoft, "QLinearSoftmax", 1, 1, qlinear_softmax, always_in_team},
    {kInternalDomain, "PowerOfTwoQLinearAdd", 0, 1, power_of_two_qlinear_add},
    {kInternalDomain, "LookupTable", 0, 1, lookup_table},
    {kInternalDomain, "ChannelLookupTable", 0, 1, channel_lookup_table},
};

}  // namespace
}  // namespace vaiq::runtime
