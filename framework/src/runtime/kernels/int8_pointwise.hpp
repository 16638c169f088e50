// 1x1 integer convolution on channels-last 8-bit tensors (MobileNet's
// expansions and projections), summed and requantized in registers: no int32
// tensor goes through memory. The same integers as QLinearConv's other paths.
#pragma once

#include <cstdint>
#include <vector>

namespace vaiq::runtime {

/// Whether this CPU has what the kernel uses (AVX-512 with VNNI and VL).
bool int8_pointwise_available();

/// Whether the kernel is the faster way for `k` input and `m` output channels:
/// oneDNN's own 1x1 kernels win once the weights are large.
bool int8_pointwise_preferred(int64_t k, int64_t m);

/// The kernel's parameters, made once a node, in its lane order per group of
/// up to 64 output channels.
struct PointwiseParameters {
    int64_t k = 0, m = 0;
    std::vector<int8_t> weights;  ///< per group: per 4 input channels, a vector per 16 output channels
    std::vector<int32_t> starts;  ///< per group: where each lane's sum starts (bias less the input zero point's share)
    std::vector<float> multipliers;  ///< per group: each lane's x_scale * w_scale / y_scale
};

/// `w` [m, k] (k a multiple of 4); `bias` per output channel or null;
/// `multiplier` one or per output channel (float32, as ONNX Runtime).
PointwiseParameters pointwise_parameters(const int8_t* w, int64_t m, int64_t k, const int32_t* bias,
                                         const std::vector<float>& multiplier, int32_t x_zero_point, bool x_signed);

struct PointwiseGeometry {
    int64_t n = 0, h = 0, w = 0;  ///< x: [n, h, w, k]
    int64_t out_h = 0, out_w = 0, stride = 1;
};

/// The 8-bit output: its type, zero point and the integer bounds its values are clamped to.
struct PointwiseOutput {
    bool is_signed = false;
    float zero_point = 0.0f;
    int32_t lo = 0, hi = 255;
};

/// y [n, out_h, out_w, m] = requantized(sum over k of (x - x_zp) * w + bias),
/// clamped to [lo, hi]: x and y are 8-bit (`x_signed` tells int8 from uint8).
void int8_pointwise(const uint8_t* x, bool x_signed, const PointwiseParameters& p, const PointwiseGeometry& g,
                    const PointwiseOutput& out, uint8_t* y);

}  // namespace vaiq::runtime
