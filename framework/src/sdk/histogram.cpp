#include "vaiq/histogram.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "sdk/vector_intrinsics.hpp"
#include "vaiq/error.hpp"

namespace vaiq {

Histogram::Histogram(int bins, bool absolute) : requested_(bins), absolute_(absolute) {
    if (bins < 2 || (!absolute && bins % 2 != 0))
        throw InputError(fmt::format("a histogram needs at least 2 bins (an even number when signed), not {}", bins));
}

double Histogram::edge(size_t i) const {
    return (static_cast<double>(i) - static_cast<double>(absolute_ ? 0 : half_)) * stride_;
}

bool Histogram::grow_to(double extent) {
    const int64_t limit = 4 * static_cast<int64_t>(absolute_ ? requested_ : requested_ / 2);
    if (std::ceil(extent / stride_) <= static_cast<double>(half_)) return false;
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
    return true;
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

namespace {

// extremes() of one piece, in one pass the compiler vectorises: independent
// lanes, comparisons without std::min's NaN ordering, the exponent bits for
// the finiteness test.
Extremes extremes_of_piece(std::span<const float> values) {
    constexpr size_t kLanes = 16;
    float lo[kLanes], hi[kLanes];
    uint32_t special[kLanes] = {};
    std::fill(std::begin(lo), std::end(lo), std::numeric_limits<float>::infinity());
    std::fill(std::begin(hi), std::end(hi), -std::numeric_limits<float>::infinity());
    const size_t whole = values.size() / kLanes * kLanes;
    const float* p = values.data();
    for (size_t i = 0; i < whole; i += kLanes)
        for (size_t l = 0; l < kLanes; ++l) {
            const float v = p[i + l];
            uint32_t bits;
            std::memcpy(&bits, &v, sizeof bits);
            special[l] |= (bits & 0x7f800000u) == 0x7f800000u;  // infinity or NaN
            lo[l] = v < lo[l] ? v : lo[l];
            hi[l] = v > hi[l] ? v : hi[l];
        }
    Extremes out{std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), true};
    for (size_t i = whole; i < values.size(); ++i) {
        out.finite = out.finite && std::isfinite(p[i]);
        out.lo = p[i] < out.lo ? p[i] : out.lo;
        out.hi = p[i] > out.hi ? p[i] : out.hi;
    }
    for (size_t l = 0; l < kLanes; ++l) {
        out.finite = out.finite && special[l] == 0;
        out.lo = std::min(out.lo, lo[l]);
        out.hi = std::max(out.hi, hi[l]);
    }
    return out;
}

// The same, sixteen lanes wide: NaN found by an unordered compare, infinity
// by the extremes it leaves.
[[gnu::target("avx512f")]] Extremes extremes_of_piece_avx512(std::span<const float> values) {
    __m512 lo = _mm512_set1_ps(std::numeric_limits<float>::infinity()),
           hi = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    __mmask16 nan = 0;
    const float* p = values.data();
    size_t i = 0;
    for (; i + 16 <= values.size(); i += 16) {
        const __m512 v = _mm512_loadu_ps(p + i);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        lo = _mm512_min_ps(lo, v);
        hi = _mm512_max_ps(hi, v);
    }
    Extremes out = extremes_of_piece(values.subspan(i));
    out.lo = std::min(out.lo, _mm512_reduce_min_ps(lo));
    out.hi = std::max(out.hi, _mm512_reduce_max_ps(hi));
    out.finite = out.finite && nan == 0 && std::isfinite(out.lo) && std::isfinite(out.hi);
    return out;
}

// Eight lanes wide, for CPUs with AVX2 but not AVX-512.
[[gnu::target("avx2")]] Extremes extremes_of_piece_avx2(std::span<const float> values) {
    __m256 lo = _mm256_set1_ps(std::numeric_limits<float>::infinity()),
           hi = _mm256_set1_ps(-std::numeric_limits<float>::infinity()), nan = _mm256_setzero_ps();
    const float* p = values.data();
    size_t i = 0;
    for (; i + 8 <= values.size(); i += 8) {
        const __m256 v = _mm256_loadu_ps(p + i);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        lo = _mm256_min_ps(lo, v);
        hi = _mm256_max_ps(hi, v);
    }
    alignas(32) float los[8], his[8];
    _mm256_store_ps(los, lo);
    _mm256_store_ps(his, hi);
    Extremes out = extremes_of_piece(values.subspan(i));
    for (int l = 0; l < 8; ++l) {
        out.lo = std::min(out.lo, los[l]);
        out.hi = std::max(out.hi, his[l]);
    }
    out.finite = out.finite && _mm256_movemask_ps(nan) == 0 && std::isfinite(out.lo) && std::isfinite(out.hi);
    return out;
}

Extremes extremes_of_any_piece(std::span<const float> values) {
    static const bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2");
    return avx512 ? extremes_of_piece_avx512(values)
           : avx2 ? extremes_of_piece_avx2(values)
                  : extremes_of_piece(values);
}

// Threads for a pass over n values: one per 2^16 values, at most OpenMP's count.
size_t threads_for(size_t n) {
    return std::max<size_t>(1, std::min(static_cast<size_t>(std::max(1, omp_get_max_threads())), n >> 16));
}

// Bin of each value: floor(x * (1 / stride)) bins from the zero bin (of |x|
// when absolute), clamped to the histogram; NaN to the lowest (a batch holding
// one is refused after its pass). In float, sixteen values an AVX-512 step:
// 0 and every multiple of a power-of-two stride still land exactly on their
// edge. Only strides whose inverse a float cannot hold (tensors of subnormal
// values) are binned in double.
struct Binning {
    double inverse_stride;
    int32_t zero, last;
    bool absolute;
    bool zeros_likely = false;  ///< 0 is an extreme so far (clamped there, as by a Relu)
    bool in_float() const { return inverse_stride >= 0x1p-100 && inverse_stride <= 0x1p100; }
};

template <typename Real>
int32_t bin_of(float x, Real inverse, const Binning& b) {
    const auto limit = static_cast<Real>(b.last) + 1;  // keeps the conversion in int32
    Real y = static_cast<Real>(x) * inverse;
    y = b.absolute ? std::abs(y) : y;
    y = y >= -limit ? (y <= limit ? y : limit) : -limit;  // NaN to -limit
    auto t = static_cast<int32_t>(y);                     // towards zero; one less below zero is floor
    t -= static_cast<int32_t>(y < static_cast<Real>(t));
    return std::clamp(t + b.zero, int32_t{0}, b.last);
}

void bins_of_portable(const float* values, size_t n, const Binning& b, int32_t* bins) {
    if (b.in_float()) {
        const auto inverse = static_cast<float>(b.inverse_stride);
        for (size_t i = 0; i < n; ++i) bins[i] = bin_of(values[i], inverse, b);
    } else {
        for (size_t i = 0; i < n; ++i) bins[i] = bin_of(values[i], b.inverse_stride, b);
    }
}

// The same arithmetic eight values at a time, where the CPU has AVX2.
[[gnu::target("avx2")]] void bins_of_avx2(const float* values, size_t n, const Binning& b, int32_t* bins) {
    const float limit = static_cast<float>(b.last) + 1.0f;
    const __m256 inverse = _mm256_set1_ps(static_cast<float>(b.inverse_stride)), high = _mm256_set1_ps(limit),
                 low = _mm256_set1_ps(-limit), sign = _mm256_set1_ps(-0.0f);
    const __m256i zero = _mm256_set1_epi32(b.zero), last = _mm256_set1_epi32(b.last), none = _mm256_setzero_si256();
    size_t i = 0;
    for (; b.in_float() && i + 8 <= n; i += 8) {
        __m256 y = _mm256_mul_ps(_mm256_loadu_ps(values + i), inverse);
        if (b.absolute) y = _mm256_andnot_ps(sign, y);
        // max(NaN, low) is low, as in bin_of.
        y = _mm256_round_ps(_mm256_min_ps(_mm256_max_ps(y, low), high), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
        const __m256i t = _mm256_add_epi32(_mm256_cvttps_epi32(y), zero);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(bins + i), _mm256_min_epi32(_mm256_max_epi32(t, none), last));
    }
    bins_of_portable(values + i, n - i, b, bins + i);
}

void bins_of(const float* values, size_t n, const Binning& b, int32_t* bins) {
    static const bool avx2 = __builtin_cpu_supports("avx2");
    (avx2 ? bins_of_avx2 : bins_of_portable)(values, n, b, bins);
}

// Counts one block's bins into four interleaved copies of the counts, so that
// a run of equal values is not one chain of dependent increments.
constexpr size_t kBlock = 256, kCopies = 4;
inline void count_bins(const int32_t* bins, size_t n, uint32_t* counts, size_t stride) {
    size_t i = 0;
    for (; i + kCopies <= n; i += kCopies)
        for (size_t c = 0; c < kCopies; ++c) ++counts[c * stride + static_cast<size_t>(bins[i + c])];
    for (; i < n; ++i) ++counts[static_cast<size_t>(bins[i])];
}

void merge_extremes(Extremes& into, const Extremes& e) {
    into.lo = std::min(into.lo, e.lo);
    into.hi = std::max(into.hi, e.hi);
    into.finite = into.finite && e.finite;
}

constexpr Extremes kNothingSeen{std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), true};

// count_shard's block loop without AVX-512: extremes, bins, counts.
Extremes count_blocks(std::span<const float> values, const Binning& b, uint32_t* counts, size_t stride) {
    int32_t bins[kBlock];
    Extremes seen = kNothingSeen;
    for (size_t start = 0; start < values.size(); start += kBlock) {
        const auto block = values.subspan(start, std::min(kBlock, values.size() - start));
        merge_extremes(seen, extremes_of_any_piece(block));
        bins_of(block.data(), block.size(), b, bins);
        count_bins(bins, block.size(), counts, stride);
    }
    return seen;
}

// The lanes of the sixteen values from i that lie below n.
inline __mmask16 lanes(size_t i, size_t n) {
    return static_cast<__mmask16>(i + 16 <= n ? 0xffffu : (1u << (n - i)) - 1);
}

// Folds lanes `in` of x into running extremes and a mask of the lanes that held NaN.
[[gnu::target("avx512f")]] inline void watch(__mmask16 in, __m512 x, __m512& lo, __m512& hi, __mmask16& nan) {
    nan |= _mm512_mask_cmp_ps_mask(in, x, x, _CMP_UNORD_Q);
    lo = _mm512_mask_min_ps(lo, in, lo, x);
    hi = _mm512_mask_max_ps(hi, in, hi, x);
}

// The same with AVX-512, each block read from memory once: its extremes taken
// while it is loaded, and when zeros are likely (a Relu's, often half its
// values) they are counted by mask into the bin of 0, where each of them
// lands, and only the others binned one by one (0.66-0.71 -> 0.48 ns a value
// at half zeros, 0.72 -> 0.39 at 70 %, but 0.55 -> 0.63 with none, hence only then).
[[gnu::target("avx512f")]] Extremes count_blocks_avx512(std::span<const float> values, const Binning& b,
                                                        uint32_t* counts, size_t stride) {
    if (values.empty()) return kNothingSeen;
    const float limit = static_cast<float>(b.last) + 1.0f;
    const __m512 inverse = _mm512_set1_ps(static_cast<float>(b.inverse_stride)), high = _mm512_set1_ps(limit),
                 low = _mm512_set1_ps(-limit), nothing = _mm512_setzero_ps();
    const __m512i zero = _mm512_set1_epi32(b.zero), last = _mm512_set1_epi32(b.last), none = _mm512_setzero_si512();
    __m512 lo = _mm512_set1_ps(kNothingSeen.lo), hi = _mm512_set1_ps(kNothingSeen.hi);
    __mmask16 nan = 0;
    alignas(64) int32_t bins[kBlock];
    alignas(64) float kept[kBlock + 16];
    size_t zeros = 0;
    for (size_t start = 0; start < values.size(); start += kBlock) {
        const float* block = values.data() + start;
        const size_t n = std::min(kBlock, values.size() - start);
        // Between this block's loads go its binning and counting, which the
        // hardware's prefetcher does not see past: a batch bigger than the
        // caches took 0.8 ns a value without this, 0.27 with.
        if (start + 5 * kBlock <= values.size())
            for (size_t i = 0; i < kBlock; i += 16)
                _mm_prefetch(reinterpret_cast<const char*>(block + 4 * kBlock + i), _MM_HINT_T0);
        // With zeros likely, a first pass over the block takes its extremes and
        // keeps the values that are not 0; else the binning pass takes them.
        size_t binned = n;
        if (b.zeros_likely) {
            binned = 0;
            for (size_t i = 0; i < n; i += 16) {
                const __mmask16 in = lanes(i, n);
                const __m512 x = _mm512_maskz_loadu_ps(in, block + i);
                watch(in, x, lo, hi, nan);
                const __mmask16 keep = _mm512_mask_cmp_ps_mask(in, x, nothing, _CMP_NEQ_UQ);
                _mm512_storeu_ps(kept + binned, _mm512_maskz_compress_ps(keep, x));
                binned += static_cast<size_t>(__builtin_popcount(keep));
            }
            zeros += n - binned;
        }
        const float* source = b.zeros_likely ? kept : block;
        for (size_t i = 0; i < binned; i += 16) {
            const __mmask16 in = lanes(i, binned);
            const __m512 x = _mm512_maskz_loadu_ps(in, source + i);
            if (!b.zeros_likely) watch(in, x, lo, hi, nan);
            __m512 y = _mm512_mul_ps(x, inverse);
            if (b.absolute) y = _mm512_abs_ps(y);
            // max(NaN, low) is low, as in bin_of.
            y = _mm512_roundscale_ps(_mm512_min_ps(_mm512_max_ps(y, low), high), _MM_FROUND_TO_NEG_INF);
            const __m512i t = _mm512_add_epi32(_mm512_cvttps_epi32(y), zero);
            _mm512_mask_storeu_epi32(bins + i, in, _mm512_min_epi32(_mm512_max_epi32(t, none), last));
        }
        count_bins(bins, binned, counts, stride);
    }
    counts[static_cast<size_t>(b.zero)] += static_cast<uint32_t>(zeros);  // 0 * 1/stride is the zero bin
    const float least = _mm512_reduce_min_ps(lo), greatest = _mm512_reduce_max_ps(hi);
    return {least, greatest, nan == 0 && !std::isinf(least) && !std::isinf(greatest)};
}

// Counts the values of one shard into `counts` (its own, one per bin, in 32
// bits: at most 2^31 values a shard) and returns their extremes.
Extremes count_shard(std::span<const float> values, const Binning& binning, std::vector<uint32_t>& counts) {
    static const bool avx512 = __builtin_cpu_supports("avx512f");
    const size_t stride = static_cast<size_t>(binning.last) + 1;
    counts.assign(kCopies * stride, 0);
    const Extremes seen = avx512 && binning.in_float() ? count_blocks_avx512(values, binning, counts.data(), stride)
                                                       : count_blocks(values, binning, counts.data(), stride);
    for (size_t c = 1; c < kCopies; ++c)  // into the first copy
        for (size_t b = 0; b < stride; ++b) counts[b] += counts[c * stride + b];
    counts.resize(stride);
    return seen;
}

// extremes() before `not_finite` is filled in.
Extremes extremes_over_threads(std::span<const float> values) {
    const size_t pieces = threads_for(values.size());
    if (pieces == 1) return extremes_of_any_piece(values);
    std::vector<Extremes> of(pieces);
    const size_t per_piece = (values.size() + pieces - 1) / pieces;
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < pieces; ++k) {
        const size_t begin = std::min(values.size(), k * per_piece);
        of[k] = extremes_of_any_piece(values.subspan(begin, std::min(values.size(), begin + per_piece) - begin));
    }
    Extremes out = of[0];
    for (const auto& e : of) {
        out.lo = std::min(out.lo, e.lo);
        out.hi = std::max(out.hi, e.hi);
        out.finite = out.finite && e.finite;
    }
    return out;
}

