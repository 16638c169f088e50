// Where a quantized model goes wrong: the first tensor, in graph order, whose
// value in the quantized model is far from the float model's on one batch. Run
// when an output's SQNR is low, so that the warning can name a place to look.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <optional>
#include <string>

#include "vaiq/model.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {

/// One tensor both models compute: its SQNR in the quantized model and its
/// float value (valid during the visit).
struct TensorComparison {
    const std::string& tensor;
    const std::string& node;  ///< the node producing it
    double sqnr_db;
    const Tensor& reference;
};
/// Returns false to stop.
using ComparisonVisitor = std::function<bool(const TensorComparison&)>;

/// Visits every float tensor the two models both compute on `feeds` (only those
/// in `only` unless it is empty), in the float model's graph order. One run of
/// each model, one after the other; the float values wait in memory up to
/// `budget_bytes` and in a temporary file beyond.
void compare_tensors(const Model& float_model, const Model& quantized, const std::map<std::string, Tensor>& feeds,
                     int threads, const std::set<std::string>& only, const ComparisonVisitor& visit,
                     size_t budget_bytes = size_t{256} << 20);

struct Divergence {
    std::string tensor;
    std::string node;  ///< the node producing it
    double sqnr_db = 0;
};

/// Compares every float tensor the two models both compute (in the float
/// model's graph order) on `feeds`, and returns the first whose SQNR is below
/// `threshold_db`; nullopt when none is. A tensor whose quantized values hold
/// NaN or infinity has an SQNR of -infinity.
std::optional<Divergence> first_divergence(const Model& float_model, const Model& quantized,
                                           const std::map<std::string, Tensor>& feeds, double threshold_db, int threads,
                                           size_t budget_bytes = size_t{256} << 20);

}  // namespace vaiq
