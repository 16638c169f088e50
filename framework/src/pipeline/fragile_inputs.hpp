// Ops whose meaning breaks under rounding, and what they read stays float.
// - Comparisons (Equal, Greater, ...) and rankings (ArgMax, ArgMin, TopK)
//   decide on their inputs' values, and an 8-bit grid turns near values into
//   equal ones: equality holds where it did not (a peak test
//   Equal(MaxPool(x), x) finds a peak on every flat stretch of the grid), an
//   ordering flips at a threshold, a ranking's ties go to the lowest index.
//   The walk goes back through the ops that keep equal values equal (MaxPool,
//   Reshape, Slice, a Sigmoid, a scale by a constant) to the op that computes
//   the values (a Conv's sums from quantized inputs rarely tie), so that both
//   sides of a comparison hold the values they held in float.
// - Log and Reciprocal are singular at 0, and a grid rounds
//   small values to 0: a log-mel front end's energies, clamped to 1e-10 in
//   float, become log(0) = -inf. The walk goes back through the clamp, and
//   through what the energies are computed from where small values stay small
//   (powers, sums and products of such tensors, a non-negative filter bank),
//   to the op that makes them (the spectrum's convolution): magnitudes whose
//   range spans decades that no 8-bit grid holds.
// None of these ops has an integer kernel in ONNX Runtime, so a quantized input
// only adds error there.
// - A score the model outputs (a graph output a Sigmoid or Softmax computes, or a
//   reshape of one) is thresholded and ranked by its users, and an 8-bit grid
//   ties every probability below 0.002 at 0: it stays float, computed from its
//   quantized logits, at the cost of one float op at the end of the graph.
#pragma once

#include <string>
#include <vector>

#include "vaiq/model.hpp"

namespace vaiq {

/// A tensor a fragile op reads, with why it stays float.
struct FragileInput {
    std::string tensor;
    std::string reason;
};

/// The tensors that comparisons, rankings and singular ops in the main graph
/// read, directly or through the ops above, in graph order of those ops; then
/// the score outputs.
std::vector<FragileInput> fragile_inputs(const Model& model);

}  // namespace vaiq
