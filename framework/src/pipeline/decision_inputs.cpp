#include "pipeline/decision_inputs.hpp"

#include <fmt/format.h>

#include <set>

#include "vaiq/graph.hpp"

namespace vaiq {

namespace {

const std::set<std::string, std::less<>> kComparisons = {"Equal", "Greater", "GreaterOrEqual", "Less",
                                                         "LessOrEqual"};
const std::set<std::string, std::less<>> kRankings = {"ArgMax", "ArgMin", "TopK"};
// Ops through which equal inputs stay equal, so that ties a grid makes in
// their input reach the comparison: those that move or pick values, and
// elementwise maps of one tensor (a Sigmoid of a score, a scale by a constant).
const std::set<std::string, std::less<>> kSelections = {
    "Identity",     "Reshape", "Transpose", "Squeeze", "Unsqueeze",      "Flatten",  "MaxPool", "Slice",  "Split",
    "Gather",       "Pad",     "DepthToSpace", "SpaceToDepth", "GatherElements", "GatherND", "Tile",    "Expand"};
const std::set<std::string, std::less<>> kElementwise = {"Sigmoid", "Tanh", "Relu",        "LeakyRelu", "Clip",
                                                         "Exp",     "Log",  "Neg",         "Abs",       "Sqrt",
                                                         "Softplus", "Erf", "HardSigmoid", "Cast",      "Softmax"};
const std::set<std::string, std::less<>> kAffine = {"Add", "Sub", "Mul", "Div"};
// Several inputs, each of whose values may reach the output as it is.
const std::set<std::string, std::less<>> kGathering = {"Concat", "Max", "Min"};

bool is_constant(const onnx::GraphProto& graph, const GraphIndex& index, const std::string& tensor) {
    if (index.initializer(tensor)) return !index.is_graph_input(tensor);
    const int producer = index.producer(tensor);
    return producer >= 0 && graph.node(producer).op_type() == "Constant";
}

std::string describe(const onnx::NodeProto& node) {
    return fmt::format("{} '{}'", node.op_type(), node.name().empty() ? node.output(0) : node.name());
}

}  // namespace

std::vector<DecisionInput> decision_inputs(const Model& model) {
    const auto& graph = model.graph();
    const GraphIndex index(graph);
    std::vector<DecisionInput> out;
    std::set<std::string> seen;
    for (const auto& node : graph.node()) {
        if (!is_default_domain(node)) continue;
        const bool comparison = kComparisons.count(node.op_type()) > 0;
        if (!comparison && !kRankings.count(node.op_type())) continue;
        const auto why =
            comparison ? fmt::format("{} compares it: on a shared 8-bit grid near values become equal", describe(node))
                       : fmt::format("{} ranks it: on an 8-bit grid close scores tie", describe(node));
        // Rankings read their data at input 0 only (TopK's k is an integer).
        std::vector<std::string> pending;
        for (int i = 0; i < (comparison ? node.input_size() : 1); ++i) pending.push_back(node.input(i));
        while (!pending.empty()) {
            const auto tensor = pending.back();
            pending.pop_back();
            if (tensor.empty() || index.initializer(tensor) || !seen.insert(tensor).second) continue;
            out.push_back({tensor, why});
            const int producer = index.producer(tensor);
            if (producer < 0) continue;
            const auto& p = graph.node(producer);
            if (!is_default_domain(p)) continue;
            const auto& op = p.op_type();
            if (kSelections.count(op) || kElementwise.count(op)) {
                pending.push_back(p.input(0));  // the data: Gather's indices, Clip's bounds are not
            } else if (kGathering.count(op)) {
                pending.insert(pending.end(), p.input().begin(), p.input().end());
            } else if (kAffine.count(op) && p.input_size() == 2) {
                // x op constant: equal x stay equal; a sum of two computed tensors rarely ties.
                const bool first = is_constant(graph, index, p.input(0)), second = is_constant(graph, index, p.input(1));
                if (first != second) pending.push_back(first ? p.input(1) : p.input(0));
            }
        }
    }
    return out;
}

}  // namespace vaiq
