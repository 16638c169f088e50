#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "test_support.hpp"
#include "vaiq/calibrator.hpp"
#include "vaiq/error.hpp"

namespace {

vaiq::CalibrationResult calibrate(const nlohmann::json& options, const std::vector<std::vector<float>>& batches) {
    auto registry = vaiq::test::registry_with_test_plugin();
    const auto& info = registry.require(vaiq::PluginKind::Calibrator, "minmse");
    auto calibrator = registry.create<vaiq::Calibrator>("minmse", registry.resolve_options(info, options));
    vaiq::QuantSpec spec;
    spec.type = vaiq::QuantType::QInt8;
    spec.symmetric = true;
    auto observer = calibrator->make_observer("t", spec);
    for (const auto& b : batches) {
        const std::vector<int64_t> shape{static_cast<int64_t>(b.size())};
        observer->observe({shape, b});
    }
    return observer->result();
}

std::vector<float> gaussian_with_outlier(unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(100000);
    for (auto& x : v) x = normal(rng);
    v[0] = 60.0f;  // one outlier: MinMax would give position 1 (scale 0.5)
    return v;
}

TEST(MinMse, TradesTheOutlierForResolution) {
    const auto r = calibrate(nullptr, {gaussian_with_outlier(1)});
    ASSERT_TRUE(r.position.has_value());
    // pos0 = rint(-log2(60/127)) = 1. Squared errors: position 2 (scale 1/4) clips the outlier at
    // 31.75 (798) and rounds 1e5 values with 1e5/48 = 2083 / 4 = 520; position 3 clips at 15.9 (1946 + 130);
    // position 1 keeps the outlier but rounds at scale 1/2 (2083). Position 2 wins.
    EXPECT_EQ(*r.position, 2);
    EXPECT_FLOAT_EQ(r.range.max, 60.0f);
}

TEST(MinMse, ModesAgreeOnACleanDistribution) {
    std::mt19937 rng(2);
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    std::vector<std::vector<float>> batches(4, std::vector<float>(5000));
    for (auto& b : batches)
        for (auto& x : b) x = u(rng);
    const auto all = calibrate(nullptr, batches);
    const auto common = calibrate({{"MinMSEMode", "MostCommon"}}, batches);
    const auto percentile = calibrate({{"MinMSEMode", "Percentile"}}, batches);
    EXPECT_EQ(all.position, common.position);
    EXPECT_EQ(all.position, percentile.position);
    EXPECT_EQ(*all.position, 5) << "3/127 = 0.0236: 2^-5 = 0.031 keeps 3.0 inside, 2^-6 would clip";
}

TEST(MinMse, BadModeIsRefused) { EXPECT_THROW(calibrate({{"MinMSEMode", "Mean"}}, {{1.0f}}), vaiq::InputError); }

}  // namespace

namespace {

// A float8 grid is relative: MinMSE's search over an integer grid's clipping
// does not apply, and it says which calibrators do.
TEST(MinMse, AFloat8TensorIsRefusedNamingTheCalibratorsToUse) {
    auto registry = vaiq::test::registry_with_test_plugin();
    const auto& info = registry.require(vaiq::PluginKind::Calibrator, "minmse");
    auto calibrator = registry.create<vaiq::Calibrator>("minmse", registry.resolve_options(info, {}));
    vaiq::QuantSpec spec;
    spec.type = vaiq::QuantType::QFloat8E4M3FN;
    spec.symmetric = true;
    try {
        calibrator->make_observer("t", spec);
        ADD_FAILURE() << "no error";
    } catch (const vaiq::InputError& e) {
        EXPECT_NE(std::string(e.what()).find("MinMax"), std::string::npos) << e.what();
    }
}

}  // namespace
