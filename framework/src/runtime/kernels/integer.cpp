// Integer-arithmetic ops of quantized models, exactly as the ONNX spec and
// ONNX Runtime define them: int32 accumulation of (x - x_zero_point) *
// (w - w_zero_point), requantization rounding half to even, then saturation.
// Plain loops: exact first; the fast int8 paths come later.
#include <cmath>
#include <limits>
#include <optional>

#include "runtime/cpu_features.hpp"
#include "runtime/kernels/common.hpp"
#include "runtime/kernels/int8_conv.hpp"
#include "runtime/kernels/int8_depthwise.hpp"
#include "runtime/kernels/int8_pointwise.hpp"
#include "runtime/kernels/intrinsics.hpp"
#include "runtime/kernels/window.hpp"
#include "runtime/layout.hpp"

namespace vaiq::runtime {
namespace {

// An 8-bit tensor's values as int32, with its zero point(s) subtracted along
// `axis` (per-tensor when the zero point has one element).
std::vector<int32_t> centred(KernelContext& ctx, const Tensor& t, const Tensor* zero_point, int64_t axis) {
    std::vector<int32_t> out(static_cast<size_t>(t.size()));
    std::vector<int32_t> zp{0};
    if (zero_point) {
        zp.clear();
        dispatch_numeric(zero_point->type(), ctx, [&](auto tag) {
            using Z = typename decltype(tag)::type;
            for (auto v : view<Z>(*zero_point)) zp.push_back(static_cast<int32_t>(v));
        });
    }
    int64_t inner = 1;
    if (zp.size() > 1)
        for (size_t d = static_cast<size_t>(axis) + 1; d < t.shape().size(); ++d) inner *= t.shape()[d];
    dispatch_numeric(t.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const auto v = view<T>(t);
        for (size_t i = 0; i < v.size(); ++i) {
            const size_t c = zp.size() == 1 ? 0 : (i / static_cast<size_t>(inner)) % zp.size();
            out[i] = static_cast<int32_t>(v[i]) - zp[c];
        }
    });
    return out;
}

std::vector<float> floats(const Tensor& t) {
    const auto v = t.data<float>();
    return {v.begin(), v.end()};
}

// requantize_8_bit with sixteen lanes: the same float32 operations, then the
// clamp to Q's range before the narrowing (vpmovdb truncates).
template <typename Q>
[[gnu::target("avx512f")]] void requantize_8_bit_avx512(const int32_t* __restrict acc, Q* __restrict out, size_t n,
                                                        float multiplier, float zero_point) {
    const __m512 m = _mm512_set1_ps(multiplier), lo = _mm512_set1_ps(-2097152.0f), hi = _mm512_set1_ps(2097152.0f);
    const __m512 round = _mm512_set1_ps(12582912.0f);
    const __m512i zp = _mm512_set1_epi32(static_cast<int32_t>(zero_point));
    const __m512i q_min = _mm512_set1_epi32(std::numeric_limits<Q>::min());
    const __m512i q_max = _mm512_set1_epi32(std::numeric_limits<Q>::max());
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(acc + i)), m);
        const __m512 r = _mm512_sub_ps(_mm512_add_ps(_mm512_min_ps(_mm512_max_ps(v, lo), hi), round), round);
        const __m512i q = _mm512_add_epi32(_mm512_cvttps_epi32(r), zp);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                         _mm512_cvtepi32_epi8(_mm512_min_epi32(_mm512_max_epi32(q, q_min), q_max)));
    }
    requantize_8_bit(acc + i, out + i, n - i, multiplier, zero_point);
}

// requantize_8_bit_avx512 eight lanes at a time, for CPUs with AVX2 only.
template <typename Q>
[[gnu::target("avx2")]] void requantize_8_bit_avx2(const int32_t* __restrict acc, Q* __restrict out, size_t n,
                                                   float multiplier, float zero_point) {
    const __m256 m = _mm256_set1_ps(multiplier);
    const __m256i zp = _mm256_set1_epi32(static_cast<int32_t>(zero_point));
    const __m256i q_min = _mm256_set1_epi32(std::numeric_limits<Q>::min());
    const __m256i q_max = _mm256_set1_epi32(std::numeric_limits<Q>::max());
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + i));
        quantize_8_avx2(_mm256_mul_ps(_mm256_cvtepi32_ps(a), m), zp, q_min, q_max, out + i);
    }
    requantize_8_bit(acc + i, out + i, n - i, multiplier, zero_point);
}

template <typename Q>
void requantize_block(const int32_t* acc, Q* out, size_t n, float multiplier, float zero_point) {
    if (cpu_features().avx512f) return requantize_8_bit_avx512(acc, out, n, multiplier, zero_point);
    if (cpu_features().avx2) return requantize_8_bit_avx2(acc, out, n, multiplier, zero_point);
    requantize_8_bit(acc, out, n, multiplier, zero_point);
}

// Writes round(acc * multiplier) + zero point, saturated, into a tensor of the zero point's type.
Tensor requantize(KernelContext& ctx, const std::vector<int64_t>& shape, const Int32Sums& acc,
                  const std::vector<double>& multiplier, int64_t channel_inner, const Tensor& zero_point) {
    // Walks the channel runs so that no element index is divided (this is the hot loop).
    if (multiplier.empty()) ctx.fail("the scales are empty");
    const auto zp = static_cast<float>(read_scalar(ctx, zero_point));
    Tensor y;
    dispatch_numeric(zero_point.type(), ctx, [&](auto tag) {
        using Q = typename decltype(tag)::type;
        if constexpr (sizeof(Q) != 1) {
            ctx.fail("outputs must be int8 or uint8");
        } else {
            y = make_tensor<Q>(shape);
            Q* o = mutable_view<Q>(y).data();
            const auto channels = static_cast<int64_t>(multiplier.size());
            for_each_channel_run(static_cast<int64_t>(acc.size()), channels, channel_inner,
                                 [&](int64_t first, int64_t n, int64_t c) {
                                     const auto m = static_cast<float>(multiplier[c]);  // float32, as ONNX Runtime
                                     requantize_block(acc.data() + first, o + first, static_cast<size_t>(n), m, zp);
                                 });
        }
    });
    return y;
}

