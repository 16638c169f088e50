// qdq: writes a plan as ONNX QuantizeLinear/DequantizeLinear pairs, the layout
// ONNX Runtime fuses into integer kernels. Weights are stored quantized and
// read through a DequantizeLinear (or kept float with a Q/DQ pair when
// AddQDQPairToWeight is set); activations get a Q/DQ pair shared by their
// consumers (or one pair per consumer with DedicatedQDQPair). 16-bit types use
// ONNX Runtime's com.microsoft Q/DQ (the default domain from opset 21); the float
// types QFloat16/QBFloat16 are Cast pairs, the form ONNX Runtime runs natively;
// the float8 types (QFloat8E4M3FN, QFloat8E5M2) are Q/DQ pairs with a float8
// zero point, which needs opset 19: an older model is converted to it first.
// Block float types (QBFP16, the QMX types) are a simulation in standard ops
// (vaiq/block_float.hpp) on activations, and their rounded values on weights.
// Weights planned in blocks (block_size, QInt4/QUInt4 among others) get a
// DequantizeLinear with block_size, which needs opset 21: an older model is
// converted to it first.
#include <vaiq/vaiq.hpp>

namespace {

using vaiq::InputError;
using vaiq::QuantType;
using vaiq::TensorQuant;

bool is_16_bit(QuantType t) { return t == QuantType::QInt16 || t == QuantType::QUInt16; }
bool is_cast_pair(QuantType t) { return t == QuantType::QFloat16 || t == QuantType::QBFloat16; }

// 16-bit pairs are ONNX Runtime's com.microsoft QuantizeLinear/DequantizeLinear:
// the default domain has 16-bit types only from opset 21.
std::string domain_for(const TensorQuant& t, int64_t opset) {
    return is_16_bit(t.params.type) && opset < 21 ? "com.microsoft" : "";
}

class Qdq final : public vaiq::Format, vaiq::PairEmitter {
  public:
    void configure(const vaiq::Options& options) override {
        settings_.pair_to_weight = options.get_bool("AddQDQPairToWeight");
        settings_.dedicated_pair = options.get_bool("DedicatedQDQPair");
    }

    void emit(vaiq::Model& model, const vaiq::QuantPlan& plan) const override {
        constexpr int64_t kBlockedOpset = 21;
        const bool blocked = std::any_of(plan.tensors.begin(), plan.tensors.end(),
                                         [](const TensorQuant& t) { return t.params.block_size > 0; });
        if (blocked && model.opset() < kBlockedOpset) {
            vaiq::log_info("qdq: the model is converted from opset {} to {} for DequantizeLinear's block_size",
                           model.opset(), kBlockedOpset);
            model = vaiq::convert_opset(model, kBlockedOpset);
        }
        constexpr int64_t kFloat8Opset = 19;
        const bool float8 = std::any_of(plan.tensors.begin(), plan.tensors.end(),
                                        [](const TensorQuant& t) { return vaiq::is_float8(t.params.type); });
        if (float8 && model.opset() < kFloat8Opset) {
            vaiq::log_info("qdq: the model is converted from opset {} to {} for float8 QuantizeLinear/DequantizeLinear",
                           model.opset(), kFloat8Opset);
            model = vaiq::convert_opset(model, kFloat8Opset);
        }
        const bool block_float = std::any_of(plan.tensors.begin(), plan.tensors.end(),
                                             [](const TensorQuant& t) { return vaiq::is_block_float(t.params.type); });
        if (block_float) {
            const int64_t needed = vaiq::block_float_simulation_opset(QuantType::QBFP16);  // the same for every type
            if (model.opset() < needed) {
                vaiq::log_info("qdq: the model is converted from opset {} to {} for the block float simulation",
                               model.opset(), needed);
                model = vaiq::convert_opset(model, needed);
            }
            shapes_ = vaiq::infer_shapes(model);  // the simulation is smallest where shapes are known
        }
        vaiq::PairEmitter::emit(model, plan, settings_);
        shapes_.clear();
    }

