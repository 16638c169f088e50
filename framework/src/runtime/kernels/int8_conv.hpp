// Exact int8 convolution and matrix product on oneDNN: int32 sums of centred
// 8-bit values, the zero points' shares handled around oneDNN's int8 kernels.
#pragma once

#include <memory>
#include <optional>

#include "runtime/kernels/common.hpp"
#include "runtime/kernels/window.hpp"

namespace vaiq::runtime {

/// int32 sums, allocated without zero-filling: every kernel writes them in full.
using Int32Sums = std::vector<int32_t, DefaultInitAllocator<int32_t>>;

/// Whether this CPU computes u8/s8 x s8 products in int32 without the int16
/// saturation of pre-VNNI instructions, so that oneDNN's int8 results are exact.
bool exact_int8_available();

/// The int32 accumulators [N, M, out...] of the 2-D convolution of `x` (zero
/// point `x_zero_point`) with int8 weights `w` (zero point 0), plus `bias` (int32
/// per output channel) when given, or nullopt when the fast path does not apply
/// (other types, or no exact int8 on this CPU). `state` keeps the compiled
/// primitive and the per-channel weight sums across runs. With `channel_offsets`,
/// x is NHWC and the sums come back NHWC [N, out..., M] before their
/// per-channel offsets, which go to `channel_offsets` (sum - offset[m] is the
/// accumulator) for the caller's own pass over them.
std::optional<Int32Sums> int8_conv(KernelContext& ctx, const Tensor& x, int32_t x_zero_point, const Tensor& w,
                                   bool w_constant, std::shared_ptr<void>& state, std::vector<int64_t>& shape,
                                   const int32_t* bias = nullptr, std::vector<int32_t>* channel_offsets = nullptr);

/// The int32 sums [batch..., M, N] of (a - a_zero_point) x (b - b_zero_point)
/// for 8-bit a and b (numpy batch broadcasting, per-tensor zero points), on
/// oneDNN's u8/s8 x s8 matmul with the zero points' shares subtracted after (a
/// uint8 b is shifted to int8 first). Nullopt when the fast path does not apply
/// (other types or ranks, or no exact int8 on this CPU). Exact: integer sums.
/// With `b_transposed` (2-D operands only) b is stored [N, K] (Gemm's transB).
std::optional<Int32Sums> int8_matmul(KernelContext& ctx, const Tensor& a, int32_t a_zero_point, const Tensor& b,
                                     int32_t b_zero_point, bool b_constant, std::shared_ptr<void>& state,
                                     std::vector<int64_t>& shape, bool b_transposed = false);

}  // namespace vaiq::runtime