// Batched (broadcast) integer matrix product of centred operands.
Int32Sums int_matmul(KernelContext& ctx, const Tensor& a, const std::vector<int32_t>& av, const Tensor& b,
                     const std::vector<int32_t>& bv, std::vector<int64_t>& shape) {
    auto as = a.shape(), bs = b.shape();
    if (as.empty() || bs.empty()) ctx.fail("a matrix product needs operands with at least one dimension");
    const bool a_vector = as.size() == 1, b_vector = bs.size() == 1;
    if (a_vector) as.insert(as.begin(), 1);
    if (b_vector) bs.push_back(1);
    const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
    if (bs[bs.size() - 2] != k) ctx.fail("inner dimensions differ");
    const std::vector<int64_t> a_batch(as.begin(), as.end() - 2), b_batch(bs.begin(), bs.end() - 2);
    const auto batch = broadcast_shapes(ctx, a_batch, b_batch);
    const auto ia = broadcast_index(a_batch, batch), ib = broadcast_index(b_batch, batch);
    shape = batch;
    if (!a_vector) shape.push_back(m);
    if (!b_vector) shape.push_back(n);
    Int32Sums out(ia.size() * static_cast<size_t>(m * n), 0);
    // Row by row, adding a-scaled rows of b: contiguous, vectorisable inner loop.
    // Integer sums are exact, so the order does not change the result.
    const auto rows = static_cast<int64_t>(ia.size()) * m;
    parallel_for(rows, rows * n * k > kParallelGrain, [&](int64_t r) {
        const auto p = static_cast<size_t>(r / m);
        const int32_t* a_row = av.data() + (ia[p] * m + r % m) * k;
        const int32_t* b_mat = bv.data() + ib[p] * k * n;
        int32_t* o_row = out.data() + r * n;
        for (int64_t q = 0; q < k; ++q) {
            const int32_t x = a_row[q];
            const int32_t* b_row = b_mat + q * n;
            for (int64_t j = 0; j < n; ++j) o_row[j] += x * b_row[j];
        }
    });
    return out;
}

int32_t scalar_zero_point(KernelContext& ctx, const Tensor& zero_point) {
    int32_t zp = 0;
    dispatch_numeric(zero_point.type(), ctx, [&](auto tag) {
        using Z = typename decltype(tag)::type;
        zp = static_cast<int32_t>(view<Z>(zero_point)[0]);
    });
    return zp;
}

// The value every zero point of `zero_point` holds, when they are all one value
// (per-column zero points of a symmetric weight are all 0): the int8 products
// then take it as one.
std::optional<int32_t> common_zero_point(KernelContext& ctx, const Tensor& zero_point) {
    std::optional<int32_t> common;
    bool same = true;
    dispatch_numeric(zero_point.type(), ctx, [&](auto tag) {
        using Z = typename decltype(tag)::type;
        const auto v = view<Z>(zero_point);
        if (v.empty()) return;
        same = std::all_of(v.begin(), v.end(), [&](Z z) { return z == v[0]; });
        common = static_cast<int32_t>(v[0]);
    });
    return same ? common : std::nullopt;
}

void matmul_integer(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& a = ctx.input(0);
    const auto& b = ctx.input(1);
    const auto av =
        centred(ctx, a, ctx.has_input(2) ? &ctx.input(2) : nullptr, static_cast<int64_t>(a.shape().size()) - 2);
    const auto bv =
        centred(ctx, b, ctx.has_input(3) ? &ctx.input(3) : nullptr, static_cast<int64_t>(b.shape().size()) - 1);
    std::vector<int64_t> shape;
    const auto acc = int_matmul(ctx, a, av, b, bv, shape);
    out[0] = Tensor::from_values<int32_t>(shape, acc);
}

void qlinear_matmul(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& a = ctx.input(0);
    const auto& b = ctx.input(3);
    std::vector<int64_t> shape;
    std::optional<Int32Sums> fast;
    if (const auto zb = common_zero_point(ctx, ctx.input(5)); ctx.input(2).size() == 1 && zb)
        fast = int8_matmul(ctx, a, scalar_zero_point(ctx, ctx.input(2)), b, *zb, ctx.is_constant(3), ctx.state, shape);
    const auto acc =
        fast ? std::move(*fast)
             : int_matmul(ctx, a, centred(ctx, a, &ctx.input(2), static_cast<int64_t>(a.shape().size()) - 2), b,
                          centred(ctx, b, &ctx.input(5), static_cast<int64_t>(b.shape().size()) - 1), shape);
    const auto sa = floats(ctx.input(1)), sb = floats(ctx.input(4)), sy = floats(ctx.input(6));
    std::vector<double> multiplier;
    for (float s : sb) multiplier.push_back(static_cast<double>(sa[0] * s / sy[0]));
    out[0] = requantize(ctx, shape, acc, multiplier, 1, ctx.input(7));
}

// A 2-D matrix of centred values, transposed when `trans`.
std::vector<int32_t> oriented(const std::vector<int32_t>& v, const std::vector<int64_t>& shape, bool trans) {
    if (!trans) return v;
    const int64_t rows = shape[0], cols = shape[1];
    std::vector<int32_t> t(v.size());
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = v[r * cols + c];
    return t;
}

