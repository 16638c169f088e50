#include "util/progress.hpp"

#include <fmt/format.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <memory>
#include <mutex>

#include <atomic>
#include <cmath>
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
    counting_.clear();
    draw("");
}

void Progress::draw(std::string_view detail) {
    if (!enabled_) return;
    constexpr int kWidth = 24;
    const int filled = total_ > 0 ? kWidth * (current_ - 1) / total_ : 0;
    line_ = fmt::format("[{}{}] {}/{} {:<44}", std::string(filled, '#'), std::string(kWidth - filled, ' '), current_,
                        total_, detail.empty() ? label_ : fmt::format("{}: {}", label_, detail));
    fmt::print(stderr, "\r{}", line_);
    std::fflush(stderr);
    last_draw_ = std::chrono::steady_clock::now();
}

void Progress::clear_line() {
    fmt::print(stderr, "\r{:<{}}\r", "", line_.size());
    std::fflush(stderr);
}

void Progress::done() {
    if (!enabled_) return;
    clear_line();
    enabled_ = false;
    Progress* self = this;
    active.compare_exchange_strong(self, nullptr);
}

std::string progress_detail(std::string_view what, int64_t done, int64_t total, int64_t started,
                            std::chrono::duration<double> elapsed) {
    if (total <= 0) return fmt::format("{} {}", what, done);
    const std::string count = fmt::format("{} {}/{}", what, done, total);
    if (done <= started || done >= total || elapsed.count() < 1) return count;
    const auto left = static_cast<int64_t>(
        std::ceil(elapsed.count() / static_cast<double>(done - started) * static_cast<double>(total - done)));
    if (left < 60) return fmt::format("{}, about {} s left", count, left);
    if (left < 3600) return fmt::format("{}, about {} min {} s left", count, left / 60, left % 60);
    return fmt::format("{}, about {} h {} min left", count, left / 3600, left % 3600 / 60);
}

void report_progress(std::string_view what, int64_t done, int64_t total) {
    Progress* bar = active.load();
    if (!bar || !bar->enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (what != bar->counting_ || done < bar->last_done_) {
        bar->counting_ = what;
        bar->counted_from_ = done;
        bar->counting_since_ = now;
    }
    bar->last_done_ = done;
    const bool last = total > 0 && done >= total;
    if (!last && now - bar->last_draw_ < std::chrono::milliseconds(100)) return;
    bar->draw(progress_detail(what, done, total, bar->counted_from_, now - bar->counting_since_));
}

// Log lines go above the bar: the bar is cleared, the line written, the bar redrawn.
class BarAwareSink final : public spdlog::sinks::base_sink<std::mutex> {
  public:
    BarAwareSink() : out_(std::make_unique<spdlog::sinks::stderr_color_sink_st>()) {}

  protected:
    void sink_it_(const spdlog::details::log_msg& msg) override {
        Progress* bar = active.load();
        const bool shown = bar && bar->enabled_ && !bar->line_.empty();
        if (shown) bar->clear_line();
        out_->log(msg);
        out_->flush();
        if (shown) {
            fmt::print(stderr, "\r{}", bar->line_);
            std::fflush(stderr);
        }
    }
    void flush_() override { out_->flush(); }
    void set_pattern_(const std::string& pattern) override { out_->set_pattern(pattern); }
    void set_formatter_(std::unique_ptr<spdlog::formatter> formatter) override {
        out_->set_formatter(std::move(formatter));
    }

  private:
    std::unique_ptr<spdlog::sinks::stderr_color_sink_st> out_;
};

void install_stderr_logger() {
    if (auto existing = spdlog::get("vaiq")) {
        spdlog::set_default_logger(existing);
        return;
    }
    auto logger = std::make_shared<spdlog::logger>("vaiq", std::make_shared<BarAwareSink>());
    logger->set_pattern("%^%l%$: %v");
    spdlog::register_logger(logger);
    spdlog::set_default_logger(logger);
}

}  // namespace vaiq
