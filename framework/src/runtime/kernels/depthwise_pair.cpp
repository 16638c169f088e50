#include "runtime/kernels/depthwise_pair.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "runtime/cpu_features.hpp"
#include "runtime/kernels/intrinsics.hpp"
#include "runtime/parallel_for.hpp"

namespace vaiq::runtime {
namespace {

constexpr int64_t kLanes = 16;
constexpr int kMaxBlocks = 4;     ///< blocks of 16 channels per pass: the pixel tiles below then hold 24 accumulators
constexpr int64_t kRingRows = 4;  ///< a 3x3 window reads 3 consecutive rows; one more is being made
/// Depthwise outputs a projection takes at once: enough pixels that its weights
/// are read from cache few times, few enough rows that they stay in L2.
constexpr int64_t kBandPixels = 96;
/// Output rows per thread from which threads share an image by rows, not channels.
constexpr int64_t kRowsPerThread = 12;

// Pixels per tile of the 1x1 convolutions for J blocks: about 24 accumulators of the 32 registers.
template <int J>
constexpr int kTile = J >= 4   ? 6
                      : J == 3 ? 8
                               : 12;

// P pixels x J blocks of a 1x1 convolution: out = clamp(bias + sum_k x[p][k] w[k] (+ residual)).
// x has `c` channels per pixel; `w` is the first block's [c][16] weights, the next
// blocks `block_stride` further; out (and residual) pixels are `out_pixel` apart.
// The last block writes only the lanes of `last_lanes`.
template <int J, int P>
[[gnu::target("avx512f"), gnu::always_inline]] inline void pointwise_tile(const float* x, int64_t c, const float* w,
                                                                          int64_t block_stride, const float* bias,
                                                                          __m512 lo, __m512 hi, float* out,
                                                                          int64_t out_pixel, const float* residual,
                                                                          __mmask16 last_lanes) {
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
        for (int j = 0; j < J; ++j) {
            const __mmask16 lanes = j == J - 1 ? last_lanes : __mmask16(0xffff);
            __m512 v = acc[p][j];
            if (residual) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(lanes, residual + p * out_pixel + j * kLanes));
            _mm512_mask_storeu_ps(out + p * out_pixel + j * kLanes, lanes, _mm512_min_ps(_mm512_max_ps(v, lo), hi));
        }
}

// The last `left` (< kTile<J>) pixels as one tile.
template <int J, int P = 1>
[[gnu::target("avx512f")]] void pointwise_tail(int64_t left, const float* x, int64_t c, const float* w,
                                               int64_t block_stride, const float* bias, __m512 lo, __m512 hi,
                                               float* out, int64_t out_pixel, const float* residual,
                                               __mmask16 last_lanes) {
    if constexpr (P + 1 < kTile<J>) {
        if (left != P)
            return pointwise_tail<J, P + 1>(left, x, c, w, block_stride, bias, lo, hi, out, out_pixel, residual,
                                            last_lanes);
    }
    pointwise_tile<J, P>(x, c, w, block_stride, bias, lo, hi, out, out_pixel, residual, last_lanes);
}

// `pixels` pixels of a 1x1 convolution for J blocks.
template <int J>
[[gnu::target("avx512f")]] void pointwise_pixels(const float* x, int64_t pixels, int64_t c, const float* w,
                                                 int64_t block_stride, const float* bias, Clamp clamp, float* out,
                                                 int64_t out_pixel, const float* residual, __mmask16 last_lanes) {
    const __m512 lo = _mm512_set1_ps(clamp.lo), hi = _mm512_set1_ps(clamp.hi);
    constexpr int P = kTile<J>;
    int64_t p = 0;
    for (; p + P <= pixels; p += P)
        pointwise_tile<J, P>(x + p * c, c, w, block_stride, bias, lo, hi, out + p * out_pixel, out_pixel,
                             residual ? residual + p * out_pixel : nullptr, last_lanes);
    if (p < pixels)
        pointwise_tail<J>(pixels - p, x + p * c, c, w, block_stride, bias, lo, hi, out + p * out_pixel, out_pixel,
                          residual ? residual + p * out_pixel : nullptr, last_lanes);
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
        for (; ox < out_width; ++ox)
            _mm512_storeu_ps(out + ox * y_pixel, depthwise_pixel(r, ox * stride, pixel, k, b, lo, hi));
    }
}

