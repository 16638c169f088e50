// Batches run several at a time but finish, and pass each named point, in the
// data's order; the first failure in that order is the one reported.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "data/batch_workers.hpp"
#include "vaiq/error.hpp"

namespace {

using vaiq::Batch;
using vaiq::BatchTurns;
using vaiq::BatchWork;

// `count` batches named by their index; reading batch `unreadable` throws.
class CountingReader final : public vaiq::DataReader {
  public:
    explicit CountingReader(size_t count, size_t unreadable = SIZE_MAX) : count_(count), unreadable_(unreadable) {}
    std::optional<Batch> next() override {
        if (given_ == unreadable_) throw vaiq::InputError("batch " + std::to_string(given_) + " is unreadable");
        if (given_ >= count_) return std::nullopt;
        return Batch{{}, std::to_string(given_++)};
    }
    void rewind() override { given_ = 0; }
    size_t items() const override { return count_; }

  private:
    size_t count_, unreadable_, given_ = 0;
};

// Earlier batches take longer, so later ones reach every turn first.
void stall(size_t index) { std::this_thread::sleep_for(std::chrono::milliseconds(2 * (index % 4 == 0 ? 4 : 1))); }

TEST(BatchWorkers, BatchesPassPointsAndFinishInTheDataOrderWhileSeveralRun) {
    CountingReader data(24);
    std::mutex mutex;
    std::vector<size_t> at_point, finished;
    std::atomic<int> running{0}, most_running{0};
    const size_t read = vaiq::run_batches(data, 4, 0, [&]() -> BatchWork {
        return [&](size_t index, const Batch& batch, BatchTurns& turns) {
            EXPECT_EQ(batch.source, std::to_string(index));
            const int now = ++running;
            for (int seen = most_running; now > seen && !most_running.compare_exchange_weak(seen, now);) {
            }
            stall(index);
            turns.await("p", index);
            {
                std::lock_guard lock(mutex);
                at_point.push_back(index);
            }
            turns.passed("p", index);
            stall(index + 1);
            turns.finish(index, [&] { finished.push_back(index); });
            --running;
        };
    });
    EXPECT_EQ(read, 24u);
    std::vector<size_t> in_order(24);
    for (size_t i = 0; i < in_order.size(); ++i) in_order[i] = i;
    EXPECT_EQ(at_point, in_order);
    EXPECT_EQ(finished, in_order);
    EXPECT_GT(most_running.load(), 1) << "batches ran one at a time";
}

TEST(BatchWorkers, ABatchThatSkipsAPointLetsTheNextPassOnceItFinishes) {
    CountingReader data(6);
    std::vector<size_t> at_point;
    vaiq::run_batches(data, 3, 0, [&]() -> BatchWork {
        return [&](size_t index, const Batch&, BatchTurns& turns) {
            if (index % 2 == 0) {  // odd batches never reach the point
                turns.await("p", index);
                at_point.push_back(index);
                turns.passed("p", index);
            }
            turns.finish(index, {});
        };
    });
    EXPECT_EQ(at_point, (std::vector<size_t>{0, 2, 4}));
}

TEST(BatchWorkers, TheFirstFailureInTheDataOrderIsReportedAndLaterBatchesStop) {
    CountingReader data(40);
    std::vector<size_t> finished;
    try {
        vaiq::run_batches(data, 4, 0, [&]() -> BatchWork {
            return [&](size_t index, const Batch&, BatchTurns& turns) {
                if (index == 6) throw std::runtime_error("six");  // at once
                if (index == 5) {                                 // later, but first in the data's order
                    std::this_thread::sleep_for(std::chrono::milliseconds(30));
                    throw std::runtime_error("five");
                }
                turns.finish(index, [&] { finished.push_back(index); });
            };
        });
        FAIL() << "no failure reported";
    } catch (const std::runtime_error& e) {
        EXPECT_STREQ(e.what(), "five");
    }
    EXPECT_EQ(finished, (std::vector<size_t>{0, 1, 2, 3, 4}));
}

TEST(BatchWorkers, AnUnreadableBatchIsReportedAfterTheBatchesBeforeIt) {
    CountingReader data(10, 7);
    std::vector<size_t> finished;
    try {
        vaiq::run_batches(data, 2, 0, [&]() -> BatchWork {
            return [&](size_t index, const Batch&, BatchTurns& turns) {
                stall(index);
                turns.finish(index, [&] { finished.push_back(index); });
            };
        });
        FAIL() << "no failure reported";
    } catch (const vaiq::InputError& e) {
        EXPECT_STREQ(e.what(), "batch 7 is unreadable");
    }
    EXPECT_EQ(finished, (std::vector<size_t>{0, 1, 2, 3, 4, 5, 6}));
}

TEST(BatchWorkers, OneAtATimeRunsOnTheCallingThreadUpToTheLimit) {
    CountingReader data(10);
    const auto caller = std::this_thread::get_id();
    size_t ran = 0;
    EXPECT_EQ(vaiq::run_batches(data, 1, 3, [&]() -> BatchWork {
                  EXPECT_EQ(std::this_thread::get_id(), caller);
                  return [&](size_t index, const Batch&, BatchTurns& turns) {
                      EXPECT_EQ(std::this_thread::get_id(), caller);
                      turns.finish(index, [&] { ++ran; });
                  };
              }),
              3u);
    EXPECT_EQ(ran, 3u);
}

TEST(BatchWorkers, EachWorkerMakesItsWorkOnItsOwnThread) {
    CountingReader data(8);
    std::mutex mutex;
    std::set<std::thread::id> makers;
    vaiq::run_batches(data, 3, 0, [&]() -> BatchWork {
        const auto maker = std::this_thread::get_id();
        {
            std::lock_guard lock(mutex);
            makers.insert(maker);
        }
        return [&, maker](size_t index, const Batch&, BatchTurns& turns) {
            EXPECT_EQ(std::this_thread::get_id(), maker) << "work ran away from the thread that made it";
            turns.finish(index, {});
        };
    });
    EXPECT_EQ(makers.size(), 3u);
    EXPECT_EQ(makers.count(std::this_thread::get_id()), 0u);
}

// Items the caller holds (batches already in memory) run as batches do: every
// item once, points passed in their order, no more workers than items.
TEST(BatchWorkers, ItemsInMemoryRunOnceEachAndPassPointsInOrder) {
    std::mutex mutex;
    std::vector<size_t> at_point;
    std::set<std::thread::id> makers;
    vaiq::run_items(7, 3, [&]() -> vaiq::ItemWork {
        {
            std::lock_guard lock(mutex);
            makers.insert(std::this_thread::get_id());
        }
        return [&](size_t index, BatchTurns& turns) {
            stall(index);
            turns.await("p", index);
            at_point.push_back(index);
            turns.passed("p", index);
            turns.finish(index, {});
        };
    });
    EXPECT_EQ(at_point, (std::vector<size_t>{0, 1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(makers.size(), 3u);
    makers.clear();
    size_t ran = 0;
    vaiq::run_items(1, 4, [&]() -> vaiq::ItemWork {
        makers.insert(std::this_thread::get_id());
        return [&](size_t, BatchTurns&) { ++ran; };
    });
    EXPECT_EQ(ran, 1u);
    EXPECT_EQ(makers, std::set<std::thread::id>{std::this_thread::get_id()}) << "one item: one worker, this thread";
    vaiq::run_items(0, 2, [&]() -> vaiq::ItemWork { return [&](size_t, BatchTurns&) { ++ran; }; });
    EXPECT_EQ(ran, 1u) << "no items: nothing runs";
}

}  // namespace
