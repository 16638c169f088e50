// The expansion + depthwise pair of MobileNet-style blocks (NhwcConvDepthwise)
// on AVX-512: rows of the expanded tensor are made just before the depthwise
// convolution reads them and live in a four-row ring that stays in cache.
#pragma once

#include <cstdint>
#include <vector>

namespace vaiq::runtime {

/// The pair's weights in the kernel's layout, per block of 16 expanded channels.
struct DepthwisePairWeights {
    int64_t in_channels = 0;          ///< C
    int64_t channels = 0;             ///< M, the expanded channels (a multiple of 16)
    std::vector<float> pointwise;     ///< [M/16][C][16]
    std::vector<float> depthwise;     ///< [M/16][3*3][16]
    std::vector<float> pointwise_bias, depthwise_bias;  ///< [M] (zeros when the model has none)
};

/// A fused Relu/Clip; without one, [-inf, inf].
struct Clamp {
    float lo, hi;
};

/// Whether run_depthwise_pair can run here: AVX-512F present and M a multiple of 16.
bool depthwise_pair_supported(int64_t channels);

/// Packs ONNX weights: pointwise [M, C, 1, 1], depthwise [M, 1, 3, 3]; biases [M] or null.
DepthwisePairWeights pack_depthwise_pair(const float* pointwise, const float* pointwise_bias, const float* depthwise,
                                         const float* depthwise_bias, int64_t in_channels, int64_t channels);

/// y (NHWC [n, oh, ow, M]) = clamp(depthwise3x3(clamp(x * pointwise + b), pad 1, stride) + b)
/// for NHWC x [n, h, w, C]; stride 1 or 2. Threads (OpenMP) share the
/// (image, 16 channels) pairs: each channel's depthwise convolution reads only
/// its own expanded channel, so no row is computed twice.
void run_depthwise_pair(const DepthwisePairWeights& weights, const float* x, int64_t n, int64_t h, int64_t w,
                        int64_t stride, Clamp pointwise, Clamp depthwise, float* y);

}  // namespace vaiq::runtime
