// fixneuron: writes a plan as vaiq's FixNeuron ops (VitisQuantFormat.FixNeuron,
// docs/formats.md): one fused quantize-dequantize per tensor, with a bit width
// and a power-of-two position. Weights stay float, each read through its own
// FixNeuron. It needs power-of-two scales (calibrate_method NonOverflow or
// MinMSE) and zero points a FixNeuron can express: 0, or the middle of a
// symmetric unsigned range (uint8 128, which is int8 with the same scale).
#include <vaiq/vaiq.hpp>

#include <algorithm>
#include <cmath>

#include "formats.hpp"
#include "native_qdq.hpp"
#include "vaiq/vaiq_ops.hpp"

namespace {

using vaiq::InputError;
using vaiq::QuantType;
using vaiq::TensorQuant;

// The FixNeuron that computes exactly what t's Q/DQ pair computes.
vaiq::FixNeuronAttributes attributes_for(const TensorQuant& t) {
    const auto& p = t.params;
    if (!vaiq::is_integer(p.type))
        throw InputError(fmt::format("format 'fixneuron' writes integer types, not {} for tensor '{}'",
                                     vaiq::quant_type_name(p.type), t.tensor));
    if (p.axis >= 0 && p.scale.size() > 1)
        throw InputError(
            fmt::format("format 'fixneuron' is per tensor; tensor '{}' is quantized per channel", t.tensor));
    int exponent = 0;
    if (std::frexp(static_cast<double>(p.scale[0]), &exponent) != 0.5)
        throw InputError(
            fmt::format("format 'fixneuron' needs power-of-two scales (calibrate_method NonOverflow or "
                        "MinMSE); tensor '{}' has the scale {}",
                        t.tensor, p.scale[0]));
    vaiq::FixNeuronAttributes a;
    a.bit_width = static_cast<int>(vaiq::element_size(vaiq::storage_type(p.type)) * 8);
    a.pos = 1 - exponent;  // scale = 0.5 * 2^exponent = 2^-pos
    const bool is_signed = p.type == QuantType::QInt8 || p.type == QuantType::QInt16 || p.type == QuantType::QInt32;
    const int64_t zp = p.zero_point[0];
    const int64_t middle = int64_t{1} << (a.bit_width - 1);
    if (is_signed ? zp != 0 : (zp != 0 && zp != middle))
        throw InputError(
            fmt::format("format 'fixneuron' stores no zero point; tensor '{}' has the zero point {} (use "
                        "ActivationSymmetric/WeightSymmetric, or quant_format QDQ)",
                        t.tensor, zp));
    a.is_unsigned = !is_signed && zp == 0;
    return a;
}

class FixNeuron final : public vaiq::Format, vaiq::PairEmitter {
  public:
    void emit(vaiq::Model& model, const vaiq::QuantPlan& plan) const override {
        // Weights stay float: a FixNeuron reads them like any other tensor.
        vaiq::PairEmitter::emit(model, plan, {.pair_to_weight = true, .dedicated_pair = false});
    }

    bool wrote(const vaiq::Model& model) const override {
        const auto& nodes = model.graph().node();
        return std::any_of(nodes.begin(), nodes.end(), [](const auto& n) { return vaiq::is_fixneuron(n); });
    }
    vaiq::NativeConversion to_native(vaiq::Model& model) const override { return vaiq::to_native_qdq(model); }

  private:
    void check(const TensorQuant& t, const vaiq::Model&) const override { attributes_for(t); }

    void add_pair(vaiq::Model& model, vaiq::UniqueNames& names, const TensorQuant& t, const std::string& input,
                  const std::string& output) const override {
        const auto a = attributes_for(t);
        vaiq::import_opset(model.proto(), std::string(vaiq::kVaiqDomain), vaiq::kVaiqDomainVersion);
        auto& n = vaiq::make_node(model.graph(), names, std::string(vaiq::kFixNeuronOp), {input}, {output},
                                  output + "_node", std::string(vaiq::kVaiqDomain));
        vaiq::set_attribute(n, "bit_width", a.bit_width);
        vaiq::set_attribute(n, "pos", a.pos);
        if (a.is_unsigned) vaiq::set_attribute(n, "unsigned", 1);
    }
};

}  // namespace

vaiq_plugin_descriptor vitis::fixneuron_descriptor() {
    return vaiq::describe<FixNeuron>("fixneuron", "0.1.0",
                                     "one fused power-of-two quantize-dequantize op per tensor "
                                     "(VitisQuantFormat.FixNeuron)");
}
