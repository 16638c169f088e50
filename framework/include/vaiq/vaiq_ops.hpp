// vaiq/vaiq_ops.hpp - vaiq's own quantization ops, as the formats that write
// them and the tools that read them (the executor, dump) name and compute them
// (docs/formats.md is their specification): VitisQuantizeLinear/
// VitisDequantizeLinear, the Q/DQ pair of VitisQuantFormat.QDQ for every quant
// type, and FixNeuron, the fused power-of-two quantize-dequantize of
// VitisQuantFormat.FixNeuron.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>

#include "vaiq/export.hpp"
#include "vaiq/model.hpp"
#include "vaiq/quant.hpp"

namespace vaiq {

inline constexpr std::string_view kVaiqDomain = "com.vaiq";
inline constexpr int64_t kVaiqDomainVersion = 1;
inline constexpr std::string_view kVitisQuantizeOp = "VitisQuantizeLinear";
inline constexpr std::string_view kVitisDequantizeOp = "VitisDequantizeLinear";
inline constexpr std::string_view kFixNeuronOp = "FixNeuron";
/// Block floating point and MX quantize-dequantize (vaiq/block_float.hpp), with
/// the attributes AMD Quark gives its ops of these names: BFPQuantizeDequantize
/// (bfp_method "to_bfp", bit_width 16, block_size, axis, rounding_mode) and
/// MXQuantizeDequantize (element_dtype, block_size, axis, rounding_mode).
inline constexpr std::string_view kBFPOp = "BFPQuantizeDequantize";
inline constexpr std::string_view kMXOp = "MXQuantizeDequantize";
/// Quark's rounding_mode 2, ties to even: what its BFP16 and MX configurations
/// use (0, ties away from zero, and 1, ties upward, are computed too).
inline constexpr int64_t kHalfToEvenRoundingMode = 2;
/// The domain other tools write FixNeuron in; vaiq reads it there too.
inline constexpr std::string_view kContribDomain = "ai.onnx.contrib";

/// Whether a node is vaiq's VitisQuantizeLinear / VitisDequantizeLinear, or a
/// FixNeuron (in vaiq's domain or the one other tools use).
VAIQ_API bool is_vitis_quantize(const onnx::NodeProto& node);
VAIQ_API bool is_vitis_dequantize(const onnx::NodeProto& node);
VAIQ_API bool is_fixneuron(const onnx::NodeProto& node);

/// What a BFPQuantizeDequantize/MXQuantizeDequantize node of vaiq's domain
/// computes; nullopt for another node. Throws InputError naming the node for
/// attributes vaiq does not compute (another method, bit width, element type or
/// rounding).
struct BlockFloatNode {
    QuantType type = QuantType::QBFP16;
    SharedExponentBlocks blocks;
};
VAIQ_API std::optional<BlockFloatNode> block_float_node(const onnx::NodeProto& node);

/// A FixNeuron's attributes: values are integers of `bit_width` bits (signed,
/// or unsigned when `is_unsigned`) times 2^-pos.
struct FixNeuronAttributes {
    int bit_width = 8;
    int pos = 0;
    bool is_unsigned = false;
};

/// Reads a FixNeuron node's attributes; `pos` may be an INT or, as other tools
/// write it, a STRING holding an integer. Throws InputError naming the node when
/// they are missing or out of range (bit_width 2..32, |pos| <= 127).
VAIQ_API FixNeuronAttributes fixneuron_attributes(const onnx::NodeProto& node);

/// What a FixNeuron computes as Q/DQ parameters: scale 2^-pos, zero point 0, in
/// the integer type that holds its values (8 bits or fewer: QInt8/QUInt8, then
/// 16, then 32 bits).
VAIQ_API QuantParams fixneuron_quant_params(const FixNeuronAttributes& attributes);

/// The integer FixNeuron stores for x: x * 2^pos rounded half to even, saturated
/// to the bit width's range.
inline int64_t fixneuron_integer(float x, const FixNeuronAttributes& a) {
    const double lo = a.is_unsigned ? 0.0 : -std::ldexp(1.0, a.bit_width - 1);
    const double hi = a.is_unsigned ? std::ldexp(1.0, a.bit_width) - 1.0 : std::ldexp(1.0, a.bit_width - 1) - 1.0;
    const double scaled = std::nearbyint(std::ldexp(static_cast<double>(x), a.pos));
    return static_cast<int64_t>(std::isnan(scaled) ? 0.0 : std::min(std::max(scaled, lo), hi));
}

/// FixNeuron's output for x: fixneuron_integer(x) * 2^-pos.
inline float fixneuron_value(float x, const FixNeuronAttributes& a) {
    return static_cast<float>(std::ldexp(static_cast<double>(fixneuron_integer(x, a)), -a.pos));
}

}  // namespace vaiq
