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
    const int64_t limit = 4 * static_cast<int64_t>(absolute_ ? requested_ : requested_ / 2);
    if (std::ceil(extent / stride_) <= static_cast<double>(half_)) return;
    // Too many bins at this stride: widen it by a power of two first, merging
    // 2^k old bins into one (0 stays on an edge), so memory stays bounded
    // however small the stride was (a constant first batch sets a tiny one).
    int64_t factor = 1;
    while (std::ceil(extent / (stride_ * static_cast<double>(factor))) > static_cast<double>(limit)) factor *= 2;
    const auto half = static_cast<int64_t>(std::ceil(extent / (stride_ * static_cast<double>(factor))));
    std::vector<double> grown(static_cast<size_t>(absolute_ ? half : 2 * half), 0.0);
    const int64_t zero = absolute_ ? 0 : half_, new_zero = absolute_ ? 0 : half;
    for (size_t i = 0; i < counts_.size(); ++i) {
        const int64_t j = static_cast<int64_t>(i) - zero;  // bin [j, j + 1) x stride
        const int64_t merged = j >= 0 ? j / factor : -((-j - 1) / factor) - 1;
        grown[static_cast<size_t>(merged + new_zero)] += counts_[i];
    }
    counts_ = std::move(grown);
    half_ = half;
    stride_ *= static_cast<double>(factor);
}

void Histogram::spread_onto(std::vector<double>& grid, double stride, int64_t half) const {
    const int64_t zero = absolute_ ? 0 : half_, grid_zero = absolute_ ? 0 : half;
    const auto last = static_cast<int64_t>(grid.size()) - 1;
    // Positions in units of the grid's stride: exact when the ratio is a power of two.
    const double ratio = stride_ / stride;
    for (size_t i = 0; i < counts_.size(); ++i) {
        if (counts_[i] == 0) continue;
        const double lo = static_cast<double>(static_cast<int64_t>(i) - zero) * ratio, hi = lo + ratio;
        for (auto j = static_cast<int64_t>(std::floor(lo)); static_cast<double>(j) < hi; ++j) {
            const double overlap = std::min(hi, static_cast<double>(j + 1)) - std::max(lo, static_cast<double>(j));
            if (overlap > 0)
                grid[static_cast<size_t>(std::clamp<int64_t>(j + grid_zero, 0, last))] += counts_[i] * overlap / ratio;
        }
    }
}

void Histogram::merge(const Histogram& other) {
    if (other.absolute_ != absolute_ || other.requested_ != requested_)
        throw InputError(fmt::format("a histogram of {} {} bins cannot take in one of {} {} bins", requested_,
                                     absolute_ ? "|x|" : "signed", other.requested_,
                                     other.absolute_ ? "|x|" : "signed"));
    if (other.empty()) return;
    if (empty()) {
        *this = other;
        return;
    }
    const int64_t limit = 4 * static_cast<int64_t>(absolute_ ? requested_ : requested_ / 2);
    const double extent = std::max(reach(), other.reach());
    double stride = std::max(stride_, other.stride_);
    // Bins needed at a stride, ignoring the rounding of the extent's product.
    auto bins_at = [&](double s) { return static_cast<int64_t>(std::ceil(extent / s * (1 - 1e-12))); };
    while (bins_at(stride) > limit) stride *= 2;
    const int64_t half = bins_at(stride);
    std::vector<double> grid(static_cast<size_t>(absolute_ ? half : 2 * half), 0.0);
    spread_onto(grid, stride, half);
    other.spread_onto(grid, stride, half);
    counts_ = std::move(grid);
    half_ = half;
    stride_ = stride;
    total_ += other.total_;
    min_ = std::min(min_, other.min_);
    max_ = std::max(max_, other.max_);
}

void Histogram::save(Statistics& out) const {
    out["hist_absolute"] = {absolute_ ? 1.0 : 0.0};
    out["hist_stride"] = {stride_};
    out["hist_counts"] = counts_;
    out["hist_min"] = {min_};
    out["hist_max"] = {max_};
}

Histogram Histogram::restore(const Statistics& in, int bins, bool absolute, const std::string& what) {
    Histogram h(bins, absolute);
    if ((statistic(in, "hist_absolute", what) != 0) != absolute)
        throw InputError(fmt::format("the histogram of {} was kept over {}, this calibrator keeps one over {}", what,
                                     absolute ? "x" : "|x|", absolute ? "|x|" : "x"));
    h.counts_ = statistic_array(in, "hist_counts", what);
    if (h.counts_.empty()) return h;  // saved before any value
    h.stride_ = statistic(in, "hist_stride", what);
    const auto n = static_cast<int64_t>(h.counts_.size());
    const int64_t limit = 4 * static_cast<int64_t>(absolute ? bins : bins / 2);
    h.half_ = absolute ? n : n / 2;
    if ((!absolute && n % 2 != 0) || h.half_ > limit || !(h.stride_ > 0) || !std::isfinite(h.stride_))
        throw InputError(fmt::format("the histogram of {} does not fit {} {} bins (stride {}, {} bins saved)", what,
                                     bins, absolute ? "|x|" : "signed", h.stride_, n));
    for (double c : h.counts_) {
        if (!(c >= 0) || !std::isfinite(c))
            throw InputError(fmt::format("the histogram of {} holds a count of {}", what, c));
        h.total_ += c;
    }
    h.min_ = static_cast<float>(statistic(in, "hist_min", what));
    h.max_ = static_cast<float>(statistic(in, "hist_max", what));
    if (h.total_ > 0 && !(h.min_ <= h.max_))
        throw InputError(fmt::format("the histogram of {} has minimum {} above maximum {}", what, h.min_, h.max_));
    return h;
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
