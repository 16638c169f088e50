// Which quantized tensors cost a model its accuracy: each tensor of the plan
// quantized alone, the model's output measured against its float run. Mixed
// precision raises tensors in this order; the sensitivity algorithm reports it.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "vaiq/algorithm.hpp"

namespace vaiq {

/// One quantized tensor's cost to the model's output.
struct TensorSensitivity {
    std::string tensor;
    TensorRole role = TensorRole::Activation;
    QuantType type = QuantType::QInt8;
    /// The tensor against itself after quantize-dequantize (its own rounding and
    /// clipping); nullopt when it has no signal (all zeros).
    std::optional<double> tensor_sqnr_db;
    /// The model output with only this tensor quantized; nullopt for biases
    /// (int32: not measured) and for tensors left unmeasured.
    std::optional<double> output_sqnr_db;
    /// Its channels differ in scale but share one grid (a head's scores beside
    /// its offsets; AlgorithmContext::mark_mixed_scales): the output's meaning
    /// can suffer more than its SQNR says.
    bool mixed_scales = false;
};

/// What the automatic sensitivity_tensors lets the analysis measure: about this
/// many activation values (the plan's activations on the batches measured)
/// times the tensors measured. PP-OCRv4's recognizer (460 tensors, 3 M values a
/// line, 4 lines) stays far below; IMG.LY's ISNet at 1024x1024 measures 59 of 471.
inline constexpr double kSensitivityBudgetValues = 5e10;

struct RankingOptions {
    int output_index = kEveryOutput;
    size_t batches = 4;  ///< the first calibration batches measured (0: all)
    /// 0 measures every tensor; N > 0 only the N whose own error (SQNR after
    /// quantize-dequantize) is largest, the others listed after them by that
    /// error, without an output SQNR; -1 picks N from kSensitivityBudgetValues
    /// (every tensor unless that costs more).
    int64_t max_tensors = -1;
};

/// Every tensor of the context's plan, most harmful first: ascending output
/// SQNR with the tensor alone quantized (fitted weights as they will be
/// written). The float model's run forks where each tensor is computed and
/// runs only what follows, measured against that run's own outputs; a tensor it
/// cannot fork at is measured on the model written with it alone.
std::vector<TensorSensitivity> rank_tensors(AlgorithmContext& context, const RankingOptions& options);

/// The ranking as the report holds it.
nlohmann::json ranking_json(const std::vector<TensorSensitivity>& tensors);

}  // namespace vaiq
