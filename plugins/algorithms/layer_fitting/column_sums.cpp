#include "column_sums.hpp"

#include <algorithm>
#include <exception>
#include <utility>

#include <omp.h>

#include "vaiq/gemm.hpp"

namespace vaiq {

namespace {

// Up to this many values per group the products run as plain loops: a
// depthwise layer's groups (k = 9) would each make tiny GEMM calls.
constexpr int64_t kLoopsUpTo = 16;
constexpr int64_t kChunk = 4096;  // columns summed at a time: the copies stay small
// The multiply-adds a chunk needs for its folds to go side by side (a parallel
// region costs a few microseconds; this is about 100 us of work). Counted by
// work, not by values: a depthwise layer's 1,024 columns of 27 values each
// take a million multiply-adds, and summed one fold after another they left
// the second core idle for a fifth of a fit of the PP-OCRv4 detector.
constexpr int64_t kParallelWork = 1 << 18;

uint64_t mixed(uint64_t v) {  // splitmix64's finaliser: neighbouring indices land in unrelated folds
    v += 0x9e3779b97f4a7c15ull;
    v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ull;
    v = (v ^ (v >> 27)) * 0x94d049bb133111ebull;
    return v ^ (v >> 31);
}

}  // namespace

int ColumnSums::fold_of(uint64_t seed, int64_t index) {
    return static_cast<int>(mixed(seed * 0x2545f4914f6cdd1dull + static_cast<uint64_t>(index)) % kFolds);
}

void ColumnSet::times_gram(const float* d, float* out) const {
    const int64_t per_group = outputs / groups;
    for (int64_t g = 0; g < groups; ++g) {
        const float* gram_g = gram.data() + g * k * k;
        const float* d_g = d + g * per_group * k;
        float* out_g = out + g * per_group * k;
        if (k > kLoopsUpTo) {
            gemm(false, false, per_group, k, k, 1.0f, d_g, k, gram_g, k, 0.0f, out_g, k);
            continue;
        }
        for (int64_t o = 0; o < per_group; ++o)
            for (int64_t j = 0; j < k; ++j) {
                float sum = 0;  // G is symmetric: its row j is its column j
                for (int64_t i = 0; i < k; ++i) sum += d_g[o * k + i] * gram_g[j * k + i];
                out_g[o * k + j] = sum;
            }
    }
}

double ColumnSet::loss(const float* d) const {
    if (count == 0) return 0;
    std::vector<float> product(cross.size());
    times_gram(d, product.data());
    double sum = base;
    for (size_t i = 0; i < product.size(); ++i) sum += static_cast<double>(d[i]) * (product[i] + 2.0f * cross[i]);
    return std::max(sum, 0.0) / static_cast<double>(count);
}

void ColumnSet::gradient(const float* d, float* grad) const {
    times_gram(d, grad);
    const float scale = 2.0f / static_cast<float>(std::max<int64_t>(count, 1));
    for (size_t i = 0; i < cross.size(); ++i) grad[i] = scale * (grad[i] + cross[i]);
}

ColumnSums::ColumnSums(const float* weights, int64_t outputs, int64_t groups, int64_t k, std::vector<float> shift,
                       uint64_t seed)
    : weights_(weights, weights + outputs * k),
      outputs_(outputs),
      groups_(groups),
      k_(k),
      shift_(std::move(shift)),
      seed_(seed) {
    if (!groups_side_by_side()) return;
    weights_by_input_.resize(weights_.size());
    for (int64_t g = 0; g < groups_; ++g)
        for (int64_t i = 0; i < k_; ++i) weights_by_input_[i * groups_ + g] = weights_[g * k_ + i];
}

// A depthwise layer (one output a group, a few inputs each: 9 for a 3 x 3
// kernel) sums its groups side by side, each column's values transposed to
// [k][groups]: the loops over a group's few inputs left most of the time to
// their own overhead. Every sum adds the same terms in the same order as the
// loops, from the same start: the bits are theirs.
bool ColumnSums::groups_side_by_side() const {
    constexpr int64_t kFewestGroups = 8;
    return outputs_ == groups_ && k_ <= kLoopsUpTo && groups_ >= kFewestGroups;
}

namespace {

// A column's values, [groups][k], as [k][groups].
void by_input_of(const float* column, int64_t groups, int64_t k, float* by_input) {
    for (int64_t g = 0; g < groups; ++g)
        for (int64_t i = 0; i < k; ++i) by_input[i * groups + g] = column[g * k + i];
}

}  // namespace

void ColumnSums::depthwise_errors(const float* diff, int64_t count, Scratch& own) {
    const int64_t groups = groups_, k = k_;
    own.t.resize(static_cast<size_t>(k * groups));
    float* by_input = own.t.data();
    for (int64_t c = 0; c < count; ++c) {
        by_input_of(diff + c * groups * k, groups, k, by_input);
        float* e = own.e.data() + c * groups;
        std::fill(e, e + groups, 0.0f);
        for (int64_t i = 0; i < k; ++i) {
            const float* w = weights_by_input_.data() + i * groups;
            const float* di = by_input + i * groups;
            for (int64_t g = 0; g < groups; ++g) e[g] += w[g] * di[g];
        }
    }
}

void ColumnSums::depthwise_sums(int fold, const float* x, int64_t count, Scratch& own) {
    const int64_t groups = groups_, k = k_;
    own.t.resize(static_cast<size_t>(k * groups));
    float* by_input = own.t.data();
    // [k][k][groups] (the upper triangle: j >= i) and [k][groups].
    own.part.assign(static_cast<size_t>((k * k + k) * groups), 0.0f);
    float* gram = own.part.data();
    float* cross = gram + k * k * groups;
    for (int64_t c = 0; c < count; ++c) {
        by_input_of(x + c * groups * k, groups, k, by_input);
        const float* e = own.e.data() + c * groups;
        for (int64_t i = 0; i < k; ++i)
            for (int64_t j = i; j < k; ++j) {
                float* p = gram + (i * k + j) * groups;
                const float *a = by_input + i * groups, *b = by_input + j * groups;
                for (int64_t g = 0; g < groups; ++g) p[g] += a[g] * b[g];
            }
        for (int64_t j = 0; j < k; ++j) {
            float* p = cross + j * groups;
            const float* b = by_input + j * groups;
            for (int64_t g = 0; g < groups; ++g) p[g] += e[g] * b[g];
        }
    }
    const auto f = static_cast<size_t>(fold);
    for (int64_t g = 0; g < groups; ++g) {
        double* total_gram = gram_[f].data() + g * k * k;
        double* total_cross = cross_[f].data() + g * k;
        for (int64_t i = 0; i < k; ++i)
            for (int64_t j = 0; j < k; ++j)
                total_gram[i * k + j] += gram[(std::min(i, j) * k + std::max(i, j)) * groups + g];
        for (int64_t j = 0; j < k; ++j) total_cross[j] += cross[j * groups + g];
    }
}

void ColumnSums::add(int64_t count, const ColumnWriter& write) {
    const int64_t rows = groups_ * k_;
    std::array<std::vector<int64_t>, kFolds> members;
    // The folds' sums are apart, so they are added side by side, each thread
    // with its own copies (a fold still adds its columns in their order: the
    // sums are those of one thread).
    const int workers = std::min(kFolds, std::max(1, omp_get_max_threads()));
    // A column's share of the sums: its errors (outputs x k), its Gram and cross products.
    const int64_t work_per_column = groups_ * k_ * k_ + 2 * outputs_ * k_ + rows;
    if (scratch_.size() < static_cast<size_t>(workers)) scratch_.resize(static_cast<size_t>(workers));
    std::array<std::exception_ptr, kFolds> failures;
    for (int64_t first = 0; first < count; first += kChunk) {
        const int64_t n = std::min(kChunk, count - first);
        for (auto& m : members) m.clear();
        for (int64_t c = first; c < first + n; ++c) members[static_cast<size_t>(fold_of(seed_, seen_++))].push_back(c);
#pragma omp parallel for schedule(dynamic) num_threads(workers) if (workers > 1 && n * work_per_column >= kParallelWork)
        for (int f = 0; f < kFolds; ++f) {
            const auto& columns = members[static_cast<size_t>(f)];
            if (columns.empty()) continue;
            auto& own = scratch_[static_cast<size_t>(omp_get_thread_num())];
            try {
                own.x.resize(columns.size() * static_cast<size_t>(rows));
                own.xf.resize(own.x.size());
                for (size_t i = 0; i < columns.size(); ++i)
                    write(columns[i], own.x.data() + i * rows, own.xf.data() + i * rows);
                add_fold(f, own, static_cast<int64_t>(columns.size()));
            } catch (...) {
                failures[static_cast<size_t>(f)] = std::current_exception();
            }
        }
        for (const auto& failure : failures)
            if (failure) std::rethrow_exception(failure);
    }
}

// Adds `count` columns (row-major [count, rows] here: a column's values
// together) to fold `fold`: e = W_f (x - x_f) + shift per column, then per
// group sum x x^T and sum e x^T.
void ColumnSums::add_fold(int fold, Scratch& own, int64_t count) {
    const float* x = own.x.data();
    const auto f = static_cast<size_t>(fold);
    const int64_t rows = groups_ * k_, per_group = outputs_ / groups_;
    if (gram_[f].empty()) {
        gram_[f].assign(static_cast<size_t>(groups_ * k_ * k_), 0.0);
        cross_[f].assign(static_cast<size_t>(outputs_ * k_), 0.0);
    }
    // xf becomes x - x_f; e the errors, [count, outputs].
    float* diff = own.xf.data();
    auto& errors = own.e;
    for (int64_t i = 0; i < count * rows; ++i) diff[i] = x[i] - diff[i];
    errors.resize(static_cast<size_t>(count * outputs_));
    const bool side_by_side = groups_side_by_side();
    if (side_by_side) depthwise_errors(diff, count, own);
    for (int64_t g = 0; g < groups_ && !side_by_side; ++g) {
        const float* w_g = weights_.data() + g * per_group * k_;
        if (k_ > kLoopsUpTo) {
            gemm(false, true, count, per_group, k_, 1.0f, diff + g * k_, rows, w_g, k_, 0.0f,
                 errors.data() + g * per_group, outputs_);
            continue;
        }
        for (int64_t c = 0; c < count; ++c)
            for (int64_t o = 0; o < per_group; ++o) {
                float sum = 0;
                for (int64_t i = 0; i < k_; ++i) sum += w_g[o * k_ + i] * diff[c * rows + g * k_ + i];
                errors[static_cast<size_t>(c * outputs_ + g * per_group + o)] = sum;
            }
    }
    double base = 0;
    for (int64_t c = 0; c < count; ++c)
        for (int64_t o = 0; o < outputs_; ++o) {
            float& e = errors[static_cast<size_t>(c * outputs_ + o)];
            e += shift_[static_cast<size_t>(o)];
            base += static_cast<double>(e) * e;
        }
    base_[f] += base;
    count_[f] += count;
    // Per group: the partial sums in float, then into the double totals.
    if (side_by_side) return depthwise_sums(fold, x, count, own);
    own.part.resize(static_cast<size_t>(k_ * k_ + per_group * k_));
    float* gram = own.part.data();
    float* cross = gram + k_ * k_;
    for (int64_t g = 0; g < groups_; ++g) {
        const float* x_g = x + g * k_;
        const float* e_g = errors.data() + g * per_group;
        if (k_ > kLoopsUpTo) {
            gemm(true, false, k_, k_, count, 1.0f, x_g, rows, x_g, rows, 0.0f, gram, k_);
            gemm(true, false, per_group, k_, count, 1.0f, e_g, outputs_, x_g, rows, 0.0f, cross, k_);
        } else {
            std::fill(own.part.begin(), own.part.end(), 0.0f);
            // The Gram matrix's upper triangle, mirrored after: x_i x_j is x_j x_i to the bit.
            for (int64_t c = 0; c < count; ++c) {
                const float* xc = x_g + c * rows;
                for (int64_t i = 0; i < k_; ++i)
                    for (int64_t j = i; j < k_; ++j) gram[i * k_ + j] += xc[i] * xc[j];
                for (int64_t o = 0; o < per_group; ++o)
                    for (int64_t j = 0; j < k_; ++j) cross[o * k_ + j] += e_g[c * outputs_ + o] * xc[j];
            }
            for (int64_t i = 0; i < k_; ++i)
                for (int64_t j = 0; j < i; ++j) gram[i * k_ + j] = gram[j * k_ + i];
        }
        double* total_gram = gram_[f].data() + g * k_ * k_;
        double* total_cross = cross_[f].data() + g * per_group * k_;
        for (int64_t i = 0; i < k_ * k_; ++i) total_gram[i] += gram[i];
        for (int64_t i = 0; i < per_group * k_; ++i) total_cross[i] += cross[i];
    }
}

ColumnSet ColumnSums::folds(const std::array<bool, kFolds>& in) const {
    ColumnSet set;
    set.outputs = outputs_, set.groups = groups_, set.k = k_;
    std::vector<double> gram(static_cast<size_t>(groups_ * k_ * k_), 0.0), cross(static_cast<size_t>(outputs_ * k_));
    for (size_t f = 0; f < kFolds; ++f) {
        if (!in[f] || count_[f] == 0) continue;
        for (size_t i = 0; i < gram.size(); ++i) gram[i] += gram_[f][i];
        for (size_t i = 0; i < cross.size(); ++i) cross[i] += cross_[f][i];
        set.base += base_[f];
        set.count += count_[f];
    }
    set.gram.assign(gram.begin(), gram.end());
    set.cross.assign(cross.begin(), cross.end());
    return set;
}

}  // namespace vaiq
