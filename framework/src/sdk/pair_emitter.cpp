#include "vaiq/pair_emitter.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_set>

#include "vaiq/error.hpp"

namespace vaiq {

PairEmitter::~PairEmitter() = default;

void PairEmitter::emit(Model& model, const QuantPlan& plan, Settings settings) const {
    auto& graph = model.graph();
    UniqueNames names(graph);
    // One index serves every tensor: a rewrite renames the reads of its own tensor
    // and appends nodes and initializers (all the hooks may do), so another
    // tensor's producer, readers and node positions stay as indexed.
    const GraphIndex index(graph);
    std::unordered_set<std::string> done;
    for (const auto& t : plan.tensors) {
        if (!done.insert(t.tensor).second)
            throw InputError(fmt::format("the plan quantizes tensor '{}' twice", t.tensor));
        check(t, model);
        if (index.initializer(t.tensor))
            emit_weight(model, names, index, t, settings);
        else
            emit_activation(model, names, index, t, settings);
    }
    remove_unused_initializers(graph);
    sort_nodes(graph);  // new nodes were appended
}

void PairEmitter::emit_weight(Model& model, UniqueNames& names, const GraphIndex& index, const TensorQuant& t,
                              Settings settings) const {
    auto& graph = model.graph();
    if (index.is_graph_input(t.tensor) || index.is_graph_output(t.tensor))
        throw InputError(fmt::format("weight '{}' is also a graph input or output, so it is not a constant", t.tensor));
    const auto* init = index.initializer(t.tensor);
    // A float16 weight (a float16 model's) is stored quantized with float16 scales, so that it stays float16.
    const bool stored = !settings.pair_to_weight || t.role == TensorRole::Bias;
    if (init->data_type() != onnx::TensorProto::FLOAT && !(stored && init->data_type() == onnx::TensorProto::FLOAT16))
        throw InputError(fmt::format("weight '{}' is {}, not float", t.tensor,
                                     data_type_name(static_cast<DataType>(init->data_type()))));
    const auto output = names.fresh(t.tensor + "_DequantizeLinear_Output");
    replace_all_uses(graph, t.tensor, output);
    if (settings.pair_to_weight && t.role != TensorRole::Bias)
        add_pair(model, names, t, t.tensor, output);
    else
        add_stored_weight(model, names, t, t.tensor, output);
}

void PairEmitter::emit_activation(Model& model, UniqueNames& names, const GraphIndex& index, const TensorQuant& t,
                                  Settings settings) const {
    auto& graph = model.graph();
    const int producer = index.producer(t.tensor);
    if (producer < 0 && !index.is_graph_input(t.tensor))
        throw InputError(fmt::format("the plan quantizes tensor '{}', which the model does not have", t.tensor));
    if (index.is_graph_output(t.tensor)) {
        // The output keeps its name: the float value is renamed and the pair writes the output.
        if (producer < 0)
            throw InputError(
                fmt::format("tensor '{}' is both a graph input and output; there is nothing to quantize", t.tensor));
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
    // The scale in a float16 weight's own type: DequantizeLinear gives values of its scale's type.
    const bool half = std::any_of(graph.initializer().begin(), graph.initializer().end(), [&](const auto& init) {
        return init.name() == t.tensor && init.data_type() == onnx::TensorProto::FLOAT16;
    });
    const auto scale_type = half ? DataType::Float16 : DataType::Float;
    *graph.add_initializer() = convert_float_type(scale_tensor(t.params), scale_type).to_proto(scale_name);
    const auto zp_name = names.fresh(t.tensor + "_zero_point");
    *graph.add_initializer() = zero_point_tensor(t.params).to_proto(zp_name);
    return {scale_name, zp_name};
}

std::string PairEmitter::store_quantized(onnx::GraphProto& graph, UniqueNames& names, const TensorQuant& t,
                                         const std::string& name) {
    const auto& inits = graph.initializer();
    const auto init = std::find_if(inits.begin(), inits.end(), [&](const auto& i) { return i.name() == name; });
    if (init == inits.end()) throw InternalError(fmt::format("no initializer '{}' to store quantized", name));
    const auto weight = convert_float_type(Tensor::from_proto(*init), DataType::Float);
    const auto stored = names.fresh(t.tensor + "_quantized");
    *graph.add_initializer() = quantize_tensor(weight, t.params, t.tensor).to_proto(stored);
    return stored;
}

}  // namespace vaiq
