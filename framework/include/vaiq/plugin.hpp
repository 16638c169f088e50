// vaiq/plugin.hpp - the base of every plugin and the macro that exports them.
#pragma once

#include <array>
#include <cstdio>
#include <exception>
#include <optional>
#include <string_view>

#include "vaiq/abi.h"
#include "vaiq/export.hpp"
#include "vaiq/options.hpp"

namespace vaiq {

enum class PluginKind : uint32_t {
    Calibrator = VAIQ_KIND_CALIBRATOR,
    Format = VAIQ_KIND_FORMAT,
    Target = VAIQ_KIND_TARGET,
    Pass = VAIQ_KIND_PASS,
    Algorithm = VAIQ_KIND_ALGORITHM,
    Reader = VAIQ_KIND_READER,
    Report = VAIQ_KIND_REPORT,
};

/// "calibrator", "format", "target", "pass", "algorithm", "reader", "report".
VAIQ_API std::string_view kind_name(PluginKind kind);
VAIQ_API std::optional<PluginKind> parse_kind(std::string_view name);

/// The version of this vaiq (and of its SDK).
VAIQ_API std::string_view version();

/// Base of the seven plugin interfaces.
class VAIQ_API Plugin {
  public:
    virtual ~Plugin();
    /// Called once after creation, before anything else, with every option of the
    /// plugin's schema present (defaults filled in) and of the declared type.
    virtual void configure(const Options& options);
};

namespace detail {

inline void write_error(char* buffer, size_t size, const char* message) noexcept {
    if (buffer != nullptr && size > 0) std::snprintf(buffer, size, "%s", message);
}

// Exceptions never cross the C entry: they become a message for the host.
template <typename T>
void* create_instance(char* error, size_t error_size) noexcept {
    try {
        return static_cast<typename T::Interface*>(new T());
    } catch (const std::exception& e) {
        write_error(error, error_size, e.what());
    } catch (...) {
        write_error(error, error_size, "unknown exception");
    }
    return nullptr;
}

template <typename T>
void destroy_instance(void* instance) noexcept {
    delete static_cast<typename T::Interface*>(instance);
}

template <size_t N>
std::array<const vaiq_plugin_descriptor*, N> pointers_to(const vaiq_plugin_descriptor (&descriptors)[N]) {
    std::array<const vaiq_plugin_descriptor*, N> pointers{};
    for (size_t i = 0; i < N; ++i) pointers[i] = &descriptors[i];
    return pointers;
}

}  // namespace detail

/// Describes plugin class T (derived from Calibrator, Format, Target, Pass, Algorithm, Reader or ReportWriter and
/// default-constructible) for VAIQ_PLUGINS.
template <typename T, size_t N>
constexpr vaiq_plugin_descriptor describe(const char* name, const char* version, const char* summary,
                                          const vaiq_option_descriptor (&options)[N]) {
    return {VAIQ_ABI_VERSION,
            sizeof(vaiq_plugin_descriptor),
            VAIQ_TOOLCHAIN_TAG,
            static_cast<uint32_t>(T::kKind),
            name,
            version,
            summary,
            options,
            N,
            &detail::create_instance<T>,
            &detail::destroy_instance<T>,
            nullptr,
            nullptr};
}

/// The same, for a plugin without options.
template <typename T>
constexpr vaiq_plugin_descriptor describe(const char* name, const char* version, const char* summary) {
    return {VAIQ_ABI_VERSION,
            sizeof(vaiq_plugin_descriptor),
            VAIQ_TOOLCHAIN_TAG,
            static_cast<uint32_t>(T::kKind),
            name,
            version,
            summary,
            nullptr,
            0,
            &detail::create_instance<T>,
            &detail::destroy_instance<T>,
            nullptr,
            nullptr};
}

/// An algorithm's descriptor that the recipe `settings` run without naming it
/// (see vaiq_plugin_descriptor::enabled_by) and that may try the algorithms
/// `may_try` names: enabled_by(describe<Mine>(...), "extra_options.MySearch").
constexpr vaiq_plugin_descriptor enabled_by(vaiq_plugin_descriptor descriptor, const char* settings,
                                            const char* may_try = nullptr) {
    descriptor.enabled_by = settings;
    descriptor.may_try = may_try;
    return descriptor;
}

}  // namespace vaiq

/// Exports a library's plugins: VAIQ_PLUGINS(vaiq::describe<MyPass>("my_pass", "1.0.0", "..."), ...)
/// Use it once per library, at namespace scope.
#define VAIQ_PLUGINS(...)                                                                                     \
    extern "C" __attribute__((visibility("default"))) const vaiq_plugin_descriptor* const* vaiq_plugin_entry( \
        size_t* count) {                                                                                      \
        static const vaiq_plugin_descriptor vaiq_descriptors_[] = {__VA_ARGS__};                              \
        static const auto vaiq_pointers_ = ::vaiq::detail::pointers_to(vaiq_descriptors_);                    \
        *count = vaiq_pointers_.size();                                                                       \
        return vaiq_pointers_.data();                                                                         \
    }
