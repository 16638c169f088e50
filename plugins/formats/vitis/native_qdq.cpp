#include "native_qdq.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "vaiq/block_float.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/quant.hpp"
#include "vaiq/vaiq_ops.hpp"

namespace vaiq {

namespace {

// Rewrites one model; collects what cannot be converted instead of stopping at the first.
class Converter {
  public:
    explicit Converter(Model& model) : model_(model), names_(model_.graph()), index_(model_.graph()) {}

    NativeConversion run() {
        auto& graph = model_.graph();
        const int count = graph.node_size();
        for (int i = 0; i < count; ++i) {
            auto& node = *graph.mutable_node(i);
            if (is_vitis_quantize(node) || is_vitis_dequantize(node))
                convert_vitis(node);
            else if (is_fixneuron(node))
                convert_fixneuron(i);
            else if (block_float_node(node))
                convert_block_float(i);
        }
        if (!refused_.empty())
            throw InputError(fmt::format("{} tensor{} ha{} no ONNX Runtime-native form: {}", refused_.size(),
                                         refused_.size() == 1 ? "" : "s", refused_.size() == 1 ? "s" : "ve",
                                         fmt::join(refused_, "; ")));
        // Dropped FixNeurons leave empty slots; remove them, then what nothing reads.
        auto* nodes = graph.mutable_node();
        for (int i = nodes->size() - 1; i >= 0; --i)
            if (nodes->Get(i).op_type().empty()) nodes->DeleteSubrange(i, 1);
        remove_unused_initializers(graph);
        sort_nodes(graph);
        drop_unused_domains();
        return {converted_, std::move(warnings_)};
    }

  private:
    // Only the model's own initializers are looked up; the ones added here never are.
    const onnx::TensorProto* constant(const std::string& name) const { return index_.initializer(name); }

    void refuse(std::string_view tensor, const std::string& why) {
        refused_.push_back(fmt::format("'{}' ({})", tensor, why));
    }

    void use_domain(onnx::NodeProto& node, const std::string& domain) {
        node.set_domain(domain);
        if (!domain.empty()) import_opset(model_.proto(), domain, 1);
    }

    std::string domain_for_16_bit() const { return model_.opset() >= 21 ? "" : "com.microsoft"; }

    void convert_vitis(onnx::NodeProto& node) {
        const bool quantize = is_vitis_quantize(node);
        // A pair is reported once, by its quantize (or by the stored constant a dequantize reads).
        const auto& tensor = node.input(0);
        auto refuse_once = [&](const std::string& why) {
            if (quantize || constant(tensor)) refuse(tensor, why);
        };
        const auto* zp = node.input_size() > 2 ? constant(node.input(2)) : nullptr;
        if (!zp) return refuse_once("its zero point is not a constant");
        const auto type = static_cast<DataType>(zp->data_type());
        switch (type) {
            case DataType::Int8:
            case DataType::UInt8: use_domain(node, ""); break;
            case DataType::Int32:  // ONNX dequantizes int32 (stored biases), but has no int32 QuantizeLinear
                if (quantize) return refuse_once("int32 has no native QuantizeLinear");
                use_domain(node, "");
                break;
            case DataType::Int16:
            case DataType::UInt16: use_domain(node, domain_for_16_bit()); break;
            case DataType::Float16:
            case DataType::BFloat16: {
                const auto* scale = constant(node.input(1));
                const auto zero = Tensor::from_proto(*zp).convert_float(DataType::Float);
                const auto scale_values = scale ? Tensor::from_proto(*scale) : Tensor();
                const bool unit = scale && scale_values.type() == DataType::Float &&
                                  std::ranges::all_of(scale_values.data<float>(), [](float s) { return s == 1.0f; }) &&
                                  std::ranges::all_of(zero.data<float>(), [](float z) { return z == 0.0f; });
                if (!unit) return refuse_once("a float type with a scale or zero point; a Cast cannot scale");
                node.clear_attribute();
                node.mutable_input()->DeleteSubrange(1, node.input_size() - 1);
                node.set_op_type("Cast");
                set_attribute(node, "to", static_cast<int64_t>(quantize ? type : DataType::Float));
                use_domain(node, "");
                if (quantize)
                    warnings_.push_back(
                        fmt::format("'{}': Cast turns values beyond the {} range into infinities where "
                                    "VitisQuantizeLinear saturates",
                                    tensor, data_type_name(type)));
                break;
            }
            default: return refuse_once(fmt::format("{} has no native Q/DQ", data_type_name(type)));
        }
        if (node.op_type() != "Cast") node.set_op_type(quantize ? "QuantizeLinear" : "DequantizeLinear");
        ++converted_;
    }

