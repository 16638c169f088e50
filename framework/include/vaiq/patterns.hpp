// vaiq/patterns.hpp - spelled-out ops found in a graph: LayerNorm, Gelu and
// HardSwish as exporters write them. The prepare passes replace them in the model; the
// executor computes them in one kernel and keeps the spelled-out nodes for taps.
#pragma once

#include <onnx/onnx_pb.h>

#include <vector>

#include "vaiq/export.hpp"

namespace vaiq {

/// One occurrence of a pattern.
struct PatternMatch {
    std::vector<int> nodes;  ///< every node of the pattern (graph indices); no node is in two matches
    int last = -1;           ///< the node writing the pattern's output
    onnx::NodeProto fused;   ///< one node computing the same output, unnamed
};

/// (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) [* gamma] [+ beta] over the
/// last axis, as an ONNX LayerNormalization (axis -1, epsilon; inputs x, gamma
/// and beta, or x alone when there is no gamma: the caller supplies ones then).
/// Intermediate tensors must be read only inside the pattern.
VAIQ_API std::vector<PatternMatch> find_layer_norms(const onnx::GraphProto& graph);

/// x * 0.5 * (1 + erf(x / sqrt 2)) in any of the orders exporters write it, as
/// ONNX Runtime's com.microsoft Gelu.
VAIQ_API std::vector<PatternMatch> find_gelus(const onnx::GraphProto& graph);

/// x * Clip(x + 3, 0, 6) / 6 (or * 1/6), as PP-LCNet and MobileNetV3 exports
/// spell HardSwish before opset 14, as an ONNX HardSwish; the constants 3 and
/// 6 (or 1/6) stored as initializers. Its nodes are the product's Mul, the
/// Clip, the Add and the last node, in that order.
VAIQ_API std::vector<PatternMatch> find_hard_swishes(const onnx::GraphProto& graph);

}  // namespace vaiq
