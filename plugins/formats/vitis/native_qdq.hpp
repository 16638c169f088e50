// to_native_qdq: a model with vaiq's own ops (what the vitis_qdq and fixneuron
// formats write) rewritten in the nearest form ONNX Runtime runs natively
// (docs/formats.md, "Converting to native QDQ"). Those formats' to_native().
#pragma once

#include <string>
#include <vector>

#include "vaiq/format.hpp"
#include "vaiq/model.hpp"

namespace vaiq {

/// Rewrites VitisQuantizeLinear/VitisDequantizeLinear as ONNX QuantizeLinear/
/// DequantizeLinear (int8/uint8, and int32 dequantization of stored biases),
/// com.microsoft Q/DQ (int16/uint16; the default domain from opset 21) or Cast
/// pairs (float16/bfloat16 with scale 1 and zero point 0), and each FixNeuron
/// of 8 or 16 bits as a Q/DQ pair with scale 2^-pos (on a constant: stored
/// quantized behind a DequantizeLinear, which also covers 32-bit biases), and
/// each BFPQuantizeDequantize/MXQuantizeDequantize as its simulation in
/// standard ops (on a constant: the rounded values, stored float).
/// Throws InputError listing every tensor that has no native form (32-bit
/// activations, uint32, other bit widths, scaled float types, parameters that
/// are not constants).
NativeConversion to_native_qdq(Model& model);

}  // namespace vaiq
