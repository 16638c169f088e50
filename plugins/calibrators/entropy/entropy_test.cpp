#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "test_support.hpp"
#include "vaiq/calibrator.hpp"
#include "vaiq/error.hpp"

namespace {

vaiq::CalibrationResult calibrate(const nlohmann::json& options, const std::vector<std::vector<float>>& batches) {
    auto registry = vaiq::test::registry_with_test_plugin();
    const auto& info = registry.require(vaiq::PluginKind::Calibrator, "entropy");
    auto calibrator = registry.create<vaiq::Calibrator>("entropy", registry.resolve_options(info, options));
    auto observer = calibrator->make_observer("t", {});
    for (const auto& b : batches) {
        const std::vector<int64_t> shape{static_cast<int64_t>(b.size())};
        observer->observe({shape, b});
    }
    return observer->result();
}

// Gaussian values with a handful of far outliers: the shape activations have.
std::vector<float> heavy_tailed() {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(200000);
    for (auto& x : v) x = normal(rng);
    for (int i = 0; i < 5; ++i) v[i * 1000] = 40.0f;
    v[1] = -40.0f;
    return v;
}

TEST(Entropy, ClipsOutliersWithEnoughBins) {
    const auto r = calibrate(nullptr, {heavy_tailed()});
    EXPECT_LT(r.range.max, 15.0f) << "KL keeps the body, not the outliers";
    EXPECT_GT(r.range.max, 3.0f) << "but not so little that the tails of the Gaussian go";
    EXPECT_LT(r.range.min, -3.0f);
}

TEST(Entropy, OnnxRuntimesDefaultBinsDegenerateToTheFullRange) {
    // 128 bins and 128 levels: one candidate, the whole histogram.
    const auto r = calibrate({{"num_bins", 128}}, {heavy_tailed()});
    EXPECT_FLOAT_EQ(r.range.max, 40.0f);
    EXPECT_FLOAT_EQ(r.range.min, -40.0f);
}

TEST(Entropy, StreamsBatchesIntoOneHistogram) {
    const auto all = heavy_tailed();
    const std::vector<float> first(all.begin(), all.begin() + 100000), second(all.begin() + 100000, all.end());
    const auto whole = calibrate(nullptr, {all});
    const auto split = calibrate(nullptr, {second, first});
    // The split histogram starts from a smaller range and grows (at a finer stride, so the
    // candidates differ): both keep the body and drop the outliers.
    for (const auto& r : {whole, split}) {
        EXPECT_GT(r.range.max, 3.0f);
        EXPECT_LT(r.range.max, 15.0f);
    }
}

TEST(Entropy, SymmetricRangesAreCentredOnZero) {
    auto v = heavy_tailed();
    for (auto& x : v) x = std::abs(x);  // a ReLU-like tensor
    const auto r = calibrate({{"CalibTensorRangeSymmetric", true}}, {v});
    EXPECT_EQ(r.range.min, -r.range.max);
    EXPECT_GT(r.range.max, 1.0f);
}

TEST(Entropy, BadOptionsAreRefused) {
    EXPECT_THROW(calibrate({{"num_bins", 64}}, {{1.0f}}), vaiq::InputError);
    EXPECT_THROW(calibrate({{"num_quantized_bins", 7}}, {{1.0f}}), vaiq::InputError);
}

}  // namespace

namespace {

// Half zeros, half |N(0, 1)|: a ReLU output. KL keeps nearly the whole body
// (a NumPy transcription of the reference algorithm gives 4.27 on this shape).
TEST(Entropy, ReluOutputsKeepTheirBody) {
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(200000, 0.0f);
    for (size_t i = v.size() / 2; i < v.size(); ++i) v[i] = std::abs(normal(rng));
    const auto r = calibrate(nullptr, {v});
    EXPECT_EQ(r.range.min, 0.0f);
    EXPECT_GT(r.range.max, 3.5f);
}

TEST(Entropy, MergedShardsAreWithinOneBinOfTheWhole) {
    // Shards whose histograms start at different strides (first batches of different spreads).
    const auto r = vaiq::test::calibrate_in_shards(
        "entropy", {{"num_bins", 256}, {"num_quantized_bins", 32}}, {}, {vaiq::test::normal_batches(3, 4000, 1.0f, 1), vaiq::test::normal_batches(3, 4000, 3.0f, 2)});
    // One bin of the merged grid: the wider shard's first batch set its stride, about extent / 128.
    const float bin = r.extent / 128 * 1.01f;
    EXPECT_NEAR(r.merged.range.max, r.whole.range.max, bin);
    EXPECT_NEAR(r.merged.range.min, r.whole.range.min, bin);
    EXPECT_GT(r.whole.range.max, 0.0f);
}

}  // namespace
