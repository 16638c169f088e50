// k-quant of weight-only MatMul weights, as ONNX Runtime's MatMulNBits
// quantizer defines it (after llama.cpp's k-quants): no data. Each value of a
// block counts by its importance, the block's root mean square plus its own
// magnitude, so large values are reproduced first. Twenty grids are tried,
// their inverse steps spread around the extremes' (levels - 1 + 0.1 i over the
// block's range, i = 0..19); for each, the levels the values round to are
// kept and the step and minimum refitted by weighted least squares. The block
// keeps the grid with the least importance-weighted squared error.
#pragma once

#include <string_view>

#include "vaiq/quant.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {

/// k-quant's scales and integer zero points for a weight W [K, N] whose plan
/// quantizes it in blocks along K (`plan`: axis 0, block_size > 0, scales
/// [blocks, N]), over the plan type's whole range whatever its symmetry.
/// Unlike ONNX Runtime's, each candidate is judged as it will be written (its
/// fitted minimum rounded to an integer zero point, the values re-rounded on
/// that grid): ONNX Runtime judges the unrounded fit and rounds afterwards, so
/// it can write a block worse than one it rejected. The plan's own parameters
/// (round to nearest) are a candidate too, so no block's error grows; and the
/// blocks past K are not padded with zeros.
QuantParams k_quant_params(const Tensor& weight, const QuantParams& plan);

/// k-quant's objective over a whole weight: sum over blocks of
/// (rms(block) + |w|) (w - dequantized w)^2, the weight quantize-dequantized with `params`.
double importance_weighted_error(const Tensor& weight, const QuantParams& params, std::string_view name);

}  // namespace vaiq
