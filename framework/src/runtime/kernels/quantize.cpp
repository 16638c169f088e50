// QuantizeLinear and DequantizeLinear, per tensor and per axis, as the ONNX
// spec and ONNX Runtime define them: round half to even, then saturate. Also
// vaiq's own VitisQuantizeLinear/VitisDequantizeLinear (the same, plus the float
// types float16 and bfloat16) and FixNeuron, as docs/formats.md specifies them.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "runtime/kernels/intrinsics.hpp"
#include "vaiq/block_float.hpp"
#include "vaiq/vaiq_ops.hpp"

#include "runtime/kernels/common.hpp"

namespace vaiq::runtime {

namespace {

// x / scale (skipped when the scale is 1, which changes nothing), clamped to
// +-2^21, rounded half to even by adding and taking off 1.5 * 2^23, plus the
// zero point, saturated to Q: quantize_8_bit's operations, sixteen lanes at once.
template <typename Q>
[[gnu::target("avx512f")]] void divided_avx512(const float* __restrict x, Q* __restrict out, size_t n, float scale,
                                               float zero_point) {
    const __m512 s = _mm512_set1_ps(scale), lo = _mm512_set1_ps(-2097152.0f), hi = _mm512_set1_ps(2097152.0f);
    const __m512 round = _mm512_set1_ps(12582912.0f);
    const __m512i zp = _mm512_set1_epi32(static_cast<int32_t>(zero_point));
    const __m512i q_min = _mm512_set1_epi32(std::numeric_limits<Q>::min());
    const __m512i q_max = _mm512_set1_epi32(std::numeric_limits<Q>::max());
    const bool divide = scale != 1.0f;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        if (divide) v = _mm512_div_ps(v, s);
        v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);  // a NaN becomes lo, as max returns its second operand
        const __m512i q = _mm512_add_epi32(_mm512_cvttps_epi32(_mm512_sub_ps(_mm512_add_ps(v, round), round)), zp);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                         _mm512_cvtepi32_epi8(_mm512_min_epi32(_mm512_max_epi32(q, q_min), q_max)));
    }
    for (; i < n; ++i) out[i] = quantize_8_bit<Q>(x[i] / scale, zero_point);
}

// divided_avx512 eight lanes at a time, for CPUs with AVX2 only.
template <typename Q>
[[gnu::target("avx2")]] void divided_avx2(const float* __restrict x, Q* __restrict out, size_t n, float scale,
                                          float zero_point) {
    const __m256 s = _mm256_set1_ps(scale);
    const __m256i zp = _mm256_set1_epi32(static_cast<int32_t>(zero_point));
    const __m256i q_min = _mm256_set1_epi32(std::numeric_limits<Q>::min());
    const __m256i q_max = _mm256_set1_epi32(std::numeric_limits<Q>::max());
    const bool divide = scale != 1.0f;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        if (divide) v = _mm256_div_ps(v, s);
        quantize_8_avx2(v, zp, q_min, q_max, out + i);
    }
    for (; i < n; ++i) out[i] = quantize_8_bit<Q>(x[i] / scale, zero_point);
}

}  // namespace

void quantize_8_bit_divided_avx512(const float* x, uint8_t* out, size_t n, float scale, float zero_point) {
    divided_avx512(x, out, n, scale, zero_point);
}

void quantize_8_bit_divided_avx512(const float* x, int8_t* out, size_t n, float scale, float zero_point) {
    divided_avx512(x, out, n, scale, zero_point);
}

void quantize_8_bit_divided_avx2(const float* x, uint8_t* out, size_t n, float scale, float zero_point) {
    divided_avx2(x, out, n, scale, zero_point);
}

