// A nested run: another model (a body of the model's control flow) quantized
// with the run's own recipe, up to the written model, on data the caller gives.
#pragma once

#include <functional>
#include <optional>

#include "pipeline/pipeline.hpp"
#include "vaiq/algorithm.hpp"

namespace vaiq::phases {

struct QuantizedRun;  // pipeline/run_state.hpp

/// The pipeline up to emit on a recipe and options, writing nothing.
using NestedRun = std::function<QuantizedRun(const Recipe& recipe, const RunOptions& options)>;

/// AlgorithmContext::quantize_nested: `model` quantized by `run` on `recipe`
/// narrowed to it (see there), reading `data`.
std::optional<NestedQuantization> quantize_nested(const Recipe& recipe, const NestedRun& run, const Model& model,
                                                  DataReader& data, const nlohmann::json& shared_inputs,
                                                  const nlohmann::json& shared_outputs);

}  // namespace vaiq::phases
