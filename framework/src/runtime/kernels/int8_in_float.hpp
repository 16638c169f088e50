// Exact 8-bit convolutions and matrix products in float32, for CPUs whose 8-bit
// products are not exact (before VNNI, vpmaddubsw saturates each pair of
// products at int16). The centred values are small integers, so every product
// is exact in float32, and so is every partial sum while its magnitude stays
// below 2^24, whatever order the kernel sums in. The reduction is cut into
// chunks whose worst-case sums stay below that; each chunk's float sums are
// converted to int32 and added. The results equal int8_conv's and int8_matmul's.
#pragma once

#include <memory>
#include <optional>

#include "runtime/kernels/int8_conv.hpp"

namespace vaiq::runtime {

/// int8_conv's sums [N, M, out...], computed in float32 (oneDNN's direct
/// convolution, channels-last). Nullopt where it does not apply: not a 2-D
/// convolution of 8-bit x and int8 weights, or a single input channel's worst
/// case already beyond 2^24.
std::optional<Int32Sums> int8_conv_in_float(KernelContext& ctx, const Tensor& x, int32_t x_zero_point, const Tensor& w,
                                            bool w_constant, std::shared_ptr<void>& state, std::vector<int64_t>& shape,
                                            const int32_t* bias);

/// int8_conv_channels_last on NHWC `x`, computed in float32: the whole
/// tensor's sums, then handed to `sink` in bands of whole pixels.
bool int8_conv_channels_last_in_float(KernelContext& ctx, const Tensor& x, int32_t x_zero_point, const Tensor& w,
                                      bool w_constant, std::shared_ptr<void>& state, const int32_t* bias,
                                      const ChannelsLastSums& sink);

/// int8_matmul's sums, computed in float32 (oneDNN's matmul over chunks of K).
std::optional<Int32Sums> int8_matmul_in_float(KernelContext& ctx, const Tensor& a, int32_t a_zero_point,
                                              const Tensor& b, int32_t b_zero_point, bool b_constant,
                                              std::shared_ptr<void>& state, std::vector<int64_t>& shape,
                                              bool b_transposed);

}  // namespace vaiq::runtime
