#include <gtest/gtest.h>

#include <random>

#include "test_support.hpp"
#include "vaiq/calibrator.hpp"
#include "vaiq/error.hpp"

namespace {

vaiq::CalibrationResult calibrate(const nlohmann::json& options, const std::vector<std::vector<float>>& batches) {
    auto registry = vaiq::test::registry_with_test_plugin();
    const auto& info = registry.require(vaiq::PluginKind::Calibrator, "percentile");
    auto calibrator = registry.create<vaiq::Calibrator>("percentile", registry.resolve_options(info, options));
    auto observer = calibrator->make_observer("t", {});
    for (const auto& b : batches) {
        const std::vector<int64_t> shape{static_cast<int64_t>(b.size())};
        observer->observe({shape, b});
    }
    return observer->result();
}

std::vector<float> uniform(int n, float lo, float hi) {
    std::vector<float> v(n);
    for (int i = 0; i < n; ++i) v[i] = lo + (hi - lo) * (static_cast<float>(i) + 0.5f) / static_cast<float>(n);
    return v;
}

TEST(Percentile, SymmetricThresholdCutsTheOutliers) {
    auto values = uniform(100000, -1.0f, 1.0f);
    values.push_back(50.0f);  // one outlier in 100001 values
    const auto r = calibrate({{"percentile", 99.9}}, {values});
    // 99.9 % of |x| lies below about 0.999; the bin stride is 50 / 2048 = 0.024.
    EXPECT_NEAR(r.range.max, 1.0, 0.03);
    EXPECT_NEAR(r.range.min, -1.0, 0.001) << "-t, clipped to the observed minimum";
    EXPECT_GE(r.range.max, 0.999f) << "the upper bin edge keeps the whole percentile";
}

TEST(Percentile, RangesAreClippedToWhatWasObserved) {
    const auto r = calibrate(nullptr, {uniform(1000, 0.0f, 4.0f)});
    EXPECT_GE(r.range.min, 0.0f) << "-t is clipped to the observed minimum: a ReLU output stays non-negative";
    EXPECT_LE(r.range.max, 4.0f);
    EXPECT_GT(r.range.max, 3.99f);
}

TEST(Percentile, AsymmetricCutsEachTail) {
    auto values = uniform(100000, 2.0f, 3.0f);
    values.push_back(-40.0f);
    values.push_back(60.0f);
    const auto r = calibrate({{"percentile", 99.99}, {"CalibTensorRangeSymmetric", false}}, {values});
    EXPECT_NEAR(r.range.min, 2.0, 0.1);
    EXPECT_NEAR(r.range.max, 3.0, 0.1);
}

TEST(Percentile, GrowsAcrossBatchesWithoutKeepingThem) {
    // Batch 1 sets the range to [0, 1]; batch 2 reaches 10: the histogram grows.
    const auto r = calibrate({{"percentile", 100.0}}, {uniform(1000, 0.0f, 1.0f), uniform(1000, 0.0f, 10.0f)});
    EXPECT_FLOAT_EQ(r.range.max, 10.0f * 1999.0f / 2000.0f);
}

TEST(Percentile, BadOptionsAreRefused) {
    EXPECT_THROW(calibrate({{"percentile", 120.0}}, {{1.0f}}), vaiq::InputError);
    EXPECT_THROW(calibrate({{"num_bins", 3}}, {{1.0f}}), vaiq::InputError);
}

TEST(Percentile, MergedShardsAreWithinOneBinOfTheWhole) {
    // Shards whose histograms start at different strides (first batches of different spreads).
    const auto r = vaiq::test::calibrate_in_shards(
        "percentile", {{"num_bins", 256}}, {}, {vaiq::test::normal_batches(3, 4000, 1.0f, 1), vaiq::test::normal_batches(3, 4000, 3.0f, 2)});
    // One bin of the merged grid: the wider shard's first batch set its stride, about extent / 128.
    const float bin = r.extent / 128 * 1.01f;
    EXPECT_NEAR(r.merged.range.max, r.whole.range.max, bin);
    EXPECT_NEAR(r.merged.range.min, r.whole.range.min, bin);
    EXPECT_GT(r.whole.range.max, 0.0f);
}

}  // namespace
