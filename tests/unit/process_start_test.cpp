// When the command line starts again: OpenMP's idle threads spinning briefly.
#include <gtest/gtest.h>

#include "util/process_start.hpp"

using vaiq::openmp_spin_count;

TEST(OpenMpWait, IdleThreadsSpinBrieflyUnlessTheUserChoseHowTheyWait) {
    EXPECT_EQ(openmp_spin_count(nullptr, nullptr), "5000");
    EXPECT_EQ(openmp_spin_count("passive", nullptr), std::nullopt);
    EXPECT_EQ(openmp_spin_count("active", nullptr), std::nullopt);
    EXPECT_EQ(openmp_spin_count(nullptr, "300000"), std::nullopt);
}
