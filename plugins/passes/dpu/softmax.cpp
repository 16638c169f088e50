// ConvertSoftmaxToDPUVersion: the DPU computes Softmax in bfloat16 with a
// polynomial exponential. The pass spells that computation out in float ops
// with a bfloat16 rounding (Cast to bfloat16 and back) wherever the device
// rounds, so ONNX Runtime runs it on the CPU and calibration sees its values.
// Every node it builds is float-only: the device runs it outside the integer
// datapath, and nothing in it is quantized.
#include <cmath>

#include "passes.hpp"
#include "rewrite.hpp"

namespace dpu_passes {

namespace {

constexpr int64_t kFloat = onnx::TensorProto::FLOAT;
constexpr int64_t kBFloat16 = onnx::TensorProto::BFLOAT16;

// exp(r) on [0, ln 2) as the device's polynomial: 1 + r (1 + r (a2 + r a3)).
constexpr float kA3 = 0.21875f;
constexpr float kA2 = 0.486328125f;

// Builds the replacement of one Softmax, node by node.
class SoftmaxBuilder {
  public:
    SoftmaxBuilder(vaiq::Model& model, vaiq::UniqueNames& names, const onnx::NodeProto& softmax, int64_t opset)
        : model_(model),
          graph_(model.graph()),
          names_(names),
          prefix_(softmax.name().empty() ? "softmax" : softmax.name()),
          opset_(opset),
          axis_(int_attribute(softmax, "axis", -1)) {}

    void build(const std::string& input, const std::string& output) {
        // Shifting by the maximum keeps exp in (0, 1]; the result is the same softmax.
        const auto shifted = op("Sub", {input, reduce("ReduceMax", input)});
        const auto x = to_bf16(shifted);
        const auto n = op("Floor", {to_bf16(op("Mul", {x, constant("rcp_ln2", 1.0 / std::log(2.0))}))});
        const auto r = to_bf16(op("Sub", {x, to_bf16(op("Mul", {n, constant("ln2", std::log(2.0))}))}));
        auto poly = to_bf16(op("Add", {op("Mul", {r, constant("a3", kA3)}), constant("a2", kA2)}));
        poly = to_bf16(op("Add", {op("Mul", {r, poly}), constant("one", 1.0)}));
        poly = to_bf16(op("Add", {op("Mul", {r, poly}), constant("one", 1.0)}));
        const auto e = to_bf16(op("Mul", {op("Pow", {constant("two", 2.0), n}), poly}));
        const auto sum = to_bf16(reduce("ReduceSum", e));
        to_bf16(op("Div", {e, sum}), output);
    }

  private:
    std::string op(const std::string& type, std::vector<std::string> inputs, std::string output = {}) {
        if (output.empty()) output = names_.fresh(prefix_ + "/" + type + "_output");
        auto& node = vaiq::make_node(graph_, names_, type, std::move(inputs), {output}, prefix_ + "/" + type);
        node.set_doc_string("vaiq: float only");
        model_.mark(node, vaiq::kFloatOnly);
        last_ = &node;
        return output;
    }

    // Rounds to bfloat16 and back to float, as the device stores the value.
    std::string to_bf16(const std::string& value, std::string output = {}) {
        const auto narrow = op("Cast", {value});
        set_attribute(*last_, "to", kBFloat16);
        const auto wide = op("Cast", {narrow}, std::move(output));
        set_attribute(*last_, "to", kFloat);
        return wide;
    }

    // A bfloat16 constant, stored as the float it rounds to.
    std::string constant(const std::string& name, double value) {
        auto& stored = constants_[name];
        if (stored.empty()) {
            const float f = vaiq::bfloat16_to_float(vaiq::float_to_bfloat16(static_cast<float>(value)));
            stored = vaiq::add_initializer(graph_, names_, prefix_ + "/" + name,
                                           vaiq::Tensor::from_values<float>({}, {&f, 1}));
        }
        return stored;
    }

    // ReduceMax / ReduceSum over the softmax axis, keeping it.
    std::string reduce(const std::string& type, const std::string& input) {
        const bool axes_input = type == "ReduceSum" ? opset_ >= 13 : opset_ >= 18;
        if (!axes_input) {
            const auto out = op(type, {input});
            set_attribute(*last_, "axes", std::vector<int64_t>{axis_});
            return out;
        }
        const auto axes = vaiq::add_initializer(graph_, names_, prefix_ + "/axes",
                                                vaiq::Tensor::from_values<int64_t>({1}, {&axis_, 1}));
        return op(type, {input, axes});
    }

    vaiq::Model& model_;
    onnx::GraphProto& graph_;
    vaiq::UniqueNames& names_;
    std::string prefix_;
    int64_t opset_;
    int64_t axis_;
    onnx::NodeProto* last_ = nullptr;
    std::map<std::string, std::string> constants_;
};

}  // namespace

bool convert_softmax_to_dpu_version(vaiq::Model& model) {
    auto& graph = model.graph();
    const int64_t opset = model.opset();
    std::vector<int> replaced;
    for (int n = 0; n < graph.node_size(); ++n) {
        if (graph.node(n).op_type() != "Softmax" || !is_default_domain(graph.node(n))) continue;
        if (opset < 13) {
            // Before opset 13 Cast has no bfloat16 (and Softmax flattens its trailing axes).
            vaiq::log_warn(
                "convert_softmax_to_dpu_version: '{}' kept: the DPU version needs opset 13 or later "
                "(the model is opset {}; vaiq convert-opset converts it)",
                graph.node(n).name(), opset);
            continue;
        }
        replaced.push_back(n);
    }
    if (replaced.empty()) return false;
    vaiq::UniqueNames names(graph);
    for (int n : replaced) {
        const auto softmax = graph.node(n);  // a copy: building appends nodes
        SoftmaxBuilder(model, names, softmax, opset).build(softmax.input(0), softmax.output(0));
        vaiq::log_debug("Softmax '{}' replaced by the DPU's bfloat16 computation", softmax.name());
    }
    vaiq::remove_nodes(graph, replaced);
    vaiq::sort_nodes(graph);
    return true;
}

}  // namespace dpu_passes
