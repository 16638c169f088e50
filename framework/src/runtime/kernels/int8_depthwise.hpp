// Depthwise 3x3 integer convolution on channels-last 8-bit tensors (MobileNet's
// middle layers), summed and requantized in registers: no int32 tensor goes
// through memory. The same integers as QLinearConv's other paths.
#pragma once

#include <cstdint>
#include <vector>

namespace vaiq::runtime {

/// Whether this CPU has what the kernel uses (AVX-512 with VBMI and VNNI).
bool int8_depthwise_available();

struct DepthwiseGeometry {
    int64_t n = 0, h = 0, w = 0, c = 0;  ///< x: [n, h, w, c]
    int64_t out_h = 0, out_w = 0, stride = 1, pad_top = 0, pad_left = 0;
};

/// Weights, offsets and multipliers in the kernel's lane order, per 64 lanes.
struct DepthwiseLanes {
    std::vector<int8_t> weights;     ///< per 64 lanes: a group a window column, four vectors each
    std::vector<int32_t> offsets;    ///< per 64 lanes
    std::vector<float> multipliers;  ///< the same
};

/// The kernel's parameters, made once a node.
struct DepthwiseParameters {
    DepthwiseLanes channels;          ///< lane i of block b: channel 64 b + i
    DepthwiseLanes pixels;            ///< a few channels (64 / c a whole number): lane i is channel i mod c
    std::vector<uint8_t> zero_input;  ///< the input's zero point, one per lane (padding reads it)
};

/// `w` [c, 1, 3, 3]; `bias` per channel or null; `multiplier` one or per
/// channel (x_scale * w_scale / y_scale in float32).
DepthwiseParameters depthwise_parameters(const int8_t* w, int64_t c, const int32_t* bias,
                                         const std::vector<float>& multiplier, int32_t x_zero_point, bool x_signed);

/// y [n, out_h, out_w, c] = requantized(sum over the 3x3 window of (x - x_zp) * w + bias): x and y
/// are 8-bit (`x_signed`, `y_signed` tell int8 from uint8).
void int8_depthwise_3x3(const uint8_t* x, bool x_signed, const DepthwiseParameters& p, const DepthwiseGeometry& g,
                        float y_zero_point, bool y_signed, uint8_t* y);

}  // namespace vaiq::runtime
