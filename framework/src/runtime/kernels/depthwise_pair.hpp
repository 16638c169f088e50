// MobileNet-style blocks (NhwcConvDepthwise) on AVX-512: a 1x1 expansion, a
// depthwise 3x3 convolution and optionally the 1x1 projection after it (with a
// residual). Rows of the expanded tensor are made just before the depthwise
// convolution reads them and live in a four-row ring that stays in cache; the
// depthwise outputs are projected a band of rows at a time, so neither wide
// tensor ever goes through memory.
#pragma once

#include <cstdint>
#include <vector>

#include "vaiq/tensor.hpp"

namespace vaiq::runtime {

/// Floats on 64-byte boundaries: the kernel's 16-float blocks never straddle cache lines.
using AlignedFloats = std::vector<float, DefaultInitAllocator<float>>;

/// The pair's weights in the kernel's layout, per block of 16 expanded channels.
struct DepthwisePairWeights {
    int64_t in_channels = 0;                       ///< C
    int64_t channels = 0;                          ///< M, the expanded channels (a multiple of 16)
    AlignedFloats pointwise;                       ///< [M/16][C][16]
    AlignedFloats depthwise;                       ///< [M/16][3*3][16]
    AlignedFloats pointwise_bias, depthwise_bias;  ///< [M] (zeros when the model has none)
    int64_t out_channels = 0;                      ///< P of the projection; 0 without one
    AlignedFloats projection;                      ///< [ceil(P/16)][M][16], zero-padded
    AlignedFloats projection_bias;                 ///< [ceil(P/16) * 16]
};

/// A fused Relu/Clip; without one, [-inf, inf].
struct Clamp {
    float lo, hi;
};

struct Clamps {
    Clamp pointwise, depthwise, projection;
};

/// Whether run_depthwise_pair can run here: AVX-512F present and M a multiple of 16.
bool depthwise_pair_supported(int64_t channels);

/// Packs ONNX weights: pointwise [M, C, 1, 1], depthwise [M, 1, 3, 3]; biases [M] or null.
DepthwisePairWeights pack_depthwise_pair(const float* pointwise, const float* pointwise_bias, const float* depthwise,
                                         const float* depthwise_bias, int64_t in_channels, int64_t channels);

/// Adds a projection: weights [P, M, 1, 1], bias [P] or null.
void add_projection(DepthwisePairWeights& weights, const float* projection, const float* bias, int64_t out_channels);

/// d = clamp(depthwise3x3(clamp(x * pointwise + b), pad 1, stride) + b) for NHWC
/// x [n, h, w, C], stride 1 or 2; y (NHWC) = d [n, oh, ow, M] without a
/// projection, else clamp(d * projection + b + residual) [n, oh, ow, P]
/// (residual: null or of y's shape; it may be y itself). Threads (OpenMP) take
/// whole images when there are enough; else a band of rows of a tall image
/// each, or of a short one a share of the channels of the expansion and
/// depthwise convolution (each channel's depthwise convolution reads only its
/// own expanded channel, so no row is made twice) and then of the projection's
/// pixels. Without a projection they share (image, 16 channels) pairs.
void run_depthwise_pair(const DepthwisePairWeights& weights, const float* x, int64_t n, int64_t h, int64_t w,
                        int64_t stride, const Clamps& clamps, const float* residual, float* y);

}  // namespace vaiq::runtime
