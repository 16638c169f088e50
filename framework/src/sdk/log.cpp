#include "vaiq/log.hpp"

#include <spdlog/spdlog.h>

namespace vaiq {

namespace {
spdlog::level::level_enum to_spdlog(LogLevel level) {
    switch (level) {
        case LogLevel::Trace: return spdlog::level::trace;
        case LogLevel::Debug: return spdlog::level::debug;
        case LogLevel::Info: return spdlog::level::info;
        case LogLevel::Warn: return spdlog::level::warn;
        case LogLevel::Error: return spdlog::level::err;
    }
    return spdlog::level::info;
}
}  // namespace

void log_message(LogLevel level, std::string_view message) { spdlog::log(to_spdlog(level), "{}", message); }

bool log_enabled(LogLevel level) { return spdlog::should_log(to_spdlog(level)); }

}  // namespace vaiq
