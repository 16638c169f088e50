// Ops whose meaning breaks under rounding: comparisons (Equal, Greater, ...)
// and rankings (ArgMax, ArgMin, TopK) decide on their inputs' values, and
// rounding to an 8-bit grid turns near values into equal ones. Equality then
// holds where it did not (a peak test Equal(MaxPool(x), x) finds a peak on
// every flat stretch of the grid), an ordering flips at a threshold, and a
// ranking's ties go to the lowest index. None of these ops has an integer
// kernel in ONNX Runtime, so a quantized input only adds error there: the
// tensors they read stay float, back through the ops that keep equal values
// equal (MaxPool, Reshape, Slice, a Sigmoid, a scale by a constant) to the op
// that computes them (a Conv's sums from quantized inputs rarely tie), so that
// both sides of a comparison hold the values they held in float.
#pragma once

#include <string>
#include <vector>

#include "vaiq/model.hpp"

namespace vaiq {

/// A tensor a decision reads, with why it stays float.
struct DecisionInput {
    std::string tensor;
    std::string reason;
};

/// The tensors that comparisons and rankings in the main graph read, directly
/// or through ops that keep equal values equal, in graph order of the decisions.
std::vector<DecisionInput> decision_inputs(const Model& model);

}  // namespace vaiq