    void convert_fixneuron(int index) {
        auto& graph = model_.graph();
        const onnx::NodeProto node = graph.node(index);
        const auto a = fixneuron_attributes(node);
        // A signed 32-bit FixNeuron on a constant (a bias) is an int32 stored behind a DequantizeLinear.
        const bool stored_int32 = a.bit_width == 32 && !a.is_unsigned && constant(node.input(0));
        if (a.bit_width != 8 && a.bit_width != 16 && !stored_int32)
            return refuse(node.input(0), fmt::format("a {}-bit {}FixNeuron has no native Q/DQ", a.bit_width,
                                                     a.is_unsigned ? "unsigned " : ""));
        TensorQuant t;
        t.tensor = node.input(0);
        t.params = fixneuron_quant_params(a);
        const std::string domain = a.bit_width == 16 ? domain_for_16_bit() : "";
        const auto scale = names_.fresh(node.output(0) + "_scale");
        const auto zp = names_.fresh(node.output(0) + "_zero_point");
        *graph.add_initializer() = scale_tensor(t.params).to_proto(scale);
        *graph.add_initializer() = zero_point_tensor(t.params).to_proto(zp);
        std::string dq_input;
        if (const auto* weight = constant(node.input(0))) {  // store the weight quantized
            dq_input = names_.fresh(node.input(0) + "_quantized");
            const auto stored = quantize_tensor(Tensor::from_proto(*weight), t.params, t.tensor);
            *graph.add_initializer() = stored.to_proto(dq_input);
        } else {
            dq_input = names_.fresh(node.output(0) + "_QuantizeLinear_Output");
            use_domain(make_node(graph, names_, "QuantizeLinear", {node.input(0), scale, zp}, {dq_input},
                                 dq_input + "_node", ""),
                       domain);
        }
        use_domain(make_node(graph, names_, "DequantizeLinear", {dq_input, scale, zp}, {node.output(0)},
                             node.output(0) + "_node", ""),
                   domain);
        graph.mutable_node(index)->Clear();  // removed once every node has been visited
        ++converted_;
    }

    // A block float op becomes its simulation in standard ops; on a constant, the rounded values.
    void convert_block_float(int index) {
        auto& graph = model_.graph();
        const onnx::NodeProto node = graph.node(index);
        const auto bf = *block_float_node(node);
        TensorQuant t;
        t.tensor = node.input(0);
        t.params = compute_quant_params({}, QuantSpec{.type = bf.type, .shared_exponent = bf.blocks});
        if (const auto* weight = constant(node.input(0))) {
            *graph.add_initializer() =
                quantize_tensor(Tensor::from_proto(*weight), t.params, t.tensor).to_proto(node.output(0));
        } else {
            if (model_.opset() < block_float_simulation_opset(bf.type))
                return refuse(t.tensor, fmt::format("its simulation in standard ops needs opset {} (vaiq "
                                                    "convert-opset first)",
                                                    block_float_simulation_opset(bf.type)));
            if (!shapes_) shapes_ = infer_shapes(model_);
            const auto shape = shapes_->find(t.tensor);
            try {
                add_block_float_simulation(
                    model_, names_, t,
                    shape == shapes_->end() ? std::nullopt : std::optional<std::vector<int64_t>>(shape->second),
                    node.input(0), node.output(0));
            } catch (const InputError& e) {
                return refuse(t.tensor, e.what());
            }
        }
        graph.mutable_node(index)->Clear();  // removed once every node has been visited
        ++converted_;
    }

    void drop_unused_domains() {
        std::set<std::string> used;
        for (const auto& n : model_.graph().node()) used.insert(n.domain());
        auto* imports = model_.proto().mutable_opset_import();
        for (int i = imports->size() - 1; i >= 0; --i) {
            const auto& d = imports->Get(i).domain();
            if ((d == kVaiqDomain || d == kContribDomain) && !used.count(d)) imports->DeleteSubrange(i, 1);
        }
    }

    Model& model_;
    UniqueNames names_;
    const GraphIndex index_;  ///< of the model as given
    int converted_ = 0;
    std::vector<std::string> refused_;
    std::vector<std::string> warnings_;
    std::optional<std::map<std::string, std::vector<int64_t>>> shapes_;  ///< of the model as given, when needed
};

}  // namespace

NativeConversion to_native_qdq(Model& model) {
    Model given = model;  // refusals leave the caller's model as it was
    auto r = Converter(given).run();
    model = std::move(given);
    return r;
}

}  // namespace vaiq
