// A one-line progress bar on stderr, shown only when stderr is a terminal.
#pragma once

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
    int total_;
    int current_ = 0;
    bool enabled_;
};

/// Whether stderr is an interactive terminal.
bool stderr_is_terminal();

}  // namespace vaiq
