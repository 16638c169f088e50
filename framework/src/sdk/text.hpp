// Small text helpers for error messages.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace vaiq {

/// The candidate closest to `word` if it is close enough to be a likely typo
/// (edit distance, case-insensitive), else "".
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

/// "; did you mean 'x'?" or "".
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

/// "a, b, c".
std::string join(const std::vector<std::string>& items, std::string_view separator = ", ");

}  // namespace vaiq
