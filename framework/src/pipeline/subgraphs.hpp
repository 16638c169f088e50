// EnableSubgraph: the bodies of If, Loop and Scan nodes quantized with the run's
// own recipe.
//
// A body reads values of the graph around it by name. Each body becomes a
// model of its own: those values are its inputs (constants among them are its
// initializers, so weights defined outside are quantized too), its outputs are
// the body's. The float model runs over the calibration data once more,
// tapping what each node reads: an If's branch calibrates on the batches that
// took it; a Loop's or Scan's body on its iterations, which the float body
// replays from the node's inputs (every iteration of a batch up to 256, else
// 256 drawn uniformly from its run). The body model is quantized by a nested
// run of the same recipe (its own control flow in turn) and put back in place of the float body, with every name it
// added made unique in the whole model.
#pragma once

#include <functional>

#include "pipeline/run_state.hpp"

namespace vaiq::phases {

// A nested run of the pipeline up to emit, on a branch model and its data.
using NestedRun = std::function<QuantizedRun(const Recipe& recipe, const RunOptions& options)>;

// Quantizes the If, Loop and Scan bodies of the prepared float `model` into
// `quantized` (the model `plan` was written into), recording what it did in
// report["subgraphs"].
void quantize_subgraphs(const RunSetup& setup, const Model& model, const QuantPlan& plan, Model& quantized,
                        nlohmann::json& report, const NestedRun& nested);

// The names a graph reads that neither it nor a graph inside it defines: the
// values of enclosing scopes it uses, sorted.
std::vector<std::string> outer_references(const onnx::GraphProto& graph);

}  // namespace vaiq::phases