// Batches of a value a bin or more are counted in one shard per thread (one
// on one thread), each in 32 bits into interleaved copies of the bins; fewer
// straight into the counts. (Straight into the counts a value costs 1.3 ns,
// 1.7 in a Relu's output, whose zeros are one chain of dependent additions;
// in a shard 0.5-0.8 at one value a bin, less the more there are.)
constexpr size_t kMostPerShard = size_t{1} << 31;

struct Tally {
    std::vector<std::vector<uint32_t>> shards;
    Extremes seen = kNothingSeen;
};

Tally tally(std::span<const float> values, const Binning& binning) {
    const size_t shards = std::max((values.size() + kMostPerShard - 1) / kMostPerShard, threads_for(values.size()));
    const size_t per_shard = (values.size() + shards - 1) / shards;
    Tally out;
    out.shards.resize(shards);
    std::vector<Extremes> seen(shards, kNothingSeen);
#pragma omp parallel for schedule(static) if (shards > 1)
    for (size_t s = 0; s < shards; ++s) {
        const size_t begin = std::min(values.size(), s * per_shard);
        const size_t end = std::min(values.size(), begin + per_shard);
        seen[s] = count_shard(values.subspan(begin, end - begin), binning, out.shards[s]);
    }
    for (const auto& e : seen) merge_extremes(out.seen, e);
    return out;
}

}  // namespace

