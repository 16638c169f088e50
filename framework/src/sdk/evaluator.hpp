// The SDK's evaluate() runs models through an executor the runtime library
// registers when it is loaded: the SDK does not link the runtime.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "vaiq/export.hpp"
#include "vaiq/model.hpp"

namespace vaiq {

using Evaluator = std::vector<Tensor> (*)(const Model& model, const std::map<std::string, Tensor>& feeds);

/// Called once by libvaiq_runtime's static initialisation.
VAIQ_API void set_evaluator(Evaluator evaluator);

}  // namespace vaiq
