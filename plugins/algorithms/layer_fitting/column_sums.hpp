// A layer's input columns summed instead of kept, for fitting its weights.
//
// Fitting W to reproduce the float layer (y = W_f x_f + b on the float model's
// input x_f) on the quantized model's input x minimises, over the columns,
// |W x + b_q - y|^2 = |D x + e|^2 with D = W - W_f and e = W_f (x - x_f) +
// (b_q - b), the float weights' own error on x. Summed over columns that is
// tr(D G D^T) + 2 tr(D R^T) + sum |e|^2 with G = sum x x^T and R = sum e x^T,
// and its gradient is 2 (D G + R): a step costs outputs x k x k whatever the
// number of columns, and every column counts in every step. Each term is of the
// size of the error itself (no difference of large sums), so float products
// keep it accurate.
//
// The columns fall into kFolds folds by a hash of their index and a seed, so
// that a fit can hold one fold out to judge itself, and fits from other seeds
// see other splits.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace vaiq {

/// The sums of a set of columns, per group: what a loss and a gradient need.
struct ColumnSet {
    int64_t outputs = 0, groups = 1, k = 0;  ///< k: input values per group
    std::vector<float> gram;                 ///< [groups][k][k]: sum of x x^T
    std::vector<float> cross;                ///< [outputs][k]: sum of e x^T, row o of its group's inputs
    double base = 0;                         ///< sum of |e|^2
    int64_t count = 0;                       ///< columns

    /// The mean over the columns of the squared output error of W = W_f + d
    /// (`d` [outputs, k] row-major, a group's rows together).
    double loss(const float* d) const;
    /// d (mean squared error) / dW at W = W_f + d, into `grad` [outputs, k].
    void gradient(const float* d, float* grad) const;

  private:
    void times_gram(const float* d, float* out) const;  // D_g G_g per group
};

class ColumnSums {
  public:
    static constexpr int kFolds = 5;

    /// `weights` [outputs, k] (row-major, group g's outputs/groups rows
    /// together), the float layer's; `shift` per output, b_q - b.
    ColumnSums(const float* weights, int64_t outputs, int64_t groups, int64_t k, std::vector<float> shift,
               uint64_t seed);

    /// Writes column `index` (of those being added) of the quantized model's
    /// input into `x` and of the float model's into `xf`, groups x k values each;
    /// called from several threads at once.
    using ColumnWriter = std::function<void(int64_t index, float* x, float* xf)>;
    /// Adds `count` columns, each written straight into its fold's place.
    void add(int64_t count, const ColumnWriter& write);

    int64_t columns() const { return seen_; }
    /// The fold of the layer's column number `index` (in the order added).
    static int fold_of(uint64_t seed, int64_t index);
    /// What the sums of such a layer hold, in bytes.
    static size_t bytes(int64_t outputs, int64_t groups, int64_t k) {
        return kFolds * sizeof(double) * static_cast<size_t>(groups * k * k + outputs * k);
    }
    /// The sums of the folds `in` selects.
    ColumnSet folds(const std::array<bool, kFolds>& in) const;

  private:
    struct Scratch {  // a chunk's columns of one fold, their errors, partial sums, a transposed column
        std::vector<float> x, xf, e, part, t;
    };
    void add_fold(int fold, Scratch& own, int64_t count);  // the columns in own.x, own.xf (overwritten)
    // A depthwise layer's errors and partial sums with its groups side by side.
    bool groups_side_by_side() const;
    void depthwise_errors(const float* diff, int64_t count, Scratch& own);
    void depthwise_sums(int fold, const float* x, int64_t count, Scratch& own);

    std::vector<float> weights_;
    std::vector<float> weights_by_input_;  // a depthwise layer's, [k][groups], when its groups go side by side
    int64_t outputs_, groups_, k_;
    std::vector<float> shift_;
    uint64_t seed_;
    int64_t seen_ = 0;
    std::array<std::vector<double>, kFolds> gram_, cross_;
    std::array<double, kFolds> base_{};
    std::array<int64_t, kFolds> count_{};
    std::vector<Scratch> scratch_;  // a thread's each
};

}  // namespace vaiq
