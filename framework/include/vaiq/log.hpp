// vaiq/log.hpp - logging through the host's logger.
#pragma once

#include <fmt/format.h>

#include <string_view>

#include "vaiq/export.hpp"

namespace vaiq {

enum class LogLevel { Trace, Debug, Info, Warn, Error };

/// Writes one message through the host's logger (spdlog in the vaiq CLI).
VAIQ_API void log_message(LogLevel level, std::string_view message);

/// True when messages of this level are written; check it before costly formatting.
VAIQ_API bool log_enabled(LogLevel level);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
    if (log_enabled(level)) log_message(level, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void log_debug(fmt::format_string<Args...> format, Args&&... args) {
    log(LogLevel::Debug, format, std::forward<Args>(args)...);
}
template <typename... Args>
void log_info(fmt::format_string<Args...> format, Args&&... args) {
    log(LogLevel::Info, format, std::forward<Args>(args)...);
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> format, Args&&... args) {
    log(LogLevel::Warn, format, std::forward<Args>(args)...);
}

}  // namespace vaiq
