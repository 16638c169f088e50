// vaiq/histogram.hpp - a batch's extremes and a streaming histogram, for calibrators.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "vaiq/export.hpp"
#include "vaiq/statistics.hpp"

namespace vaiq {

/// The lowest and highest value of a batch, and whether every value is finite
/// (if not, `not_finite` is the first NaN or infinity, for the error message).
/// Vectorised, and spread over the threads (OpenMP) for big batches: what a
/// calibrator's observe() should call rather than loop itself.
struct Extremes {
    float lo, hi;
    bool finite;
    float not_finite = 0;
};
VAIQ_API Extremes extremes(std::span<const float> values);

/// Counts values in equal bins whose edges are multiples of one stride, laid
/// out symmetrically around 0 ([-t, t], `absolute` false) or over |x| ([0, t]).
/// The range is set by the first batch and grows with later ones: new bins are
/// added at the same stride, so counts already taken stay exact. When growth
/// leaves more than 4x the requested bins, adjacent pairs merge (the stride
/// doubles), so memory stays bounded however far the range grows.
class VAIQ_API Histogram {
  public:
    Histogram(int bins, bool absolute);

    /// Adds a batch. Throws InputError naming `tensor` on NaN or infinity.
    void add(std::span<const float> values, const std::string& tensor = "tensor");

    bool empty() const { return total_ == 0; }
    const std::vector<double>& counts() const { return counts_; }
    /// Edge i of the bins (0 <= i <= counts().size()).
    double edge(size_t i) const;
    double stride() const { return stride_; }
    double total() const { return total_; }
    /// Observed extremes of the values (of x, not |x|).
    float min() const { return min_; }
    float max() const { return max_; }

    /// Adds another histogram's counts (same bins and layout) as if its values
    /// had been added here. Both go onto one grid, at the coarser stride (doubled
    /// while there would be too many bins) and the wider extent: a bin that lies
    /// inside a bin of the grid moves whole (exact when the strides differ by a
    /// power of two, as they do after growth from one start); one that straddles
    /// an edge is split in proportion, so no count moves by more than one bin.
    void merge(const Histogram& other);

    /// Writes the state under keys starting with "hist_".
    void save(Statistics& out) const;
    /// A histogram of `bins` and layout `absolute` rebuilt from save()'s keys;
    /// throws InputError naming `what` for a state it could not have written.
    static Histogram restore(const Statistics& in, int bins, bool absolute, const std::string& what);

  private:
    /// Widens the bins to reach `extent`; whether they changed.
    bool grow_to(double extent);
    /// How far the bins reach from 0.
    double reach() const { return static_cast<double>(absolute_ ? counts_.size() : counts_.size() / 2) * stride_; }
    /// Adds this histogram's counts onto a grid of `stride`, `half` bins per side.
    void spread_onto(std::vector<double>& grid, double stride, int64_t half) const;

    int requested_;
    bool absolute_;
    int64_t half_ = 0;  ///< bins on each side of 0 (all bins when absolute)
    double stride_ = 0;
    std::vector<double> counts_;
    double total_ = 0;
    float min_ = 0, max_ = 0;
};

}  // namespace vaiq
