#include "vaiq/histogram.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "vaiq/error.hpp"

namespace vaiq {

Histogram::Histogram(int bins, bool absolute) : requested_(bins), absolute_(absolute) {
    if (bins < 2 || (!absolute && bins % 2 != 0))
        throw InputError(fmt::format("a histogram needs at least 2 bins (an even number when signed), not {}", bins));
}

double Histogram::edge(size_t i) const {
    return (static_cast<double>(i) - static_cast<double>(absolute_ ? 0 : half_)) * stride_;
}

void Histogram::grow_to(double extent) {
    const int64_t initial_half = absolute_ ? requested_ : requested_ / 2;
    int64_t half = static_cast<int64_t>(std::ceil(extent / stride_));
    if (half <= half_) return;
    // New bins at the old stride on the outside (both sides when signed).
    const int64_t extra = half - half_;
    std::vector<double> grown(static_cast<size_t>(absolute_ ? half : 2 * half), 0.0);
    std::copy(counts_.begin(), counts_.end(), grown.begin() + (absolute_ ? 0 : extra));
    counts_ = std::move(grown);
    half_ = half;
    // Too many bins: merge pairs, keeping 0 on an edge.
    while (half_ > 4 * initial_half) {
        if (half_ % 2 != 0) {
            std::vector<double> padded(static_cast<size_t>(absolute_ ? half_ + 1 : 2 * (half_ + 1)), 0.0);
            std::copy(counts_.begin(), counts_.end(), padded.begin() + (absolute_ ? 0 : 1));
            counts_ = std::move(padded);
            ++half_;
        }
        std::vector<double> merged(counts_.size() / 2);
        for (size_t i = 0; i < merged.size(); ++i) merged[i] = counts_[2 * i] + counts_[2 * i + 1];
        counts_ = std::move(merged);
        half_ /= 2;
        stride_ *= 2;
    }
}

void Histogram::add(std::span<const float> values, const std::string& tensor) {
    if (values.empty()) return;
    float lo = std::numeric_limits<float>::infinity(), hi = -std::numeric_limits<float>::infinity();
    for (float v : values) {
        if (!std::isfinite(v))
            throw InputError(fmt::format("tensor '{}' holds {} during calibration; its range is undefined", tensor, v));
        lo = std::min(lo, v);
        hi = std::max(hi, v);
    }
    const double extent = std::max(std::abs(static_cast<double>(lo)), std::abs(static_cast<double>(hi)));
    if (total_ == 0) {
        min_ = lo;
        max_ = hi;
        half_ = absolute_ ? requested_ : requested_ / 2;
        // A constant-zero first batch still needs a positive stride.
        stride_ = (extent > 0 ? extent : 1e-6) / static_cast<double>(half_);
        counts_.assign(static_cast<size_t>(absolute_ ? half_ : 2 * half_), 0.0);
    } else {
        min_ = std::min(min_, lo);
        max_ = std::max(max_, hi);
        grow_to(extent);
    }
    const double offset = absolute_ ? 0.0 : static_cast<double>(half_) * stride_;
    const auto last = static_cast<int64_t>(counts_.size()) - 1;
    for (float v : values) {
        const double x = absolute_ ? std::abs(static_cast<double>(v)) : static_cast<double>(v);
        const auto bin = static_cast<int64_t>(std::floor((x + offset) / stride_));
        counts_[static_cast<size_t>(std::clamp<int64_t>(bin, 0, last))] += 1.0;
    }
    total_ += static_cast<double>(values.size());
}

}  // namespace vaiq
