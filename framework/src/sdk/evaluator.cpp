#include "sdk/evaluator.hpp"

#include "vaiq/error.hpp"

namespace vaiq {

namespace {
Evaluator g_evaluator = nullptr;
}

void set_evaluator(Evaluator evaluator) { g_evaluator = evaluator; }

std::vector<Tensor> evaluate(const Model& model, const std::map<std::string, Tensor>& feeds) {
    if (!g_evaluator) throw InternalError("evaluate() needs vaiq's runtime library, which is not loaded");
    return g_evaluator(model, feeds);
}

}  // namespace vaiq