struct Geometry {
    int64_t h, w, c, m, stride, oh, ow;
};

// Up to kMaxBlocks blocks of one image streamed row by row: the expanded rows
// live in `ring` (kRingRows padded rows, then one that stays zero for rows
// outside the image), `made` of them so far.
struct Pass {
    int64_t first = 0, blocks = 0;
    AlignedFloats ring;
    int64_t made = 0;

    Pass(int64_t first_block, int64_t count, int64_t width, int64_t first_row)
        : first(first_block),
          blocks(count),
          ring(static_cast<size_t>((kRingRows + 1) * (width + 2) * count * kLanes), 0.0f),
          made(first_row) {}
};

// Depthwise output rows [oy0, oy1) of a pass's blocks, row oy at out + oy * ow * m.
template <int J>
[[gnu::target("avx512f")]] void pass_rows(const DepthwisePairWeights& weights, const Geometry& g, const float* x,
                                          Pass& pass, int64_t oy0, int64_t oy1, const Clamps& clamps, float* out) {
    constexpr int64_t pixel = J * kLanes;
    const int64_t row = (g.w + 2) * pixel;
    float* ring = pass.ring.data();
    const float* zero_row = ring + kRingRows * row;
    const int64_t block_stride = g.c * kLanes;
    const float* pw = weights.pointwise.data() + pass.first * block_stride;
    const float* dw = weights.depthwise.data() + pass.first * 9 * kLanes;
    for (int64_t oy = oy0; oy < oy1; ++oy) {
        const int64_t top = oy * g.stride - 1;
        for (; pass.made <= std::min(top + 2, g.h - 1); ++pass.made)
            pointwise_pixels<J>(x + pass.made * g.w * g.c, g.w, g.c, pw, block_stride,
                                weights.pointwise_bias.data() + pass.first * kLanes, clamps.pointwise,
                                ring + (pass.made % kRingRows) * row + pixel, pixel, nullptr, 0xffff);
        const float* rows[3];
        for (int64_t i = 0; i < 3; ++i) {
            const int64_t iy = top + i;
            rows[i] = iy < 0 || iy >= g.h ? zero_row : ring + (iy % kRingRows) * row;
        }
        depthwise_row<J>(rows, g.ow, g.stride, dw, weights.depthwise_bias.data() + pass.first * kLanes,
                         clamps.depthwise, out + oy * g.ow * g.m + pass.first * kLanes, g.m);
    }
}

void run_pass(const DepthwisePairWeights& weights, const Geometry& g, const float* x, Pass& pass, int64_t oy0,
              int64_t oy1, const Clamps& clamps, float* out) {
    switch (pass.blocks) {
        case 1: return pass_rows<1>(weights, g, x, pass, oy0, oy1, clamps, out);
        case 2: return pass_rows<2>(weights, g, x, pass, oy0, oy1, clamps, out);
        case 3: return pass_rows<3>(weights, g, x, pass, oy0, oy1, clamps, out);
        default: return pass_rows<4>(weights, g, x, pass, oy0, oy1, clamps, out);
    }
}

// Blocks [first, first + count) as passes of near-equal widths of at most
// kMaxBlocks, for output rows from `first_output_row` on.
std::vector<Pass> passes_of(const Geometry& g, int64_t first, int64_t count, int64_t first_output_row = 0) {
    std::vector<Pass> passes;
    const int64_t n = (count + kMaxBlocks - 1) / kMaxBlocks;
    const int64_t first_row = std::max<int64_t>(0, first_output_row * g.stride - 1);  // the window's top row
    for (int64_t i = 0; i < n; ++i)
        passes.emplace_back(first + count * i / n, count * (i + 1) / n - count * i / n, g.w, first_row);
    return passes;
}

