// Finding, checking and instantiating plugins.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "vaiq/abi.h"
#include "vaiq/options.hpp"
#include "vaiq/plugin.hpp"

namespace vaiq {

struct OptionSpec {
    std::string name;
    vaiq_option_type type;
    nlohmann::json default_value;
    std::string doc;
};

/// "bool", "int", "float", "string", "list of strings".
std::string option_type_name(vaiq_option_type type);

enum class AlgorithmStage : uint32_t;
/// "prepare", "plan", "precision", "parameters", "corrections"; "" for a value that is none.
std::string_view algorithm_stage_name(AlgorithmStage stage);

/// A recipe setting that runs an algorithm the recipe does not name: on when
/// the setting is true (a number: set), or has one of `values`.
struct AlgorithmSwitch {
    std::string setting;              ///< "extra_options.SmoothQuant", "weight_only_algorithm"
    std::vector<std::string> values;  ///< empty: true or set
    /// "extra_options.SmoothQuant", "weight_only_algorithm=gptq|awq_full".
    std::string describe() const;
};

/// A plugin the registry accepted: its descriptor checked, its options parsed.
struct PluginInfo {
    PluginKind kind;
    std::string name;
    std::string version;
    std::string summary;
    std::vector<OptionSpec> options;
    std::filesystem::path library;
    const vaiq_plugin_descriptor* descriptor = nullptr;
    std::vector<AlgorithmSwitch> enabled_by;  ///< algorithms: the settings that run it unnamed
    std::vector<std::string> may_try;         ///< algorithms: those it may try
};

/// An instance that is destroyed by the library that created it.
template <typename T>
using PluginInstance = std::unique_ptr<T, std::function<void(T*)>>;

class Target;
class Format;
class Calibrator;
class Pass;
class Algorithm;
class Reader;
class ReportWriter;

/// Plugin guards (guard.cpp): create() wraps every instance so that each call
/// into the plugin is guarded. A refusal (InputError) passes through unchanged:
/// it is the plugin's message to the user. Any other exception becomes
/// InternalError "<kind> plugin '<name>' failed in <method>(): <what>". What the
/// host relies on is checked: a calibrator's ranges finite and ordered, its
/// constants' scales finite and positive with one zero point per scale.
PluginInstance<Target> guard_plugin(PluginInstance<Target> inner, const PluginInfo& info);
PluginInstance<Format> guard_plugin(PluginInstance<Format> inner, const PluginInfo& info);
PluginInstance<Calibrator> guard_plugin(PluginInstance<Calibrator> inner, const PluginInfo& info);
PluginInstance<Pass> guard_plugin(PluginInstance<Pass> inner, const PluginInfo& info);
PluginInstance<Algorithm> guard_plugin(PluginInstance<Algorithm> inner, const PluginInfo& info);
PluginInstance<Reader> guard_plugin(PluginInstance<Reader> inner, const PluginInfo& info);
PluginInstance<ReportWriter> guard_plugin(PluginInstance<ReportWriter> inner, const PluginInfo& info);

/// Where an option value came from, for error messages ("recipe.yaml:3:5").
using OptionOrigin = std::function<std::string(const std::string& option)>;

/// The plugins this process has loaded. Libraries are never unloaded.
class PluginRegistry {
  public:
    /// Loads every *.so in `dir` in name order. A missing folder is skipped.
    void load_directory(const std::filesystem::path& dir);
    /// Loads one library; a library already loaded (same file) is skipped.
    /// Throws InputError with one sentence naming the library and the problem.
    void load_library(const std::filesystem::path& file);
    /// Loads a folder (every *.so in it) or one library. Throws InputError
    /// "<path> does not exist" when it is neither.
    void load_path(const std::filesystem::path& path);
    /// The default search path: the built-in plugin folder beside libvaiq, then
    /// the folders of VAIQ_PLUGIN_PATH (colon-separated).
    void load_default_paths();

    const PluginInfo* find(PluginKind kind, std::string_view name) const;
    /// Like find(), but throws InputError listing what is installed.
    const PluginInfo& require(PluginKind kind, std::string_view name, std::string_view needed_by = {}) const;
    std::vector<const PluginInfo*> list(std::optional<PluginKind> kind = std::nullopt) const;
    std::vector<std::string> names(PluginKind kind) const;

    /// Checks `given` (a JSON object, may be null) against the plugin's option
    /// schema and returns every option, defaults filled in.
    Options resolve_options(const PluginInfo& plugin, const nlohmann::json& given,
                            const OptionOrigin& origin = {}) const;

    /// Creates and configures an instance of plugin `name` of T's kind.
    template <typename T>
    PluginInstance<T> create(std::string_view name, const Options& options) const {
        const PluginInfo& info = require(T::kKind, name);
        void* raw = create_raw(info);
        auto* destroy = info.descriptor->destroy;
        PluginInstance<T> instance(static_cast<T*>(raw), [destroy](T* p) { destroy(p); });
        configure(info, *instance, options);
        return guard_plugin(std::move(instance), info);
    }

    /// Configures a throwaway instance with `options`: what a plugin refuses
    /// (a value outside its choices) is found when the recipe is checked, before
    /// anything runs. Throws InputError "<kind> '<name>': <the plugin's reason>".
    void check_configuration(const PluginInfo& info, const Options& options) const;

  private:
    void* create_raw(const PluginInfo& info) const;
    void configure(const PluginInfo& info, Plugin& plugin, const Options& options) const;

    std::vector<PluginInfo> plugins_;
    std::vector<std::filesystem::path> loaded_files_;
};

/// The folder of the built-in plugins: <folder of libvaiq>/vaiq/plugins.
std::filesystem::path builtin_plugin_dir();

}  // namespace vaiq
