// vaiq/histogram.hpp - a streaming histogram for calibrators.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "vaiq/export.hpp"

namespace vaiq {

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

  private:
    void grow_to(double extent);

    int requested_;
    bool absolute_;
    int64_t half_ = 0;  ///< bins on each side of 0 (all bins when absolute)
    double stride_ = 0;
    std::vector<double> counts_;
    double total_ = 0;
    float min_ = 0, max_ = 0;
};

}  // namespace vaiq
