// Helpers shared by kernels: type dispatch, broadcasting, index arithmetic.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "runtime/cpu_features.hpp"
#include "runtime/kernel.hpp"
#include "runtime/parallel_for.hpp"
#include "runtime/qdq_fusion.hpp"
#include "vaiq/error.hpp"
#include "vaiq/quant.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq::runtime {

/// The newest default-domain opset the kernels are written against: the upper
/// bound of registrations valid "from some version on".
inline constexpr int kLatest = 21;

template <typename T>
struct TypeTag {
    using type = T;
};

/// Calls fn(TypeTag<T>{}) for the C++ numeric type of `type` (bool excluded);
/// fails for other types.
template <typename F>
void dispatch_numeric(DataType type, const KernelContext& ctx, F&& fn) {
    switch (type) {
        case DataType::Float: return fn(TypeTag<float>{});
        case DataType::Double: return fn(TypeTag<double>{});
        case DataType::Int64: return fn(TypeTag<int64_t>{});
        case DataType::Int32: return fn(TypeTag<int32_t>{});
        case DataType::Int16: return fn(TypeTag<int16_t>{});
        case DataType::Int8: return fn(TypeTag<int8_t>{});
        case DataType::UInt64: return fn(TypeTag<uint64_t>{});
        case DataType::UInt32: return fn(TypeTag<uint32_t>{});
        case DataType::UInt16: return fn(TypeTag<uint16_t>{});
        case DataType::UInt8: return fn(TypeTag<uint8_t>{});
        default: break;
    }
    ctx.fail(fmt::format("element type {} is not supported", data_type_name(type)));
}

/// Like dispatch_numeric, bool included.
template <typename F>
void dispatch(DataType type, const KernelContext& ctx, F&& fn) {
    if (type == DataType::Bool) return fn(TypeTag<bool>{});
    dispatch_numeric(type, ctx, std::forward<F>(fn));
}

/// Like dispatch, for float and double only.
template <typename F>
void dispatch_float(DataType type, const KernelContext& ctx, F&& fn) {
    if (type == DataType::Float) return fn(TypeTag<float>{});
    if (type == DataType::Double) return fn(TypeTag<double>{});
    ctx.fail(fmt::format("element type {} is not supported (float and double are)", data_type_name(type)));
}

template <typename T>
DataType type_of() {
    if constexpr (std::is_same_v<T, bool>)
        return DataType::Bool;
    else
        return data_type_of<T>();
}

/// A new tensor of T with `shape`, not zero-filled: the kernel writes every element.
template <typename T>
Tensor make_tensor(std::vector<int64_t> shape) {
    return Tensor::uninitialized(type_of<T>(), std::move(shape));
}

template <typename T>
std::span<const T> view(const Tensor& t) {
    if constexpr (std::is_same_v<T, bool>)
        return {reinterpret_cast<const bool*>(t.bytes().data()), static_cast<size_t>(t.size())};
    else
        return t.data<T>();
}

template <typename T>
std::span<T> mutable_view(Tensor& t) {
    if constexpr (std::is_same_v<T, bool>)
        return {reinterpret_cast<bool*>(t.mutable_bytes().data()), static_cast<size_t>(t.size())};
    else
        return t.mutable_data<T>();
}

/// Numpy broadcasting of two shapes; fails when they are incompatible.
std::vector<int64_t> broadcast_shapes(const KernelContext& ctx, const std::vector<int64_t>& a,
                                      const std::vector<int64_t>& b);

/// For each output element, the index of the matching element of an input of
/// `shape` broadcast to `out_shape`.
std::vector<int64_t> broadcast_index(const std::vector<int64_t>& shape, const std::vector<int64_t>& out_shape);

/// Row-major strides.
std::vector<int64_t> strides_of(const std::vector<int64_t>& shape);

/// An axis attribute in [-rank, rank) made non-negative; fails out of range.
int64_t normalize_axis(const KernelContext& ctx, int64_t axis, int64_t rank);

/// Reads an int64 (or int32) tensor as a list of int64.
std::vector<int64_t> read_ints(const KernelContext& ctx, const Tensor& t);

/// Reads a scalar of any numeric type as double.
double read_scalar(const KernelContext& ctx, const Tensor& t);

/// A 4-D tensor with its dimensions permuted (any element type).
Tensor permute4(const Tensor& t, const std::vector<int64_t>& perm);

/// Per output dimension, the stride of an input of `shape` broadcast to
/// `out_shape` (0 where the input is broadcast).
std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& shape, const std::vector<int64_t>& out_shape);

