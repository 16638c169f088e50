// The executor's graph rewrites: convolutions and 2-D pools run in NHWC
// (oneDNN's fastest layout here) with the transposes between them cancelled and
// their neighbours fused in; spelled-out LayerNorms, Gelus and MatMul + bias run
// as one kernel each.
#pragma once

#include <onnx/onnx_pb.h>

#include <set>
#include <string>

namespace vaiq::runtime {

/// Domain of the executor's private ops (NhwcConv, NhwcConvDepthwise, NhwcMaxPool,
/// NhwcAveragePool, NhwcQLinearConv, LayerNormalization and Gelu at any opset,
/// MatMul with a bias).
inline constexpr const char* kInternalDomain = "vaiq.internal";
/// An NhwcQLinearConvPair's attributes for its 1x1 half's output bounds.
inline constexpr const char* kPointwiseOutputMinAttribute = "pointwise_output_min";
inline constexpr const char* kPointwiseOutputMaxAttribute = "pointwise_output_max";

/// Rewrites `graph` in place: Conv, QLinearConv (where oneDNN's int8 kernels
/// are exact) and 2-D MaxPool/AveragePool become their NHWC forms between
/// Transposes, which are pushed through elementwise ops (QLinearAdd/Mul and
/// per-tensor Q/DQ among them, and into QLinearGlobalAveragePool's channels-last
/// form) and cancelled in pairs. Then a convolution takes in a residual Add of its output,
/// the Relu/Clip after it, and a 1x1 convolution the depthwise 3x3 ones reading
/// it. Every original tensor keeps its name and NCHW value (some are then
/// computed only on demand). A fusion that would leave a tensor in `tapped` to
/// be computed on demand is not made: it would compute twice. Returns whether
/// anything changed.
bool optimize_layout(onnx::GraphProto& graph, const std::set<std::string>& tapped = {});

/// Rewrites `graph` in place: the last node of each spelled-out LayerNorm (with
/// a scale), Gelu and HardSwish (vaiq/patterns.hpp) becomes one internal
/// LayerNormalization, Gelu or HardSwish (the spelled-out float arithmetic in
/// one pass) writing the same tensor, and an Add of a bias to a MatMul by a weight
/// an internal MatMul with the bias (and a Gelu of such a product the product
/// with attribute activation = "gelu"); the other nodes stay and run only when
/// a tap wants their values; patterns with a tensor in `tapped` inside stay as
/// they are. Returns whether anything changed.
bool fuse_patterns(onnx::GraphProto& graph, const std::set<std::string>& tapped = {});

}  // namespace vaiq::runtime
