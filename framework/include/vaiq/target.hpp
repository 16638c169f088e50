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

/// The spec the recipe asks for a tensor in `role`: activation_type with
/// ActivationSymmetric, weight_type with WeightSymmetric, per_channel and
/// reduce_range, int32 symmetric biases. Targets start from it and adjust.
VAIQ_API QuantSpec spec_from_config(TensorRole role, const Options& config);

/// One device constraint after refinement or a check: on how many nodes it
/// applies, how many refinement adjusted, how many still break it.
struct ConstraintCount {
    std::string name;
    int checked = 0;
    int adjusted = 0;
    int violated = 0;
};

/// What a device supports and requires. `config` holds the recipe's resolved
/// quantize_static settings under their documented names, with extra_options
/// as "extra_options.<Key>" (e.g. config.get_bool("extra_options.ActivationSymmetric")).
class VAIQ_API Target : public Plugin {
  public:
    using Interface = Target;
    static constexpr PluginKind kKind = PluginKind::Target;

    /// Whether this node's op type is quantized on the device.
    virtual bool supports(const onnx::NodeProto& node) const = 0;
    /// The default spec for a tensor in `role` under `config`.
    virtual QuantSpec default_spec(TensorRole role, const Options& config) const = 0;
    /// Rejects settings the device cannot honour: throws InputError naming the
    /// setting and what the device needs instead. The default accepts everything.
    virtual void check(const Options& config) const;
    /// Names of pass plugins that legalise a graph for the device under `config`,
    /// run in order in the prepare phase. The default is none.
    virtual std::vector<std::string> legalization_passes(const Options& config) const;
    /// Whether the device computes `consumer` (e.g. a Relu) inside `producer`
    /// (e.g. a Conv), so the tensor between them is not quantized. `index` is
    /// over the graph being planned. The default fuses nothing.
    virtual bool fuses(const onnx::NodeProto& producer, const onnx::NodeProto& consumer, const GraphIndex& index,
                       const Options& config) const;
    /// Moves parameters in `plan` (for the prepared float `model`) until the
    /// device's constraints hold; returns a count per constraint. The default
    /// has no constraints.
    virtual std::vector<ConstraintCount> refine(const Model& model, QuantPlan& plan, const Options& config) const;
    /// Checks the constraints on the written model; `violated` counts the nodes
    /// that break each. The default has no constraints.
    virtual std::vector<ConstraintCount> verify(const Model& quantized, const Options& config) const;
};

}  // namespace vaiq
