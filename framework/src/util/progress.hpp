// A one-line progress bar on stderr, shown only when stderr is a terminal.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace vaiq {

class Progress {
  public:
    /// `enabled` is further limited to an interactive stderr.
    Progress(int total_steps, bool enabled);
    ~Progress();
    Progress(const Progress&) = delete;
    Progress& operator=(const Progress&) = delete;

    /// Starts the next step, labelled.
    void step(std::string_view label);
    /// Clears the bar.
    void done();

  private:
    friend void report_progress(std::string_view what, int64_t done, int64_t total);
    friend class BarAwareSink;
    void draw(std::string_view detail);
    void clear_line();

    int total_;
    int current_ = 0;
    bool enabled_;
    std::string label_;
    std::string line_;  ///< what the bar shows, redrawn below a log message
    std::chrono::steady_clock::time_point last_draw_{};
    // The count being estimated: what, where it started and when (a new
    // what, or a count that goes back, as a second trial's layers, restarts it).
    std::string counting_;
    int64_t counted_from_ = 0, last_done_ = 0;
    std::chrono::steady_clock::time_point counting_since_{};
};

/// What the bar shows for `done` of `total` (0: not known) `what`, `elapsed`
/// after `started` of them were done: with a total, an estimate of the time
/// left at the pace so far ("layer 12/51, about 1 min 20 s left"), once one is
/// done and a second has passed.
std::string progress_detail(std::string_view what, int64_t done, int64_t total, int64_t started,
                            std::chrono::duration<double> elapsed);

/// Progress inside the current step (calibration batches, layers of an
/// algorithm): `done` of `total` (0: not known) `what`. Shown on the active
/// bar, at most ten times a second, with the time left (progress_detail); a
/// no-op when no bar is shown.
void report_progress(std::string_view what, int64_t done, int64_t total = 0);

/// Whether stderr is an interactive terminal.
bool stderr_is_terminal();

/// Makes "vaiq" the default logger: "level: message" lines on stderr (coloured on a
/// terminal), drawn above the progress bar rather than across it.
void install_stderr_logger();

}  // namespace vaiq
