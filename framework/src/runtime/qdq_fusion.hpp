// The executor's QDQ fusion: DequantizeLinear -> op -> QuantizeLinear groups run
// as the integer operators ONNX Runtime's CPU provider fuses them into, so that
// vaiq computes a QDQ model the way it is deployed (integer accumulation and
// requantization), not as float arithmetic between the Q/DQ pairs.
#pragma once

#include <onnx/onnx_pb.h>

#include <string>
#include <vector>

namespace vaiq::runtime {

/// Rewrites `model`'s main graph in place. First, as ONNX Runtime's basic
/// optimizations do, a Relu or Clip whose one reader is a QuantizeLinear that
/// clamps the same is removed, whatever precedes it. Then, as its
/// WeightBiasQuantization does, a float weight or bias of a Conv/ConvTranspose/Gemm
/// between a per-tensor DequantizeLinear input and a QuantizeLinear is quantized
/// (int8 weight, int32 bias). Fused, as ONNX Runtime does on x86
/// (uint8 activations only: it does not fuse int8 activations there):
///  - Conv (with a Relu/Clip the Q makes redundant) -> QLinearConv,
///  - MatMul -> QLinearMatMul, Gemm -> com.microsoft QGemm,
///  - Add, Mul -> com.microsoft QLinearAdd, QLinearMul,
///  - Concat -> com.microsoft QLinearConcat,
///  - AveragePool, GlobalAveragePool, LeakyRelu, Sigmoid, Softmax -> their com.microsoft QLinear forms;
/// and beyond its rules, where that provably computes the same values as its float ops:
///  - a Conv whose scales are all powers of two (int8 bias, any Relu/Clip) -> QLinearConv
///    with an int32 bias and the activation as bounds of its output's integers,
///  - an Add of two power-of-two inputs (any Relu/Clip) -> vaiq.internal PowerOfTwoQLinearAdd,
///  - what is left of float elementwise ops between one DequantizeLinear and a
///    QuantizeLinear -> vaiq.internal LookupTable (lookup_fusion.hpp).
/// Float MatMuls left between DequantizeLinear inputs are marked to sum in ONNX
/// Runtime's order. Returns whether anything changed; `gone` receives the tensors
/// that no longer exist (the op's float output, a folded
/// activation's output); every other tensor keeps its name and value.
bool fuse_qdq(onnx::ModelProto& model, std::vector<std::string>& gone);

/// Set by fuse_qdq on the power-of-two QLinearConv and PowerOfTwoQLinearAdd it makes
/// with a Relu/Clip the QuantizeLinear does not make redundant: the bounds of the
/// output's integers.
inline constexpr const char* kOutputMinAttribute = "vaiq_output_min";
inline constexpr const char* kOutputMaxAttribute = "vaiq_output_max";

/// Set by fuse_qdq on a float MatMul left between DequantizeLinear inputs: sum in
/// ONNX Runtime's order (see kernels/ort_float.hpp).
inline constexpr const char* kOrtOrderAttribute = "vaiq_ort_order";

}  // namespace vaiq::runtime
