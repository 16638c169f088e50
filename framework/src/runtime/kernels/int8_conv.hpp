// Exact int8 convolution on oneDNN: sum over the window of (x - x_zero_point) * w
// in int32, for uint8/int8 inputs and int8 weights whose zero point is 0.
#pragma once

#include <memory>
#include <optional>

#include "runtime/kernels/common.hpp"
#include "runtime/kernels/window.hpp"

namespace vaiq::runtime {

/// Whether this CPU computes u8/s8 x s8 products in int32 without the int16
/// saturation of pre-VNNI instructions, so that oneDNN's int8 results are exact.
bool exact_int8_available();

/// The int32 accumulators [N, M, out...] of the convolution of `x` (zero point
/// `x_zero_point`) with int8 weights `w` (zero point 0), or nullopt when the
/// fast path does not apply (other types, or no exact int8 on this CPU). `state`
/// keeps the compiled primitive and the per-channel weight sums across runs.
std::optional<std::vector<int32_t>> int8_conv(KernelContext& ctx, const Tensor& x, int32_t x_zero_point, const Tensor& w,
                                              bool w_constant, std::shared_ptr<void>& state, std::vector<int64_t>& shape);

}  // namespace vaiq::runtime
