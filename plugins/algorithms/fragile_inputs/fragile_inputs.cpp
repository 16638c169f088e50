// The fragile_inputs algorithm (Plan stage): ops whose meaning breaks under
// rounding, and what they read stays float (float_fragile_inputs).
// - Comparisons (Equal, Greater, ...) and rankings (ArgMax, ArgMin, TopK)
//   decide on their inputs' values, and an 8-bit grid turns near values into
//   equal ones: equality holds where it did not (a peak test
//   Equal(MaxPool(x), x) finds a peak on every flat stretch of the grid), an
//   ordering flips at a threshold, a ranking's ties go to the lowest index.
//   The walk goes back through the ops that keep equal values equal (MaxPool,
//   Reshape, Slice, a Sigmoid, a scale by a constant) to the op that computes
//   the values (a Conv's sums from quantized inputs rarely tie), so that both
//   sides of a comparison hold the values they held in float.
// - Log and Reciprocal are singular at 0, and a grid rounds
//   small values to 0: a log-mel front end's energies, clamped to 1e-10 in
//   float, become log(0) = -inf. The walk goes back through the clamp, and
//   through what the energies are computed from where small values stay small
//   (powers, sums and products of such tensors, a non-negative filter bank),
//   to the op that makes them (the spectrum's convolution): magnitudes whose
//   range spans decades that no 8-bit grid holds.
// None of these ops has an integer kernel in ONNX Runtime, so a quantized input
// only adds error there.
// - A score the model outputs (a graph output a Sigmoid or Softmax computes, or a
//   reshape of one) is thresholded and ranked by its users, and an 8-bit grid
//   ties every probability below 0.002 at 0: it stays float, computed from its
//   quantized logits, at the cost of one float op at the end of the graph.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "vaiq/algorithm.hpp"
#include "vaiq/fold.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/log.hpp"
#include "vaiq/plugin.hpp"

