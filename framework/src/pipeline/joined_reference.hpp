// pipeline/joined_reference.hpp - the given model's outputs computed beside the
// prepared model's, sharing what preparation left as it was.
//
// When preparation changes what a model computes (the DPU simulations), the
// evaluation's reference is the given model, which used to run again on every
// sample. Most of it is usually what the prepared model computes too (a DPU
// rewrite touches a pool or a few activations): joined into the prepared model,
// only the part that differs runs a second time, during calibration.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "vaiq/model.hpp"

namespace vaiq {

struct JoinedReference {
    /// Per output of the prepared model, in its order: the index among `model`'s
    /// outputs of the given model's output of the same name.
    std::vector<int> given_outputs;
    int shared_nodes = 0;  ///< given nodes that read and write the prepared model's tensors
    int added_nodes = 0;   ///< given nodes added beside them
    /// The prepared graph's sizes before the join: what was added follows them.
    int nodes_before = 0, initializers_before = 0, outputs_before = 0;
};

/// Joins `given` into `prepared` (in place: nodes, initializers and outputs are
/// appended): a node of `given` with the op, domain, attributes and inputs of a
/// prepared node (inputs by name for graph inputs, by value for initializers, by
/// the nodes that compute them otherwise) is that node; the others are added.
/// nullopt, `prepared` unchanged, when the two cannot be joined (other graph
/// inputs or outputs, an opset `prepared` imports at another version,
/// subgraphs or local functions in `given`) or when fewer nodes are shared than
/// added.
std::optional<JoinedReference> join_given_model(Model& prepared, const Model& given);

/// Removes what join_given_model appended.
void remove_joined(Model& model, const JoinedReference& joined);

}  // namespace vaiq
