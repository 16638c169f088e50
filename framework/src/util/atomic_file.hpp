// Writing a file so that readers see either the old or the complete new content.
#pragma once

#include <filesystem>
#include <functional>
#include <ostream>

namespace vaiq {

/// Writes through `write` into a temporary file beside `path`, flushes it to
/// disk, then renames it over `path`. On any failure the temporary file is
/// removed, `path` is untouched and the error propagates.
void write_file_atomically(const std::filesystem::path& path, const std::function<void(std::ostream&)>& write);

}  // namespace vaiq
