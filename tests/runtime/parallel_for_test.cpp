// The kernels' parallel loops: every index once, a team only where one can
// share the work, and no OpenMP region at all where it cannot (a team of one
// costs a system call).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "runtime/parallel_for.hpp"
#include "runtime/thread_count.hpp"

namespace vaiq::runtime {
namespace {

// What parallel_for saw: each index's visits, and the deepest OpenMP level any
// call ran at (0: outside every region, a region of one thread included).
struct Seen {
    explicit Seen(int64_t n) : visits(static_cast<size_t>(n)) {}
    std::vector<std::atomic<int>> visits;
    std::atomic<int> deepest{0}, widest{0};
    void visit(int64_t i) {
        ++visits[static_cast<size_t>(i)];
        deepest = std::max(deepest.load(), omp_get_level());
        widest = std::max(widest.load(), omp_get_num_threads());
    }
    bool each_once() const {
        for (const auto& v : visits)
            if (v != 1) return false;
        return true;
    }
};

TEST(ParallelFor, OneThreadRunsTheLoopOutsideOpenMP) {
    const ThreadCount one(1);
    Seen seen(100), pieces(100);
    parallel_for(100, true, [&](int64_t i) { seen.visit(i); });
    parallel_for_pieces(100, 7, true, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) pieces.visit(i);
    });
    for (const Seen* s : {&seen, &pieces}) {
        EXPECT_TRUE(s->each_once());
        EXPECT_EQ(s->deepest, 0);  // an `if (false)` region would be level 1
    }
    int calls = 0;
    parallel_team(true, [&](int64_t thread, int64_t threads) {
        ++calls;
        EXPECT_EQ(thread, 0);
        EXPECT_EQ(threads, 1);
        EXPECT_EQ(omp_get_level(), 0);
    });
    EXPECT_EQ(calls, 1);
}

TEST(ParallelFor, WorkTooSmallRunsOutsideOpenMPAndBigWorkGetsATeam) {
    const ThreadCount three(3);
    Seen small(50), big(50);
    parallel_for(50, false, [&](int64_t i) { small.visit(i); });
    EXPECT_TRUE(small.each_once());
    EXPECT_EQ(small.deepest, 0);
    std::vector<int> owner(50, -1);
    parallel_for(50, true, [&](int64_t i) {
        big.visit(i);
        owner[static_cast<size_t>(i)] = omp_get_thread_num();
    });
    EXPECT_TRUE(big.each_once());
    EXPECT_EQ(big.deepest, 1);
    EXPECT_EQ(big.widest, 3);
    // Contiguous shares in thread order, as the next layer's loop will split its rows.
    EXPECT_TRUE(std::is_sorted(owner.begin(), owner.end()));
    EXPECT_EQ(owner.front(), 0);
    EXPECT_EQ(owner.back(), 2);
    std::atomic<int> members{0}, covered{0};
    parallel_team(true, [&](int64_t thread, int64_t threads) {
        ++members;
        EXPECT_EQ(threads, 3);
        for (int64_t r = 30 * thread / threads; r < 30 * (thread + 1) / threads; ++r) ++covered;
    });
    EXPECT_EQ(members, 3);
    EXPECT_EQ(covered, 30);
    std::atomic<int> capped{0};
    parallel_team(
        true,
        [&](int64_t, int64_t threads) {
            ++capped;
            EXPECT_EQ(threads, 2);
        },
        2);
    EXPECT_EQ(capped, 2);  // at most the two asked for
}

TEST(ParallelFor, InsideATeamTheLoopRunsOnTheCallingThread) {
    const ThreadCount two(2);
    std::atomic<int> nested_levels{0}, done{0};
#pragma omp parallel num_threads(2)
    {
        Seen seen(40);
        parallel_for(40, true, [&](int64_t i) { seen.visit(i); });
        if (seen.each_once() && seen.deepest == 1 && seen.widest == 2) ++done;
        nested_levels = std::max(nested_levels.load(), seen.deepest.load());
    }
    EXPECT_EQ(done, 2);
    EXPECT_EQ(nested_levels, 1);  // no nested region
}

}  // namespace
}  // namespace vaiq::runtime
