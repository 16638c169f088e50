// qdq: writes a plan as ONNX QuantizeLinear/DequantizeLinear pairs, the layout
// ONNX Runtime fuses into integer kernels. Weights are stored quantized and
// read through a DequantizeLinear (or kept float with a Q/DQ pair when
// AddQDQPairToWeight is set); activations get a Q/DQ pair shared by their
// consumers (or one pair per consumer with DedicatedQDQPair).
#include <vaiq/vaiq.hpp>

#include <cmath>

namespace {

using vaiq::InputError;
using vaiq::QuantType;
using vaiq::TensorQuant;

bool is_16_bit(QuantType t) { return t == QuantType::QInt16 || t == QuantType::QUInt16; }

void check_params(const TensorQuant& t, int64_t opset) {
    const bool int32_bias = t.role == vaiq::TensorRole::Bias && t.params.type == QuantType::QInt32;
    if (t.params.type != QuantType::QInt8 && t.params.type != QuantType::QUInt8 && !is_16_bit(t.params.type) &&
        !int32_bias)
        throw InputError(fmt::format("format 'qdq' writes QInt8, QUInt8, QInt16 and QUInt16 (and QInt32 biases), not "
                                     "{} for tensor '{}'; use quant_format VitisQuantFormat.QDQ for other types",
                                     vaiq::quant_type_name(t.params.type), t.tensor));
    vaiq::check_quant_params(t, opset);
}

// 16-bit pairs are ONNX Runtime's com.microsoft QuantizeLinear/DequantizeLinear:
// the default domain has 16-bit types only from opset 21.
std::string domain_for(const TensorQuant& t) { return is_16_bit(t.params.type) ? "com.microsoft" : ""; }

void import_microsoft_domain(onnx::ModelProto& model) {
    for (const auto& o : model.opset_import())
        if (o.domain() == "com.microsoft") return;
    auto* o = model.add_opset_import();
    o->set_domain("com.microsoft");
    o->set_version(1);
}

// Scale and zero-point initializers: scalars per tensor, vectors per channel.
std::pair<std::string, std::string> add_params(onnx::GraphProto& graph, vaiq::UniqueNames& names, const TensorQuant& t) {
    const auto scale_name = names.fresh(t.tensor + "_scale");
    *graph.add_initializer() = vaiq::scale_tensor(t.params).to_proto(scale_name);
    const auto zp_name = names.fresh(t.tensor + "_zero_point");
    *graph.add_initializer() = vaiq::zero_point_tensor(t.params).to_proto(zp_name);
    return {scale_name, zp_name};
}

onnx::NodeProto& add_node(onnx::GraphProto& graph, vaiq::UniqueNames& names, const std::string& op,
                          const std::string& input, const std::string& scale, const std::string& zp,
                          const std::string& output, int axis, const std::string& domain) {
    auto* n = graph.add_node();
    n->set_op_type(op);
    n->set_domain(domain);
    n->set_name(names.fresh(output + "_node"));
    n->add_input(input);
    n->add_input(scale);
    n->add_input(zp);
    n->add_output(output);
    if (axis >= 0) {
        auto* a = n->add_attribute();
        a->set_name("axis");
        a->set_type(onnx::AttributeProto::INT);
        a->set_i(axis);
    }
    return *n;
}

class Qdq final : public vaiq::Format {
  public:
    void configure(const vaiq::Options& options) override {
        pair_to_weight_ = options.get_bool("AddQDQPairToWeight");
        dedicated_pair_ = options.get_bool("DedicatedQDQPair");
    }

    void emit(vaiq::Model& model, const vaiq::QuantPlan& plan) const override {
        auto& graph = model.graph();
        vaiq::UniqueNames names(graph);
        for (const auto& t : plan.tensors) {
            check_params(t, model.opset());
            if (is_16_bit(t.params.type)) import_microsoft_domain(model.proto());
            const vaiq::GraphIndex index(graph);
            if (const auto* init = index.initializer(t.tensor)) emit_weight(graph, names, index, *init, t);
            else emit_activation(graph, names, index, t);
        }
        vaiq::sort_nodes(graph);  // new nodes were appended
    }

