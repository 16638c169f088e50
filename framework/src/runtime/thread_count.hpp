// runtime/thread_count.hpp - an OpenMP thread count that lasts a scope.
#pragma once

#include <omp.h>

namespace vaiq::runtime {

/// OpenMP's thread count for the calling thread while it lives; the count
/// before it comes back after (a count set and left would hold for everything
/// the thread runs later).
class ThreadCount {
  public:
    explicit ThreadCount(int threads) : restore_(omp_get_max_threads()) { omp_set_num_threads(threads); }
    ~ThreadCount() { omp_set_num_threads(restore_); }
    ThreadCount(const ThreadCount&) = delete;
    ThreadCount& operator=(const ThreadCount&) = delete;

  private:
    int restore_;
};

}  // namespace vaiq::runtime