Extremes extremes(std::span<const float> values) {
    Extremes out = extremes_over_threads(values);
    if (!out.finite)
        out.not_finite = *std::find_if(values.begin(), values.end(), [](float v) { return !std::isfinite(v); });
    return out;
}

void Histogram::add(std::span<const float> values, const std::string& tensor) {
    if (values.empty()) return;
    auto binning = [&] {
        return Binning{1.0 / stride_, static_cast<int32_t>(absolute_ ? 0 : half_),
                       static_cast<int32_t>(counts_.size()) - 1, absolute_, min_ == 0.0f || max_ == 0.0f};
    };
    auto tallied = [&] { return values.size() >= counts_.size() || values.size() >= kMostPerShard; };
    // After the first batch, a batch of many values a bin is counted at the
    // present bins in the pass that takes its extremes. Only when it reaches
    // past them (a new extreme: a few batches in a hundred) are the bins grown
    // and the batch counted again. One pass over a batch instead of two.
    std::optional<Tally> counted;
    Extremes seen;
    if (total_ > 0 && tallied()) {
        counted = tally(values, binning());
        seen = counted->seen.finite ? counted->seen : extremes(values);  // extremes() finds the culprit
    } else {
        seen = extremes(values);
    }
    if (!seen.finite)
        throw InputError(
            fmt::format("tensor '{}' holds {} during calibration; its range is undefined", tensor, seen.not_finite));
    const double extent = std::max(std::abs(static_cast<double>(seen.lo)), std::abs(static_cast<double>(seen.hi)));
    if (total_ == 0) {
        min_ = seen.lo;
        max_ = seen.hi;
        half_ = absolute_ ? requested_ : requested_ / 2;
        // A constant-zero first batch still needs a positive stride.
        stride_ = (extent > 0 ? extent : 1e-6) / static_cast<double>(half_);
        counts_.assign(static_cast<size_t>(absolute_ ? half_ : 2 * half_), 0.0);
    } else {
        min_ = std::min(min_, seen.lo);
        max_ = std::max(max_, seen.hi);
        if (grow_to(extent)) counted.reset();
    }
    if (!counted && tallied()) counted = tally(values, binning());
    if (counted) {
        for (const auto& c : counted->shards)
            for (size_t b = 0; b < counts_.size(); ++b) counts_[b] += static_cast<double>(c[b]);
    } else {
        const Binning at = binning();
        int32_t bins[kBlock];
        for (size_t start = 0; start < values.size(); start += kBlock) {
            const size_t n = std::min(kBlock, values.size() - start);
            bins_of(values.data() + start, n, at, bins);
            for (size_t i = 0; i < n; ++i) counts_[static_cast<size_t>(bins[i])] += 1.0;
        }
    }
    total_ += static_cast<double>(values.size());
}

}  // namespace vaiq
