// A team session: one OpenMP region whose threads take work from the thread
// that leads it. Every hand-over reaches every member once, loops split as
// they do outside a session, failures come back to the leader, and waiting
// threads that went to sleep still wake.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "runtime/parallel_for.hpp"
#include "runtime/team_session.hpp"
#include "runtime/thread_count.hpp"

namespace vaiq::runtime {
namespace {

TEST(TeamSession, EveryHandOverReachesEachMemberOnItsOwnThread) {
    std::atomic<int> wrong_thread{0}, wrong_team{0};
    std::vector<std::atomic<int>> runs(3);
    int shares = 0;
    const ThreadCount two(2);
    TeamSession::run(3, [&] {
        auto* session = TeamSession::leading();
        ASSERT_NE(session, nullptr);
        ASSERT_EQ(session->threads(), 3);
        // What the body makes for OpenMP (a oneDNN primitive) is made for the
        // one thread it will run on inside the region.
        EXPECT_EQ(omp_get_max_threads(), 1);
        EXPECT_EQ(team_threads(), 3);
        // Many in a row: a member that lagged behind one would miss or repeat work.
        for (int k = 0; k < 500; ++k, ++shares) {
            const int team = 2 + k % 2;  // teams of two and of all three
            session->share(team, [&](int64_t t, int64_t n) {
                if (omp_get_thread_num() != t) ++wrong_thread;
                if (n != team) ++wrong_team;
                ++runs[static_cast<size_t>(t)];
            });
        }
    });
    EXPECT_EQ(TeamSession::leading(), nullptr);  // only while the body runs
    EXPECT_EQ(omp_get_max_threads(), 2);
    EXPECT_EQ(wrong_thread, 0);
    EXPECT_EQ(wrong_team, 0);
    EXPECT_EQ(runs[0], shares);
    EXPECT_EQ(runs[1], shares);
    EXPECT_EQ(runs[2], shares / 2);  // only in the teams of three
}

TEST(TeamSession, LoopsSplitAsOutsideASessionAndNestedLoopsStayPut) {
    const ThreadCount three(3);
    constexpr int64_t kN = 47;
    auto owners = [] {
        std::vector<int> owner(kN, -1);
        parallel_for(kN, true, [&](int64_t i) { owner[static_cast<size_t>(i)] = omp_get_thread_num(); });
        return owner;
    };
    const auto outside = owners();
    std::vector<int> inside, nested_owner(3 * 10, -1);
    std::atomic<int> nested_elsewhere{0};
    TeamSession::run(3, [&] {
        inside = owners();
        // Small work too: in a session sharing is cheap, so it is shared.
        std::vector<int> small(4, -1);
        parallel_for(4, false, [&](int64_t i) { small[static_cast<size_t>(i)] = omp_get_thread_num(); });
        EXPECT_EQ(small, (std::vector<int>{0, 0, 1, 2}));
        parallel_team(true, [&](int64_t t, int64_t) {
            EXPECT_EQ(TeamSession::leading(), nullptr);  // not to be handed work again
            const int me = omp_get_thread_num();
            parallel_for(10, true, [&](int64_t i) {
                nested_owner[static_cast<size_t>(t * 10 + i)] = omp_get_thread_num();
                if (omp_get_thread_num() != me) ++nested_elsewhere;
            });
        });
    });
    EXPECT_EQ(inside, outside);
    EXPECT_TRUE(std::is_sorted(inside.begin(), inside.end()));
    EXPECT_EQ(inside.front(), 0);
    EXPECT_EQ(inside.back(), 2);
    EXPECT_EQ(nested_elsewhere, 0);
    for (int v : nested_owner) EXPECT_NE(v, -1);
}

TEST(TeamSession, FailuresReachTheLeaderAndTheSessionGoesOn) {
    int after = 0;
    EXPECT_THROW(TeamSession::run(2,
                                  [&] {
                                      auto* session = TeamSession::leading();
                                      for (int k = 0; k < 3; ++k) {
                                          try {
                                              session->share(2, [&](int64_t t, int64_t) {
                                                  if (t == 1) throw std::runtime_error("member");
                                              });
                                          } catch (const std::runtime_error& e) {
                                              EXPECT_STREQ(e.what(), "member");
                                              ++after;
                                          }
                                      }
                                      throw std::logic_error("leader");  // ends the session
                                  }),
                 std::logic_error);
    EXPECT_EQ(after, 3);
    EXPECT_EQ(TeamSession::leading(), nullptr);
}

TEST(TeamSession, MembersAsleepAfterALongGapStillTakeWork) {
    std::atomic<int> members{0};
    TeamSession::run(2, [&] {
        for (int k = 0; k < 3; ++k) {
            // Longer than a member spins before it sleeps.
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
            TeamSession::leading()->share(2, [&](int64_t t, int64_t) {
                if (t == 1) ++members;
            });
        }
    });
    EXPECT_EQ(members, 3);
}

}  // namespace
}  // namespace vaiq::runtime