/// `batches` row-major [rows, cols] matrices of 4-byte elements written
/// transposed ([cols, rows] each); with `column_minus`, as int32 less
/// column_minus[j] for column j.
void transpose_4_byte(const void* src, void* dst, int64_t batches, int64_t rows, int64_t cols,
                      const int32_t* column_minus = nullptr);

/// Whether the model quantizes values (QuantizeLinear, DequantizeLinear,
/// FixNeuron). There the last bits of a float op before a quantization decide
/// which integer it rounds to, so kernels keep ONNX Runtime's arithmetic instead
/// of faster equivalents (Winograd convolutions, oneDNN's Gelu).
bool quantizes(const Model& model);

/// Loops over big enough work in parallel (OpenMP, the executor's thread count).
constexpr int64_t kParallelGrain = 1 << 14;

/// out[k] = f(in[k]) over [0, n) (`out` may be `in`), a thread's share of it
/// in one loop when n is above `grain`. Each loop calls a copy of `f` of its
/// own: through a reference, a store to `out` might change what f captured, so
/// every element would reload it and the loop would not vectorise.
template <typename T, typename R, typename F>
void map_range(const T* in, R* out, int64_t n, int64_t grain, const F& f) {
    const int64_t shares = std::clamp<int64_t>(team_threads(), 1, std::max<int64_t>(n, 1));
    parallel_for(shares, n > grain, [&](int64_t share) {
        const F g = f;
        const auto [begin, end] = share_of(n, share, shares);  // as parallel_for over the elements splits them
        for (int64_t k = begin; k < end; ++k) out[k] = g(in[k]);
    });
}

/// Elementwise f(x) -> R into a new tensor of x's shape, in parallel above `grain` elements.
template <typename T, typename R = T, typename F>
Tensor map_elements(const Tensor& x, F f, int64_t grain = kParallelGrain) {
    Tensor out = make_tensor<R>(x.shape());
    auto o = mutable_view<R>(out);
    const auto i = view<T>(x);
    map_range(i.data(), o.data(), static_cast<int64_t>(o.size()), grain, f);
    return out;
}

/// map_elements of input `i` into its own buffer when the executor donated it
/// (this node reads it last), else into a new tensor: a standalone activation
/// (a tapped value keeps it from fusing) then touches no new memory.
template <typename T, typename F>
Tensor map_input(KernelContext& ctx, size_t i, F f) {
    if (i >= ctx.donated.size() || !ctx.donated[i]) return map_elements<T>(ctx.input(i), f);
    Tensor x = ctx.take_input(i);
    auto o = mutable_view<T>(x);
    map_range(o.data(), o.data(), static_cast<int64_t>(o.size()), kParallelGrain, f);
    return x;
}

/// Calls f(first element, length, channel) over `size` elements stored as runs of
/// `inner` elements per channel, the `channels` channels cycling (a per-axis
/// scale's layout). One channel: the whole tensor, cut into pieces so that
/// threads share it. In parallel for big tensors.
template <typename F>
void for_each_channel_run(int64_t size, int64_t channels, int64_t inner, F f) {
    const int64_t run = channels == 1 ? std::clamp<int64_t>(size, 1, int64_t{1} << 14) : std::max<int64_t>(inner, 1);
    const int64_t runs = (size + run - 1) / run;
    parallel_for(runs, size > kParallelGrain,
                 [&](int64_t r) { f(r * run, std::min(run, size - r * run), r % channels); });
}

/// quantize_value for 8-bit outputs, branch-free so that loops vectorise: the
/// rounding half to even is float's own (adding and removing 1.5 * 2^23 rounds
/// exactly for |x| < 2^22), after clamping to +-2^21, which no 8-bit result can
/// tell from the unclamped value.
template <typename Q>
inline Q quantize_8_bit(float scaled, float zero_point) {
    static_assert(sizeof(Q) == 1);
    constexpr float kRound = 12582912.0f;
    const float bounded = std::min(std::max(scaled, -2097152.0f), 2097152.0f);
    const float q = ((bounded + kRound) - kRound) + zero_point;
    // NaN (a NaN input, or 0 / 0) becomes the type's minimum, as the SSE path's
    // conversion and saturating packs make it, instead of an undefined conversion.
    constexpr float lo = static_cast<float>(std::numeric_limits<Q>::min());
    constexpr float hi = static_cast<float>(std::numeric_limits<Q>::max());
    return static_cast<Q>(q >= lo ? std::min(q, hi) : lo);
}

