// vaiq/fold.hpp - rewrites that fold one node's constant arithmetic into
// another's weights, shared by the preparation and DPU passes.
#pragma once

#include <onnx/onnx_pb.h>

#include <optional>
#include <vector>

#include "vaiq/export.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {

/// y[c] = x[c] * scale[c] + shift[c] along the channel axis.
struct ChannelAffine {
    std::vector<float> scale;
    std::vector<float> shift;
};

/// An inference-mode BatchNormalization with constant parameters as its
/// per-channel affine map; nullopt otherwise (training outputs, non-constant
/// or non-float parameters).
VAIQ_API std::optional<ChannelAffine> batch_norm_affine(const onnx::NodeProto& bn, const GraphIndex& index);

/// A constant initializer (not a graph input) decoded, or nullopt.
VAIQ_API std::optional<Tensor> constant_tensor(const GraphIndex& index, const std::string& name);

/// The same, or the value of a Constant node (attribute value or value_float).
VAIQ_API std::optional<Tensor> constant_value(const onnx::GraphProto& graph, const GraphIndex& index,
                                              const std::string& name);

/// Folds `affine` applied to the output of node `producer` into its weights
/// and bias, when the producer is a Conv, a ConvTranspose or a Gemm with
/// constant float weights whose output only `consumer` reads. The producer
/// then writes `consumer`'s output (the caller removes the consumer). New
/// initializers take fresh names; the old ones stay for the caller to clean up.
VAIQ_API bool fold_affine_into_producer(onnx::GraphProto& graph, UniqueNames& names, const GraphIndex& index,
                                        int producer, const onnx::NodeProto& consumer, const ChannelAffine& affine);

}  // namespace vaiq
