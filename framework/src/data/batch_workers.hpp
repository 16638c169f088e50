// Batches run on several threads at once, finished in the data's order.
//
// A model at batch 1 leaves cores idle inside and between its operators (a
// 2-thread inference of mobilenet_v2 takes 0.6 of a 1-thread one, not 0.5),
// while two batches at a time, one thread each, keep them busy. What the
// batches feed (observers, metric sums, outputs put aside) must still see them
// in the data's order, as a serial run would, so that results never depend on
// timing: a batch waits at each named point (a tapped tensor) until every
// earlier batch has passed it or finished, and finishes only after every
// earlier batch has.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <unordered_map>

#include "data/data_reader.hpp"
#include "vaiq/model.hpp"

namespace vaiq {

/// Turn-taking of the batches in flight (see above).
class BatchTurns {
  public:
    /// Blocks until every batch before `index` has passed `point` or finished.
    void await(const std::string& point, size_t index);
    /// Batch `index` has passed `point`.
    void passed(const std::string& point, size_t index);
    /// Blocks until every batch before `index` has finished, runs `finish`,
    /// then counts batch `index` finished.
    void finish(size_t index, const std::function<void()>& finish);

    /// Batch `index` failed: later batches stop at their next turn.
    void fail(size_t index);
    /// Thrown by a turn of a batch after one that failed.
    struct Stopped {};

  private:
    void wait_until(std::unique_lock<std::mutex>& lock, size_t index, const std::function<bool()>& ready);

    std::mutex mutex_;
    std::condition_variable changed_;
    std::unordered_map<std::string, size_t> passed_;  ///< per point: how many batches have passed it
    size_t finished_ = 0;                              ///< batches finished, all before the unfinished ones
    size_t failed_ = std::numeric_limits<size_t>::max();
};

/// How the threads of a run are split: batches at once, and each one's threads.
struct BatchThreads {
    int batches = 1;
    int threads_each = 0;  ///< 0: every core
};

/// For `threads` (0: every core): one batch per thread, up to four at once,
/// for a model of up to 64 MB of weights counted as float; a bigger one runs a
/// batch at a time on every thread. Each batch's executor holds its own
/// prepared weights and buffers (one more executor: mobilenet_v2 +60-85 MB,
/// resnet50 +300-480 MB), and the bigger models scale well over threads
/// anyway (resnet50: about 5 % faster at two batches at once).
BatchThreads batch_threads(int threads, const Model& model);

/// One worker's work on a batch it took; made on the worker's thread.
using BatchWork = std::function<void(size_t index, const Batch& batch, BatchTurns& turns)>;

/// Reads batches from `data` where it stands (`max_batches` 0: to its end) and
/// runs them `batches` at a time. Each worker thread calls `make_work()` once
/// (so that its executor is made where it runs: oneDNN's primitives must run
/// on the thread that created them) and then the work for each batch it takes.
/// With one batch at a time everything runs on the calling thread. The first
/// failure in the data's order is rethrown once every worker has stopped.
/// Returns how many batches were read.
size_t run_batches(DataReader& data, int batches, size_t max_batches, const std::function<BatchWork()>& make_work);

/// One worker's work on item `index` of those a caller holds (batches already in memory).
using ItemWork = std::function<void(size_t index, BatchTurns& turns)>;

/// run_batches() over items 0 .. count - 1, `at_once` at a time (at most one a worker).
void run_items(size_t count, int at_once, const std::function<ItemWork()>& make_work);

}  // namespace vaiq
