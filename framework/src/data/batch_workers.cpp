#include "data/batch_workers.hpp"

#include <omp.h>

#include <algorithm>
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

size_t run_batches(DataReader& data, int batches, size_t max_batches, const std::function<BatchWork()>& make_work) {
    BatchTurns turns;
    std::mutex reading;
    size_t read = 0;
    bool stop = false;
    std::vector<std::pair<size_t, std::exception_ptr>> failures;
    auto failed = [&](size_t index, std::exception_ptr error) {
        std::lock_guard lock(reading);
        failures.emplace_back(index, std::move(error));
        stop = true;
        turns.fail(index);
    };
    auto worker = [&] {
        BatchWork work;
        try {
            work = make_work();
        } catch (...) {
            return failed(0, std::current_exception());
        }
        while (true) {
            std::optional<Batch> batch;
            size_t index = 0;
            std::exception_ptr unreadable;
            {
                std::lock_guard lock(reading);
                if (stop || (max_batches > 0 && read >= max_batches)) return;
                index = read;
                try {
                    batch = data.next();
                } catch (...) {
                    unreadable = std::current_exception();
                }
                if (!batch) stop = true;
                else ++read;
            }
            if (unreadable) return failed(index, unreadable);
            if (!batch) return;
            try {
                work(index, *batch, turns);
            } catch (const BatchTurns::Stopped&) {
                return;
            } catch (...) {
                return failed(index, std::current_exception());
            }
        }
    };
    if (batches <= 1) {
        worker();
    } else {
        std::vector<std::thread> threads;
        for (int w = 0; w < batches; ++w) threads.emplace_back(worker);
        for (auto& t : threads) t.join();
    }
    if (!failures.empty())
        std::rethrow_exception(
            std::min_element(failures.begin(), failures.end(), [](const auto& a, const auto& b) {
                return a.first < b.first;
            })->second);
    return read;
}

}  // namespace vaiq
