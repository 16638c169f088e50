// runtime/team_session.hpp - one OpenMP region that serves the parallel loops
// of many steps.
//
// Every OpenMP region costs a few microseconds however little it shares:
// libgomp wakes its threads with a futex system call at each barrier, two a
// region, 3 us for an empty region of two threads on a VM. An int8
// mobilenet_v2 runs about 200 regions an inference of 2-50 us of work each,
// so at two threads it ran slower than at one. In a session the calling
// thread runs the steps while the team's other threads wait, spinning, for
// work it hands them (parallel_for.hpp): a hand-over is a few atomic
// operations. The waiting threads are the region's own, so nothing competes
// with OpenMP's threads for the cores.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>

namespace vaiq::runtime {

class TeamSession {
  public:
    /// Runs body() here, inside one region of `threads` threads (at least 2)
    /// that body's parallel loops share; rethrows what body threw.
    static void run(int threads, const std::function<void()>& body);

    /// The session this thread leads and may hand work to now: not inside
    /// work it was handed itself. Null elsewhere.
    static TeamSession* leading();

    /// The threads of the session, the leading one included.
    int threads() const { return threads_; }

    /// f(t, team) for every t in [0, team) (team <= threads()), t = 0 here and
    /// the others on the session's threads; returns when all are done and
    /// rethrows the first exception any of them threw.
    template <typename F>
    void share(int team, const F& f) {
        share(
            team, [](const void* work, int64_t t, int64_t n) { (*static_cast<const F*>(work))(t, n); },
            static_cast<const void*>(&f));
    }

  private:
    using Call = void (*)(const void* work, int64_t t, int64_t team);
    explicit TeamSession(int threads) : threads_(threads) {}
    void share(int team, Call call, const void* work);
    void serve(int thread);  // a waiting thread's loop, until close()
    void close();
    void publish();  // a new generation: work or closing
    void run_share(int thread, int team);

    int threads_;
    Call call_ = nullptr;
    const void* work_ = nullptr;
    int team_ = 0;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> remaining_{0};
    std::atomic<int> sleeping_{0};
    std::atomic<bool> closing_{false};
    std::mutex failure_mutex_;
    std::exception_ptr failure_;
};

}  // namespace vaiq::runtime
