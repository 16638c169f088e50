#include "vaiq/qdq_view.hpp"

#include <fmt/format.h>

#include <cmath>
#include <map>

#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {

namespace {

// ONNX's and com.microsoft's Q/DQ (a format's own pairs are read after its to_native()).
bool is_standard_domain(const onnx::NodeProto& n) { return is_default_domain(n) || n.domain() == "com.microsoft"; }
bool is_q(const onnx::NodeProto& n) { return n.op_type() == "QuantizeLinear" && is_standard_domain(n); }
bool is_dq(const onnx::NodeProto& n) { return n.op_type() == "DequantizeLinear" && is_standard_domain(n); }

std::optional<QuantType> quant_type_of(DataType t) {
    switch (t) {
        case DataType::Int8: return QuantType::QInt8;
        case DataType::UInt8: return QuantType::QUInt8;
        case DataType::Int16: return QuantType::QInt16;
        case DataType::UInt16: return QuantType::QUInt16;
        case DataType::Int32: return QuantType::QInt32;
        case DataType::UInt32: return QuantType::QUInt32;
        case DataType::Float16: return QuantType::QFloat16;
        case DataType::BFloat16: return QuantType::QBFloat16;
        case DataType::Float8E4M3FN: return QuantType::QFloat8E4M3FN;
        case DataType::Float8E5M2: return QuantType::QFloat8E5M2;
        default: return std::nullopt;
    }
}

// The parameters of a Q or DQ node; its scale and zero point are initializers.
QuantParams params_of(const onnx::NodeProto& n, const GraphIndex& index, DataType stored) {
    auto constant = [&](int slot) -> std::optional<Tensor> {
        if (n.input_size() <= slot || n.input(slot).empty()) return std::nullopt;
        const auto* init = index.initializer(n.input(slot));
        if (!init)
            throw InputError(fmt::format("{} '{}' reads its {} from '{}', which is not an initializer", n.op_type(),
                                         n.name(), slot == 1 ? "scale" : "zero point", n.input(slot)));
        return Tensor::from_proto(*init);
    };
    QuantParams p;
    const auto scale = constant(1);
    if (!scale || scale->type() != DataType::Float)
        throw InputError(fmt::format("{} '{}' has no float scale", n.op_type(), n.name()));
    p.scale.assign(scale->data<float>().begin(), scale->data<float>().end());
    const auto zp = constant(2);
    const DataType type = zp ? zp->type() : stored;
    const auto qt = quant_type_of(type);
    if (!qt) throw InputError(fmt::format("{} '{}' quantizes to {}", n.op_type(), n.name(), data_type_name(type)));
    p.type = *qt;
    if (zp) {
        for (int64_t i = 0; i < zp->size(); ++i) {
            switch (type) {
                case DataType::Int8: p.zero_point.push_back(zp->data<int8_t>()[i]); break;
                case DataType::UInt8: p.zero_point.push_back(zp->data<uint8_t>()[i]); break;
                case DataType::Int16: p.zero_point.push_back(zp->data<int16_t>()[i]); break;
                case DataType::UInt16: p.zero_point.push_back(zp->data<uint16_t>()[i]); break;
                case DataType::Int32: p.zero_point.push_back(zp->data<int32_t>()[i]); break;
                case DataType::UInt32: p.zero_point.push_back(zp->data<uint32_t>()[i]); break;
                default: p.zero_point.push_back(0); break;  // float types: checked as 0 where written
            }
        }
    } else {
        p.zero_point.assign(p.scale.size(), 0);
    }
    if (p.scale.size() > 1) {
        p.axis = 1;
        for (const auto& a : n.attribute())
            if (a.name() == "axis") p.axis = static_cast<int>(a.i());
    }
    return p;
}

}  // namespace

QdqView read_qdq(const Model& model) {
    const auto& graph = model.graph();
    const GraphIndex index(graph);
    std::map<std::string, std::string> alias;  // DQ output -> the tensor it stands for
    QdqView view;
    auto record = [&](const std::string& tensor, QuantParams params) {
        if (view.plan.find(tensor)) return;
        TensorQuant t;
        t.tensor = tensor;
        t.params = std::move(params);
        t.spec.type = t.params.type;
        t.spec.per_channel = t.params.axis >= 0;
        view.plan.tensors.push_back(std::move(t));
    };
    for (const auto& n : graph.node()) {
        if (!is_dq(n) || n.input_size() < 2) continue;
        const auto& source = n.input(0);
        const int producer = index.producer(source);
        if (producer >= 0 && is_q(graph.node(producer))) {
            const auto& q = graph.node(producer);
            const auto params = params_of(q, index, DataType::UInt8);  // no zero point: uint8
            if (index.is_graph_output(n.output(0))) {
                // A quantized graph output keeps its name: the float tensor before Q takes it back.
                record(n.output(0), params);
                alias[q.input(0)] = n.output(0);
            } else {
                record(q.input(0), params);
                alias[n.output(0)] = q.input(0);
            }
        } else if (const auto* init = index.initializer(source)) {
            record(n.output(0), params_of(n, index, static_cast<DataType>(init->data_type())));
        }
    }
    onnx::ModelProto proto = model.proto();
    auto* g = proto.mutable_graph();
    google::protobuf::RepeatedPtrField<onnx::NodeProto> kept;
    for (const auto& n : graph.node()) {
        if (is_q(n) && index.consumers(n.output(0)).size() > 0) {
            bool all_dq = true;
            for (const auto& use : index.consumers(n.output(0))) all_dq = all_dq && is_dq(graph.node(use.node));
            if (all_dq) continue;
        }
        // A stored weight's DQ output name stands for the weight; a pair's for its source.
        if (is_dq(n) && (alias.count(n.output(0)) || view.plan.find(n.output(0)))) continue;
        auto* copy = kept.Add();
        *copy = n;
        for (auto& in : *copy->mutable_input())
            if (auto it = alias.find(in); it != alias.end()) in = it->second;
        for (auto& out : *copy->mutable_output())
            if (auto it = alias.find(out); it != alias.end()) out = it->second;
    }
    g->mutable_node()->Swap(&kept);
    view.graph = Model(std::move(proto));
    view.graph.copy_marks(model);
    return view;
}

}  // namespace vaiq
