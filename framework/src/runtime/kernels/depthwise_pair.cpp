#include "runtime/kernels/depthwise_pair.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>

// GCC 12 warns inside its own AVX-512 headers (their _mm512_undefined_* placeholders).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

namespace vaiq::runtime {
namespace {

constexpr int64_t kLanes = 16;
constexpr int kMaxBlocks = 4;  ///< blocks of 16 channels per pass: the pixel tiles below then hold 24 accumulators
constexpr int64_t kRingRows = 4;  ///< a 3x3 window reads 3 consecutive rows; one more is being made

// Pixels per tile of the 1x1 convolution for J blocks: about 24 accumulators of the 32 registers.
template <int J>
constexpr int kTile = J >= 4 ? 6 : J == 3 ? 8 : 12;

// P pixels x J blocks of the 1x1 convolution: out = clamp(bias + sum_k x[p][k] w[k]).
// `w` is the first block's [C][16] weights, the next blocks `block_stride` further.
template <int J, int P>
[[gnu::target("avx512f"), gnu::always_inline]] inline void expand_tile(const float* x, int64_t c, const float* w,
                                                                      int64_t block_stride, const float* bias,
                                                                      __m512 lo, __m512 hi, float* out) {
    __m512 acc[P][J];
#pragma GCC unroll 4
    for (int j = 0; j < J; ++j) {
        const __m512 b = _mm512_loadu_ps(bias + j * kLanes);
#pragma GCC unroll 12
        for (int p = 0; p < P; ++p) acc[p][j] = b;
    }
    for (int64_t k = 0; k < c; ++k) {
        __m512 wk[J];
#pragma GCC unroll 4
        for (int j = 0; j < J; ++j) wk[j] = _mm512_loadu_ps(w + j * block_stride + k * kLanes);
#pragma GCC unroll 12
        for (int p = 0; p < P; ++p) {
            const __m512 xv = _mm512_set1_ps(x[p * c + k]);
#pragma GCC unroll 4
            for (int j = 0; j < J; ++j) acc[p][j] = _mm512_fmadd_ps(xv, wk[j], acc[p][j]);
        }
    }
#pragma GCC unroll 12
    for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
        for (int j = 0; j < J; ++j)
            _mm512_storeu_ps(out + (p * J + j) * kLanes, _mm512_min_ps(_mm512_max_ps(acc[p][j], lo), hi));
}

// The last `left` (< kTile<J>) pixels of a row as one tile.
template <int J, int P = 1>
[[gnu::target("avx512f")]] void expand_tail(int64_t left, const float* x, int64_t c, const float* w,
                                            int64_t block_stride, const float* bias, __m512 lo, __m512 hi, float* out) {
    if constexpr (P + 1 < kTile<J>) {
        if (left != P) return expand_tail<J, P + 1>(left, x, c, w, block_stride, bias, lo, hi, out);
    }
    expand_tile<J, P>(x, c, w, block_stride, bias, lo, hi, out);
}

// One expanded row for J blocks: `out` holds `width` pixels of J * 16 channels.
template <int J>
[[gnu::target("avx512f")]] void expand_row(const float* x, int64_t width, int64_t c, const float* w,
                                           int64_t block_stride, const float* bias, Clamp clamp, float* out) {
    const __m512 lo = _mm512_set1_ps(clamp.lo), hi = _mm512_set1_ps(clamp.hi);
    constexpr int P = kTile<J>;
    int64_t p = 0;
    for (; p + P <= width; p += P) expand_tile<J, P>(x + p * c, c, w, block_stride, bias, lo, hi, out + p * J * kLanes);
    if (p < width) expand_tail<J>(width - p, x + p * c, c, w, block_stride, bias, lo, hi, out + p * J * kLanes);
}

// One output pixel of the depthwise convolution for one block: r[0..2] point at
// the block's channels in the three rows under the window.
[[gnu::target("avx512f"), gnu::always_inline]] inline __m512 depthwise_pixel(const float* const r[3], int64_t ix,
                                                                            int64_t pixel, const __m512 k[9], __m512 b,
                                                                            __m512 lo, __m512 hi) {
    __m512 acc = b;
    for (int ky = 0; ky < 3; ++ky)
        for (int kx = 0; kx < 3; ++kx)
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(r[ky] + (ix + kx) * pixel), k[ky * 3 + kx], acc);
    return _mm512_min_ps(_mm512_max_ps(acc, lo), hi);
}

// One output row of the depthwise convolution for J blocks. rows[0..2] are the
// expanded rows under the window (J * 16 channels per pixel, a zero pixel on
// either side, so pixel ix of the padded row is input column ix - 1).
template <int J>
[[gnu::target("avx512f")]] void depthwise_row(const float* const rows[3], int64_t out_width, int64_t stride,
                                              const float* w, const float* bias, Clamp clamp, float* y,
                                              int64_t y_pixel) {
    const __m512 lo = _mm512_set1_ps(clamp.lo), hi = _mm512_set1_ps(clamp.hi);
    constexpr int64_t pixel = J * kLanes;
    for (int j = 0; j < J; ++j) {
        __m512 k[9];
        for (int t = 0; t < 9; ++t) k[t] = _mm512_loadu_ps(w + (j * 9 + t) * kLanes);
        const __m512 b = _mm512_loadu_ps(bias + j * kLanes);
        const float* const r[3] = {rows[0] + j * kLanes, rows[1] + j * kLanes, rows[2] + j * kLanes};
        float* out = y + j * kLanes;
        int64_t ox = 0;
        // Four pixels at a time: four independent chains of multiply-adds.
        for (; ox + 4 <= out_width; ox += 4) {
            const __m512 a0 = depthwise_pixel(r, ox * stride, pixel, k, b, lo, hi);
            const __m512 a1 = depthwise_pixel(r, (ox + 1) * stride, pixel, k, b, lo, hi);
            const __m512 a2 = depthwise_pixel(r, (ox + 2) * stride, pixel, k, b, lo, hi);
            const __m512 a3 = depthwise_pixel(r, (ox + 3) * stride, pixel, k, b, lo, hi);
            _mm512_storeu_ps(out + ox * y_pixel, a0);
            _mm512_storeu_ps(out + (ox + 1) * y_pixel, a1);
            _mm512_storeu_ps(out + (ox + 2) * y_pixel, a2);
            _mm512_storeu_ps(out + (ox + 3) * y_pixel, a3);
        }
        for (; ox < out_width; ++ox) _mm512_storeu_ps(out + ox * y_pixel, depthwise_pixel(r, ox * stride, pixel, k, b, lo, hi));
    }
}

struct Geometry {
    int64_t h, w, c, m, stride, oh, ow;
};

// Blocks [first, first + J) of one image, row by row. `ring` has room for
// kRingRows + 1 padded rows of J blocks; the last stays zero (rows outside the image).
template <int J>
[[gnu::target("avx512f")]] void run_blocks(const DepthwisePairWeights& weights, const Geometry& g, const float* x,
                                           int64_t first, Clamp pointwise, Clamp depthwise, float* y, float* ring) {
    constexpr int64_t pixel = J * kLanes;
    const int64_t row = (g.w + 2) * pixel;
    std::memset(ring, 0, sizeof(float) * static_cast<size_t>(row * (kRingRows + 1)));
    const float* zero_row = ring + kRingRows * row;
    const int64_t block_stride = g.c * kLanes;
    const float* pw = weights.pointwise.data() + first * block_stride;
    const float* dw = weights.depthwise.data() + first * 9 * kLanes;
    int64_t made = 0;  // expanded rows made so far
    for (int64_t oy = 0; oy < g.oh; ++oy) {
        const int64_t top = oy * g.stride - 1;
        for (; made <= std::min(top + 2, g.h - 1); ++made)
            expand_row<J>(x + made * g.w * g.c, g.w, g.c, pw, block_stride,
                          weights.pointwise_bias.data() + first * kLanes, pointwise, ring + (made % kRingRows) * row + pixel);
        const float* rows[3];
        for (int64_t i = 0; i < 3; ++i) {
            const int64_t iy = top + i;
            rows[i] = iy < 0 || iy >= g.h ? zero_row : ring + (iy % kRingRows) * row;
        }
        depthwise_row<J>(rows, g.ow, g.stride, dw, weights.depthwise_bias.data() + first * kLanes, depthwise,
                         y + oy * g.ow * g.m + first * kLanes, g.m);
    }
}

}  // namespace

