// The executor's lookup fusion: what an 8-bit QuantizeLinear writes is, when its
// input is computed elementwise from one 8-bit DequantizeLinear and constants,
// a function of that DequantizeLinear's integer alone, so its 256 values can be
// computed once and looked up (a HardSwish spelled out as x * HardSigmoid(x)
// between a DequantizeLinear and a QuantizeLinear, which no QLinear operator
// covers, costs four float passes a run otherwise).
#pragma once

#include <onnx/onnx_pb.h>

#include <string>
#include <vector>

namespace vaiq::runtime {

/// Rewrites `model`'s main graph in place: a QuantizeLinear to uint8/int8 with
/// constant per-tensor parameters, whose input is computed from one such
/// DequantizeLinear of a uint8/int8 tensor through float elementwise ops alone
/// (kLookupOps in the source; their other operands one-element constants; their
/// outputs read by nothing else), becomes a vaiq.internal LookupTable of the
/// DequantizeLinear's input. A BatchNormalization among the ops (inference,
/// its parameters constants or DequantizeLinears of stored values: DenseNet's
/// normalization after each Concat) makes the values depend on the channel too:
/// a vaiq.internal ChannelLookupTable then holds a table per channel (axis 1).
/// Its table holds what the executor's own kernels
/// compute for the group on each of the 256 integers, so every value is the
/// one running the group would give. Returns whether anything changed; `gone`
/// receives the group's float tensors. Run after fuse_qdq's other fusions: the
/// groups ONNX Runtime turns into QLinear operators compute differently.
bool fuse_lookup_tables(onnx::ModelProto& model, std::vector<std::string>& gone);

/// Then, on the integers: a com.microsoft QLinearMul whose data inputs are one
/// 8-bit tensor, LookupTables of it that nothing else reads, or constant single
/// values (a HardSwish as x * table(x), a product by a constant), and a
/// LookupTable of such a LookupTable, become one LookupTable of that tensor, its
/// table computed by running them on the 256 integers; repeated while anything
/// folds. QLinearMul computes the same whatever its operands' shapes, which is
/// what makes its table exact (QLinearAdd folds a single value differently from a
/// tensor: it stays). Returns whether anything changed; `gone` receives the
/// folded tables' outputs.
bool fold_into_tables(onnx::ModelProto& model, std::vector<std::string>& gone);

}  // namespace vaiq::runtime
