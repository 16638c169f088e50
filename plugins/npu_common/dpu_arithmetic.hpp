// The DPU's (the NPU for CNNs) arithmetic that its transforms and its target
// share: how the device approximates LeakyRelu, HardSigmoid and averages.
// Private to the NPU plugins, not part of the SDK.
#pragma once

#include <vaiq/graph.hpp>

#include <cstdint>

namespace dpu {

/// LeakyRelu's slope as the DPU stores it: round(256 alpha) / 256.
float leaky_relu_alpha(float alpha);

/// HardSigmoid(alpha 1/6, beta 1/2) is the DPU's sigmoid; it multiplies by
/// 2731/16384 where the float op multiplies by 1/6.
inline constexpr double kHardSigmoidScale = (2731.0 / 16384.0) * 6.0;
bool is_dpu_hard_sigmoid(const onnx::NodeProto& node);

/// The factor the DPU's average differs from the true mean by, for a k x k
/// window (tabled sizes, else the nearest round(2^n / k^2) / 2^n).
double average_pool_factor(int64_t kh, int64_t kw);
/// The same for a mean over `count` elements (ReduceMean).
double mean_factor(int64_t count);

}  // namespace dpu