// com.microsoft QGemm: (A, a_scale, a_zp, B, b_scale, b_zp, [C int32], [y_scale, y_zp]),
// alpha, transA, transB. Integer sums plus C, requantized with (alpha a_scale b_scale) / y_scale
// per output column, as ONNX Runtime does; float output without y_scale.
void qgemm(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& a = ctx.input(0);
    const auto& b = ctx.input(3);
    if (a.shape().size() != 2 || b.shape().size() != 2) ctx.fail("A and B must be 2-D");
    const bool ta = ctx.attributes.get_int("transA", 0) != 0, tb = ctx.attributes.get_int("transB", 0) != 0;
    const float alpha = ctx.attributes.get_float("alpha", 1.0f);
    const int64_t m = ta ? a.shape()[1] : a.shape()[0], k = ta ? a.shape()[0] : a.shape()[1];
    const int64_t n = tb ? b.shape()[0] : b.shape()[1];
    if ((tb ? b.shape()[1] : b.shape()[0]) != k) ctx.fail("inner dimensions differ");
    std::vector<int64_t> shape;
    std::optional<Int32Sums> fast;
    const auto zb = ctx.has_input(5) ? common_zero_point(ctx, ctx.input(5)) : std::optional<int32_t>(0);
    if (!ta && ctx.input(2).size() == 1 && zb)
        fast =
            int8_matmul(ctx, a, scalar_zero_point(ctx, ctx.input(2)), b, *zb, ctx.is_constant(3), ctx.state, shape, tb);
    Int32Sums acc;
    if (fast) {
        acc = std::move(*fast);
    } else {
        const auto av = oriented(centred(ctx, a, &ctx.input(2), 0), a.shape(), ta);
        // Per-column zero points of B run along its N axis: axis 0 when transposed.
        const auto bv = oriented(centred(ctx, b, &ctx.input(5), tb ? 0 : 1), b.shape(), tb);
        const Tensor a2 = Tensor::uninitialized(DataType::Int32, {m, k}),
                     b2 = Tensor::uninitialized(DataType::Int32, {k, n});
        acc = int_matmul(ctx, a2, av, b2, bv, shape);
    }
    if (ctx.has_input(6)) {
        const auto& c = ctx.input(6);
        if (c.type() != DataType::Int32) ctx.fail("C must be int32");
        const auto cv = c.data<int32_t>();
        if (c.size() != 1 && c.size() != n && c.size() != m * n) ctx.fail("C must have 1, N or M x N values");
        // A row of C per row of the sums (a bias), or one value for all; as rows, so the adds vectorise.
        for (int64_t i = 0; i < m; ++i) {
            int32_t* row = acc.data() + i * n;
            if (c.size() == 1) {
                for (int64_t j = 0; j < n; ++j) row[j] += cv[0];
            } else {
                const int32_t* add = cv.data() + (c.size() == n ? 0 : i * n);
                for (int64_t j = 0; j < n; ++j) row[j] += add[j];
            }
        }
    }
    const auto sa = floats(ctx.input(1)), sb = floats(ctx.input(4));
    if (!ctx.has_input(7)) {
        out[0] = Tensor::uninitialized(DataType::Float, shape);
        auto y = out[0].mutable_data<float>();
        for (size_t i = 0; i < acc.size(); ++i)
            y[i] = static_cast<float>(acc[i]) * (alpha * sa[0] * sb[sb.size() == 1 ? 0 : i % sb.size()]);
        return;
    }
    const float sy = ctx.input(7).data<float>()[0];
    std::vector<double> multiplier;
    for (float s : sb) multiplier.push_back(static_cast<double>(alpha * sa[0] * s / sy));
    if (!ctx.has_input(8)) ctx.fail("y_zero_point is required with y_scale");
    out[0] = requantize(ctx, shape, acc, multiplier, 1, ctx.input(8));
}

// Integer convolution of centred input and weights: [N, M, out...] int32.
Int32Sums int_conv(KernelContext& ctx, const Tensor& x, const std::vector<int32_t>& xv, const Tensor& w,
                   const std::vector<int32_t>& wv, std::vector<int64_t>& shape) {
    if (x.shape().size() < 3 || w.shape().size() != x.shape().size())
        ctx.fail("the input needs at least 3 dimensions and the weight as many as the input");
    const size_t spatial = x.shape().size() - 2;
    const int64_t group = ctx.attributes.get_int("group", 1);
    if (group < 1) ctx.fail("group must be positive");
    const int64_t n = x.shape()[0], c = x.shape()[1], m = w.shape()[0], cg = c / group, mg = m / group;
    if (c % group != 0 || m % group != 0 || w.shape()[1] != cg || mg == 0)
        ctx.fail("channels, weights and group disagree");
    const std::vector<int64_t> in(x.shape().begin() + 2, x.shape().end()),
        kernel(w.shape().begin() + 2, w.shape().end());
    const auto g = WindowGeometry::from(ctx, in, kernel, false);
    shape = {n, m};
    shape.insert(shape.end(), g.out.begin(), g.out.end());
    const int64_t out_plane = element_count(g.out), in_plane = element_count(in), k_plane = element_count(kernel);
    const int64_t rows = cg * k_plane;  // a group's weight row: (input channel, kernel offset)
    const auto in_strides = strides_of(in);
    // Where each kernel offset lands, per spatial axis, relative to an output position's origin.
    std::vector<std::vector<int64_t>> offset(spatial, std::vector<int64_t>(static_cast<size_t>(k_plane)));
    for (int64_t kk = 0; kk < k_plane; ++kk)
        for (int64_t d = static_cast<int64_t>(spatial) - 1, r = kk; d >= 0; --d) {
            offset[d][kk] = (r % kernel[d]) * g.dilations[d];
            r /= kernel[d];
        }
    Int32Sums acc(static_cast<size_t>(n * m * out_plane), 0);
    // Columns of output positions, a block at a time (im2col, centred values, 0
    // outside the input), multiplied by each output channel's weight row: the
    // same integer sums as a loop per output, in a bounded buffer.
    constexpr int64_t kBlock = 1024;
    std::vector<int32_t> columns(static_cast<size_t>(rows * kBlock));
    std::vector<int64_t> origin(spatial * kBlock);
    for (int64_t b = 0; b < n; ++b)
        for (int64_t grp = 0; grp < group; ++grp)
            for (int64_t first = 0; first < out_plane; first += kBlock) {
                const int64_t width = std::min(kBlock, out_plane - first);
                for (int64_t o = 0; o < width; ++o)
                    for (int64_t d = static_cast<int64_t>(spatial) - 1, rest = first + o; d >= 0; --d) {
                        origin[d * kBlock + o] = (rest % g.out[d]) * g.strides[d] - g.pad_begin[d];
                        rest /= g.out[d];
                    }
                const int32_t* image = xv.data() + (b * c + grp * cg) * in_plane;
                for (int64_t ic = 0; ic < cg; ++ic)
                    for (int64_t kk = 0; kk < k_plane; ++kk) {
                        int32_t* column = columns.data() + (ic * k_plane + kk) * width;
                        for (int64_t o = 0; o < width; ++o) {
                            int64_t flat = 0;
                            bool inside = true;
                            for (size_t d = 0; d < spatial; ++d) {
                                const int64_t at = origin[static_cast<int64_t>(d) * kBlock + o] + offset[d][kk];
                                inside &= at >= 0 && at < in[d];
                                flat += at * in_strides[d];
                            }
                            column[o] = inside ? image[ic * in_plane + flat] : 0;
                        }
                    }
                parallel_for(mg, mg * rows * width > kParallelGrain, [&](int64_t j) {
                    const int64_t oc = grp * mg + j;
                    // Wrapping (unsigned) sums: what int32 accumulators give, without overflow being undefined.
                    auto* y = reinterpret_cast<uint32_t*>(acc.data() + (b * m + oc) * out_plane + first);
                    const int32_t* weights = wv.data() + oc * rows;
                    for (int64_t r = 0; r < rows; ++r) {
                        const auto wr = static_cast<uint32_t>(weights[r]);
                        if (wr == 0) continue;
                        const int32_t* column = columns.data() + r * width;
                        for (int64_t o = 0; o < width; ++o) y[o] += wr * static_cast<uint32_t>(column[o]);
                    }
                });
            }
    return acc;
}

