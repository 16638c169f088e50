// EnableSubgraph: the branches of If nodes quantized with the run's own recipe.
//
// A branch reads values of the graph around it by name. Each branch becomes a
// model of its own: those values are its inputs (constants among them are its
// initializers, so weights defined outside are quantized too), its outputs are
// the branch's. The float model runs over the calibration data once more,
// tapping what each If reads; a branch calibrates on the batches that took it.
// The branch model is quantized by a nested run of the same recipe (its own
// If nodes in turn) and put back in place of the float branch, with every name
// it added made unique in the whole model. Loop and Scan bodies, whose inputs
// change from one iteration to the next, stay float and are named in the report.
#pragma once

#include <functional>

#include "pipeline/run_state.hpp"

namespace vaiq::phases {

// A nested run of the pipeline up to emit, on a branch model and its data.
using NestedRun = std::function<QuantizedRun(const Recipe& recipe, const RunOptions& options)>;

// Quantizes the If branches of the run's prepared model into s.quantized,
// recording what it did in s.report["subgraphs"].
void quantize_subgraphs(RunState& s, const NestedRun& nested);

// The names a graph reads that neither it nor a graph inside it defines: the
// values of enclosing scopes it uses, sorted.
std::vector<std::string> outer_references(const onnx::GraphProto& graph);

}  // namespace vaiq::phases
