// vitis_qdq: writes a plan as vaiq's VitisQuantizeLinear/VitisDequantizeLinear
// pairs (VitisQuantFormat.QDQ, docs/formats.md): every quant type, 8 to 32
// bits and float16/bfloat16, per tensor or per channel; block float types
// (QBFP16, the QMX types) as vaiq's BFPQuantizeDequantize/MXQuantizeDequantize. With
// UseQDQVitisCustomOps off, int8/uint8 tensors get ONNX's own Q/DQ instead.
// Weights are stored quantized behind a VitisDequantizeLinear (or kept float
// behind a pair with AddQDQPairToWeight).
#include <vaiq/vaiq.hpp>

#include <algorithm>

#include "formats.hpp"
#include "native_qdq.hpp"
#include "vaiq/vaiq_ops.hpp"

namespace {

using vaiq::QuantType;
using vaiq::TensorQuant;

class VitisQdq final : public vaiq::Format, vaiq::PairEmitter {
  public:
    void configure(const vaiq::Options& options) override {
        settings_.pair_to_weight = options.get_bool("AddQDQPairToWeight");
        settings_.dedicated_pair = options.get_bool("DedicatedQDQPair");
        custom_ops_for_8_bit_ = options.get_bool("UseQDQVitisCustomOps");
    }

    void emit(vaiq::Model& model, const vaiq::QuantPlan& plan) const override {
        vaiq::PairEmitter::emit(model, plan, settings_);
    }

    bool wrote(const vaiq::Model& model) const override {
        const auto& nodes = model.graph().node();
        return std::any_of(nodes.begin(), nodes.end(),
                           [](const auto& n) { return vaiq::is_vitis_quantize(n) || vaiq::is_vitis_dequantize(n); });
    }
    vaiq::NativeConversion to_native(vaiq::Model& model) const override { return vaiq::to_native_qdq(model); }

  private:
    void check(const TensorQuant& t, const vaiq::Model& model) const override {
        vaiq::check_quant_params(t, model.opset());
    }

    void add_pair(vaiq::Model& model, vaiq::UniqueNames& names, const TensorQuant& t, const std::string& input,
                  const std::string& output) const override {
        if (vaiq::is_block_float(t.params.type)) return vaiq::add_block_float_op(model, names, t, input, output);
        const auto params = add_params(model.graph(), names, t);
        const auto q_out = names.fresh(t.tensor + "_QuantizeLinear_Output");
        add_qdq_node(model, names, t, true, input, params, q_out);
        add_qdq_node(model, names, t, false, q_out, params, output);
    }

    void add_stored_weight(vaiq::Model& model, vaiq::UniqueNames& names, const TensorQuant& t, const std::string& name,
                           const std::string& output) const override {
        // A block float weight stays float behind the op, as Quark writes it.
        if (vaiq::is_block_float(t.params.type)) return vaiq::add_block_float_op(model, names, t, name, output);
        auto& graph = model.graph();
        const auto q_name = store_quantized(graph, names, t, name);
        add_qdq_node(model, names, t, false, q_name, add_params(graph, names, t), output);
    }

    void add_qdq_node(vaiq::Model& model, vaiq::UniqueNames& names, const TensorQuant& t, bool quantize,
                      const std::string& input, const std::pair<std::string, std::string>& params,
                      const std::string& output) const {
        const bool is_8_bit = t.params.type == QuantType::QInt8 || t.params.type == QuantType::QUInt8;
        std::string op = quantize ? "QuantizeLinear" : "DequantizeLinear", domain;
        if (custom_ops_for_8_bit_ || !is_8_bit) {
            op = std::string(quantize ? vaiq::kVitisQuantizeOp : vaiq::kVitisDequantizeOp);
            domain = vaiq::kVaiqDomain;
            vaiq::import_opset(model.proto(), domain, vaiq::kVaiqDomainVersion);
        }
        auto& n = vaiq::make_node(model.graph(), names, op, {input, params.first, params.second}, {output},
                                  output + "_node", domain);
        if (t.params.axis >= 0) vaiq::set_attribute(n, "axis", t.params.axis);
    }

    vaiq::PairEmitter::Settings settings_;
    bool custom_ops_for_8_bit_ = true;
};

const vaiq_option_descriptor kOptions[] = {
    {"UseQDQVitisCustomOps", VAIQ_OPTION_BOOL, "true",
     "Write int8/uint8 pairs as vaiq's custom ops too (false: ONNX's QuantizeLinear/DequantizeLinear)."},
    {"AddQDQPairToWeight", VAIQ_OPTION_BOOL, "false",
     "Keep weights float behind a quantize/dequantize pair instead of storing them quantized."},
    {"DedicatedQDQPair", VAIQ_OPTION_BOOL, "false", "Give each consumer of an activation its own pair."},
};

}  // namespace

vaiq_plugin_descriptor vitis::vitis_qdq_descriptor() {
    return vaiq::describe<VitisQdq>("vitis_qdq", "0.1.0",
                                    "vaiq's VitisQuantizeLinear/VitisDequantizeLinear pairs for every quant type "
                                    "(VitisQuantFormat.QDQ)",
                                    kOptions);
}