// Whether every zero point of an 8-bit tensor is 0.
bool all_zero(KernelContext& ctx, const Tensor& zero_point) {
    bool zero = true;
    dispatch_numeric(zero_point.type(), ctx, [&](auto tag) {
        using Z = typename decltype(tag)::type;
        for (auto v : view<Z>(zero_point)) zero = zero && v == Z{};
    });
    return zero;
}

// ConvInteger (dynamic quantization's convolutions): with one zero point for x
// and none for int8 weights, the int8 convolution QLinearConv runs on (the
// same exact int32 sums); otherwise the reference loops.
void conv_integer(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto& w = ctx.input(1);
    std::vector<int64_t> shape;
    const bool one_x_zero_point = !ctx.has_input(2) || ctx.input(2).size() == 1;
    if (one_x_zero_point && (!ctx.has_input(3) || all_zero(ctx, ctx.input(3)))) {
        const int32_t zero_point = ctx.has_input(2) ? scalar_zero_point(ctx, ctx.input(2)) : 0;
        if (auto fast = int8_conv(ctx, x, zero_point, w, ctx.is_constant(1), ctx.state, shape)) {
            out[0] = Tensor::from_values<int32_t>(shape, std::span<const int32_t>(*fast));
            return;
        }
    }
    const auto xv = centred(ctx, x, ctx.has_input(2) ? &ctx.input(2) : nullptr, 1);
    const auto wv = centred(ctx, w, ctx.has_input(3) ? &ctx.input(3) : nullptr, 0);
    const auto acc = int_conv(ctx, x, xv, w, wv, shape);
    out[0] = Tensor::from_values<int32_t>(shape, acc);
}

// QLinearConv's requantization multipliers, x_scale * w_scale / y_scale in float32.
std::vector<double> conv_multipliers(KernelContext& ctx, size_t x_scale = 1, size_t w_scale = 4, size_t y_scale = 6) {
    const auto sx = floats(ctx.input(x_scale)), sw = floats(ctx.input(w_scale)), sy = floats(ctx.input(y_scale));
    if (sx.empty() || sy.empty()) ctx.fail("the scales are empty");
    std::vector<double> multiplier;
    for (float s : sw) multiplier.push_back(static_cast<double>(sx[0] * s / sy[0]));
    return multiplier;
}

template <typename Q>
void clamp_values(Q* y, size_t n, std::pair<Q, Q> bounds) {
    for (size_t i = 0; i < n; ++i) y[i] = std::min(std::max(y[i], bounds.first), bounds.second);
}

// Applies output_bounds to a QLinearConv's 8-bit output, when it has them.
void clamp_output(KernelContext& ctx, Tensor& y) {
    if (!ctx.attributes.has(kOutputMinAttribute) && !ctx.attributes.has(kOutputMaxAttribute)) return;
    if (y.type() == DataType::UInt8)
        clamp_values(y.mutable_data<uint8_t>().data(), static_cast<size_t>(y.size()), output_bounds<uint8_t>(ctx));
    else if (y.type() == DataType::Int8)
        clamp_values(y.mutable_data<int8_t>().data(), static_cast<size_t>(y.size()), output_bounds<int8_t>(ctx));
}

// QLinearConv of `x` (NCHW; ctx's other inputs as the op has them).
Tensor qlinear_conv_of(KernelContext& ctx, const Tensor& x) {
    const auto& w = ctx.input(3);
    std::vector<int64_t> shape;
    std::optional<Int32Sums> fast;
    const int32_t* bias = ctx.has_input(8) ? ctx.input(8).data<int32_t>().data() : nullptr;
    if (bias && (w.shape().empty() || ctx.input(8).size() != w.shape()[0]))
        ctx.fail("the bias must have one value per output channel");
    if (ctx.input(2).size() == 1 && all_zero(ctx, ctx.input(5)))
        fast = int8_conv(ctx, x, scalar_zero_point(ctx, ctx.input(2)), w, ctx.is_constant(3), ctx.state, shape, bias);
    auto acc = fast ? std::move(*fast)
                    : int_conv(ctx, x, centred(ctx, x, &ctx.input(2), 1), w, centred(ctx, w, &ctx.input(5), 0), shape);
    const int64_t m = shape[1], plane = element_count(std::vector<int64_t>(shape.begin() + 2, shape.end()));
    if (bias && !fast) {  // (the int8 path added it already)
        const auto block = static_cast<size_t>(plane);
        for (size_t start = 0, c = 0; start < acc.size(); start += block, c = (c + 1) % static_cast<size_t>(m))
            for (size_t i = start; i < start + block; ++i) acc[i] += bias[c];
    }
    Tensor y = requantize(ctx, shape, acc, conv_multipliers(ctx), plane, ctx.input(7));
    clamp_output(ctx, y);
    return y;
}

void qlinear_conv(KernelContext& ctx, std::vector<Tensor>& out) { out[0] = qlinear_conv_of(ctx, ctx.input(0)); }

// ChannelsLastRequantizer with sixteen lanes over values [i, end) of the flat
// buffer, value i being channel c: channel c's offset and multiplier for lanes
// c..c+15 come from copies of the per-channel arrays laid out periodically
// (entry k holds channel k mod M), so that a vector may wrap from one pixel into
// the next. The float32 product of requantize(), clamped to the output's range
// less the zero point before it is rounded (to nearest, ties to even, as
// requantize()): the bounds are integers, so clamping first rounds the same.
template <typename Q>
[[gnu::target("avx512f")]] void requantize_channels_last_avx512(const int32_t* __restrict acc, size_t i, size_t end,
                                                                size_t c, size_t m, const int32_t* off,
                                                                const float* mul, float zero_point,
                                                                Q* __restrict out) {
    const __m512 lo = _mm512_set1_ps(static_cast<float>(std::numeric_limits<Q>::min()) - zero_point);
    const __m512 hi = _mm512_set1_ps(static_cast<float>(std::numeric_limits<Q>::max()) - zero_point);
    const __m512i zp = _mm512_set1_epi32(static_cast<int32_t>(zero_point));
    for (; i + 16 <= end; i += 16) {
        const __m512i a = _mm512_sub_epi32(_mm512_loadu_si512(acc + i), _mm512_loadu_si512(off + c));
        const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(a), _mm512_loadu_ps(mul + c));
        const __m512 r = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
        const __m512i q = _mm512_add_epi32(_mm512_cvt_roundps_epi32(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zp);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm512_cvtepi32_epi8(q));
        for (c += 16; c >= m;) c -= m;
    }
    for (; i < end; ++i, c = c + 1 == m ? 0 : c + 1) {
        const auto a = static_cast<int32_t>(static_cast<uint32_t>(acc[i]) - static_cast<uint32_t>(off[c]));
        out[i] = quantize_8_bit<Q>(static_cast<float>(a) * mul[c], zero_point);
    }
}

