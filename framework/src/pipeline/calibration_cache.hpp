// Calibrations kept across the runs of one process: `vaiq tune` runs its
// candidates one after another, and those that observe the same tensors of the
// same prepared model on the same data with the same calibrators (per-channel
// weights, fast finetune, the accurate recipe's algorithms) calibrate once.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>

#include "report/evaluation.hpp"

namespace vaiq {

/// What a calibrate phase computed that a later run with the same key takes as is.
struct CachedCalibration {
    nlohmann::json statistics;  ///< the observers' state, as a statistics file holds it
    /// The float outputs evaluation compares against (read only once kept).
    std::shared_ptr<ReferenceOutputs> float_outputs, prepared_outputs;
    bool float_outputs_from_input = false;
    nlohmann::json preparation_error;  ///< the report's entry, or null
};

struct CalibrationCache {
    std::map<std::string, CachedCalibration> entries;  ///< by calibration_key (calibrate_phase.cpp)
    int reused = 0;                                    ///< runs that took a kept calibration
};

}  // namespace vaiq
