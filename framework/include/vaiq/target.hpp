// vaiq/target.hpp - the target (device) plugin interface.
#pragma once

#include <onnx/onnx_pb.h>

#include <string>
#include <vector>

#include "vaiq/graph.hpp"
#include "vaiq/model.hpp"
#include "vaiq/options.hpp"
#include "vaiq/plugin.hpp"
#include "vaiq/quant.hpp"

namespace vaiq {

/// What the recipe asks of the quantized tensors of one node (its settings
/// after overrides), or of the whole run: the documented quantize_static
/// settings a target decides specs by, typed.
struct QuantRequest {
    QuantType activation_type = QuantType::QUInt8;  ///< activation_type
    QuantType weight_type = QuantType::QInt8;       ///< weight_type
    bool activation_symmetric = false;              ///< extra_options.ActivationSymmetric
    bool weight_symmetric = true;                   ///< extra_options.WeightSymmetric
    bool per_channel = false;                       ///< per_channel
    bool reduce_range = false;                      ///< reduce_range
    int64_t block_size = 0;                         ///< block_size: weights in blocks (0: per tensor or channel)
    bool quantize_bias = true;                      ///< extra_options.QuantizeBias
    bool int16_scale = false;                       ///< extra_options.Int16Scale
    bool power_of_two = false;                      ///< the node's calibrator gives power-of-two scales
    SharedExponentBlocks bfp_blocks{1, 8};          ///< extra_options.BFPAttributes: QBFP16's blocks
    SharedExponentBlocks mx_blocks{1, 32};          ///< extra_options.MXAttributes: the MX types' blocks
};

/// The spec `request` asks for a tensor in `role`: activation_type with
/// activation_symmetric, weight_type with weight_symmetric, per_channel,
/// reduce_range and block_size, int32 symmetric biases (a float bias for float weights).
/// Targets start from it and adjust.
VAIQ_API QuantSpec spec_from_request(TensorRole role, const QuantRequest& request);

/// One device constraint after refinement or a check: on how many nodes it
/// applies, how many refinement adjusted, how many still break it.
struct ConstraintCount {
    std::string name;
    int checked = 0;
    int adjusted = 0;
    int violated = 0;
};

/// What a device supports and requires. Its methods see the recipe's
/// documented settings as a QuantRequest; options of its own (a device's
/// extra_options among them) it declares in its option table and reads in
/// configure().
class VAIQ_API Target : public Plugin {
  public:
    using Interface = Target;
    static constexpr PluginKind kKind = PluginKind::Target;

    /// Whether this node's op type is quantized on the device.
    virtual bool supports(const onnx::NodeProto& node) const = 0;
    /// The default spec for a tensor in `role` of a node the recipe asks `request` of.
    virtual QuantSpec default_spec(TensorRole role, const QuantRequest& request) const = 0;
    /// Rejects settings of the run the device cannot honour: throws InputError
    /// naming the setting and what the device needs instead. The default
    /// accepts everything.
    virtual void check(const QuantRequest& run) const;
    /// Names of pass plugins that legalise a graph for the device, run in
    /// order in the prepare phase. The default is none.
    virtual std::vector<std::string> legalization_passes(const QuantRequest& run) const;
    /// Whether the device computes `consumer` (e.g. a Relu) inside `producer`
    /// (e.g. a Conv), so the tensor between them is not quantized. `index` is
    /// over the model being planned (with its node marks). The default fuses
    /// nothing.
    virtual bool fuses(const onnx::NodeProto& producer, const onnx::NodeProto& consumer, const GraphIndex& index,
                       const QuantRequest& run) const;
    /// Moves parameters in `plan` (for the prepared float `model`) until the
    /// device's constraints hold; returns a count per constraint. The default
    /// has no constraints.
    virtual std::vector<ConstraintCount> refine(const Model& model, QuantPlan& plan, const QuantRequest& run) const;
    /// Checks the constraints on the written model; `violated` counts the nodes
    /// that break each. The default has no constraints.
    virtual std::vector<ConstraintCount> verify(const Model& quantized, const QuantRequest& run) const;
};

}  // namespace vaiq