  private:
    void check(const TensorQuant& t, const vaiq::Model& model) const override {
        const auto type = t.params.type;
        const bool int32_bias = t.role == vaiq::TensorRole::Bias && type == QuantType::QInt32;
        const bool four_bit = vaiq::quant_bits(type) == 4;
        if (type != QuantType::QInt8 && type != QuantType::QUInt8 && !is_16_bit(type) && !is_cast_pair(type) &&
            !vaiq::is_float8(type) && !vaiq::is_block_float(type) && !int32_bias && !four_bit)
            throw InputError(
                fmt::format("format 'qdq' writes QInt8, QUInt8, QInt16, QUInt16, QFloat16, QBFloat16, QFloat8E4M3FN, "
                            "QFloat8E5M2, QBFP16 and the QMX types (and QInt32 biases, and QInt4/QUInt4 weights in "
                            "blocks), not {} for tensor '{}': ONNX "
                            "Runtime has no native form for it; use quant_format VitisQuantFormat.QDQ",
                            vaiq::quant_type_name(type), t.tensor));
        vaiq::check_quant_params(t, model.opset(), /*blocks=*/true);
        if (is_cast_pair(type))
            for (float s : t.params.scale)
                if (s != 1.0f)
                    throw InputError(
                        fmt::format("tensor '{}' is {} with the scale {}: a Cast pair cannot scale; use "
                                    "quant_format VitisQuantFormat.QDQ",
                                    t.tensor, vaiq::quant_type_name(type), s));
    }

    void add_pair(vaiq::Model& model, vaiq::UniqueNames& names, const TensorQuant& t, const std::string& input,
                  const std::string& output) const override {
        if (vaiq::is_block_float(t.params.type)) {
            const auto shape = shapes_.find(t.tensor);  // none: the rank too is read at run time
            vaiq::add_block_float_simulation(
                model, names, t,
                shape == shapes_.end() ? std::nullopt : std::optional<std::vector<int64_t>>(shape->second), input,
                output);
            return;
        }
        const auto q_out = names.fresh(t.tensor + "_QuantizeLinear_Output");
        if (is_cast_pair(t.params.type)) {
            add_cast(model.graph(), names, input, q_out, vaiq::storage_type(t.params.type));
            add_cast(model.graph(), names, q_out, output, vaiq::DataType::Float);
            return;
        }
        const auto params = add_params(model.graph(), names, t);
        add_qdq_node(model, names, t, "QuantizeLinear", input, params, q_out);
        add_qdq_node(model, names, t, "DequantizeLinear", q_out, params, output);
    }

    void add_stored_weight(vaiq::Model& model, vaiq::UniqueNames& names, const TensorQuant& t, const std::string& name,
                           const std::string& output) const override {
        auto& graph = model.graph();
        const auto q_name = store_quantized(graph, names, t, name);
        if (vaiq::is_block_float(t.params.type)) {  // stored already rounded, as float: read as it is
            graph.mutable_initializer(graph.initializer_size() - 1)->set_name(output);
            return;
        }
        if (is_cast_pair(t.params.type))
            add_cast(graph, names, q_name, output, vaiq::DataType::Float);
        else
            add_qdq_node(model, names, t, "DequantizeLinear", q_name, add_params(graph, names, t), output);
    }

    static void add_qdq_node(vaiq::Model& model, vaiq::UniqueNames& names, const TensorQuant& t, const std::string& op,
                             const std::string& input, const std::pair<std::string, std::string>& params,
                             const std::string& output) {
        const auto domain = domain_for(t, model.opset());
        if (!domain.empty()) vaiq::import_opset(model.proto(), domain, 1);
        // A symmetric int4 weight's zero point (0) is left out, as ONNX Runtime's quantizer writes it.
        const bool default_zero_point =
            t.params.type == QuantType::QInt4 &&
            std::all_of(t.params.zero_point.begin(), t.params.zero_point.end(), [](int64_t z) { return z == 0; });
        std::vector<std::string> inputs = {input, params.first};
        if (!default_zero_point) inputs.push_back(params.second);
        auto& n = vaiq::make_node(model.graph(), names, op, std::move(inputs), {output}, output + "_node", domain);
        if (t.params.axis >= 0) vaiq::set_attribute(n, "axis", t.params.axis);
        if (t.params.block_size > 0) vaiq::set_attribute(n, "block_size", t.params.block_size);
    }

    static void add_cast(onnx::GraphProto& graph, vaiq::UniqueNames& names, const std::string& input,
                         const std::string& output, vaiq::DataType to) {
        auto& cast = vaiq::make_node(graph, names, "Cast", {input}, {output}, output + "_node", "");
        vaiq::set_attribute(cast, "to", static_cast<int64_t>(to));
    }

    vaiq::PairEmitter::Settings settings_;
    mutable std::map<std::string, std::vector<int64_t>> shapes_;  ///< during emit(), for block float types
};

const vaiq_option_descriptor kOptions[] = {
    {"AddQDQPairToWeight", VAIQ_OPTION_BOOL, "false",
     "Keep weights float behind a QuantizeLinear/DequantizeLinear pair instead of storing them quantized."},
    {"DedicatedQDQPair", VAIQ_OPTION_BOOL, "false", "Give each consumer of an activation its own Q/DQ pair."},
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<Qdq>("qdq", "0.1.0", "QuantizeLinear/DequantizeLinear pairs (QuantFormat.QDQ)", kOptions))