/// quantize_8_bit over n values, `scaled(i)` giving value i already divided by the
/// scale (or multiplied by the requantization multiplier). Sixteen at a time with
/// SSE2, whose saturating packs are the 8-bit clamp; the arithmetic per value is
/// the same float32 operations, so the results are identical.
template <typename Q, typename Scaled4, typename Scaled>
void quantize_8_bit_block(Q* __restrict out, size_t n, float zero_point, Scaled4 scaled4, Scaled scaled) {
    size_t i = 0;
#if defined(__SSE2__)
    const __m128 lo = _mm_set1_ps(-2097152.0f), hi = _mm_set1_ps(2097152.0f), round = _mm_set1_ps(12582912.0f);
    const __m128i zp = _mm_set1_epi32(static_cast<int32_t>(zero_point));
    for (; i + 16 <= n; i += 16) {
        __m128i q[4];
        for (size_t k = 0; k < 4; ++k) {
            const __m128 v = _mm_min_ps(_mm_max_ps(scaled4(i + 4 * k), lo), hi);
            q[k] = _mm_add_epi32(_mm_cvttps_epi32(_mm_sub_ps(_mm_add_ps(v, round), round)), zp);
        }
        const __m128i w0 = _mm_packs_epi32(q[0], q[1]), w1 = _mm_packs_epi32(q[2], q[3]);
        const __m128i b = std::is_signed_v<Q> ? _mm_packs_epi16(w0, w1) : _mm_packus_epi16(w0, w1);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), b);
    }
#else
    (void)scaled4;
#endif
    for (; i < n; ++i) out[i] = quantize_8_bit<Q>(scaled(i), zero_point);
}

/// quantize_8_bit_divided with sixteen lanes (AVX-512F), or eight (AVX2): the same float32 operations.
void quantize_8_bit_divided_avx512(const float* x, uint8_t* out, size_t n, float scale, float zero_point);
void quantize_8_bit_divided_avx512(const float* x, int8_t* out, size_t n, float scale, float zero_point);
void quantize_8_bit_divided_avx2(const float* x, uint8_t* out, size_t n, float scale, float zero_point);
void quantize_8_bit_divided_avx2(const float* x, int8_t* out, size_t n, float scale, float zero_point);

/// QuantizeLinear's 8-bit core: x / scale, rounded, plus the zero point, saturated.
template <typename Q>
void quantize_8_bit_divided(const float* __restrict x, Q* __restrict out, size_t n, float scale, float zero_point) {
    if (cpu_features().avx512f) return quantize_8_bit_divided_avx512(x, out, n, scale, zero_point);
    if (cpu_features().avx2) return quantize_8_bit_divided_avx2(x, out, n, scale, zero_point);
#if defined(__SSE2__)
    const __m128 s = _mm_set1_ps(scale);
    auto four = [&](size_t i) { return _mm_div_ps(_mm_loadu_ps(x + i), s); };
#else
    auto four = [](size_t) { return 0; };
#endif
    quantize_8_bit_block(out, n, zero_point, four, [&](size_t i) { return x[i] / scale; });
}

/// Requantization's 8-bit core: float(acc) * multiplier, rounded, plus the zero point, saturated.
template <typename Q>
void requantize_8_bit(const int32_t* __restrict acc, Q* __restrict out, size_t n, float multiplier, float zero_point) {
#if defined(__SSE2__)
    const __m128 m = _mm_set1_ps(multiplier);
    auto four = [&](size_t i) {
        return _mm_mul_ps(_mm_cvtepi32_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(acc + i))), m);
    };
#else
    auto four = [](size_t) { return 0; };
#endif
    quantize_8_bit_block(out, n, zero_point, four, [&](size_t i) { return static_cast<float>(acc[i]) * multiplier; });
}

/// A new int8 or uint8 tensor (as `type` says) of `shape` holding
/// quantize_value(value(i), zero_point) for each flat index i.
template <typename Value>
Tensor quantized_tensor(KernelContext& ctx, DataType type, const std::vector<int64_t>& shape, double zero_point,
                        Value value) {
    Tensor y;
    dispatch_numeric(type, ctx, [&](auto tag) {
        using Q = typename decltype(tag)::type;
        if constexpr (sizeof(Q) != 1) {
            ctx.fail("outputs must be int8 or uint8");
        } else {
            y = make_tensor<Q>(shape);
            auto o = mutable_view<Q>(y);
            const auto n = static_cast<int64_t>(o.size());
            const auto zp = static_cast<float>(zero_point);
            parallel_for(n, n > kParallelGrain,
                         [&](int64_t i) { o[i] = quantize_8_bit<Q>(value(static_cast<size_t>(i)), zp); });
        }
    });
    return y;
}