// Eight requantized values of requantize_channels_last_avx2, as int32 lanes within Q's range.
[[gnu::target("avx2")]] inline __m256i requantized_8(const int32_t* acc, const int32_t* off, const float* mul,
                                                     __m256 lo, __m256 hi, __m256i zp) {
    const __m256i a = _mm256_sub_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc)),
                                       _mm256_loadu_si256(reinterpret_cast<const __m256i*>(off)));
    const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(a), _mm256_loadu_ps(mul));
    const __m256 r = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    return _mm256_add_epi32(_mm256_cvtps_epi32(r), zp);
}

// requantize_channels_last_avx512 for CPUs with AVX2 but not AVX-512: the same
// operations (cvtps rounds to nearest even under the default rounding mode),
// 32 values narrowed by packs into one store (exact: they are clamped into Q's
// range already), then eight at a time.
template <typename Q>
[[gnu::target("avx2")]] void requantize_channels_last_avx2(const int32_t* __restrict acc, size_t i, size_t end,
                                                           size_t c, size_t m, const int32_t* off, const float* mul,
                                                           float zero_point, Q* __restrict out) {
    const __m256 lo = _mm256_set1_ps(static_cast<float>(std::numeric_limits<Q>::min()) - zero_point);
    const __m256 hi = _mm256_set1_ps(static_cast<float>(std::numeric_limits<Q>::max()) - zero_point);
    const __m256i zp = _mm256_set1_epi32(static_cast<int32_t>(zero_point));
    // The packs work within 128-bit halves: their 4-byte groups come out as
    // q0 q1 q2 q3 (low halves), then the high halves; this puts them in order.
    const __m256i in_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (; i + 32 <= end; i += 32) {
        __m256i q[4];
        for (size_t k = 0; k < 4; ++k) {
            q[k] = requantized_8(acc + i + 8 * k, off + c, mul + c, lo, hi, zp);
            for (c += 8; c >= m;) c -= m;
        }
        const __m256i w0 = _mm256_packs_epi32(q[0], q[1]), w1 = _mm256_packs_epi32(q[2], q[3]);
        const __m256i b = std::is_signed_v<Q> ? _mm256_packs_epi16(w0, w1) : _mm256_packus_epi16(w0, w1);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_permutevar8x32_epi32(b, in_order));
    }
    for (; i + 8 <= end; i += 8) {
        store_low_bytes_avx2(requantized_8(acc + i, off + c, mul + c, lo, hi, zp), out + i);
        for (c += 8; c >= m;) c -= m;
    }
    for (; i < end; ++i, c = c + 1 == m ? 0 : c + 1) {
        const auto a = static_cast<int32_t>(static_cast<uint32_t>(acc[i]) - static_cast<uint32_t>(off[c]));
        out[i] = quantize_8_bit<Q>(static_cast<float>(a) * mul[c], zero_point);
    }
}

// Requantizes NHWC sums less their per-channel offsets into 8-bit NHWC, a band
// of whole pixels at a time: the same float32 operations as requantize(), so
// the same integers. Pixel by pixel with SSE2 where AVX2 is missing too.
template <typename Q>
class ChannelsLastRequantizer {
  public:
    ChannelsLastRequantizer(std::vector<int32_t> offsets, const std::vector<float>& multiplier, float zero_point)
        : offsets_(std::move(offsets)), multiplier_(multiplier), zero_point_(zero_point) {
        const size_t m = offsets_.size();
        if (!(cpu_features().avx512f || cpu_features().avx2) || m == 0) return;
        periodic_offsets_.resize(m + 16);
        periodic_multiplier_.resize(m + 16);
        for (size_t k = 0; k < m + 16; ++k) {
            periodic_offsets_[k] = offsets_[k % m];
            periodic_multiplier_[k] = multiplier_[multiplier_.size() > 1 ? k % m : 0];
        }
    }

    // Values [0, count) of a band that starts at a pixel.
    void operator()(const int32_t* sums, size_t count, Q* out) const {
        const size_t m = offsets_.size();
        if (m == 0) return;
        if (!periodic_offsets_.empty()) {
            // Chunks of whole vectors across the threads, unless the band is
            // one of many already run a thread each.
            constexpr size_t kChunk = size_t{1} << 14;
            const auto chunks = static_cast<int64_t>((count + kChunk - 1) / kChunk);
            parallel_for(chunks, true, [&](int64_t k) {
                const size_t start = static_cast<size_t>(k) * kChunk;
                (cpu_features().avx512f
                     ? requantize_channels_last_avx512<Q>
                     : requantize_channels_last_avx2<Q>)(sums, start, std::min(count, start + kChunk), start % m, m,
                                                         periodic_offsets_.data(), periodic_multiplier_.data(),
                                                         zero_point_, out);
            });
            return;
        }
        const bool per_channel = multiplier_.size() > 1;
        const float* mult = multiplier_.data();
        for (size_t start = 0; start < count; start += m) {
            const int32_t* acc = sums + start;
#if defined(__SSE2__)
            auto four = [&](size_t i) {
                const __m128i a = _mm_sub_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(acc + i)),
                                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(offsets_.data() + i)));
                return _mm_mul_ps(_mm_cvtepi32_ps(a), per_channel ? _mm_loadu_ps(mult + i) : _mm_set1_ps(mult[0]));
            };
#else
            auto four = [](size_t) { return 0; };
#endif
            quantize_8_bit_block(out + start, m, zero_point_, four, [&](size_t i) {
                const auto a = static_cast<int32_t>(static_cast<uint32_t>(acc[i]) - static_cast<uint32_t>(offsets_[i]));
                return static_cast<float>(a) * mult[per_channel ? i : 0];
            });
        }
    }

  private:
    std::vector<int32_t> offsets_, periodic_offsets_;  ///< periodic: entry k holds channel k mod M
    std::vector<float> multiplier_, periodic_multiplier_;
    float zero_point_;
};

// The parameters a register kernel lays out from an NhwcQLinearConv's weights,
// scales and bias, kept in the node's state while they hold.
template <typename Parameters>
struct KeptParameters {
    Parameters parameters;
    int32_t x_zero_point = 0;
    bool constant = false;  ///< every input but x is an initializer: the layout holds across runs
};

