// The progress bar's estimate of the time left.
#include <gtest/gtest.h>

#include "util/progress.hpp"

using vaiq::progress_detail;
using Seconds = std::chrono::duration<double>;

namespace {

TEST(ProgressDetail, EstimatesTheTimeLeftAtThePaceSoFar) {
    // 10 of 50 in 20 s from 0: 2 s each, 40 to go.
    EXPECT_EQ(progress_detail("layer", 10, 50, 0, Seconds(20)), "layer 10/50, about 1 min 20 s left");
    // Counted from 5: 5 done in 10 s, 40 to go.
    EXPECT_EQ(progress_detail("layer", 10, 50, 5, Seconds(10)), "layer 10/50, about 1 min 20 s left");
    EXPECT_EQ(progress_detail("batch", 3, 4, 0, Seconds(6)), "batch 3/4, about 2 s left");
    EXPECT_EQ(progress_detail("candidate", 1, 3000, 0, Seconds(10)), "candidate 1/3000, about 8 h 19 min left");
}

TEST(ProgressDetail, GivesNoEstimateItCannotMake) {
    EXPECT_EQ(progress_detail("batch", 7, 0, 0, Seconds(30)), "batch 7") << "no total";
    EXPECT_EQ(progress_detail("layer", 5, 50, 5, Seconds(30)), "layer 5/50") << "none done since counting began";
    EXPECT_EQ(progress_detail("layer", 2, 50, 0, Seconds(0.5)), "layer 2/50") << "too soon to tell";
    EXPECT_EQ(progress_detail("layer", 50, 50, 0, Seconds(30)), "layer 50/50") << "the last";
}

}  // namespace