/// The bounds the executor's power-of-two QDQ fusions put on an 8-bit output's
/// integers (a fused Relu/Clip, quantized), or Q's whole range.
/// (An NhwcQLinearConvPair keeps its 1x1 half's under other names.)
template <typename Q>
std::pair<Q, Q> output_bounds(const KernelContext& ctx, const char* min_name = kOutputMinAttribute,
                              const char* max_name = kOutputMaxAttribute) {
    constexpr int64_t lowest = std::numeric_limits<Q>::min(), highest = std::numeric_limits<Q>::max();
    const auto lo = ctx.attributes.get_int(min_name, lowest);
    const auto hi = ctx.attributes.get_int(max_name, highest);
    return {static_cast<Q>(std::clamp(lo, lowest, highest)), static_cast<Q>(std::clamp(hi, lowest, highest))};
}

/// Elementwise f(a, b) -> R with broadcasting. Rows of the last dimension are
/// walked with fixed strides, so no per-element index is ever materialised.
template <typename T, typename R, typename F>
Tensor broadcast_binary(const KernelContext& ctx, const Tensor& a, const Tensor& b, F f) {
    // The op's schema check covers the opsets the ONNX library knows; this, the newer ones too.
    if (a.type() != type_of<T>() || b.type() != type_of<T>())
        ctx.fail(fmt::format("the operands have element types {} and {}, but must both be {}",
                             data_type_name(a.type()), data_type_name(b.type()), data_type_name(type_of<T>())));
    const auto shape = broadcast_shapes(ctx, a.shape(), b.shape());
    Tensor out = make_tensor<R>(shape);
    auto o = mutable_view<R>(out);
    const auto x = view<T>(a);
    const auto y = view<T>(b);
    const auto n = static_cast<int64_t>(o.size());
    if (a.shape() == b.shape()) {
        parallel_for(n, n > kParallelGrain, [&](int64_t i) { o[i] = f(x[i], y[i]); });
        return out;
    }
    if (y.size() == 1) {
        const T s = y[0];
        parallel_for(n, n > kParallelGrain, [&](int64_t i) { o[i] = f(x[i], s); });
        return out;
    }
    if (x.size() == 1) {
        const T s = x[0];
        parallel_for(n, n > kParallelGrain, [&](int64_t i) { o[i] = f(s, y[i]); });
        return out;
    }
    const auto sa = broadcast_strides(a.shape(), shape);
    const auto sb = broadcast_strides(b.shape(), shape);
    // The trailing dimensions along which each operand is either contiguous or
    // broadcast throughout make one inner run, a loop that vectorises: an SE
    // block's [N, C, H, W] * [N, C, 1, 1] is C runs of H * W values times one.
    // (The last dimension longer than 1 is one or the other in each operand, so
    // `mode` is set wherever there is a value.)
    enum Along { Broadcast, Contiguous, Strided };
    auto along = [](int64_t stride, int64_t run) {
        return stride == 0 ? Broadcast : stride == run ? Contiguous : Strided;
    };
    int64_t run = 1;
    size_t outer = shape.size();
    std::optional<std::pair<Along, Along>> mode;
    for (; outer > 0; --outer) {
        const size_t d = outer - 1;
        if (shape[d] == 1) continue;
        const std::pair<Along, Along> here{along(sa[d], run), along(sb[d], run)};
        if (here.first == Strided || here.second == Strided || (mode && here != *mode)) break;
        mode = here;
        run *= shape[d];
    }
    const int64_t rows = run ? n / run : 0;
    parallel_for(rows, n > kParallelGrain, [&](int64_t r) {
        int64_t pa = 0, pb = 0, rest = r;
        for (size_t d = outer; d-- > 0;) {
            const int64_t c = rest % shape[d];
            rest /= shape[d];
            pa += c * sa[d];
            pb += c * sb[d];
        }
        R* row = o.data() + r * run;
        const T* xs = x.data() + pa;
        const T* ys = y.data() + pb;
        if (mode->first == Contiguous && mode->second == Contiguous)
            for (int64_t j = 0; j < run; ++j) row[j] = f(xs[j], ys[j]);
        else if (mode->first == Contiguous)
            for (int64_t j = 0; j < run; ++j) row[j] = f(xs[j], *ys);
        else
            for (int64_t j = 0; j < run; ++j) row[j] = f(*xs, ys[j]);
    });
    return out;
}

}  // namespace vaiq::runtime