// The kept parameters, laid out anew by `make` on the first run, when an input
// they come from is not constant, or when x's zero point changed.
template <typename Parameters, typename Make>
const Parameters& kept_parameters(KernelContext& ctx, int32_t x_zero_point, Make&& make) {
    auto state = std::static_pointer_cast<KeptParameters<Parameters>>(ctx.state);
    if (!state || !state->constant || state->x_zero_point != x_zero_point) {
        state = std::make_shared<KeptParameters<Parameters>>();
        state->parameters = make();
        state->x_zero_point = x_zero_point;
        state->constant = ctx.is_constant(1) && ctx.is_constant(3) && ctx.is_constant(4) && ctx.is_constant(6) &&
                          (!ctx.has_input(8) || ctx.is_constant(8));
        ctx.state = state;
    }
    return state->parameters;
}

bool is_8_bit(DataType t) { return t == DataType::UInt8 || t == DataType::Int8; }

bool depthwise_3x3(KernelContext& ctx, const Tensor& x, const Tensor& w, const int32_t* bias,
                   const std::vector<float>& multiplier, float y_zero_point, std::vector<Tensor>& out) {
    const auto& xs = x.shape();
    const auto y_type = ctx.input(7).type();
    const auto& ws = w.shape();
    // Only what holds from run to run decides (ctx.state is this path's or another's).
    if (!int8_depthwise_available() || !is_8_bit(x.type()) || !is_8_bit(y_type) || w.type() != DataType::Int8 ||
        ws.size() != 4 || ws[1] != 1 || ws[2] != 3 || ws[3] != 3 || ctx.attributes.get_int("group", 1) != ws[0] ||
        ctx.attributes.get_ints("dilations", {1, 1}) != std::vector<int64_t>{1, 1} ||
        (multiplier.size() != 1 && static_cast<int64_t>(multiplier.size()) != ws[0]))
        return false;
    if (ws[0] != xs[3]) ctx.fail("the weights' channels differ from the input's");
    const auto g = WindowGeometry::from(ctx, {xs[1], xs[2]}, {3, 3}, false);
    if (g.strides[0] != g.strides[1]) return false;
    const int32_t x_zero_point = scalar_zero_point(ctx, ctx.input(2));
    // A depthwise 3x3 NhwcQLinearConv on a CPU with AVX-512 VNNI: summed and
    // requantized in registers (int8_depthwise.hpp).
    const auto& parameters = kept_parameters<DepthwiseParameters>(ctx, x_zero_point, [&] {
        return depthwise_parameters(w.data<int8_t>().data(), xs[3], bias, multiplier, x_zero_point,
                                    x.type() == DataType::Int8);
    });
    DepthwiseGeometry geometry;
    geometry.n = xs[0], geometry.h = xs[1], geometry.w = xs[2], geometry.c = xs[3];
    geometry.out_h = g.out[0], geometry.out_w = g.out[1], geometry.stride = g.strides[0];
    geometry.pad_top = g.pad_begin[0], geometry.pad_left = g.pad_begin[1];
    out[0] = Tensor::uninitialized(y_type, {xs[0], g.out[0], g.out[1], xs[3]});  // written in full
    int8_depthwise_3x3(reinterpret_cast<const uint8_t*>(x.bytes().data()), x.type() == DataType::Int8,
                       parameters, geometry, y_zero_point, y_type == DataType::Int8,
                       reinterpret_cast<uint8_t*>(out[0].mutable_bytes().data()));
    return true;
}

template <typename Q>
bool pointwise_1x1(KernelContext& ctx, const Tensor& x, const Tensor& w, const int32_t* bias,
                   const std::vector<float>& multiplier, float y_zero_point, std::vector<Tensor>& out) {
    const auto& xs = x.shape();
    const auto& ws = w.shape();
    // Only what holds from run to run decides (ctx.state is this path's or another's).
    if (!int8_pointwise_available() || !is_8_bit(x.type()) || w.type() != DataType::Int8 || ws.size() != 4 ||
        ws[2] != 1 || ws[3] != 1 || !int8_pointwise_preferred(ws[1], ws[0]) ||
        ctx.attributes.get_int("group", 1) != 1 ||
        (multiplier.size() != 1 && static_cast<int64_t>(multiplier.size()) != ws[0]))
        return false;
    if (ws[1] != xs[3]) ctx.fail("the weights' input channels differ from the input's");
    const auto g = WindowGeometry::from(ctx, {xs[1], xs[2]}, {1, 1}, false);
    if (g.strides[0] != g.strides[1] || g.pad_begin != std::vector<int64_t>{0, 0} ||
        g.pad_end != std::vector<int64_t>{0, 0})
        return false;
    const int32_t x_zero_point = scalar_zero_point(ctx, ctx.input(2));
    // A 1x1 NhwcQLinearConv without padding on a CPU with AVX-512 VNNI: summed
    // and requantized in registers (int8_pointwise.hpp).
    const auto& parameters = kept_parameters<PointwiseParameters>(ctx, x_zero_point, [&] {
        return pointwise_parameters(w.data<int8_t>().data(), ws[0], ws[1], bias, multiplier, x_zero_point,
                                    x.type() == DataType::Int8);
    });
    PointwiseGeometry geometry;
    geometry.n = xs[0], geometry.h = xs[1], geometry.w = xs[2];
    geometry.out_h = g.out[0], geometry.out_w = g.out[1], geometry.stride = g.strides[0];
    const auto [lo, hi] = output_bounds<Q>(ctx);
    const PointwiseOutput format{std::is_signed_v<Q>, y_zero_point, lo, hi};
    out[0] = Tensor::uninitialized(type_of<Q>(), {xs[0], g.out[0], g.out[1], ws[0]});  // written in full
    int8_pointwise(reinterpret_cast<const uint8_t*>(x.bytes().data()), x.type() == DataType::Int8, parameters,
                   geometry, format, reinterpret_cast<uint8_t*>(mutable_view<Q>(out[0]).data()));
    return true;
}

