// The calibrate and parameters phases: stream data through the float model,
// observe the planned activations, then turn ranges into scales and zero points.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "data/data_reader.hpp"
#include "pipeline/planner.hpp"
#include "vaiq/calibrator.hpp"

namespace vaiq {

struct CalibrationOutcome {
    std::map<std::string, CalibrationResult> results;  ///< by observed tensor
    std::vector<std::string> not_float;                ///< planned tensors that are not float: not quantized
    /// Planned tensors whose observed values held an infinity or NaN (an attention
    /// mask's -inf, a log of 0): no range holds them, so they stay float.
    std::vector<std::string> not_finite;
    /// Planned tensors that held no value in any batch (a decoder's empty past): no range, so they stay float.
    std::vector<std::string> empty;
    int batches = 0;
};

/// The observers of a plan's activations and what they have seen.
struct Observations {
    /// By observed tensor; each made by the tensor's planned calibrator.
    std::map<std::string, std::unique_ptr<RangeObserver>> observers;
    std::set<std::string> not_float;    ///< tapped tensors whose values are not float
    std::set<std::string> not_finite;   ///< observed tensors that held an infinity or NaN: no longer observed
    std::set<std::string> held_values;  ///< observed tensors that held a value in some batch
    int batches = 0;
};

/// Fresh observers for every activation of `plan` whose range is observed.
Observations make_observers(const DraftPlan& plan);

/// For each observed value, the planned tensor that decides how it is observed:
/// its own, or that of the tensor taking its range.
std::map<std::string, const PlannedTensor*> observing_tensors(const DraftPlan& plan);

/// The model's outputs on one batch, as calibration computed them.
using OutputSink = std::function<void(const Batch& batch, std::vector<Tensor> outputs)>;

/// Runs every batch of `data` through `model` with the planned activations
/// tapped; each observer sees each batch once and keeps only its statistics.
/// `on_batch` is called after each batch (progress), `outputs` with each
/// batch's outputs (when there is one).
void observe(Observations& into, const Model& model, const DraftPlan& plan, DataReader& data, int threads,
             const std::function<void(int)>& on_batch = {}, const OutputSink& outputs = {});

/// The observers' results, and the planned tensors that are not float.
CalibrationOutcome conclude(const DraftPlan& plan, const Observations& observations);

/// make_observers, observe and conclude.
CalibrationOutcome calibrate(const Model& model, const DraftPlan& plan, DataReader& data, int threads,
                             const std::function<void(int)>& on_batch = {});

/// Weights' parameters as compute_parameters() found them, by weight, kept for
/// its next call: a search computes a plan for every candidate, and a weight's
/// parameters depend only on its values, spec and calibrator. Whoever changes
/// the model's initializers clears it.
struct ConstantParamsCache {
    struct Entry {
        QuantSpec planned;  ///< the spec and calibrator they were computed for
        const Calibrator* calibrator = nullptr;
        QuantSpec spec;  ///< as the parameters took it (per channel only along an axis the weight has)
        QuantParams params;
    };
    std::map<std::string, Entry> weights;
};

/// Scales and zero points for the plan: weights from their data (per channel
/// where planned), activations from the calibrated ranges, shared parameters
/// copied, int32 biases at input scale x weight scale.
/// `constants`: parameters of weights from earlier calls on the same model.
QuantPlan compute_parameters(const Model& model, const DraftPlan& plan, const CalibrationOutcome& calibration,
                             std::map<std::string, TensorRange>* ranges = nullptr,
                             ConstantParamsCache* constants = nullptr);

}  // namespace vaiq