namespace vaiq {

namespace {

/// A tensor a fragile op reads, with why it stays float.
struct FragileInput {
    std::string tensor;
    std::string reason;
};

const std::set<std::string, std::less<>> kComparisons = {"Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual"};
const std::set<std::string, std::less<>> kRankings = {"ArgMax", "ArgMin", "TopK"};
// Ops through which equal inputs stay equal, so that ties a grid makes in
// their input reach the comparison, and small values stay small: those that
// move or pick values, and elementwise maps of one tensor (a Sigmoid of a
// score, an eps clamp, a scale by a constant).
const std::set<std::string, std::less<>> kSelections = {
    "Identity", "Reshape", "Transpose",    "Squeeze",      "Unsqueeze",      "Flatten",  "MaxPool", "Slice", "Split",
    "Gather",   "Pad",     "DepthToSpace", "SpaceToDepth", "GatherElements", "GatherND", "Tile",    "Expand"};
const std::set<std::string, std::less<>> kElementwise = {"Sigmoid",  "Tanh", "Relu",        "LeakyRelu", "Clip",
                                                         "Exp",      "Log",  "Neg",         "Abs",       "Sqrt",
                                                         "Softplus", "Erf",  "HardSigmoid", "Cast",      "Softmax"};
const std::set<std::string, std::less<>> kAffine = {"Add", "Sub", "Mul", "Div"};
// Several inputs, each of whose values may reach the output as it is.
const std::set<std::string, std::less<>> kGathering = {"Concat", "Max", "Min"};

bool is_constant(const onnx::GraphProto& graph, const GraphIndex& index, const std::string& tensor) {
    if (index.initializer(tensor)) return !index.is_graph_input(tensor);
    const int producer = index.producer(tensor);
    return producer >= 0 && graph.node(producer).op_type() == "Constant";
}

// Whether a MatMul/Gemm's B is a constant without negative values (a filter
// bank): its sums of small magnitudes stay small, as its inputs were.
bool sums_magnitudes(const onnx::GraphProto& graph, const GraphIndex& index, const onnx::NodeProto& node) {
    if ((node.op_type() != "MatMul" && node.op_type() != "Gemm") || node.input_size() < 2) return false;
    const auto b = constant_value(graph, index, node.input(1));
    if (!b || b->type() != DataType::Float) return false;
    const auto v = b->data<float>();
    return std::all_of(v.begin(), v.end(), [](float x) { return x >= 0.0f; });
}

// What a singular op's input is computed from, where its small values come from
// small values there: powers, sums and products of magnitudes, a filter bank.
std::vector<std::string> magnitude_sources(const onnx::GraphProto& graph, const GraphIndex& index,
                                           const onnx::NodeProto& node) {
    const auto& op = node.op_type();
    if (op == "Pow" && node.input_size() == 2 && is_constant(graph, index, node.input(1))) return {node.input(0)};
    if ((op == "Add" || op == "Mul") && node.input_size() == 2 && !is_constant(graph, index, node.input(0)) &&
        !is_constant(graph, index, node.input(1)))
        return {node.input(0), node.input(1)};
    if (sums_magnitudes(graph, index, node)) return {node.input(0)};
    return {};
}

// The inputs of `node` whose rounding breaks what it computes, and why; none for other ops.
std::pair<std::vector<std::string>, std::string> fragile_reads(const onnx::NodeProto& node) {
    const auto& op = node.op_type();
    if (!is_default_domain(node) || node.input_size() == 0) return {};
    if (kComparisons.count(op))
        return {{node.input().begin(), node.input().end()},
                fmt::format("{} compares it: on a shared 8-bit grid near values become equal", describe_node(node))};
    if (kRankings.count(op))  // the data; TopK's k is an integer
        return {{node.input(0)}, fmt::format("{} ranks it: on an 8-bit grid close scores tie", describe_node(node))};
    const auto singular = [&] {
        return fmt::format("{} is singular at 0: a grid rounds small values to 0 (log(0), 1/0)", describe_node(node));
    };
    // (A spelled-out LayerNorm's Div keeps its divisor float by FloatLayerNormStatistics.)
    if (op == "Log" || op == "Reciprocal") return {{node.input(0)}, singular()};
    return {};
}

// Ops whose output is a probability: a graph output made by one is a score that
// users threshold and rank.
const std::set<std::string, std::less<>> kScores = {"Sigmoid", "Softmax", "HardSigmoid"};

// The tensors from a graph output back through selections to the Sigmoid or
// Softmax that computes it; none when another op computes it.
std::vector<std::string> score_output_path(const onnx::GraphProto& graph, const GraphIndex& index,
                                           const std::string& output) {
    std::vector<std::string> path{output};
    for (int producer = index.producer(output); producer >= 0; producer = index.producer(path.back())) {
        const auto& p = graph.node(producer);
        if (!is_default_domain(p) || p.input_size() == 0) break;
        if (kScores.count(p.op_type())) return path;
        if (!kSelections.count(p.op_type()) || p.op_type() == "MaxPool") break;
        path.push_back(p.input(0));
    }
    return {};
}

// The tensors that comparisons, rankings and singular ops in the main graph
// read, directly or through the ops above, in graph order of those ops; then
// the score outputs.
std::vector<FragileInput> fragile_inputs(const Model& model) {
    const auto& graph = model.graph();
    const GraphIndex index(graph);
    std::vector<FragileInput> out;
    std::set<std::string> seen;
    for (const auto& node : graph.node()) {
        auto [pending, why] = fragile_reads(node);
        const bool singular = node.op_type() == "Log" || node.op_type() == "Reciprocal";
        while (!pending.empty()) {
            const auto tensor = pending.back();
            pending.pop_back();
            if (tensor.empty() || index.initializer(tensor) || is_constant(graph, index, tensor) ||
                !seen.insert(tensor).second)
                continue;
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
            } else if (const auto sources = singular ? magnitude_sources(graph, index, p) : std::vector<std::string>{};
                       !sources.empty()) {
                pending.insert(pending.end(), sources.begin(), sources.end());
            } else if (kAffine.count(op) && p.input_size() == 2) {
                // x op constant: equal x stay equal; a sum of two computed tensors rarely ties.
                const bool first = is_constant(graph, index, p.input(0)),
                           second = is_constant(graph, index, p.input(1));
                if (first != second) pending.push_back(first ? p.input(1) : p.input(0));
            }
        }
    }
    // A score output: an 8-bit grid of step 1/255 rounds every probability
    // below 0.002 to 0, so scores that ranked clips, boxes or classes tie
    // (a wake-word model's AUC fell 3-7 points); its input, a logit, holds them on
    // a uniform grid.
    for (const auto& output : graph.output()) {
        const auto path = score_output_path(graph, index, output.name());
        if (path.empty()) continue;
        const auto& producer = graph.node(index.producer(path.back()));
        for (const auto& tensor : path)
            if (seen.insert(tensor).second)
                out.push_back({tensor, fmt::format("a score the model outputs ({}): on an 8-bit grid every "
                                                   "probability below 0.002 is 0, and scores that ranked tie",
                                                   describe_node(producer))});
    }
    return out;
}

class FragileInputs final : public Algorithm {
  public:
    AlgorithmStage stage() const override { return AlgorithmStage::Plan; }
    void run(AlgorithmContext& context) override {
        std::set<std::string> planned;
        for (const auto& t : context.draft().tensors) planned.insert(t.tensor);
        std::vector<std::string> kept;
        for (const auto& d : fragile_inputs(context.model())) {
            if (!planned.count(d.tensor)) continue;
            context.keep_float(d.tensor, d.reason);
            kept.push_back(d.tensor);
        }
        if (kept.empty()) return;
        const size_t shown = std::min<size_t>(kept.size(), 6);
        log_info(
            "{} tensors that comparisons, rankings or singular ops read are left float (float_fragile_inputs): {}{}",
            kept.size(), fmt::join(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
            shown < kept.size() ? fmt::format(" and {} more", kept.size() - shown) : "");
    }
};

}  // namespace

}  // namespace vaiq

VAIQ_PLUGINS(vaiq::enabled_by(
    vaiq::describe<vaiq::FragileInputs>("fragile_inputs", "1.0.0",
                                        "What comparisons, rankings, Log and Reciprocal read, and the scores a model "
                                        "outputs, stay float: rounding would change what they decide"),
    "float_fragile_inputs"))