bool depthwise_pair_supported(int64_t channels) {
    static const bool avx512 = __builtin_cpu_supports("avx512f");
    return avx512 && channels > 0 && channels % kLanes == 0;
}

DepthwisePairWeights pack_depthwise_pair(const float* pointwise, const float* pointwise_bias, const float* depthwise,
                                         const float* depthwise_bias, int64_t in_channels, int64_t channels) {
    DepthwisePairWeights p;
    p.in_channels = in_channels;
    p.channels = channels;
    p.pointwise.resize(static_cast<size_t>(channels * in_channels));
    p.depthwise.resize(static_cast<size_t>(channels * 9));
    for (int64_t o = 0; o < channels; ++o) {
        const int64_t block = o / kLanes, lane = o % kLanes;
        for (int64_t k = 0; k < in_channels; ++k)
            p.pointwise[(block * in_channels + k) * kLanes + lane] = pointwise[o * in_channels + k];
        for (int64_t t = 0; t < 9; ++t) p.depthwise[(block * 9 + t) * kLanes + lane] = depthwise[o * 9 + t];
    }
    p.pointwise_bias.assign(static_cast<size_t>(channels), 0.0f);
    p.depthwise_bias.assign(static_cast<size_t>(channels), 0.0f);
    if (pointwise_bias) std::copy(pointwise_bias, pointwise_bias + channels, p.pointwise_bias.begin());
    if (depthwise_bias) std::copy(depthwise_bias, depthwise_bias + channels, p.depthwise_bias.begin());
    return p;
}