void quantize_8_bit_divided_avx2(const float* x, int8_t* out, size_t n, float scale, float zero_point) {
    divided_avx2(x, out, n, scale, zero_point);
}
namespace {

// The scale/zero-point index of each element: 0 per tensor, else its channel on `axis`.
struct Channels {
    int64_t count = 1, inner = 1;
    int64_t of(int64_t i) const { return count == 1 ? 0 : (i / inner) % count; }
};

Channels channels(KernelContext& ctx, const Tensor& x, const Tensor& scale) {
    if (ctx.attributes.get_int("block_size", 0) != 0) ctx.fail("blocked quantization (block_size) is not supported");
    Channels c;
    if (scale.size() == 1 && scale.shape().size() <= 1) return c;
    if (scale.shape().size() != 1) ctx.fail("scale must be a scalar or a 1-D tensor");
    const auto rank = static_cast<int64_t>(x.shape().size());
    if (rank == 0) ctx.fail(fmt::format("{} scales for a scalar input: per-axis scales need an axis", scale.size()));
    const int64_t axis = normalize_axis(ctx, ctx.attributes.get_int("axis", 1), rank);
    if (x.shape()[axis] != scale.size())
        ctx.fail(fmt::format("{} scales for axis {} of size {}", scale.size(), axis, x.shape()[axis]));
    c.count = scale.size();
    for (int64_t d = axis + 1; d < rank; ++d) c.inner *= x.shape()[d];
    return c;
}

// A zero point has one value per scale (and, for dequantization, the input's type).
void check_zero_point(KernelContext& ctx, const Tensor& scale, const Tensor* must_match) {
    if (!ctx.has_input(2)) return;
    const auto& zp = ctx.input(2);
    if (zp.size() != scale.size())
        ctx.fail(fmt::format("the zero point has {} values and the scale {}", zp.size(), scale.size()));
    if (must_match && zp.type() != must_match->type())
        ctx.fail(fmt::format("the zero point is {} but the input {}", data_type_name(zp.type()),
                             data_type_name(must_match->type())));
}

// A float8 zero point, when given, is (plus or minus) 0.
void check_float8_zero_point(KernelContext& ctx) {
    if (ctx.has_input(2))
        for (const auto b : ctx.input(2).bytes())
            if ((static_cast<uint8_t>(b) & 0x7f) != 0) ctx.fail("a float8 zero point must be 0");
}

// To float8, as ONNX Runtime computes it: x / scale as a float8, saturated to
// the largest finite value unless `saturate` is 0.
void quantize_float8(KernelContext& ctx, std::vector<Tensor>& out, const Channels& ch, DataType type) {
    const auto xv = ctx.input(0).data<float>();
    const auto s = ctx.input(1).data<float>();
    check_float8_zero_point(ctx);
    const bool saturate = ctx.attributes.get_int("saturate", 1) != 0;
    out[0] = Tensor::uninitialized(type, ctx.input(0).shape());
    auto* y = reinterpret_cast<uint8_t*>(out[0].mutable_bytes().data());
    for (size_t i = 0; i < xv.size(); ++i)
        y[i] = float_to_float8(xv[i] / s[ch.of(static_cast<int64_t>(i))], type, saturate);
}

// From float8: the float8's value times the scale.
void dequantize_float8(KernelContext& ctx, std::vector<Tensor>& out, const Channels& ch) {
    const auto& x = ctx.input(0);
    const auto s = ctx.input(1).data<float>();
    check_float8_zero_point(ctx);
    out[0] = Tensor::uninitialized(DataType::Float, x.shape());
    auto o = out[0].mutable_data<float>();
    const auto* bits = reinterpret_cast<const uint8_t*>(x.bytes().data());
    for (size_t i = 0; i < o.size(); ++i) o[i] = float8_to_float(bits[i], x.type()) * s[ch.of(static_cast<int64_t>(i))];
}

void quantize(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto& scale = ctx.input(1);
    if (x.type() != DataType::Float || scale.type() != DataType::Float)
        ctx.fail("only float input and scale are supported");
    const auto ch = channels(ctx, x, scale);
    check_zero_point(ctx, scale, nullptr);
    // Opset 21 may name the type with output_dtype when there is no zero point.
    const DataType type =
        ctx.has_input(2) ? ctx.input(2).type() : static_cast<DataType>(ctx.attributes.get_int("output_dtype", 2));
    if (is_float8(type)) return quantize_float8(ctx, out, ch, type);
    dispatch_numeric(type, ctx, [&](auto tag) {
        using Q = typename decltype(tag)::type;
        if constexpr (std::is_floating_point_v<Q> || sizeof(Q) > 4) {
            ctx.fail("the zero point must be a 8-, 16- or 32-bit integer");
        } else {
            const auto s = scale.data<float>();
            const auto zp = ctx.has_input(2) ? view<Q>(ctx.input(2)) : std::span<const Q>();
            out[0] = make_tensor<Q>(x.shape());
            auto o = mutable_view<Q>(out[0]);
            const auto xv = x.data<float>();
            if constexpr (sizeof(Q) == 1) {
                // Sixteen values at a time within each channel's run.
                for_each_channel_run(x.size(), ch.count, ch.inner, [&](int64_t first, int64_t n, int64_t c) {
                    quantize_8_bit_divided(xv.data() + first, o.data() + first, static_cast<size_t>(n), s[c],
                                           zp.empty() ? 0.0f : static_cast<float>(zp[c]));
                });
            } else {
                for (size_t i = 0; i < o.size(); ++i) {
                    const int64_t c = ch.of(static_cast<int64_t>(i));
                    o[i] = quantize_value<Q>(xv[i] / s[c], zp.empty() ? 0.0 : static_cast<double>(zp[c]));
                }
            }
        }
    });
}

// (x - zero point) * scale for 8- and 16-bit x: the difference is exact in int32.
template <typename Q>
void dequantize_block(const Q* __restrict x, float* __restrict out, size_t n, int32_t zero_point, float scale) {
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<int32_t>(x[i]) - zero_point) * scale;
}

