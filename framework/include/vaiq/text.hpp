// vaiq/text.hpp - small text helpers for error messages, as the host words them.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "vaiq/export.hpp"

namespace vaiq {

/// The candidate closest to `word` if it is close enough to be a likely typo
/// (edit distance, case-insensitive), else "".
VAIQ_API std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

/// "; did you mean 'x'?" or "".
VAIQ_API std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

/// "a, b, c".
VAIQ_API std::string join(const std::vector<std::string>& items, std::string_view separator = ", ");

}  // namespace vaiq
