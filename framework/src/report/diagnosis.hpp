// Where a quantized model goes wrong, tensor by tensor on one batch: each
// tensor's SQNR for the report's page, and, when an output's SQNR is low, the
// first tensor in graph order far from the float model's value, so that the
// warning can name a place to look.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <optional>
#include <string>

#include "vaiq/model.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {

/// One tensor both models compute: its SQNR in the quantized model.
struct TensorComparison {
    const std::string& tensor;
    const std::string& node;  ///< the node producing it
    double sqnr_db;
};
/// Returns false to stop.
using ComparisonVisitor = std::function<bool(const TensorComparison&)>;
/// Sees a compared tensor's float value as the float model computes it.
using ReferenceVisitor = std::function<void(const std::string& tensor, const Tensor& value)>;

/// Visits every float tensor the two models both compute on `feeds` (only those
/// in `only` unless it is empty), in the float model's graph order. One run of
/// each model, one after the other; the float values wait in memory up to
/// `budget_bytes` and in a temporary file beyond, and `reference` sees each as
/// the float model computes it (no second read of what went to the file).
void compare_tensors(const Model& float_model, const Model& quantized, const std::map<std::string, Tensor>& feeds,
                     int threads, const std::set<std::string>& only, const ComparisonVisitor& visit,
                     const ReferenceVisitor& reference = {}, size_t budget_bytes = size_t{256} << 20);

/// The first tensor, in graph order, whose SQNR falls below a threshold (a
/// tensor whose quantized values hold NaN or infinity has an SQNR of -infinity).
struct Divergence {
    std::string tensor;
    std::string node;  ///< the node producing it
    double sqnr_db = 0;
};

}  // namespace vaiq
