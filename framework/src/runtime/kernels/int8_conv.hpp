// Exact int8 convolution and matrix product on oneDNN: int32 sums of centred
// 8-bit values, the zero points' shares handled around oneDNN's int8 kernels.
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "runtime/kernels/common.hpp"
#include "runtime/kernels/window.hpp"

namespace vaiq::runtime {

/// int32 sums, allocated without zero-filling: every kernel writes them in full.
using Int32Sums = std::vector<int32_t, DefaultInitAllocator<int32_t>>;

/// Whether this CPU computes u8/s8 x s8 products in int32 without the int16
/// saturation of pre-VNNI instructions, so that oneDNN's int8 results are exact
/// for any operands. Without it they are exact for uint8 x and weights in
/// [-64, 64] (reduce_range), which int8_conv and int8_matmul still give oneDNN.
bool exact_int8_available();

/// The int32 accumulators [N, M, out...] of the 2-D convolution of `x` (zero
/// point `x_zero_point`) with int8 weights `w` (zero point 0), plus `bias` (int32
/// per output channel) when given, or nullopt when the fast path does not apply
/// (other types; where oneDNN's int8 kernels would not be exact, the limits of
/// int8_in_float.hpp, which computes it there). `state` keeps the compiled
/// primitive and the per-channel weight sums across runs.
std::optional<Int32Sums> int8_conv(KernelContext& ctx, const Tensor& x, int32_t x_zero_point, const Tensor& w,
                                   bool w_constant, std::shared_ptr<void>& state, std::vector<int64_t>& shape,
                                   const int32_t* bias = nullptr);

/// Where a channels-last convolution's sums go: `start` gets the output shape
/// [N, out..., M] and the per-channel offsets (sum - offset[m] is the
/// accumulator, bias included) before any sums; then `band` gets the sums of
/// whole output pixels, values [first, first + count) of the output, band by
/// band while they are still in cache: from several threads at once (disjoint
/// bands), each band on one thread, or one band on the calling thread.
struct ChannelsLastSums {
    std::function<void(const std::vector<int64_t>& shape, const std::vector<int32_t>& offsets)> start;
    std::function<void(const int32_t* sums, size_t first, size_t count)> band;
};

/// int8_conv on NHWC `x`, computed a band of output rows (or of whole images)
/// at a time into a cache-sized buffer and handed to `sink`: the sums are
/// consumed where they were written instead of going through memory. False
/// when the fast path does not apply (nothing was called).
bool int8_conv_channels_last(KernelContext& ctx, const Tensor& x, int32_t x_zero_point, const Tensor& w,
                             bool w_constant, std::shared_ptr<void>& state, const int32_t* bias,
                             const ChannelsLastSums& sink);

/// An 8-bit matrix product's operands as int8_matmul runs it: both brought to
/// one rank, B as [batch..., K, N] (swapped when stored [N, K]); a stack of A
/// matrices times one B made one taller A. `batch`: the sums' batch dimensions;
/// `result_shape`: their shape as the op gives it.
struct MatMulGeometry {
    std::vector<int64_t> a, b, a_batch, b_batch, batch, result_shape;
};

/// Nullopt for operands int8_matmul does not take (other types or ranks).
std::optional<MatMulGeometry> matmul_geometry(KernelContext& ctx, const Tensor& a, const Tensor& b, bool b_transposed);

/// The int32 sums [batch..., M, N] of (a - a_zero_point) x (b - b_zero_point)
/// for 8-bit a and b (numpy batch broadcasting, per-tensor zero points), on
/// oneDNN's u8/s8 x s8 matmul with the zero points' shares subtracted after (a
/// uint8 b is shifted to int8 first). Nullopt when the fast path does not apply
/// (other types or ranks). Exact: integer sums (in float32 where oneDNN's int8
/// kernels would not be exact, int8_in_float.hpp).
/// With `b_transposed` (2-D operands only) b is stored [N, K] (Gemm's transB).
std::optional<Int32Sums> int8_matmul(KernelContext& ctx, const Tensor& a, int32_t a_zero_point, const Tensor& b,
                                     int32_t b_zero_point, bool b_constant, std::shared_ptr<void>& state,
                                     std::vector<int64_t>& shape, bool b_transposed = false);

}  // namespace vaiq::runtime
