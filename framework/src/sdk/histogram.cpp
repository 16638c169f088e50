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