  private:
    void emit_weight(onnx::GraphProto& graph, vaiq::UniqueNames& names, const vaiq::GraphIndex& index,
                     const onnx::TensorProto& init, const TensorQuant& t) const {
        if (index.is_graph_input(t.tensor) || index.is_graph_output(t.tensor))
            throw InputError(fmt::format("weight '{}' is also a graph input or output, so it is not a constant", t.tensor));
        const auto weight = vaiq::Tensor::from_proto(init);
        if (weight.type() != vaiq::DataType::Float)
            throw InputError(fmt::format("weight '{}' is {}, not float", t.tensor, vaiq::data_type_name(weight.type())));
        const auto [scale, zp] = add_params(graph, names, t);
        const auto dq_out = names.fresh(t.tensor + "_DequantizeLinear_Output");
        vaiq::replace_all_uses(graph, t.tensor, dq_out);
        if (pair_to_weight_ && t.role != vaiq::TensorRole::Bias) {
            const auto q_out = names.fresh(t.tensor + "_QuantizeLinear_Output");
            add_node(graph, names, "QuantizeLinear", t.tensor, scale, zp, q_out, t.params.axis, domain_for(t));
            add_node(graph, names, "DequantizeLinear", q_out, scale, zp, dq_out, t.params.axis, domain_for(t));
            return;
        }
        const auto q_name = names.fresh(t.tensor + "_quantized");
        *graph.add_initializer() = vaiq::quantize_tensor(weight, t.params, t.tensor).to_proto(q_name);
        add_node(graph, names, "DequantizeLinear", q_name, scale, zp, dq_out, t.params.axis, domain_for(t));
        vaiq::remove_unused_initializers(graph);
    }

    void emit_activation(onnx::GraphProto& graph, vaiq::UniqueNames& names, const vaiq::GraphIndex& index,
                         const TensorQuant& t) const {
        const int producer = index.producer(t.tensor);
        if (producer < 0 && !index.is_graph_input(t.tensor))
            throw InputError(fmt::format("the plan quantizes tensor '{}', which the model does not have", t.tensor));
        const auto [scale, zp] = add_params(graph, names, t);
        const int axis = t.params.axis;
        if (index.is_graph_output(t.tensor)) {
            // The output keeps its name: the float value is renamed and the DequantizeLinear writes the output.
            if (producer < 0)
                throw InputError(fmt::format("tensor '{}' is both a graph input and output; there is nothing to quantize",
                                             t.tensor));
            const auto float_name = names.fresh(t.tensor + "_QuantizeLinear_Input");
            // Only the producer changes: other readers keep reading the output's name, now the DequantizeLinear's.
            for (auto& out : *graph.mutable_node(producer)->mutable_output())
                if (out == t.tensor) out = float_name;
            const auto q_out = names.fresh(t.tensor + "_QuantizeLinear_Output");
            add_node(graph, names, "QuantizeLinear", float_name, scale, zp, q_out, axis, domain_for(t));
            add_node(graph, names, "DequantizeLinear", q_out, scale, zp, t.tensor, axis, domain_for(t));
            return;
        }
        const auto& uses = index.consumers(t.tensor);
        const bool dedicated = dedicated_pair_ && uses.size() > 1 &&
                               std::none_of(uses.begin(), uses.end(), [](const auto& u) { return u.slot < 0; });
        if (!dedicated) {
            const auto q_out = names.fresh(t.tensor + "_QuantizeLinear_Output");
            const auto dq_out = names.fresh(t.tensor + "_DequantizeLinear_Output");
            vaiq::replace_all_uses(graph, t.tensor, dq_out);
            add_node(graph, names, "QuantizeLinear", t.tensor, scale, zp, q_out, axis, domain_for(t));
            add_node(graph, names, "DequantizeLinear", q_out, scale, zp, dq_out, axis, domain_for(t));
            return;
        }
        for (const auto& use : uses) {
            const auto q_out = names.fresh(t.tensor + "_QuantizeLinear_Output");
            const auto dq_out = names.fresh(t.tensor + "_DequantizeLinear_Output");
            graph.mutable_node(use.node)->set_input(use.slot, dq_out);
            add_node(graph, names, "QuantizeLinear", t.tensor, scale, zp, q_out, axis, domain_for(t));
            add_node(graph, names, "DequantizeLinear", q_out, scale, zp, dq_out, axis, domain_for(t));
        }
    }

    bool pair_to_weight_ = false;
    bool dedicated_pair_ = false;
};

const vaiq_option_descriptor kOptions[] = {
    {"AddQDQPairToWeight", VAIQ_OPTION_BOOL, "false",
     "Keep weights float behind a QuantizeLinear/DequantizeLinear pair instead of storing them quantized."},
    {"DedicatedQDQPair", VAIQ_OPTION_BOOL, "false", "Give each consumer of an activation its own Q/DQ pair."},
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<Qdq>("qdq", "0.1.0", "QuantizeLinear/DequantizeLinear pairs (QuantFormat.QDQ)", kOptions))