// Pixels [0, pixels) of the projection of depthwise outputs `d` (m channels per
// pixel) into `y` (and `residual`), out_channels per pixel.
[[gnu::target("avx512f")]] void project(const DepthwisePairWeights& weights, const float* d, int64_t pixels, int64_t m,
                                        Clamp clamp, const float* residual, float* y) {
    const int64_t p = weights.out_channels, blocks = (p + kLanes - 1) / kLanes, block_stride = m * kLanes;
    const int64_t groups = (blocks + kMaxBlocks - 1) / kMaxBlocks;
    for (int64_t i = 0; i < groups; ++i) {
        const int64_t from = blocks * i / groups, to = blocks * (i + 1) / groups;
        const int64_t tail = std::min(kLanes, p - (to - 1) * kLanes);
        const auto last_lanes = static_cast<__mmask16>((1u << tail) - 1);
        const float* w = weights.projection.data() + from * block_stride;
        const float* bias = weights.projection_bias.data() + from * kLanes;
        const float* r = residual ? residual + from * kLanes : nullptr;
        float* out = y + from * kLanes;
        switch (to - from) {
            case 1: pointwise_pixels<1>(d, pixels, m, w, block_stride, bias, clamp, out, p, r, last_lanes); break;
            case 2: pointwise_pixels<2>(d, pixels, m, w, block_stride, bias, clamp, out, p, r, last_lanes); break;
            case 3: pointwise_pixels<3>(d, pixels, m, w, block_stride, bias, clamp, out, p, r, last_lanes); break;
            default: pointwise_pixels<4>(d, pixels, m, w, block_stride, bias, clamp, out, p, r, last_lanes); break;
        }
    }
}

// The pixels of a band that thread `rank` projects: between two barriers a
// thread projects one band and makes the depthwise outputs of its channels for
// the next, so the threads with fewer channels (16 at a time do not always
// divide evenly) project more pixels, for equal multiply-adds.
std::pair<int64_t, int64_t> projection_share(const DepthwisePairWeights& weights, const Geometry& g, int64_t rows,
                                             int64_t pixels, int64_t team, int64_t rank) {
    const int64_t blocks = g.m / kLanes;
    const double per_block = static_cast<double>(kLanes * rows * (g.stride * g.w * g.c + g.ow * 9));
    const double per_pixel = static_cast<double>(g.m * ((weights.out_channels + kLanes - 1) / kLanes * kLanes));
    const double total = static_cast<double>(blocks) * per_block + static_cast<double>(pixels) * per_pixel;
    double start = 0;
    int64_t from = 0;
    for (int64_t r = 0; r <= rank; ++r) {
        const double own = static_cast<double>(blocks * (r + 1) / team - blocks * r / team) * per_block;
        start += std::max(0.0, total / static_cast<double>(team) - own) / per_pixel;
        const int64_t to = r == team - 1 ? pixels : std::clamp<int64_t>(std::llround(start), from, pixels);
        if (r == rank) return {from, to};
        from = to;
    }
    return {pixels, pixels};
}

// Output rows [rows_begin, rows_end) of one image of the whole block with
// `team` threads (this one is `rank`): the depthwise outputs go through `bands`
// (two buffers of band_rows rows) and are projected as soon as a band is
// complete. Each thread makes the depthwise outputs of its share of the
// channels, then projects its share of the band's pixels; one barrier per band
// (the other buffer is being filled meanwhile).
void run_block_image(const DepthwisePairWeights& weights, const Geometry& g, const float* x, const float* residual,
                     float* y, const Clamps& clamps, int64_t team, int64_t rank, int64_t rows_begin, int64_t rows_end,
                     int64_t band_rows, float* bands[2]) {
    const int64_t blocks = g.m / kLanes;
    const int64_t first = blocks * rank / team;
    auto passes = passes_of(g, first, blocks * (rank + 1) / team - first, rows_begin);
    const int64_t band_count = (rows_end - rows_begin + band_rows - 1) / band_rows;
    for (int64_t b = 0; b < band_count; ++b) {
        const int64_t oy0 = rows_begin + b * band_rows, oy1 = std::min(rows_end, oy0 + band_rows);
        float* band = bands[b % 2];
        for (auto& pass : passes) run_pass(weights, g, x, pass, oy0, oy1, clamps, band - oy0 * g.ow * g.m);
        if (team > 1) {
#pragma omp barrier
        }
        const int64_t pixels = (oy1 - oy0) * g.ow;
        const auto [p0, p1] = projection_share(weights, g, oy1 - oy0, pixels, team, rank);
        const int64_t at = oy0 * g.ow + p0, p = weights.out_channels;
        project(weights, band + p0 * g.m, p1 - p0, g.m, clamps.projection, residual ? residual + at * p : nullptr,
                y + at * p);
    }
    if (team > 1) {
#pragma omp barrier
    }
}

}  // namespace