void run_depthwise_pair(const DepthwisePairWeights& weights, const float* x, int64_t n, int64_t h, int64_t w,
                        int64_t stride, Clamp pointwise, Clamp depthwise, float* y) {
    const Geometry g{h, w, weights.in_channels, weights.channels, stride, (h - 1) / stride + 1, (w - 1) / stride + 1};
    const int64_t blocks = g.m / kLanes, units = n * blocks;
#pragma omp parallel
    {
        // This thread's share of the (image, block) units, in runs of at most
        // kMaxBlocks blocks of one image, of near-equal widths.
        const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t begin = units * t / threads, end = units * (t + 1) / threads;
        std::vector<float> ring(static_cast<size_t>((kRingRows + 1) * (w + 2) * kMaxBlocks * kLanes));
        for (int64_t u = begin; u < end;) {
            const int64_t image = u / blocks, first = u % blocks;
            const int64_t count = std::min(blocks - first, end - u), passes = (count + kMaxBlocks - 1) / kMaxBlocks;
            const float* xi = x + image * h * w * g.c;
            float* yi = y + image * g.oh * g.ow * g.m;
            for (int64_t pass = 0; pass < passes; ++pass) {
                const int64_t from = first + count * pass / passes, to = first + count * (pass + 1) / passes;
                switch (to - from) {
                    case 1: run_blocks<1>(weights, g, xi, from, pointwise, depthwise, yi, ring.data()); break;
                    case 2: run_blocks<2>(weights, g, xi, from, pointwise, depthwise, yi, ring.data()); break;
                    case 3: run_blocks<3>(weights, g, xi, from, pointwise, depthwise, yi, ring.data()); break;
                    default: run_blocks<4>(weights, g, xi, from, pointwise, depthwise, yi, ring.data()); break;
                }
            }
            u += count;
        }
    }
}

}  // namespace vaiq::runtime
