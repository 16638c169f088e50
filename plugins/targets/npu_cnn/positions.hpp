// The DPU's fixed-point limits. Every tensor has a position p (scale 2^-p);
// the device shifts integers between them, and each shift has a range. These
// are the limits as constraints on the positions around each node, and the
// refinement that moves positions until all of them hold.
#pragma once

#include <vaiq/vaiq.hpp>

#include <functional>
#include <string>
#include <vector>

namespace npu_cnn {

/// Which constraints apply (the documented IPULimitationCheck switches).
struct Rules {
    bool align_concat = true;
    bool align_pool = true;
    bool align_pad = true;
    bool align_slice = true;
    bool shift_read = true;
    bool shift_write = true;
    bool shift_cut = true;
    bool shift_bias = true;
    bool hard_sigmoid = true;
    bool shift_swish = true;

    /// Every limit off (checks then cover only power-of-two scales).
    static Rules none() { return {false, false, false, false, false, false, false, false, false, false}; }
};

/// Whether the device computes `consumer` inside `producer` (their tensor has no position).
using Fused = std::function<bool(const onnx::NodeProto& producer, const onnx::NodeProto& consumer)>;

/// Moves positions in `plan` until every constraint holds or `max_sweeps`
/// sweeps ran. Counts: nodes each constraint applies to, nodes it adjusted,
/// nodes that still break it.
std::vector<vaiq::ConstraintCount> refine_positions(const onnx::GraphProto& graph, vaiq::QuantPlan& plan,
                                                    const Rules& rules, const Fused& fused, int max_sweeps);

/// Counts the nodes breaking each constraint, changing nothing; also checks
/// that every scale is a power of two ("PowerOfTwoScale", counted per tensor).
std::vector<vaiq::ConstraintCount> check_positions(const onnx::GraphProto& graph, const vaiq::QuantPlan& plan,
                                                   const Rules& rules, const Fused& fused);

}  // namespace npu_cnn
