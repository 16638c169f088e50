// The plan phase: which tensors get quantized, in which role and spec, and
// which take their parameters or range from another tensor. It follows ONNX
// Runtime's QDQ quantizer: per op type, which inputs and outputs are quantized,
// which ops pass their input's parameters through, which activations Q absorbs.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "pipeline/run_settings.hpp"
#include "pipeline/selection.hpp"
#include "vaiq/algorithm.hpp"
#include "vaiq/calibrator.hpp"
#include "vaiq/quant.hpp"
#include "vaiq/target.hpp"

namespace vaiq {

/// One tensor to quantize, before calibration.
struct PlannedTensor {
    std::string tensor;
    TensorRole role = TensorRole::Activation;
    QuantSpec spec;
    bool constant = false;                   ///< an initializer: parameters come from its data
    std::string calibrate_method;            ///< the node's calibrator plugin (integer tensors)
    const Calibrator* calibrator = nullptr;  ///< that plugin: observes activations, gives constants their parameters
    std::string share_with;                  ///< parameters are this tensor's (data-movement ops)
    std::string range_from;                  ///< the calibrated range is this tensor's (Relu/Clip input)
    std::optional<TensorRange> fixed_range;  ///< e.g. Softmax output [0, 1]
    /// Its only reader gives every value outside this interval the output of
    /// the nearest end (a HardSigmoid's input): calibration observes the values
    /// clamped to it, so far-out values (DBNet's background logits) cost no range.
    std::optional<TensorRange> saturates_outside;
    std::optional<QuantParams> given;     ///< input/output_quantization_params: used as they are
    std::string bias_input, bias_weight;  ///< bias: scale = input scale x weight scale
    std::string node;                     ///< the node that asked for it first

    /// An integer activation whose range calibration finds (possibly through range_from).
    bool observed() const {
        return calibrator != nullptr && !constant && role == TensorRole::Activation && !fixed_range && !given &&
               !spec.dynamic;
    }
};

struct DraftPlan {
    std::vector<PlannedTensor> tensors;
    std::map<std::string, size_t> index;  ///< tensor -> position in `tensors`
    /// Nodes the recipe selected whose quantization depended on something that
    /// did not hold (e.g. a Reshape whose input is not quantized), with why.
    std::vector<std::pair<std::string, std::string>> skipped;
    /// Tensors left float on purpose although a quantized node reads or writes
    /// them (what a comparison or a Log reads, a tensor whose channels differ in scale), with why.
    std::vector<std::pair<std::string, std::string>> kept_float;

    const PlannedTensor* find(const std::string& tensor) const;
    /// Activations whose range must be observed during calibration.
    std::vector<std::string> observed() const;
};

/// The calibrator plugins of a run by method (plugin name), created on first
/// use and kept for the run: the plan points into them.
class CalibratorSet {
  public:
    using Factory = std::function<std::unique_ptr<Calibrator, std::function<void(Calibrator*)>>(const std::string&)>;
    explicit CalibratorSet(Factory factory) : factory_(std::move(factory)) {}
    const Calibrator& get(const std::string& method);

  private:
    Factory factory_;
    std::map<std::string, std::unique_ptr<Calibrator, std::function<void(Calibrator*)>>> instances_;
};

/// Plans every tensor of the quantized nodes. Throws InputError for a plan the
/// settings make impossible (e.g. per-channel weights below opset 13).
DraftPlan plan_tensors(const RunSettings& settings, const Model& model, const Target& target,
                       const std::vector<NodeDecision>& decisions, CalibratorSet& calibrators);

/// Leaves `tensor` float, recording `reason` in `kept_float`: what takes its
/// parameters from it goes too, or, with `sharers_on_own_range`, stays on a
/// range of its own. A tensor the plan does not hold (any longer: what a tensor
/// left float before took with it) is only recorded.
void keep_float(DraftPlan& plan, const std::string& tensor, const std::string& reason, bool sharers_on_own_range);

/// Drops tensors (and whatever takes its parameters from them): those that
/// turned out not to be float, or that mixed precision leaves float. With
/// `ranges_observed` (after calibration) a tensor whose range comes from a
/// dropped one keeps taking it from there.
void drop_tensors(DraftPlan& plan, const std::vector<std::string>& tensors, bool ranges_observed = false);

/// The draft with `raised` tensors, and those sharing parameters with them, at
/// `precision`'s types, or left float (`keep_float`: the run's target cannot
/// run those types; a Conv/ConvTranspose/Gemm whose weight is left float then
/// has its output left float too, or ONNX Runtime would quantize the weight
/// itself). `count` gets the number of activations and weights changed.
DraftPlan raise_tensors(const Model& model, const DraftPlan& draft, const std::set<std::string>& raised,
                        const Precision& precision, size_t* count);

}  // namespace vaiq
