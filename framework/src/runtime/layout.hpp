// The executor's layout optimisation: convolutions and 2-D pools run in NHWC
// (oneDNN's fastest layout here), and the transposes between them cancel.
#pragma once

#include <onnx/onnx_pb.h>

namespace vaiq::runtime {

/// Domain of the executor's private ops (NhwcConv, NhwcMaxPool, NhwcAveragePool).
inline constexpr const char* kInternalDomain = "vaiq.internal";

/// Rewrites `graph` in place: Conv and 2-D MaxPool/AveragePool become their
/// NHWC forms between Transposes, which are pushed through elementwise ops and
/// cancelled in pairs. Every original tensor keeps its name and NCHW value
/// (some are then computed only on demand). Returns whether anything changed.
bool optimize_layout(onnx::GraphProto& graph);

}  // namespace vaiq::runtime