// QLinearConv on NHWC activations: the layout pass's form inside a chain of
// integer convolutions. oneDNN's int8 kernels read and write channels-last, so
// the sums are requantized where they are, a band at a time while in cache,
// with no transpose between the convolutions. Without exact int8 on this CPU,
// the NCHW path between transposes.
void nhwc_qlinear_conv(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto& w = ctx.input(3);
    if (x.shape().size() != 4) ctx.fail("the input must be 4-D (NHWC)");
    const int32_t* bias = ctx.has_input(8) ? ctx.input(8).data<int32_t>().data() : nullptr;
    if (bias && (w.shape().empty() || ctx.input(8).size() != w.shape()[0]))
        ctx.fail("the bias must have one value per output channel");
    bool fast = false;
    if (ctx.input(2).size() == 1 && all_zero(ctx, ctx.input(5))) {
        const auto wide = conv_multipliers(ctx);
        const std::vector<float> multiplier(wide.begin(), wide.end());  // float32, as ONNX Runtime
        const auto zp = static_cast<float>(read_scalar(ctx, ctx.input(7)));
        if (depthwise_3x3(ctx, x, w, bias, multiplier, zp, out)) return clamp_output(ctx, out[0]);
        dispatch_numeric(ctx.input(7).type(), ctx, [&](auto tag) {
            using Q = typename decltype(tag)::type;
            if constexpr (sizeof(Q) == 1) {
                if (pointwise_1x1<Q>(ctx, x, w, bias, multiplier, zp, out)) {
                    fast = true;
                    return;
                }
                std::optional<ChannelsLastRequantizer<Q>> requantize;
                const auto bounds = output_bounds<Q>(ctx);
                const bool bounded = bounds != std::pair{std::numeric_limits<Q>::min(), std::numeric_limits<Q>::max()};
                Q* y = nullptr;
                ChannelsLastSums sink;
                sink.start = [&](const std::vector<int64_t>& shape, const std::vector<int32_t>& offsets) {
                    if (multiplier.size() != 1 && multiplier.size() != offsets.size())
                        ctx.fail("the weight scales must be one or one per channel");
                    out[0] = make_tensor<Q>(shape);
                    y = mutable_view<Q>(out[0]).data();
                    requantize.emplace(offsets, multiplier, zp);
                };
                sink.band = [&](const int32_t* sums, size_t first, size_t count) {
                    (*requantize)(sums, count, y + first);
                    if (bounded) clamp_values(y + first, count, bounds);  // while the band is in cache
                };
                fast = int8_conv_channels_last(ctx, x, scalar_zero_point(ctx, ctx.input(2)), w, ctx.is_constant(3),
                                               ctx.state, bias, sink);
            }
        });
    }
    if (!fast) out[0] = permute4(qlinear_conv_of(ctx, permute4(x, {0, 3, 1, 2})), {0, 2, 3, 1});
}

// NhwcQLinearConvPair (layout.cpp): a 1x1 integer convolution (inputs 0-8)
// and the depthwise 3x3 one that alone reads it (inputs 9-14: weights, their
// scale and zero point, the output's, the bias; the attributes are its own,
// the 1x1's bounds pointwise_output_min/max). Where both halves have their
// kernels here (int8_pointwise.hpp, int8_depthwise.hpp) they run an image at a
// time, so that the expanded image, the block's widest tensor, stays in cache
// between them (mobilenet_v2 at batch 8: 9.6 MB). Else the two run as
// NhwcQLinearConvs, each on the whole batch.
struct PairState {
    onnx::NodeProto pointwise_node, depthwise_node;  ///< the halves as NhwcQLinearConvs
    std::shared_ptr<void> pointwise_state, depthwise_state;
    PointwiseParameters pointwise;
    DepthwiseParameters depthwise;
    int32_t x_zero_point = 0, mid_zero_point = 0;
    bool constant = false;  ///< made from initializers only: they hold across runs (false: none made yet)
};

// The pair's halves on the whole batch, as their own nodes would run.
void pair_in_halves(KernelContext& ctx, PairState& state, std::vector<Tensor>& out) {
    auto half = [&](const onnx::NodeProto& node, std::shared_ptr<void>& half_state, std::vector<const Tensor*> inputs,
                    std::vector<bool> constant) {
        KernelContext sub{ctx.model,        node,       ctx.opset, std::move(inputs), std::move(constant),
                          Attributes(node), half_state, ctx.lookup};
        std::vector<Tensor> y(1);
        nhwc_qlinear_conv(sub, y);
        return std::move(y[0]);
    };
    auto slots = [&](std::initializer_list<size_t> indices, std::vector<const Tensor*>& inputs,
                     std::vector<bool>& constant) {
        for (size_t i : indices) {
            inputs.push_back(ctx.has_input(i) ? &ctx.input(i) : nullptr);
            constant.push_back(ctx.is_constant(i));
        }
    };
    std::vector<const Tensor*> inputs;
    std::vector<bool> constant;
    slots({0, 1, 2, 3, 4, 5, 6, 7, 8}, inputs, constant);
    const Tensor mid = half(state.pointwise_node, state.pointwise_state, inputs, constant);
    inputs = {&mid};
    constant = {false};
    slots({6, 7, 9, 10, 11, 12, 13, 14}, inputs, constant);
    out[0] = half(state.depthwise_node, state.depthwise_state, inputs, constant);
}

