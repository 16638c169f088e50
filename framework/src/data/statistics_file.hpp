// Calibration statistics files: what `vaiq calibrate` writes and `vaiq run
// --calibration` merges, and the calibration tables other runtimes read.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <string>

#include "pipeline/calibration.hpp"

namespace vaiq {

/// What statistics belong to: the prepared model (a fingerprint of its bytes)
/// and the options of every calibrator the plan uses.
struct StatisticsIdentity {
    std::string model_fingerprint;
    std::map<std::string, nlohmann::json> calibrators;  ///< method -> its resolved options
};

/// A fingerprint of a model's serialized bytes (FNV-1a, 64 bits, hex).
std::string model_fingerprint(const Model& model);

/// The statistics file (format "vaiq-calibration-statistics", version 1) for
/// `observations` of `plan`. Throws InputError when a calibrator cannot save
/// its statistics.
nlohmann::json statistics_file(const Observations& observations, const DraftPlan& plan,
                               const StatisticsIdentity& identity);

/// Merges the statistics file `file` (read from `path`) into `into`, whose
/// observers were made for `plan`. Throws InputError, naming the file, when
/// it is not such a file or was computed for another model, plan or options.
void merge_statistics_file(Observations& into, const DraftPlan& plan, const StatisticsIdentity& identity,
                           const nlohmann::json& file, const std::filesystem::path& path);

/// The calibrated ranges as ONNX Runtime's calibration.json: {tensor: [min, max]}.
nlohmann::json ort_calibration_json(const CalibrationOutcome& outcome);

/// The calibrated ranges as the TensorRT calibration cache text ONNX Runtime
/// writes (calibration.cache): "tensor absmax" lines, sorted by name.
std::string tensorrt_calibration_cache(const CalibrationOutcome& outcome);

}  // namespace vaiq
