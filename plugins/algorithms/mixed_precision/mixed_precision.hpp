// Automatic mixed precision: the tensors whose quantization costs the output
// most are raised (to 16 bits, or left float where the target cannot run 16
// bits), most harmful first, until the output meets a target on the
// calibration data or a budget of raised tensors is spent.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ranking.hpp"
#include "vaiq/algorithm.hpp"

namespace vaiq {

/// extra_options.AutoMixprecision; nullopt when no target is set.
struct MixedPrecisionTarget {
    std::optional<double> sqnr_db;    ///< SQNRTarget: output SQNR at least this
    std::optional<double> l2;         ///< L2Target: relative L2 error at most this
    std::optional<double> top1_drop;  ///< Top1AccTarget: top-1 agreement at least 1 - this
    int output_index = 0;
    Precision precision;  ///< what a raised tensor gets
    double max_fraction = 0.1;

    bool met_by(const OutputAgreement& e) const;
    /// Higher is better, in the measure of the first target set (top-1, SQNR, L2).
    double score(const OutputAgreement& e) const;
    /// The score at which that first target holds.
    double threshold() const;
    std::string describe() const;
};

/// An output error as the report shows it (SQNR, relative L2, top-1 agreement).
nlohmann::json error_json(const OutputAgreement& e);

/// Estimates of raisings on top of a set: the set's own estimate, and each
/// tensor's raised on top (nullopt where there is none: measure it instead).
/// They are compared with each other; the search reads each as a change from
/// `base`, so that the simulation's own error cancels.
struct Estimates {
    std::optional<OutputAgreement> base;
    std::vector<std::optional<OutputAgreement>> raised;
};

/// What raising a set of tensors gives: how many tensors that raises (a
/// tensor sharing its parameters raises the tensors it shares them with), and
/// how the model's output then agrees with the float model's on a part of the
/// calibration data (see BatchSet: no batches held out measure nothing, and
/// the choice is not confirmed).
struct Raising {
    std::function<size_t(const std::set<std::string>&)> count;
    std::function<OutputAgreement(const std::set<std::string>&, BatchSet)> measure;
    /// Optional: a cheaper estimate of measure() for each of several tensors
    /// raised on top of a set, all at once (see Estimates).
    std::function<Estimates(const std::set<std::string>& raised, const std::vector<std::string>& tensors, BatchSet)>
        screen;
    MeasuredOutput output;  ///< for the report
    /// Where the greedy search's measurements are counted ("candidate", 3 of 34); may be empty.
    std::function<void(std::string_view, int64_t, int64_t)> progress;
};

struct MixedPrecisionResult {
    std::set<std::string> raised;  ///< as given to Raising
    nlohmann::json report;
};

/// The tensors most harmful first (rank_tensors).
using Ranker = std::function<std::vector<TensorSensitivity>()>;

/// Searches the shortest prefix of `rank()`'s ranking (most harmful first) whose
/// raising meets `target` within `budget` raised tensors: doubling the prefix,
/// then bisecting (the error mostly falls as the prefix grows, so a few
/// evaluations do), each measured on the Searched batches. When no prefix
/// within the budget meets the target, a greedy search by measured gain
/// follows; the best state tried is kept and a warning says when the target
/// was missed. With batches held out, they confirm its choice (the report's
/// held_out); a choice that misses there is extended along the ranking within
/// the budget, else the run warns that it may not carry.
/// `rank` is called only when the model with nothing raised misses the target
/// on either part: an accurate recipe on a model that quantizes well costs
/// two evaluations more than a plain one.
MixedPrecisionResult search_mixed_precision(const MixedPrecisionTarget& target, const Ranker& rank,
                                            const Raising& raise, size_t budget);

}  // namespace vaiq
