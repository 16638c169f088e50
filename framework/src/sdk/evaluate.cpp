#include "runtime/executor.hpp"
#include "vaiq/model.hpp"

namespace vaiq {

std::vector<Tensor> evaluate(const Model& model, const std::map<std::string, Tensor>& feeds) {
    runtime::Executor executor(model, {.threads = 1, .optimize_layout = false, .fuse_qdq = false});
    return executor.run(feeds);
}

}  // namespace vaiq
