#include "data/batch_workers.hpp"

#include <omp.h>

#include <algorithm>
#include <climits>
#include <exception>
#include <optional>
#include <thread>
#include <vector>

namespace vaiq {

void BatchTurns::wait_until(std::unique_lock<std::mutex>& lock, size_t index, const std::function<bool()>& ready) {
    changed_.wait(lock, [&] { return index > failed_ || ready(); });
    if (index > failed_) throw Stopped{};
}

void BatchTurns::await(const std::string& point, size_t index) {
    std::unique_lock lock(mutex_);
    wait_until(lock, index, [&] {
        auto it = passed_.find(point);
        return finished_ >= index || (it != passed_.end() && it->second >= index);
    });
}

void BatchTurns::passed(const std::string& point, size_t index) {
    {
        std::lock_guard lock(mutex_);
        auto& n = passed_[point];
        n = std::max(n, index + 1);
    }
    changed_.notify_all();
}

void BatchTurns::finish(size_t index, const std::function<void()>& finish) {
    {
        std::unique_lock lock(mutex_);
        wait_until(lock, index, [&] { return finished_ == index; });
    }
    // Alone here: every later batch waits for this one to be counted.
    if (finish) finish();
    {
        std::lock_guard lock(mutex_);
        finished_ = index + 1;
    }
    changed_.notify_all();
}

void BatchTurns::fail(size_t index) {
    {
        std::lock_guard lock(mutex_);
        failed_ = std::min(failed_, index);
    }
    changed_.notify_all();
}

BatchThreads batch_threads(int threads, const Model& model) {
    constexpr int kMostAtOnce = 4;
    constexpr int64_t kMostWeightBytes = int64_t{64} << 20;
    const int cores = threads > 0 ? threads : std::max(1, omp_get_max_threads());
    // Counted as float: the executor may hold integer weights in float (exact int8
    // products without VNNI), as resnet50's int8 model does (+300 MB an executor).
    int64_t weight_bytes = 0;
    for (const auto& t : model.graph().initializer()) {
        int64_t count = 1;
        for (auto d : t.dims()) count *= std::max<int64_t>(d, 0);
        weight_bytes += std::max<int64_t>(stored_bytes(static_cast<DataType>(t.data_type()), count),
                                          count * static_cast<int64_t>(sizeof(float)));
    }
    if (cores < 2 || weight_bytes > kMostWeightBytes) return {1, threads};
    const int at_once = std::min(cores, kMostAtOnce);
    return {at_once, std::max(1, cores / at_once)};
}

namespace {

// `at_once` workers (one: on the calling thread), each making its work once and
// then running items until `take` has none: `take(index)` runs under a lock and
// gives item `index` or nothing, `run(work, index, item, turns)` runs unlocked.
// The first failure in the items' order is rethrown once every worker has stopped.
template <typename Work, typename Item>
void run_workers(int at_once, const std::function<Work()>& make_work,
                 const std::function<std::optional<Item>(size_t)>& take,
                 const std::function<void(Work&, size_t, Item&, BatchTurns&)>& run) {
    BatchTurns turns;
    std::mutex taking;
    size_t taken = 0;
    bool stop = false;
    std::vector<std::pair<size_t, std::exception_ptr>> failures;
    auto failed = [&](size_t index, std::exception_ptr error) {
        std::lock_guard lock(taking);
        failures.emplace_back(index, std::move(error));
        stop = true;
        turns.fail(index);
    };
    auto worker = [&] {
        Work work;
        try {
            work = make_work();
        } catch (...) {
            return failed(0, std::current_exception());
        }
        while (true) {
            std::optional<Item> item;
            size_t index = 0;
            std::exception_ptr untaken;
            {
                std::lock_guard lock(taking);
                if (stop) return;
                index = taken;
                try {
                    item = take(index);
                } catch (...) {
                    untaken = std::current_exception();
                }
                if (!item)
                    stop = true;
                else
                    ++taken;
            }
            if (untaken) return failed(index, untaken);
            if (!item) return;
            try {
                run(work, index, *item, turns);
            } catch (const BatchTurns::Stopped&) {
                return;
            } catch (...) {
                return failed(index, std::current_exception());
            }
        }
    };
    if (at_once <= 1) {
        worker();
    } else {
        std::vector<std::thread> threads;
        for (int w = 0; w < at_once; ++w) threads.emplace_back(worker);
        for (auto& t : threads) t.join();
    }
    if (!failures.empty())
        std::rethrow_exception(
            std::min_element(failures.begin(), failures.end(), [](const auto& a, const auto& b) {
                return a.first < b.first;
            })->second);
}

}  // namespace

size_t run_batches(DataReader& data, int batches, size_t max_batches, const std::function<BatchWork()>& make_work) {
    size_t read = 0;
    run_workers<BatchWork, Batch>(
        batches, make_work,
        [&](size_t index) -> std::optional<Batch> {
            if (max_batches > 0 && index >= max_batches) return std::nullopt;
            auto batch = data.next();
            if (batch) read = index + 1;
            return batch;
        },
        [](BatchWork& work, size_t index, Batch& batch, BatchTurns& turns) { work(index, batch, turns); });
    return read;
}

void run_items(size_t count, int at_once, const std::function<ItemWork()>& make_work) {
    run_workers<ItemWork, size_t>(
        std::clamp(static_cast<int>(std::min<size_t>(count, INT_MAX)), 1, std::max(at_once, 1)), make_work,
        [&](size_t index) { return index < count ? std::optional<size_t>(index) : std::nullopt; },
        [](ItemWork& work, size_t index, size_t&, BatchTurns& turns) { work(index, turns); });
}

}  // namespace vaiq
