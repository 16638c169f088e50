#include "vaiq/vaiq_ops.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "vaiq/block_float.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"

namespace vaiq {

bool is_vitis_quantize(const onnx::NodeProto& node) {
    return node.op_type() == kVitisQuantizeOp && node.domain() == kVaiqDomain;
}

bool is_vitis_dequantize(const onnx::NodeProto& node) {
    return node.op_type() == kVitisDequantizeOp && node.domain() == kVaiqDomain;
}

bool is_fixneuron(const onnx::NodeProto& node) {
    return node.op_type() == kFixNeuronOp && (node.domain() == kVaiqDomain || node.domain() == kContribDomain);
}

std::optional<BlockFloatNode> block_float_node(const onnx::NodeProto& node) {
    const bool bfp = node.op_type() == kBFPOp, mx = node.op_type() == kMXOp;
    if ((!bfp && !mx) || node.domain() != kVaiqDomain) return std::nullopt;
    auto fail = [&](const std::string& why) {
        throw InputError(fmt::format("{} node '{}': {}", node.op_type(), node.name(), why));
    };
    auto text = [&](std::string_view name, std::string_view fallback) {
        const auto* a = find_attribute(node, name);
        return a ? a->s() : std::string(fallback);
    };
    BlockFloatNode out;
    if (bfp) {
        if (const auto method = text("bfp_method", "to_bfp"); method != "to_bfp")
            fail(fmt::format("bfp_method '{}' is not computed (vaiq computes 'to_bfp')", method));
        if (const auto bits = int_attribute(node, "bit_width", 16); bits != 16)
            fail(fmt::format("bit_width {} is not computed (vaiq computes BFP16: bit_width 16)", bits));
    } else {
        const auto element = text("element_dtype", "int8");
        const auto type = mx_type_of_element(element);
        if (!type)
            fail(
                fmt::format("element_dtype '{}' is not one of int8, fp8_e4m3, fp8_e5m2, fp6_e3m2, "
                            "fp6_e2m3, fp4_e2m1",
                            element));
        out.type = *type;
    }
    const auto mode = int_attribute(node, "rounding_mode", bfp ? 0 : kHalfToEvenRoundingMode);
    if (mode < 0 || mode > 2)
        fail(fmt::format("rounding_mode {} is not 0 (half away from zero), 1 (half upward) or 2 (half to even)", mode));
    out.blocks.rounding_mode = static_cast<int>(mode);
    out.blocks.axis = static_cast<int>(int_attribute(node, "axis", 1));
    out.blocks.size = int_attribute(node, "block_size", bfp ? 8 : 32);
    if (out.blocks.size < 1) fail(fmt::format("block_size {} is not a block size", out.blocks.size));
    return out;
}

QuantParams fixneuron_quant_params(const FixNeuronAttributes& a) {
    QuantParams p;
    if (a.bit_width <= 8)
        p.type = a.is_unsigned ? QuantType::QUInt8 : QuantType::QInt8;
    else if (a.bit_width <= 16)
        p.type = a.is_unsigned ? QuantType::QUInt16 : QuantType::QInt16;
    else
        p.type = a.is_unsigned ? QuantType::QUInt32 : QuantType::QInt32;
    p.scale = {static_cast<float>(std::ldexp(1.0, -a.pos))};
    p.zero_point = {0};
    return p;
}

FixNeuronAttributes fixneuron_attributes(const onnx::NodeProto& node) {
    auto fail = [&](const std::string& why) {
        throw InputError(fmt::format("FixNeuron node '{}': {}", node.name(), why));
    };
    FixNeuronAttributes a;
    bool has_bits = false, has_pos = false;
    for (const auto& attr : node.attribute()) {
        if (attr.name() == "bit_width") {
            if (attr.type() != onnx::AttributeProto::INT) fail("bit_width must be an INT attribute");
            a.bit_width = static_cast<int>(std::clamp<int64_t>(attr.i(), -1, 64));
            has_bits = true;
        } else if (attr.name() == "pos") {
            int64_t pos = 0;
            if (attr.type() == onnx::AttributeProto::INT) {
                pos = attr.i();
            } else if (attr.type() == onnx::AttributeProto::STRING) {
                const auto& s = attr.s();
                const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), pos);
                if (ec != std::errc() || end != s.data() + s.size()) fail(fmt::format("pos '{}' is not an integer", s));
            } else {
                fail("pos must be an INT (or a STRING holding one)");
            }
            if (pos < -127 || pos > 127) fail(fmt::format("pos {} is outside [-127, 127]", pos));
            a.pos = static_cast<int>(pos);
            has_pos = true;
        } else if (attr.name() == "unsigned") {
            if (attr.type() != onnx::AttributeProto::INT) fail("unsigned must be an INT attribute");
            a.is_unsigned = attr.i() != 0;
        }
    }
    if (!has_bits || !has_pos) fail("needs the attributes bit_width and pos");
    if (a.bit_width < 2 || a.bit_width > 32) fail(fmt::format("bit_width {} is outside [2, 32]", a.bit_width));
    return a;
}

}  // namespace vaiq
