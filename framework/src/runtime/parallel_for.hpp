// runtime/parallel_for.hpp - loops over OpenMP threads that cost nothing when
// they run on one, and little inside a TeamSession.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include <omp.h>

#include "runtime/team_session.hpp"

namespace vaiq::runtime {

/// The threads a loop started here would share: the session's, when this
/// thread leads one (see team_session.hpp), else OpenMP's thread count, or 1
/// inside a team that already shares the work.
inline int team_threads() {
    if (const auto* session = TeamSession::leading()) return session->threads();
    return omp_in_parallel() ? 1 : omp_get_max_threads();
}

/// Whether a loop started here could be shared by more than one thread.
inline bool team_possible() { return team_threads() > 1; }

/// The t-th of `team` contiguous shares of [0, n): OpenMP's static schedule
/// (the first n % team shares one longer), so that loops split alike in a
/// session and outside one.
inline std::pair<int64_t, int64_t> share_of(int64_t n, int64_t t, int64_t team) {
    const int64_t base = n / team, longer = n % team;
    const int64_t begin = t * base + std::min(t, longer);
    return {begin, begin + base + (t < longer ? 1 : 0)};
}

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
    // In a session sharing costs less than leaving the other thread's share of
    // this layer's output to be read across cores by the next layer: `worth`
    // does not count there.
    worth = worth || TeamSession::leading();
    if (!(worth && n > 1 && team_possible())) {
        for (int64_t i = 0; i < n; ++i) f(i);
    } else if (auto* session = TeamSession::leading()) {
        session->share(static_cast<int>(std::min<int64_t>(n, session->threads())), [&](int64_t t, int64_t team) {
            const auto [begin, end] = share_of(n, t, team);
            for (int64_t i = begin; i < end; ++i) f(i);
        });
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) f(i);
    }
}

/// f(begin, end) over [0, count) in pieces of at most `piece` values, a piece
/// a thread at a time (parallel_for over the pieces). The pieces are alike and
/// as many as a multiple of the threads, so that every thread gets an equal
/// contiguous share (as the next layer's rows split).
template <typename F>
void parallel_for_pieces(int64_t count, int64_t piece, bool worth, F&& f) {
    const int64_t threads = std::max(1, team_threads());
    const int64_t pieces = (count + piece * threads - 1) / (piece * threads) * threads;
    const int64_t size = std::max<int64_t>(1, (count + pieces - 1) / pieces);
    parallel_for((count + size - 1) / size, worth, [&](int64_t k) { f(k * size, std::min(count, (k + 1) * size)); });
}

/// f(thread, threads) on every thread of a team when `worth` and a team is
/// possible, else f(0, 1) here: for work that keeps buffers a thread. The
/// team has at most `most` threads (0: the thread count).
template <typename F>
void parallel_team(bool worth, F&& f, int most = 0) {
    worth = worth || TeamSession::leading();  // as in parallel_for
    const int threads = most > 0 ? std::min(most, team_threads()) : team_threads();
    if (!(worth && threads > 1)) {
        f(int64_t{0}, int64_t{1});
    } else if (auto* session = TeamSession::leading()) {
        session->share(threads, f);
    } else {
#pragma omp parallel num_threads(threads)
        f(static_cast<int64_t>(omp_get_thread_num()), static_cast<int64_t>(omp_get_num_threads()));
    }
}

}  // namespace vaiq::runtime
