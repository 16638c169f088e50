#include <gtest/gtest.h>

#include "test_support.hpp"
#include "vaiq/calibrator.hpp"
#include "vaiq/error.hpp"

namespace {

using vaiq::CalibrationResult;
using vaiq::Calibrator;
using vaiq::TensorView;

struct Batch {
    std::vector<int64_t> shape;
    std::vector<float> values;
    TensorView<float> view() const { return {shape, values}; }
};

CalibrationResult calibrate(const nlohmann::json& options, const std::vector<Batch>& batches) {
    auto registry = vaiq::test::registry_with_test_plugin();
    const auto& info = registry.require(vaiq::PluginKind::Calibrator, "minmax");
    auto calibrator = registry.create<Calibrator>("minmax", registry.resolve_options(info, options));
    auto observer = calibrator->make_observer("t", {});
    for (const auto& b : batches) observer->observe(b.view());
    return observer->result();
}

TEST(MinMax, RangeSpansEveryBatch) {
    auto r = calibrate(nullptr, {{{2, 2}, {0.5f, -1.0f, 2.0f, 0.0f}}, {{2}, {3.0f, -0.25f}}});
    EXPECT_FLOAT_EQ(r.range.min, -1.0f);
    EXPECT_FLOAT_EQ(r.range.max, 3.0f);
    EXPECT_FALSE(r.position.has_value());
}

TEST(MinMax, MovingAverageFollowsOnnxRuntimeSmoothing) {
    // First batch sets [-1, 1]; the second pulls by the constant: -1 + 0.5 * (-3 - -1) = -2, 1 + 0.5 * (5 - 1) = 3.
    auto r = calibrate({{"CalibMovingAverage", true}, {"CalibMovingAverageConstant", 0.5}},
                       {{{2}, {-1.0f, 1.0f}}, {{2}, {-3.0f, 5.0f}}});
    EXPECT_FLOAT_EQ(r.range.min, -2.0f);
    EXPECT_FLOAT_EQ(r.range.max, 3.0f);
}

TEST(MinMax, SymmetricRangeIsCentredOnZero) {
    auto r = calibrate({{"CalibTensorRangeSymmetric", true}}, {{{3}, {-0.5f, 0.25f, 2.0f}}});
    EXPECT_FLOAT_EQ(r.range.min, -2.0f);
    EXPECT_FLOAT_EQ(r.range.max, 2.0f);
}

TEST(MinMax, NonFiniteValuesAreAnError) {
    EXPECT_THROW(calibrate(nullptr, {{{2}, {1.0f, std::numeric_limits<float>::quiet_NaN()}}}), vaiq::InputError);
}

TEST(MinMax, NothingObservedIsAnError) { EXPECT_THROW(calibrate(nullptr, {}), vaiq::InputError); }

TEST(MinMax, RejectsAnAveragingConstantOutsideUnitInterval) {
    try {
        calibrate({{"CalibMovingAverageConstant", 1.5}}, {});
        FAIL() << "configure accepted 1.5";
    } catch (const vaiq::InputError& e) {
        EXPECT_NE(std::string(e.what()).find("CalibMovingAverageConstant must be in (0, 1]"), std::string::npos)
            << e.what();
    }
}

TEST(MinMax, DeclaresItsOptionsWithDocumentedNames) {
    auto registry = vaiq::test::registry_with_test_plugin();
    const auto& info = registry.require(vaiq::PluginKind::Calibrator, "minmax");
    std::vector<std::string> names;
    for (const auto& o : info.options) names.push_back(o.name);
    EXPECT_EQ(names, (std::vector<std::string>{"CalibMovingAverage", "CalibMovingAverageConstant",
                                               "CalibTensorRangeSymmetric"}));
}

TEST(MinMax, ShardStatisticsMergeToTheWholeRangeExactly) {
    // The second shard's first batch is narrower than the first's: order must not matter.
    const auto r = vaiq::test::calibrate_in_shards(
        "minmax", nullptr, {}, {vaiq::test::normal_batches(3, 500, 2.0f, 1), vaiq::test::normal_batches(4, 300, 0.5f, 2)});
    EXPECT_EQ(r.merged.range.min, r.whole.range.min);
    EXPECT_EQ(r.merged.range.max, r.whole.range.max);
}

TEST(MinMax, MovingAverageShardsAreNotMerged) {
    const nlohmann::json options = {{"CalibMovingAverage", true}};
    try {
        vaiq::test::calibrate_in_shards("minmax", options, {},
                                        {vaiq::test::normal_batches(2, 10, 1.0f, 1), vaiq::test::normal_batches(2, 10, 1.0f, 2)});
        FAIL() << "merged two moving averages";
    } catch (const vaiq::InputError& e) {
        EXPECT_NE(std::string(e.what()).find("order of all batches"), std::string::npos) << e.what();
    }
    // One shard (a statistics file reloaded) is fine.
    const auto one = vaiq::test::calibrate_in_shards("minmax", options, {}, {vaiq::test::normal_batches(3, 10, 1.0f, 1)});
    EXPECT_EQ(one.merged.range.max, one.whole.range.max);
}

}  // namespace
