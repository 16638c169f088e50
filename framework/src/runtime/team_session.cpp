#include "runtime/team_session.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "runtime/thread_count.hpp"

namespace vaiq::runtime {

namespace {

thread_local TeamSession* led = nullptr;  ///< the session this thread leads, while it may hand out work

// One turn of a wait on memory another thread writes: a hint to the core at
// first, then the core given up to any other thread that wants it (more
// threads than cores: the one being waited for may be among them).
inline void spin_pause(int turn) {
    if (turn > 1024) {
        std::this_thread::yield();
        return;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

// How long a waiting thread spins before it sleeps: the gaps between a
// session's loops are microseconds; a step with no loop at all (a oneDNN
// matrix product running alone) may take milliseconds, and a core spinning
// through it would be taken from anything else this process or another runs.
constexpr auto kSpinFor = std::chrono::microseconds(200);

}  // namespace

TeamSession* TeamSession::leading() { return led; }

void TeamSession::run(int threads, const std::function<void()>& body) {
    TeamSession session(threads);
    std::exception_ptr failed;
#pragma omp parallel num_threads(threads)
    {
        const int thread = omp_get_thread_num();
        if (thread == 0) {
            session.threads_ = omp_get_num_threads();  // OpenMP may give fewer
            // Whatever body makes for OpenMP's threads runs on one here (a oneDNN
            // primitive inside a region): made for more, a reorder of int8
            // weights summed its compensation over threads that never ran.
            const ThreadCount one(1);
            led = &session;
            try {
                body();
            } catch (...) {
                failed = std::current_exception();
            }
            led = nullptr;
            session.close();
        } else {
            session.serve(thread);
        }
    }
    if (failed) std::rethrow_exception(failed);
}

void TeamSession::publish() {
    // Sequentially consistent with the waiters' count and wait (see serve): a
    // waiter going to sleep either sees the new generation or is counted here.
    generation_.fetch_add(1);
    if (sleeping_.load() > 0) generation_.notify_all();
}

void TeamSession::close() {
    closing_.store(true, std::memory_order_relaxed);
    publish();
}

void TeamSession::run_share(int thread, int team) {
    try {
        call_(work_, thread, team);
    } catch (...) {
        std::lock_guard lock(failure_mutex_);
        if (!failure_) failure_ = std::current_exception();
    }
}

void TeamSession::share(int team, Call call, const void* work) {
    team = std::clamp(team, 1, threads_);  // no share for a thread OpenMP did not give
    call_ = call;
    work_ = work;
    team_ = team;
    // Every waiting thread answers every hand-over, those outside the team at
    // once: none can lag behind and read the next one's fields as this one's.
    remaining_.store(threads_ - 1, std::memory_order_relaxed);
    publish();
    led = nullptr;  // loops inside the work run where they are
    run_share(0, team);
    led = this;
    for (int turn = 1; remaining_.load(std::memory_order_acquire) > 0; ++turn) spin_pause(turn);
    if (failure_) {
        auto failure = std::exchange(failure_, nullptr);
        std::rethrow_exception(failure);
    }
}

void TeamSession::serve(int thread) {
    uint64_t seen = 0;
    while (true) {
        uint64_t now = generation_.load(std::memory_order_acquire);
        const auto until = std::chrono::steady_clock::now() + kSpinFor;
        for (int i = 1; now == seen; ++i) {
            if (i % 256 == 0 && std::chrono::steady_clock::now() > until) {
                sleeping_.fetch_add(1);
                generation_.wait(seen);
                sleeping_.fetch_sub(1);
            } else {
                spin_pause(i);
            }
            now = generation_.load(std::memory_order_acquire);
        }
        seen = now;
        if (closing_.load(std::memory_order_relaxed)) return;
        if (thread < team_) run_share(thread, team_);
        remaining_.fetch_sub(1, std::memory_order_release);
    }
}

}  // namespace vaiq::runtime
