// Writing a file so that readers see either the old or the complete new content.
#pragma once

#include <filesystem>
#include <functional>
#include <ostream>
#include <string_view>

namespace vaiq {

/// A file written in full to a temporary beside `path` and flushed to disk,
/// waiting to be moved over `path` by commit(). Removed unless committed. For
/// files that must appear together: write them all, then commit them.
class PendingFile {
  public:
    /// On failure the temporary is removed and the error propagates.
    PendingFile(const std::filesystem::path& path, const std::function<void(std::ostream&)>& write);
    PendingFile(PendingFile&& other) noexcept;
    PendingFile& operator=(PendingFile&&) = delete;
    PendingFile(const PendingFile&) = delete;
    ~PendingFile();
    /// Renames the temporary over the path.
    void commit();

  private:
    std::filesystem::path path_, temp_;
};

/// Writes through `write` into a temporary file beside `path`, flushes it to
/// disk, then renames it over `path`. On any failure the temporary file is
/// removed, `path` is untouched and the error propagates.
void write_file_atomically(const std::filesystem::path& path, const std::function<void(std::ostream&)>& write);

/// A test hook: kills this process (SIGKILL) when the environment's VAIQ_FAILPOINT
/// names `point`, so that a test can stop a write between two renames, a moment
/// no timer hits.
void failpoint(std::string_view point);

}  // namespace vaiq