// DequantizeLinear from opset 21 with block_size: a scale (and zero point) per
// block of block_size values along axis; scale has x's rank, ceil(D / block)
// along axis.
void dequantize_blocked(KernelContext& ctx, std::vector<Tensor>& out, int64_t block) {
    const auto& x = ctx.input(0);
    const auto& scale = ctx.input(1);
    const auto rank = static_cast<int64_t>(x.shape().size());
    if (rank == 0) ctx.fail("blocked quantization needs an input with an axis, not a scalar");
    const auto axis = static_cast<int>(normalize_axis(ctx, ctx.attributes.get_int("axis", 1), rank));
    if (block < 0) ctx.fail("block_size must be positive");
    if (scale.shape() != ParamLayout::block_shape(x.shape(), axis, block))
        ctx.fail("the scale's shape must be the input's with ceil(dim / block_size) along axis");
    if (ctx.has_input(2) && ctx.input(2).shape() != scale.shape()) ctx.fail("the zero point's shape must be the scale's");
    if (ctx.has_input(2) && ctx.input(2).type() != x.type()) ctx.fail("the zero point's type must be the input's");
    const ParamLayout layout(x.shape(), axis, block, static_cast<size_t>(scale.size()), ctx.node.input(0));
    const auto s = scale.data<float>();
    out[0] = Tensor::uninitialized(DataType::Float, x.shape());
    auto o = out[0].mutable_data<float>();
    auto run = [&](auto tag) {
        using Q = typename decltype(tag)::type;
        const auto xv = x.data<Q>();
        const auto zp = ctx.has_input(2) ? ctx.input(2).data<Q>() : std::span<const Q>();
        for (size_t i = 0; i < o.size(); ++i) {
            const size_t c = layout.index(i);
            o[i] = static_cast<float>(static_cast<int32_t>(xv[i]) - (zp.empty() ? 0 : static_cast<int32_t>(zp[c]))) *
                   s[c];
        }
    };
    switch (x.type()) {
        case DataType::Int4:
        case DataType::Int8: return run(TypeTag<int8_t>{});
        case DataType::UInt4:
        case DataType::UInt8: return run(TypeTag<uint8_t>{});
        case DataType::Int16: return run(TypeTag<int16_t>{});
        case DataType::UInt16: return run(TypeTag<uint16_t>{});
        default: ctx.fail("blocked input must be a 4-, 8- or 16-bit integer tensor");
    }
}

void dequantize(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto& scale = ctx.input(1);
    if (scale.type() != DataType::Float) ctx.fail("only float scales are supported");
    if (const int64_t block = ctx.attributes.get_int("block_size", 0); block != 0)
        return dequantize_blocked(ctx, out, block);
    // 4-bit values are held one per byte.
    const DataType type = x.type() == DataType::Int4 ? DataType::Int8 : x.type() == DataType::UInt4 ? DataType::UInt8 : x.type();
    const auto ch = channels(ctx, x, scale);
    check_zero_point(ctx, scale, &x);
    if (is_float8(type)) return dequantize_float8(ctx, out, ch);
    dispatch_numeric(type, ctx, [&](auto tag) {
        using Q = typename decltype(tag)::type;
        if constexpr (std::is_floating_point_v<Q> || std::is_same_v<Q, bool>) {
            ctx.fail("the input must be an integer tensor");
        } else {
            const auto s = scale.data<float>();
            const auto zp = ctx.has_input(2) ? view<Q>(ctx.input(2)) : std::span<const Q>();
            out[0] = Tensor::uninitialized(DataType::Float, x.shape());
            auto o = out[0].mutable_data<float>();
            const auto xv = view<Q>(x);
            if constexpr (sizeof(Q) <= 2) {
                // Each channel's run is a plain loop that vectorises.
                for_each_channel_run(x.size(), ch.count, ch.inner, [&](int64_t first, int64_t n, int64_t c) {
                    dequantize_block(xv.data() + first, o.data() + first, static_cast<size_t>(n),
                                     zp.empty() ? 0 : static_cast<int32_t>(zp[c]), s[c]);
                });
            } else {
                for (size_t i = 0; i < o.size(); ++i) {
                    const int64_t c = ch.of(static_cast<int64_t>(i));
                    const int64_t z = zp.empty() ? 0 : static_cast<int64_t>(zp[c]);
                    o[i] = static_cast<float>(static_cast<int64_t>(xv[i]) - z) * s[c];
                }
            }
        }
    });
}

