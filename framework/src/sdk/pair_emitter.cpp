#include "vaiq/pair_emitter.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "vaiq/error.hpp"

namespace vaiq {

PairEmitter::~PairEmitter() = default;

void set_int_attribute(onnx::NodeProto& node, const std::string& name, int64_t value) {
    auto* a = node.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(value);
}

void PairEmitter::emit(Model& model, const QuantPlan& plan, Settings settings) const {
    auto& graph = model.graph();
    UniqueNames names(graph);
    for (const auto& t : plan.tensors) {
        check(t, model);
        if (GraphIndex(graph).initializer(t.tensor)) emit_weight(model, names, t, settings);
        else emit_activation(model, names, t, settings);
    }
    remove_unused_initializers(graph);
    sort_nodes(graph);  // new nodes were appended
}

void PairEmitter::emit_weight(Model& model, UniqueNames& names, const TensorQuant& t, Settings settings) const {
    auto& graph = model.graph();
    const GraphIndex index(graph);
    if (index.is_graph_input(t.tensor) || index.is_graph_output(t.tensor))
        throw InputError(fmt::format("weight '{}' is also a graph input or output, so it is not a constant", t.tensor));
    const auto* init = index.initializer(t.tensor);
    if (init->data_type() != onnx::TensorProto::FLOAT)
        throw InputError(fmt::format("weight '{}' is {}, not float", t.tensor,
                                     data_type_name(static_cast<DataType>(init->data_type()))));
    const auto output = names.fresh(t.tensor + "_DequantizeLinear_Output");
    replace_all_uses(graph, t.tensor, output);
    if (settings.pair_to_weight && t.role != TensorRole::Bias) add_pair(model, names, t, t.tensor, output);
    else add_stored_weight(model, names, t, t.tensor, output);
}

void PairEmitter::emit_activation(Model& model, UniqueNames& names, const TensorQuant& t, Settings settings) const {
    auto& graph = model.graph();
    const GraphIndex index(graph);
    const int producer = index.producer(t.tensor);
    if (producer < 0 && !index.is_graph_input(t.tensor))
        throw InputError(fmt::format("the plan quantizes tensor '{}', which the model does not have", t.tensor));
    if (index.is_graph_output(t.tensor)) {
        // The output keeps its name: the float value is renamed and the pair writes the output.
        if (producer < 0)
            throw InputError(fmt::format("tensor '{}' is both a graph input and output; there is nothing to quantize",
                                         t.tensor));
        const auto float_name = names.fresh(t.tensor + "_QuantizeLinear_Input");
        // Only the producer changes: other readers keep reading the output's name, now the pair's.
        for (auto& out : *graph.mutable_node(producer)->mutable_output())
            if (out == t.tensor) out = float_name;
        add_pair(model, names, t, float_name, t.tensor);
        return;
    }
    const auto& uses = index.consumers(t.tensor);
    const bool dedicated = settings.dedicated_pair && uses.size() > 1 &&
                           std::none_of(uses.begin(), uses.end(), [](const auto& u) { return u.slot < 0; });
    if (!dedicated) {
        const auto output = names.fresh(t.tensor + "_DequantizeLinear_Output");
        replace_all_uses(graph, t.tensor, output);
        add_pair(model, names, t, t.tensor, output);
        return;
    }
    for (const auto& use : uses) {
        const auto output = names.fresh(t.tensor + "_DequantizeLinear_Output");
        graph.mutable_node(use.node)->set_input(use.slot, output);
        add_pair(model, names, t, t.tensor, output);
    }
}

void PairEmitter::add_stored_weight(Model& model, UniqueNames& names, const TensorQuant& t, const std::string& name,
                                    const std::string& output) const {
    add_pair(model, names, t, name, output);
}

std::pair<std::string, std::string> PairEmitter::add_params(onnx::GraphProto& graph, UniqueNames& names,
                                                            const TensorQuant& t) {
    const auto scale_name = names.fresh(t.tensor + "_scale");
    *graph.add_initializer() = scale_tensor(t.params).to_proto(scale_name);
    const auto zp_name = names.fresh(t.tensor + "_zero_point");
    *graph.add_initializer() = zero_point_tensor(t.params).to_proto(zp_name);
    return {scale_name, zp_name};
}

onnx::NodeProto& PairEmitter::add_node(onnx::GraphProto& graph, UniqueNames& names, const std::string& op,
                                       const std::string& domain, std::initializer_list<std::string> inputs,
                                       const std::string& output) {
    auto* n = graph.add_node();
    n->set_op_type(op);
    n->set_domain(domain);
    n->set_name(names.fresh(output + "_node"));
    for (const auto& in : inputs) n->add_input(in);
    n->add_output(output);
    return *n;
}

void PairEmitter::import_domain(Model& model, const std::string& domain, int64_t version) {
    for (const auto& o : model.proto().opset_import())
        if (o.domain() == domain) return;
    auto* o = model.proto().add_opset_import();
    o->set_domain(domain);
    o->set_version(version);
}

}  // namespace vaiq
