// Column sums: the loss and gradient they give are those computed from the
// columns themselves, for groups small enough for the loops and large enough
// for the GEMM, the folds split the columns, and folds added on several
// threads sum what one thread sums.
#include "column_sums.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

namespace {

struct Case {
    int64_t outputs, groups, k, columns;
};

class ColumnSumsTest : public ::testing::TestWithParam<Case> {};

// Adds `count` columns of `rows` values each, held column-major in x and xf from column `first`.
void add_columns(vaiq::ColumnSums& sums, const std::vector<float>& x, const std::vector<float>& xf, int64_t rows,
                 int64_t first, int64_t count) {
    sums.add(count, [&](int64_t c, float* to_x, float* to_xf) {
        std::copy_n(x.data() + (first + c) * rows, rows, to_x);
        std::copy_n(xf.data() + (first + c) * rows, rows, to_xf);
    });
}

std::vector<float> uniform(size_t n, std::mt19937& rng, float lo = -1, float hi = 1) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng);
    return v;
}

TEST_P(ColumnSumsTest, LossAndGradientAreThoseOfTheColumns) {
    const auto [outputs, groups, k, columns] = GetParam();
    const int64_t rows = groups * k, per_group = outputs / groups;
    std::mt19937 rng(5);
    const auto w = uniform(static_cast<size_t>(outputs * k), rng), shift = uniform(static_cast<size_t>(outputs), rng);
    const auto x = uniform(static_cast<size_t>(rows * columns), rng);
    auto xf = x;  // the float input: the quantized one plus a little noise
    const auto noise = uniform(xf.size(), rng, -0.05f, 0.05f);
    for (size_t i = 0; i < xf.size(); ++i) xf[i] += noise[i];
    const auto d = uniform(w.size(), rng, -0.1f, 0.1f);

    vaiq::ColumnSums sums(w.data(), outputs, groups, k, shift, 3);
    add_columns(sums, x, xf, rows, 0, columns / 3);  // in two parts, as batches come
    add_columns(sums, x, xf, rows, columns / 3, columns - columns / 3);
    ASSERT_EQ(sums.columns(), columns);

    // Directly: per column, r = (W_f + d) x + shift - W_f xf, over the folds chosen.
    std::array<bool, vaiq::ColumnSums::kFolds> in{true, false, true, true, false};
    double loss = 0;
    int64_t count = 0;
    std::vector<double> grad(w.size(), 0.0);
    for (int64_t c = 0; c < columns; ++c) {
        if (!in[static_cast<size_t>(vaiq::ColumnSums::fold_of(3, c))]) continue;
        ++count;
        for (int64_t g = 0; g < groups; ++g)
            for (int64_t o = g * per_group; o < (g + 1) * per_group; ++o) {
                double r = shift[static_cast<size_t>(o)];
                for (int64_t i = 0; i < k; ++i) {
                    const auto wi = static_cast<size_t>(o * k + i), xi = static_cast<size_t>(c * rows + g * k + i);
                    r += (w[wi] + d[wi]) * x[xi] - w[wi] * xf[xi];
                }
                loss += r * r;
                for (int64_t i = 0; i < k; ++i)
                    grad[static_cast<size_t>(o * k + i)] += 2 * r * x[static_cast<size_t>(c * rows + g * k + i)];
            }
    }
    const auto set = sums.folds(in);
    ASSERT_EQ(set.count, count);
    EXPECT_NEAR(set.loss(d.data()), loss / count, 1e-4 * loss / count);
    std::vector<float> got(w.size());
    set.gradient(d.data(), got.data());
    double largest = 0;
    for (double v : grad) largest = std::max(largest, std::abs(v / count));
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], grad[i] / count, 1e-4 * largest) << i;

    // The folds split the columns: every fold has some, and together they are all.
    int64_t total = 0;
    for (int f = 0; f < vaiq::ColumnSums::kFolds; ++f) {
        std::array<bool, vaiq::ColumnSums::kFolds> one{};
        one[static_cast<size_t>(f)] = true;
        const auto part = sums.folds(one).count;
        EXPECT_GT(part, columns / 10) << "fold " << f;
        total += part;
    }
    EXPECT_EQ(total, columns);
}

INSTANTIATE_TEST_SUITE_P(Shapes, ColumnSumsTest,
                         ::testing::Values(Case{8, 8, 9, 500},      // depthwise 3x3: the loops
                                           Case{6, 2, 12, 300},     // two groups, the loops
                                           Case{5, 1, 40, 5000}));  // the GEMM, over more than one chunk

