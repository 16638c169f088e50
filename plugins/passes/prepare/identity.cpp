// eliminate_identity: removes Identity nodes and inference-time Dropout (whose
// mask nobody reads), wiring their readers to the input directly.
#include "passes.hpp"

namespace prepare_passes {

namespace {

bool removable(const onnx::NodeProto& node, const vaiq::GraphIndex& index) {
    if (!node.domain().empty() && node.domain() != "ai.onnx") return false;
    if (node.input_size() < 1 || node.input(0).empty() || node.output_size() < 1) return false;
    if (node.op_type() == "Identity") return true;
    if (node.op_type() != "Dropout") return false;
    // A read mask, or a training_mode that is not a known false, keeps the Dropout.
    if (node.output_size() > 1 && !node.output(1).empty() &&
        (!index.consumers(node.output(1)).empty() || index.is_graph_output(node.output(1))))
        return false;
    if (node.input_size() > 2 && !node.input(2).empty()) {
        const auto* mode = index.initializer(node.input(2));
        if (!mode) return false;
        const auto t = vaiq::Tensor::from_proto(*mode);
        if (t.type() != vaiq::DataType::Bool || t.size() != 1 || t.data<uint8_t>()[0] != 0) return false;
    }
    return true;
}

void erase_value_info(onnx::GraphProto& graph, const std::string& name) {
    auto* infos = graph.mutable_value_info();
    infos->erase(std::remove_if(infos->begin(), infos->end(), [&](const auto& v) { return v.name() == name; }),
                 infos->end());
}

// Removes one node; returns false when it must stay (it ties a graph output to
// a graph input, an initializer or another output, which renaming cannot undo).
bool bypass(onnx::GraphProto& graph, const vaiq::GraphIndex& index, int n) {
    const std::string x = graph.node(n).input(0);
    const std::string y = graph.node(n).output(0);
    if (!index.is_graph_output(y)) {
        vaiq::replace_all_uses(graph, y, x);
        erase_value_info(graph, y);
        vaiq::remove_nodes(graph, {n});
        return true;
    }
    const int producer = index.producer(x);
    if (producer < 0 || index.is_graph_output(x)) return false;
    // The output keeps its name: x is renamed to y wherever it appears.
    for (auto& out : *graph.mutable_node(producer)->mutable_output())
        if (out == x) out = y;
    vaiq::replace_all_uses(graph, x, y);
    erase_value_info(graph, x);
    vaiq::remove_nodes(graph, {n});
    return true;
}

}  // namespace

bool eliminate_identity(vaiq::Model& model) {
    vaiq::RewriteContext context(model);
    auto& graph = context.graph();
    int removed = 0;
    for (bool again = true; again; context.changed()) {
        again = false;
        const auto& index = context.index();
        for (int n = 0; n < graph.node_size(); ++n) {
            if (removable(graph.node(n), index) && bypass(graph, index, n)) {
                ++removed;
                again = true;
                break;  // indices moved; look again with a fresh index
            }
        }
    }
    if (removed) vaiq::log_debug("eliminate_identity removed {} nodes", removed);
    return removed > 0;
}

}  // namespace prepare_passes
