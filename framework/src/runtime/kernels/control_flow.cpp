// If: runs one of two subgraphs, which may read the enclosing scope.
#include "runtime/executor.hpp"
#include "runtime/kernels/common.hpp"

namespace vaiq::runtime {
namespace {

// A branch compiled once: its graph as a model (with the parent's opsets) and its executor.
struct Branch {
    Model model;
    std::unique_ptr<Executor> executor;
};

struct IfState {
    std::unique_ptr<Branch> branches[2];
};

Branch& branch(KernelContext& ctx, bool then_branch) {
    auto state = std::static_pointer_cast<IfState>(ctx.state);
    if (!state) {
        state = std::make_shared<IfState>();
        ctx.state = state;
    }
    auto& slot = state->branches[then_branch ? 0 : 1];
    if (!slot) {
        const char* name = then_branch ? "then_branch" : "else_branch";
        const onnx::GraphProto* graph = nullptr;
        for (const auto& a : ctx.node.attribute())
            if (a.name() == name && a.has_g()) graph = &a.g();
        if (!graph) ctx.fail(std::string("has no ") + name);
        onnx::ModelProto proto;
        proto.set_ir_version(ctx.model.proto().ir_version());
        *proto.mutable_opset_import() = ctx.model.proto().opset_import();
        *proto.mutable_graph() = *graph;
        slot = std::make_unique<Branch>();
        slot->model = Model(std::move(proto));
        slot->executor = std::make_unique<Executor>(slot->model, ExecutorOptions{});
    }
    return *slot;
}

void if_kernel(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& cond = ctx.input(0);
    if (cond.type() != DataType::Bool || cond.size() != 1) ctx.fail("the condition must be a single bool");
    auto& b = branch(ctx, view<bool>(cond)[0]);
    // Borrowed, not copied: a branch often reads the enclosing graph's weights.
    std::vector<ScopeValue> outer;
    for (const auto& name : b.executor->outer_names()) {
        outer.push_back(ctx.lookup ? ctx.lookup(name) : ScopeValue{});
        if (!outer.back().tensor) ctx.fail("the branch reads '" + name + "', which the enclosing graph does not have");
    }
    auto results = b.executor->run_nested(outer);
    if (results.size() != out.size())
        ctx.fail(fmt::format("the branch has {} outputs; the node has {}", results.size(), out.size()));
    for (size_t i = 0; i < out.size(); ++i) out[i] = std::move(results[i]);
}

const KernelRegistration kKernels[] = {
    {"", "If", 1, 21, if_kernel},
};

}  // namespace
}  // namespace vaiq::runtime