bool depthwise_pair_supported(int64_t channels) {
    return cpu_features().avx512f && channels > 0 && channels % kLanes == 0;
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

void add_projection(DepthwisePairWeights& p, const float* projection, const float* bias, int64_t out_channels) {
    const int64_t m = p.channels, padded = (out_channels + kLanes - 1) / kLanes * kLanes;
    p.out_channels = out_channels;
    p.projection.assign(static_cast<size_t>(padded * m), 0.0f);
    p.projection_bias.assign(static_cast<size_t>(padded), 0.0f);
    for (int64_t o = 0; o < out_channels; ++o)
        for (int64_t k = 0; k < m; ++k)
            p.projection[((o / kLanes) * m + k) * kLanes + o % kLanes] = projection[o * m + k];
    if (bias) std::copy(bias, bias + out_channels, p.projection_bias.begin());
}

void run_depthwise_pair(const DepthwisePairWeights& weights, const float* x, int64_t n, int64_t h, int64_t w,
                        int64_t stride, const Clamps& clamps, const float* residual, float* y) {
    const Geometry g{h, w, weights.in_channels, weights.channels, stride, (h - 1) / stride + 1, (w - 1) / stride + 1};
    const int64_t blocks = g.m / kLanes;
    const int64_t x_image = h * w * g.c, y_image = g.oh * g.ow * (weights.out_channels ? weights.out_channels : g.m);
    if (weights.out_channels == 0) {
        parallel_team(true, [&](int64_t t, int64_t threads) {
            // This thread's share of the (image, block) units, every row of them.
            const int64_t units = n * blocks, end = units * (t + 1) / threads;
            for (int64_t u = units * t / threads; u < end;) {
                const int64_t image = u / blocks, count = std::min(blocks - u % blocks, end - u);
                for (auto& pass : passes_of(g, u % blocks, count))
                    run_pass(weights, g, x + image * x_image, pass, 0, g.oh, clamps, y + image * y_image);
                u += count;
            }
        });
        return;
    }
    const int64_t band_rows = std::min(g.oh, (kBandPixels + g.ow - 1) / g.ow);
    const auto band_floats = static_cast<size_t>(band_rows * g.ow * g.m);
    const int64_t threads = omp_get_max_threads();
    if (n >= threads || g.oh >= kRowsPerThread * threads) {
        // Whole images per thread, or with fewer images than threads, tall ones
        // cut into a band of rows per thread (the expanded rows at a cut are made
        // by both threads: 2 of 56 rows, against barriers and channel shares).
        parallel_team(true, [&](int64_t rank, int64_t team) {
            AlignedFloats buffer(2 * band_floats);
            float* bands[2] = {buffer.data(), buffer.data() + band_floats};
            const bool whole = n >= team;
            const int64_t first = whole ? n * rank / team : 0, last = whole ? n * (rank + 1) / team : n;
            for (int64_t image = first; image < last; ++image)
                run_block_image(weights, g, x + image * x_image, residual ? residual + image * y_image : nullptr,
                                y + image * y_image, clamps, 1, 0, whole ? 0 : g.oh * rank / team,
                                whole ? g.oh : g.oh * (rank + 1) / team, band_rows, bands);
        });
        return;
    }
    // Fewer images than threads, and short: the team shares each image's channels.
    AlignedFloats buffer(2 * band_floats);
    float* bands[2] = {buffer.data(), buffer.data() + band_floats};
    for (int64_t image = 0; image < n; ++image)
        parallel_team(true, [&](int64_t rank, int64_t team) {
            run_block_image(weights, g, x + image * x_image, residual ? residual + image * y_image : nullptr,
                            y + image * y_image, clamps, team, rank, 0, g.oh, band_rows, bands);
        });
}

}  // namespace vaiq::runtime
