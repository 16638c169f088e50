#include "util/progress.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace vaiq {

bool stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }

Progress::Progress(int total_steps, bool enabled) : total_(total_steps), enabled_(enabled && stderr_is_terminal()) {}

Progress::~Progress() { done(); }

void Progress::step(std::string_view label) {
    ++current_;
    if (!enabled_) return;
    constexpr int kWidth = 24;
    const int filled = total_ > 0 ? kWidth * (current_ - 1) / total_ : 0;
    fmt::print(stderr, "\r[{}{}] {}/{} {:<20}", std::string(filled, '#'), std::string(kWidth - filled, ' '), current_,
               total_, label);
    std::fflush(stderr);
}

void Progress::done() {
    if (!enabled_) return;
    fmt::print(stderr, "\r{:<60}\r", "");
    std::fflush(stderr);
    enabled_ = false;
}

}  // namespace vaiq
