#include <gtest/gtest.h>

#include <cmath>

#include "test_support.hpp"
#include "vaiq/calibrator.hpp"

namespace {

vaiq::CalibrationResult calibrate(const nlohmann::json& options, const std::vector<float>& values,
                                  vaiq::QuantType type = vaiq::QuantType::QInt8) {
    auto registry = vaiq::test::registry_with_test_plugin();
    const auto& info = registry.require(vaiq::PluginKind::Calibrator, "nonoverflow");
    auto calibrator = registry.create<vaiq::Calibrator>("nonoverflow", registry.resolve_options(info, options));
    vaiq::QuantSpec spec;
    spec.type = type;
    spec.symmetric = true;
    auto observer = calibrator->make_observer("t", spec);
    const std::vector<int64_t> shape{static_cast<int64_t>(values.size())};
    observer->observe({shape, values});
    return observer->result();
}

TEST(NonOverflow, RoundsThePositionToNearestLikeTheAnchors) {
    // |x| max 3.0, symmetric int8: scale 3/127 = 0.0236, -log2 = 5.40 -> 5 (scale 1/32; 127/32 = 3.97 covers 3).
    auto r = calibrate(nullptr, {-1.0f, 3.0f});
    EXPECT_EQ(r.position, 5);
    EXPECT_EQ(r.range.min, -3.0f) << "symmetric by default for power-of-two methods";
    // |x| max 2.2: scale 0.01732, -log2 = 5.85 -> 6: 127/64 = 1.98 < 2.2, the largest values clip.
    r = calibrate(nullptr, {2.2f});
    EXPECT_EQ(r.position, 6);
}

TEST(NonOverflow, StrictNeverClips) {
    const auto r = calibrate({{"strict", true}}, {2.2f});
    EXPECT_EQ(r.position, 5);
    EXPECT_GE(127.0 * std::ldexp(1.0, -*r.position), 2.2);
}

}  // namespace
