// The calibrate and parameters phases: stream data through the float model,
// observe the planned activations, then turn ranges into scales and zero points.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "pipeline/data_reader.hpp"
#include "pipeline/planner.hpp"
#include "vaiq/calibrator.hpp"

namespace vaiq {

struct CalibrationOutcome {
    std::map<std::string, CalibrationResult> results;  ///< by observed tensor
    std::vector<std::string> not_float;                ///< planned tensors that are not float: not quantized
    int batches = 0;
};

/// Runs every batch of `data` through `model` with the planned activations
/// tapped; each observer sees each batch once and keeps only its statistics.
/// Each tensor is observed by its planned calibrator. `on_batch` is called
/// after each batch (progress).
CalibrationOutcome calibrate(const Model& model, const DraftPlan& plan, DataReader& data, int threads,
                             const std::function<void(int)>& on_batch = {});

/// Scales and zero points for the plan: weights from their data (per channel
/// where planned), activations from the calibrated ranges, shared parameters
/// copied, int32 biases at input scale x weight scale.
QuantPlan compute_parameters(const Model& model, const DraftPlan& plan, const CalibrationOutcome& calibration,
                             std::map<std::string, TensorRange>* ranges = nullptr);

}  // namespace vaiq