// The float quant type a float16/bfloat16 zero point names.
QuantType float_quant_type(DataType t) { return t == DataType::Float16 ? QuantType::QFloat16 : QuantType::QBFloat16; }
bool is_half_type(DataType t) { return t == DataType::Float16 || t == DataType::BFloat16; }

// VitisQuantizeLinear: QuantizeLinear, and for float16/bfloat16 zero points
// x / scale + zero point rounded to the type and saturated to its finite range.
void vitis_quantize(KernelContext& ctx, std::vector<Tensor>& out) {
    if (!ctx.has_input(2)) ctx.fail("the zero point is required: its type is the quantized type");
    const DataType type = ctx.input(2).type();
    if (!is_half_type(type)) return quantize(ctx, out);
    const auto& x = ctx.input(0);
    const auto& scale = ctx.input(1);
    if (x.type() != DataType::Float || scale.type() != DataType::Float)
        ctx.fail("only float input and scale are supported");
    const auto ch = channels(ctx, x, scale);
    const QuantType qt = float_quant_type(type);
    const auto* zp = reinterpret_cast<const uint16_t*>(ctx.input(2).bytes().data());
    out[0] = Tensor::uninitialized(type, x.shape());
    auto* o = reinterpret_cast<uint16_t*>(out[0].mutable_bytes().data());
    const auto xv = x.data<float>();
    const auto s = scale.data<float>();
    for (size_t i = 0; i < xv.size(); ++i) {
        const int64_t c = ch.of(static_cast<int64_t>(i));
        o[i] = quantize_float_value(xv[i] / s[c], float_quant_value(zp[c], qt), qt);
    }
}

// VitisDequantizeLinear: DequantizeLinear, and (x - zero point) * scale for the float types.
void vitis_dequantize(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    if (!is_half_type(x.type())) return dequantize(ctx, out);
    const auto& scale = ctx.input(1);
    if (scale.type() != DataType::Float) ctx.fail("only float scales are supported");
    if (ctx.has_input(2) && ctx.input(2).type() != x.type()) ctx.fail("the zero point's type must be the input's");
    const auto ch = channels(ctx, x, scale);
    const QuantType qt = float_quant_type(x.type());
    const auto* xv = reinterpret_cast<const uint16_t*>(x.bytes().data());
    const auto* zp = ctx.has_input(2) ? reinterpret_cast<const uint16_t*>(ctx.input(2).bytes().data()) : nullptr;
    const auto s = scale.data<float>();
    out[0] = Tensor::uninitialized(DataType::Float, x.shape());
    auto o = out[0].mutable_data<float>();
    for (size_t i = 0; i < o.size(); ++i) {
        const int64_t c = ch.of(static_cast<int64_t>(i));
        o[i] = (float_quant_value(xv[i], qt) - (zp ? float_quant_value(zp[c], qt) : 0.0f)) * s[c];
    }
}

void fixneuron(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    if (x.type() != DataType::Float) ctx.fail("the input must be float");
    const auto attributes = fixneuron_attributes(ctx.node);
    out[0] = Tensor::uninitialized(DataType::Float, x.shape());
    auto o = out[0].mutable_data<float>();
    const auto xv = x.data<float>();
    for (size_t i = 0; i < o.size(); ++i) o[i] = fixneuron_value(xv[i], attributes);
}

// BFPQuantizeDequantize / MXQuantizeDequantize (vaiq/block_float.hpp).
void block_float(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    if (x.type() != DataType::Float) ctx.fail("the input must be float");
    const auto node = block_float_node(ctx.node);
    out[0] = block_float_fake_quantize(x, node->type, node->blocks, ctx.node.name());
}

const KernelRegistration kKernels[] = {
    {"", "QuantizeLinear", 10, 21, quantize, always_in_team},
    {"", "DequantizeLinear", 10, 21, dequantize, always_in_team},
    {"com.microsoft", "QuantizeLinear", 1, 1, quantize, always_in_team},
    {"com.microsoft", "DequantizeLinear", 1, 1, dequantize, always_in_team},
    {std::string(kVaiqDomain), std::string(kVitisQuantizeOp), 1, 1, vitis_quantize},
    {std::string(kVaiqDomain), std::string(kVitisDequantizeOp), 1, 1, vitis_dequantize},
    {std::string(kVaiqDomain), std::string(kFixNeuronOp), 1, 1, fixneuron},
    {std::string(kContribDomain), std::string(kFixNeuronOp), 1, 1, fixneuron},
    {std::string(kVaiqDomain), std::string(kBFPOp), 1, 1, block_float},
    {std::string(kVaiqDomain), std::string(kMXOp), 1, 1, block_float},
};

}  // namespace
}  // namespace vaiq::runtime
