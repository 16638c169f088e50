// Half-quadratic quantization (HQQ) of weight-only MatMul weights, as ONNX
// Runtime's MatMulNBits quantizer defines it: no data. Each block of a weight
// keeps its extremes' scale, and its zero point becomes a float that a
// proximal solver moves to lower the block's error in an lp norm (p < 1, so
// a few large errors count less than many small ones): each iteration rounds
// with the current zero point, shrinks the error (soft thresholding for the
// lp norm) and sets the zero point to the mean that reproduces what is left.
#pragma once

#include "vaiq/quant.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {

struct HqqOptions {
    double lp_norm = 0.7;  ///< p of the error's norm
    double beta = 10;      ///< the shrinkage's 1 / threshold at the start
    double kappa = 1.01;   ///< beta's growth a step
    int iterations = 20;
};

/// HQQ's parameters for a weight W [K, N] whose plan quantizes it in blocks
/// along K (`plan`: axis 0, block_size > 0, scales [blocks, N]): each block's
/// scale from its extremes over the type's range (one step of 1 for a block
/// of equal values; at least 1 / 20000), a float zero point per block
/// (float_zero_point) and its rounding in zero_point. Unlike ONNX Runtime's,
/// the blocks past K are not padded with zeros, and each block keeps the zero
/// point of the iteration with its least mean absolute error (ONNX Runtime
/// stops all blocks at the first step that does not lower the whole weight's
/// error, and returns the zero point of that step, one past the best).
QuantParams hqq_params(const Tensor& weight, const QuantParams& plan, const HqqOptions& options);

/// The mean absolute error of a weight quantize-dequantized with `params`.
double mean_absolute_error(const Tensor& weight, const QuantParams& params, const std::string& name);

}  // namespace vaiq
