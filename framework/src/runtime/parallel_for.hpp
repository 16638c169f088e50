// runtime/parallel_for.hpp - loops over OpenMP threads that cost nothing when
// they run on one.
#pragma once

#include <algorithm>
#include <cstdint>

#include <omp.h>

namespace vaiq::runtime {

/// Whether a parallel region entered here would get more than one thread:
/// the thread count allows it and no enclosing team already shares the work.
inline bool team_possible() { return omp_get_max_threads() > 1 && !omp_in_parallel(); }

// A region that gets one thread is not free: libgomp ends every team, even a
// team of one (an `if` clause that is false, a thread count of one, a region
// nested in a team), with a barrier whose release is a futex system call:
// 1.2 us a region on a VM, about 200 regions an inference of mobilenet_v2. So
// these run the work here, outside OpenMP, unless a team can share it.

/// f(i) for i in [0, n): shared over the threads when `worth` (the work is big
/// enough) and a team is possible, else here in order. Statically, thread t
/// taking the t-th contiguous share: then successive layers split their rows
/// alike, and a thread reads mostly what it wrote itself (reading 512 KB
/// another core wrote took 5 times as long as reading its own, on a VM).
template <typename F>
void parallel_for(int64_t n, bool worth, F&& f) {
    if (worth && n > 1 && team_possible()) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) f(i);
    } else {
        for (int64_t i = 0; i < n; ++i) f(i);
    }
}

/// f(begin, end) over [0, count) in pieces of `piece` values, a piece a
/// thread at a time (parallel_for over the pieces).
template <typename F>
void parallel_for_pieces(int64_t count, int64_t piece, bool worth, F&& f) {
    const int64_t pieces = (count + piece - 1) / piece;
    parallel_for(pieces, worth, [&](int64_t k) { f(k * piece, std::min(count, (k + 1) * piece)); });
}

/// f(thread, threads) on every thread of a team when `worth` and a team is
/// possible, else f(0, 1) here: for work that keeps buffers a thread. The
/// team has at most `most` threads (0: the thread count).
template <typename F>
void parallel_team(bool worth, F&& f, int most = 0) {
    if (worth && team_possible()) {
#pragma omp parallel num_threads(most > 0 ? std::min(most, omp_get_max_threads()) : omp_get_max_threads())
        f(static_cast<int64_t>(omp_get_thread_num()), static_cast<int64_t>(omp_get_num_threads()));
    } else {
        f(int64_t{0}, int64_t{1});
    }
}

}  // namespace vaiq::runtime
