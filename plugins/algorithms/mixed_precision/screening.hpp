// A first look at many raisings at once: the greedy search screens every
// candidate on a simulation of the quantized model instead of compiling and
// running a model for each.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "mixed_precision.hpp"
#include "vaiq/algorithm.hpp"

namespace vaiq {

/// How the output agrees with the float model's with `raised` raised to
/// `precision`, and with each of `candidates` raised on top, on `batches`, all
/// measured in one forking run a batch. The float model simulates the quantized one: its
/// weights quantize-dequantized as the plan with `raised` stores them, each
/// planned activation quantize-dequantized where it is computed (biases stay
/// float: their int32 grid changes little). Where a candidate's change first
/// matters the run forks and resumes with the candidate's plan. nullopt for a
/// candidate the simulation cannot express (its change touches a second weight,
/// or a tensor computed before that point), and for every candidate when the
/// model cannot run forking there (then `base` too): measure those on their own models.
Estimates screen_raisings(AlgorithmContext& context, const Precision& precision, int output_index,
                          const std::set<std::string>& raised, const std::vector<std::string>& candidates,
                          BatchSet batches);

}  // namespace vaiq
