#include "util/progress.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>

namespace vaiq {

namespace {
// The bar being shown: one run at a time draws on a terminal.
std::atomic<Progress*> active{nullptr};
}  // namespace

bool stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }

Progress::Progress(int total_steps, bool enabled) : total_(total_steps), enabled_(enabled && stderr_is_terminal()) {
    Progress* none = nullptr;
    if (enabled_ && !active.compare_exchange_strong(none, this)) enabled_ = false;  // an outer bar is showing
}

Progress::~Progress() { done(); }

void Progress::step(std::string_view label) {
    ++current_;
    label_ = label;
    draw("");
}

void Progress::draw(std::string_view detail) {
    if (!enabled_) return;
    constexpr int kWidth = 24;
    const int filled = total_ > 0 ? kWidth * (current_ - 1) / total_ : 0;
    fmt::print(stderr, "\r[{}{}] {}/{} {:<44}", std::string(filled, '#'), std::string(kWidth - filled, ' '), current_,
               total_, detail.empty() ? label_ : fmt::format("{}: {}", label_, detail));
    std::fflush(stderr);
    last_draw_ = std::chrono::steady_clock::now();
}

void Progress::done() {
    if (!enabled_) return;
    fmt::print(stderr, "\r{:<80}\r", "");
    std::fflush(stderr);
    enabled_ = false;
    Progress* self = this;
    active.compare_exchange_strong(self, nullptr);
}

void report_progress(std::string_view what, int64_t done, int64_t total) {
    Progress* bar = active.load();
    if (!bar || !bar->enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    const bool last = total > 0 && done >= total;
    if (!last && now - bar->last_draw_ < std::chrono::milliseconds(100)) return;
    bar->draw(total > 0 ? fmt::format("{} {}/{}", what, done, total) : fmt::format("{} {}", what, done));
}

}  // namespace vaiq
