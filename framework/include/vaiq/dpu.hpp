// vaiq/dpu.hpp - the DPU (the NPU for CNNs) arithmetic that its transforms and
// its target share: how the device approximates LeakyRelu, HardSigmoid and
// averages, and how its fixed-point positions relate to scales.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <optional>
#include <string_view>

#include "vaiq/export.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/quant.hpp"

namespace vaiq::dpu {

/// The doc_string that marks a Mul the simulation passes inserted to rescale
/// an average or a HardSigmoid as the DPU computes it. The pair is one
/// operation on the device: nothing is quantized between them.
inline constexpr std::string_view kRescaleMark = "vaiq: DPU rescale";
VAIQ_API bool is_rescale(const onnx::NodeProto& node);

/// LeakyRelu's slope as the DPU stores it: round(256 alpha) / 256.
VAIQ_API float leaky_relu_alpha(float alpha);

/// HardSigmoid(alpha 1/6, beta 1/2) is the DPU's sigmoid; it multiplies by
/// 2731/16384 where the float op multiplies by 1/6.
inline constexpr double kHardSigmoidScale = (2731.0 / 16384.0) * 6.0;
VAIQ_API bool is_dpu_hard_sigmoid(const onnx::NodeProto& node);

/// The factor the DPU's average differs from the true mean by, for a k x k
/// window (tabled sizes, else the nearest round(2^n / k^2) / 2^n).
VAIQ_API double average_pool_factor(int64_t kh, int64_t kw);
/// The same for a mean over `count` elements (ReduceMean).
VAIQ_API double mean_factor(int64_t count);

/// Clip's bounds from attributes (opset < 11) or constant inputs; nullopt when
/// a bound is not a constant. A missing bound is -inf / +inf.
VAIQ_API std::optional<std::pair<float, float>> clip_bounds(const onnx::NodeProto& node, const GraphIndex& index);

/// Whether a Pad fills with zeros (constant mode, value 0 or none): the padding
/// the DPU's pools apply themselves.
VAIQ_API bool pads_with_zeros(const onnx::NodeProto& pad, const GraphIndex& index);

/// The position p of parameters whose scale is exactly 2^-p; nullopt for
/// per-channel parameters or a scale that is not a power of two.
VAIQ_API std::optional<int> exact_position(const QuantParams& params);

}  // namespace vaiq::dpu
