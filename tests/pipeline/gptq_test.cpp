// GPTQ's lazy, Cholesky-based column updates against the direct update of the
// optimal brain surgeon formula: the inverse Hessian restricted to the rows not
// yet rounded, updated by Gaussian elimination after each row.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "pipeline/gptq.hpp"
#include "test_support.hpp"

namespace {

using Matrix = std::vector<std::vector<double>>;

Matrix inverse(Matrix a) {
    const size_t n = a.size();
    Matrix inv(n, std::vector<double>(n, 0.0));
    for (size_t i = 0; i < n; ++i) inv[i][i] = 1;
    for (size_t c = 0; c < n; ++c) {
        const double p = a[c][c];
        for (size_t j = 0; j < n; ++j) {
            a[c][j] /= p;
            inv[c][j] /= p;
        }
        for (size_t r = 0; r < n; ++r) {
            if (r == c) continue;
            const double f = a[r][c];
            for (size_t j = 0; j < n; ++j) {
                a[r][j] -= f * a[c][j];
                inv[r][j] -= f * inv[c][j];
            }
        }
    }
    return inv;
}

TEST(Gptq, LazyBatchesMatchTheDirectUpdate) {
    constexpr size_t k = 6, n = 3;
    std::mt19937 rng(3);
    std::normal_distribution<double> normal;
    // H = 2/m Σ xᵀx over correlated inputs.
    Matrix h(k, std::vector<double>(k, 0.0));
    for (int row = 0; row < 40; ++row) {
        std::vector<double> x(k);
        const double shared = normal(rng);
        for (size_t i = 0; i < k; ++i) x[i] = normal(rng) + 0.8 * shared;
        for (size_t i = 0; i < k; ++i)
            for (size_t j = 0; j < k; ++j) h[i][j] += 2.0 / 40 * x[i] * x[j];
    }
    std::vector<float> wv(k * n);
    for (auto& v : wv) v = static_cast<float>(normal(rng) * 0.5);
    const auto w = vaiq::Tensor::from_values<float>({int64_t{k}, int64_t{n}}, wv);
    const auto params = vaiq::constant_params(w, vaiq::test::blocked_spec(vaiq::QuantType::QInt4, true, 3));
    const vaiq::ParamLayout layout(w.shape(), params, "w");

    vaiq::GptqOptions options;
    options.batch_rows = 2;  // a batch boundary inside each block of 3
    std::vector<double> flat;
    for (const auto& row : h) flat.insert(flat.end(), row.begin(), row.end());
    const auto lazy = vaiq::gptq_round(w, params, flat, options);

    // Direct: damp, then for each row i in order round it and move its error into the later rows.
    double mean = 0;
    for (size_t i = 0; i < k; ++i) mean += h[i][i] / k;
    for (size_t i = 0; i < k; ++i) h[i][i] += options.damping * mean;
    Matrix hinv = inverse(h);
    std::vector<std::vector<double>> weights(k, std::vector<double>(n));
    for (size_t i = 0; i < k; ++i)
        for (size_t c = 0; c < n; ++c) weights[i][c] = wv[i * n + c];
    for (size_t i = 0; i < k; ++i) {
        for (size_t c = 0; c < n; ++c) {
            const size_t p = layout.index(i * n + c);
            const double s = params.scale[p];
            const double q = std::clamp(std::nearbyint(weights[i][c] / s), -8.0, 7.0) * s;
            EXPECT_NEAR(lazy.data<float>()[i * n + c], q, 1e-5) << "row " << i << " column " << c;
            const double error = (weights[i][c] - q) / hinv[i][i];
            for (size_t j = i + 1; j < k; ++j) weights[j][c] -= error * hinv[i][j];
        }
        // Row i is fixed now: eliminate it from the inverse Hessian of the rest.
        Matrix next = hinv;
        for (size_t a = i + 1; a < k; ++a)
            for (size_t b = i + 1; b < k; ++b) next[a][b] = hinv[a][b] - hinv[a][i] * hinv[i][b] / hinv[i][i];
        hinv = next;
    }
}

}  // namespace
