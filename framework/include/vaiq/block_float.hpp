// vaiq/block_float.hpp - block floating point (BFP16) and OCP microscaling (MX)
// types as AMD Quark defines them (its BFPQuantizeDequantize and
// MXQuantizeDequantize): the values of a block, `size` consecutive values
// along one axis, share a power of two set by the largest of them, and each
// keeps a few bits relative to it. Values stay float: a block float tensor is
// a quantize-dequantize computed at run time, with nothing calibrated.
//
// For each block, P is the largest power of two not above the block's largest
// magnitude, and at least 2^-127 (a block of zeros or float32 subnormals takes
// 2^-127, as Quark's biased exponent 0 does). Then each value x becomes:
// - BFP16 (8-bit shared exponent, sign and 7-bit magnitude):
//     clamp(round(x / P * 64), -127, 127) / 64 * P
// - MXINT8 (E8M0 scale, int8 elements with 6 fraction bits):
//     clamp(round(x / P * 64), -128, 127) / 64 * P
// - MXFP8/6/4 (E8M0 scale, float elements of E exponent and M mantissa bits,
//   largest exponent emax):
//     S = P * 2^-emax, e = x / S, then e rounded to the element's grid (the
//     step 2^(max(floor(log2 |e|), 1 - bias) - M), bias = 2^(E-1) - 1),
//     saturated to its largest finite value, times S.
// Every rounding is to nearest; ties as the blocks' rounding_mode says (Quark's:
// 0 away from zero, 1 upward, 2 to even, the one its BFP16 and MX
// configurations use). Each step is one float32
// operation, exact but for the rounding, so the same values come out of the
// custom ops and of their simulation in standard ONNX ops (formats.md).
// Blocks holding an infinity or a NaN are not defined.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "vaiq/export.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/model.hpp"
#include "vaiq/quant.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {

/// What a block float type keeps of each value.
struct BlockFloatFormat {
    bool float_elements = false;               ///< MXFP: float elements; else BFP16/MXINT8: fixed point
    int fraction_bits = 6;                     ///< fixed point: the element's step is P * 2^-fraction_bits
    int64_t qmin = -127, qmax = 127;           ///< fixed point: the element's integer range
    int exponent_bits = 0, mantissa_bits = 0;  ///< float elements
    int emax = 0;                              ///< float elements: S = P * 2^-emax
    float max_norm = 0.0f;                     ///< float elements: the largest finite element
    /// The float8 type whose conversion rounds the elements (MXFP8), else Undefined.
    DataType float8 = DataType::Undefined;
};

/// The format of a block float type (is_block_float); throws InternalError for another.
VAIQ_API BlockFloatFormat block_float_format(QuantType type);

/// The type Quark's MX attribute element_dtype names ("int8", "fp8_e4m3", "fp8_e5m2",
/// "fp6_e3m2", "fp6_e2m3", "fp4_e2m1"); nullopt for another.
VAIQ_API std::optional<QuantType> mx_type_of_element(std::string_view element_dtype);
/// The element_dtype of an MX type ("int8", ...); empty for another type.
VAIQ_API std::string_view mx_element_name(QuantType type);

/// The axis the blocks run along in a tensor of `rank`: a vector's only axis,
/// else `axis` (negative: from the end). Throws InputError naming `tensor` when
/// the axis is outside the rank.
VAIQ_API int shared_exponent_axis(int axis, size_t rank, std::string_view tensor);

/// The largest power of two not above |a| (0 for 0), exactly.
VAIQ_API float floor_power_of_two(float a);

/// `values` (float) quantized to block float `type` and back, blocks as given:
/// what BFPQuantizeDequantize/MXQuantizeDequantize compute. A tensor of one
/// value is returned as it is (Quark leaves those alone).
VAIQ_API Tensor block_float_fake_quantize(const Tensor& values, QuantType type, const SharedExponentBlocks& blocks,
                                          std::string_view tensor = {});

/// Writes t's block float quantize-dequantize from float `input` to `output` as
/// vaiq's custom op (BFPQuantizeDequantize or MXQuantizeDequantize, vaiq_ops.hpp).
VAIQ_API void add_block_float_op(Model& model, UniqueNames& names, const TensorQuant& t, const std::string& input,
                                 const std::string& output);

/// The opset the simulation in standard ops needs: 11 (Pad, Clip and Round as written).
VAIQ_API int64_t block_float_simulation_opset(QuantType type);

/// Writes the same computation in standard ONNX ops that ONNX Runtime runs with
/// no extra library, value for value: the blocks as a Reshape (after a Pad to
/// whole blocks), their largest magnitude by ReduceMax, its power of two from
/// Log and Pow corrected by two comparisons (so exact whatever Log's last bit),
/// then the element's rounding (Round and Clip at the element's step). `shape`
/// is the tensor's as far as it is known (-1: a size known at run time;
/// nullopt: the rank too): where it gives the size along the axis, the Pad and Reshape
/// are constants, else they are computed from the tensor's shape at run time.
/// The model must have at least block_float_simulation_opset().
VAIQ_API void add_block_float_simulation(Model& model, UniqueNames& names, const TensorQuant& t,
                                         const std::optional<std::vector<int64_t>>& shape, const std::string& input,
                                         const std::string& output);

}  // namespace vaiq