// The folds are added side by side, each on a thread with its own copies of
// the columns: the sums are those that one thread adds, to the bit.
TEST(ColumnSumsThreads, FoldsAddedSideBySideAreTheSumsOfOneThread) {
    const int64_t outputs = 16, k = 40, columns = 3000;  // 8.8 million multiply-adds: enough to go side by side
    std::mt19937 rng(9);
    const auto w = uniform(static_cast<size_t>(outputs * k), rng), shift = uniform(static_cast<size_t>(outputs), rng);
    const auto x = uniform(static_cast<size_t>(k * columns), rng), xf = uniform(x.size(), rng);
    const int threads = omp_get_max_threads();

    omp_set_num_threads(1);
    vaiq::ColumnSums alone(w.data(), outputs, 1, k, shift, 7);
    add_columns(alone, x, xf, k, 0, columns);

    omp_set_num_threads(4);
    vaiq::ColumnSums side_by_side(w.data(), outputs, 1, k, shift, 7);
    std::mutex mutex;
    std::condition_variable arrived;
    std::set<std::thread::id> writers;
    side_by_side.add(columns, [&](int64_t c, float* to_x, float* to_xf) {
        {
            // The first writer waits for a second (at most 10 s), so that the folds
            // go side by side however busy the machine is.
            std::unique_lock lock(mutex);
            writers.insert(std::this_thread::get_id());
            arrived.notify_all();
            arrived.wait_for(lock, std::chrono::seconds(10), [&] { return writers.size() > 1; });
        }
        std::copy_n(x.data() + c * k, k, to_x);
        std::copy_n(xf.data() + c * k, k, to_xf);
    });
    omp_set_num_threads(threads);
    EXPECT_GT(writers.size(), 1u) << "the folds must have gone side by side for the comparison to mean anything";

    for (int f = 0; f < vaiq::ColumnSums::kFolds; ++f) {
        std::array<bool, vaiq::ColumnSums::kFolds> one{};
        one[static_cast<size_t>(f)] = true;
        const auto a = alone.folds(one), b = side_by_side.folds(one);
        EXPECT_EQ(a.count, b.count) << "fold " << f;
        EXPECT_EQ(a.base, b.base) << "fold " << f;
        EXPECT_EQ(a.gram, b.gram) << "fold " << f;
        EXPECT_EQ(a.cross, b.cross) << "fold " << f;
    }
}

// A depthwise layer of 12 groups sums them side by side; each group alone (one
// group, below the side-by-side path) sums its inputs with the loops. The sums
// are the same to the bit: the same terms added in the same order.
TEST(ColumnSumsDepthwise, GroupsSideBySideSumAsEachGroupAlone) {
    const int64_t groups = 12, k = 9, columns = 700;
    const int64_t rows = groups * k;
    std::mt19937 rng(5);
    const auto w = uniform(static_cast<size_t>(groups * k), rng), shift = uniform(static_cast<size_t>(groups), rng);
    const auto x = uniform(static_cast<size_t>(rows * columns), rng), xf = uniform(x.size(), rng);
    vaiq::ColumnSums together(w.data(), groups, groups, k, shift, 3);
    add_columns(together, x, xf, rows, 0, columns);
    std::array<bool, vaiq::ColumnSums::kFolds> every{};
    every.fill(true);
    const auto all = together.folds(every);
    for (int64_t g = 0; g < groups; ++g) {
        std::vector<float> xg, xfg;  // group g's inputs of each column
        for (int64_t c = 0; c < columns; ++c)
            for (int64_t i = 0; i < k; ++i) {
                xg.push_back(x[static_cast<size_t>(c * rows + g * k + i)]);
                xfg.push_back(xf[static_cast<size_t>(c * rows + g * k + i)]);
            }
        vaiq::ColumnSums alone(w.data() + g * k, 1, 1, k, {shift[static_cast<size_t>(g)]}, 3);
        add_columns(alone, xg, xfg, k, 0, columns);
        const auto one = alone.folds(every);
        for (int64_t i = 0; i < k * k; ++i)
            ASSERT_EQ(all.gram[static_cast<size_t>(g * k * k + i)], one.gram[static_cast<size_t>(i)]) << g << " " << i;
        for (int64_t i = 0; i < k; ++i)
            ASSERT_EQ(all.cross[static_cast<size_t>(g * k + i)], one.cross[static_cast<size_t>(i)]) << g << " " << i;
    }
}

// Another seed puts the columns in other folds.
TEST(ColumnSumsFolds, AnotherSeedSplitsTheColumnsOtherwise) {
    int same = 0;
    for (int64_t c = 0; c < 1000; ++c) same += vaiq::ColumnSums::fold_of(0, c) == vaiq::ColumnSums::fold_of(1, c);
    EXPECT_LT(same, 300) << "about a fifth agree by chance";
}

}  // namespace
