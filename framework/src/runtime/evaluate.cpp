// The executor behind the SDK's evaluate(), registered when this library loads.
#include "runtime/executor.hpp"
#include "sdk/evaluator.hpp"

namespace vaiq {

namespace {

std::vector<Tensor> run_once(const Model& model, const std::map<std::string, Tensor>& feeds) {
    runtime::Executor executor(model, {.threads = 1, .optimize_layout = false, .fuse_qdq = false});
    return executor.run(feeds);
}

const bool registered = (set_evaluator(&run_once), true);

}  // namespace

}  // namespace vaiq