void nhwc_qlinear_conv_pair(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto& wp = ctx.input(3);
    const auto& wd = ctx.input(9);
    if (x.shape().size() != 4) ctx.fail("the input must be 4-D (NHWC)");
    auto state = std::static_pointer_cast<PairState>(ctx.state);
    if (!state) {
        state = std::make_shared<PairState>();
        auto& p = state->pointwise_node;
        p.set_op_type("NhwcQLinearConv");
        p.set_domain(ctx.node.domain());
        p.set_name(ctx.node.name() + "_pointwise");
        auto& d = state->depthwise_node;
        d = ctx.node;
        d.set_op_type("NhwcQLinearConv");
        d.clear_attribute();
        for (const auto& a : ctx.node.attribute()) {
            const bool pointwise = a.name() == kPointwiseOutputMinAttribute || a.name() == kPointwiseOutputMaxAttribute;
            auto* copy = pointwise ? p.add_attribute() : d.add_attribute();
            *copy = a;
            if (pointwise)
                copy->set_name(a.name() == kPointwiseOutputMinAttribute ? kOutputMinAttribute : kOutputMaxAttribute);
        }
        ctx.state = state;
    }
    const auto& xs = x.shape();
    const auto& ps = wp.shape();
    const auto mid_type = ctx.input(7).type(), y_type = ctx.input(13).type();
    // Each way keeps its own state: the halves' in theirs, the parameters here.
    const bool own_kernels = int8_pointwise_available() && int8_depthwise_available() && is_8_bit(x.type()) &&
                             is_8_bit(mid_type) && is_8_bit(y_type) && wp.type() == DataType::Int8 &&
                             wd.type() == DataType::Int8 && ps.size() == 4 && int8_pointwise_preferred(ps[1], ps[0]) &&
                             wd.shape() == std::vector<int64_t>{ps[0], 1, 3, 3} && ctx.input(2).size() == 1 &&
                             ctx.input(7).size() == 1 && all_zero(ctx, ctx.input(5)) && all_zero(ctx, ctx.input(11)) &&
                             (ctx.input(4).size() == 1 || ctx.input(4).size() == ps[0]) &&
                             (ctx.input(10).size() == 1 || ctx.input(10).size() == ps[0]);
    if (!own_kernels) return pair_in_halves(ctx, *state, out);
    const int64_t n = xs[0], h = xs[1], w = xs[2], k = xs[3], m = ps[0];
    if (ps[1] != k) ctx.fail("the weights' input channels differ from the input's");
    const auto g = WindowGeometry::from(ctx, {h, w}, {3, 3}, false);
    if (g.strides[0] != g.strides[1]) return pair_in_halves(ctx, *state, out);
    const int32_t x_zero_point = scalar_zero_point(ctx, ctx.input(2));
    const int32_t mid_zero_point = scalar_zero_point(ctx, ctx.input(7));
    if (!state->constant || state->x_zero_point != x_zero_point || state->mid_zero_point != mid_zero_point) {
        auto as_float = [](const std::vector<double>& wide) { return std::vector<float>(wide.begin(), wide.end()); };
        const int32_t* bp = ctx.has_input(8) ? ctx.input(8).data<int32_t>().data() : nullptr;
        const int32_t* bd = ctx.has_input(14) ? ctx.input(14).data<int32_t>().data() : nullptr;
        if ((bp && ctx.input(8).size() != m) || (bd && ctx.input(14).size() != m))
            ctx.fail("the bias must have one value per output channel");
        state->pointwise = pointwise_parameters(wp.data<int8_t>().data(), m, k, bp, as_float(conv_multipliers(ctx)),
                                                x_zero_point, x.type() == DataType::Int8);
        state->depthwise =
            depthwise_parameters(wd.data<int8_t>().data(), m, bd, as_float(conv_multipliers(ctx, 6, 10, 12)),
                                 mid_zero_point, mid_type == DataType::Int8);
        state->x_zero_point = x_zero_point;
        state->mid_zero_point = mid_zero_point;
        state->constant = true;
        for (size_t i = 1; i < ctx.input_count(); ++i)
            state->constant = state->constant && (!ctx.has_input(i) || ctx.is_constant(i));
    }
    // The expanded image, clamped to its type's bounds or the 1x1's.
    auto bounds = [&](auto type) {
        const auto b = output_bounds<decltype(type)>(ctx, kPointwiseOutputMinAttribute, kPointwiseOutputMaxAttribute);
        return std::pair<int32_t, int32_t>{b.first, b.second};
    };
    const auto [lo, hi] = mid_type == DataType::Int8 ? bounds(int8_t{}) : bounds(uint8_t{});
    const PointwiseOutput expanded{mid_type == DataType::Int8, static_cast<float>(mid_zero_point), lo, hi};
    const PointwiseGeometry pointwise{1, h, w, h, w, 1};
    DepthwiseGeometry depthwise;
    depthwise.n = 1, depthwise.h = h, depthwise.w = w, depthwise.c = m;
    depthwise.out_h = g.out[0], depthwise.out_w = g.out[1], depthwise.stride = g.strides[0];
    depthwise.pad_top = g.pad_begin[0], depthwise.pad_left = g.pad_begin[1];
    const auto y_zero_point = static_cast<float>(read_scalar(ctx, ctx.input(13)));
    out[0] = Tensor::uninitialized(y_type, {n, g.out[0], g.out[1], m});  // written in full
    std::vector<uint8_t, DefaultInitAllocator<uint8_t>> mid(static_cast<size_t>(h * w * m));
    const auto* xb = reinterpret_cast<const uint8_t*>(x.bytes().data());
    auto* yb = reinterpret_cast<uint8_t*>(out[0].mutable_bytes().data());
    for (int64_t i = 0; i < n; ++i) {
        int8_pointwise(xb + i * h * w * k, x.type() == DataType::Int8, state->pointwise, pointwise, expanded,
                       mid.data());
        int8_depthwise_3x3(mid.data(), mid_type == DataType::Int8, state->depthwise, depthwise, y_zero_point,
                           y_type == DataType::Int8, yb + i * g.out[0] * g.out[1] * m);
    }
    clamp_output(ctx, out[0]);
}

// y = saturate(round(x / scale) + zero_point) with scale and zero point from x's
// range (always including 0) mapped onto [0, 255].
void dynamic_quantize(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    if (x.type() != DataType::Float) ctx.fail("the input must be float");
    const auto v = x.data<float>();
    float lo = 0.0f, hi = 0.0f;
    for (float f : v) {
        lo = std::min(lo, f);
        hi = std::max(hi, f);
    }
    const float scale = (hi - lo) / 255.0f;
    const float zp_float = scale == 0.0f ? 0.0f : std::nearbyint(std::clamp(0.0f - lo / scale, 0.0f, 255.0f));
    out[0] = make_tensor<uint8_t>(x.shape());
    auto o = mutable_view<uint8_t>(out[0]);
    for (size_t i = 0; i < v.size(); ++i) {
        const float q = scale == 0.0f ? zp_float : std::nearbyint(v[i] / scale) + zp_float;
        o[i] = static_cast<uint8_t>(std::clamp(q, 0.0f, 255.0f));
    }
    out[1] = Tensor::from_values<float>({}, std::vector<float>{scale});
    out[2] = Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{static_cast<uint8_t>(zp_float)});
}

const KernelRegistration kKernels[] = {
    {"", "MatMulInteger", 10, 21, matmul_integer},
    {"", "QLinearMatMul", 10, 20, qlinear_matmul},
    {"com.microsoft", "QGemm", 1, 1, qgemm},
    {"", "ConvInteger", 10, 21, conv_integer},
    {"", "QLinearConv", 10, 21, qlinear_conv},
    {"", "DynamicQuantizeLinear", 11, 21, dynamic_quantize},
    {kInternalDomain, "NhwcQLinearConv", 0, 1, nhwc_qlinear_conv, exact_int8_available},
    {kInternalDomain, "NhwcQLinearConvPair", 0, 1, nhwc_qlinear_conv_pair, exact_int8_available},
};

}  // namespace
}  // namespace vaiq::runtime
