#include "plugin/registry.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <boost/dll/shared_library.hpp>
#include <cstddef>
#include <regex>

#include "util/paths.hpp"
#include "util/yaml_json.hpp"
#include "vaiq/algorithm.hpp"
#include "vaiq/calibrator.hpp"
#include "vaiq/error.hpp"
#include "vaiq/format.hpp"
#include "vaiq/log.hpp"
#include "vaiq/pass.hpp"
#include "vaiq/reader.hpp"
#include "vaiq/report.hpp"
#include "vaiq/target.hpp"
#include "vaiq/text.hpp"

namespace fs = std::filesystem;

namespace vaiq {

std::string option_type_name(vaiq_option_type type) {
    switch (type) {
        case VAIQ_OPTION_BOOL: return "bool";
        case VAIQ_OPTION_INT: return "int";
        case VAIQ_OPTION_FLOAT: return "float";
        case VAIQ_OPTION_STRING: return "string";
        case VAIQ_OPTION_STRING_LIST: return "list of strings";
        case VAIQ_OPTION_FLOAT_LIST: return "list of numbers";
        case VAIQ_OPTION_ANY: return "any value";
    }
    return "unknown";
}

std::string_view algorithm_stage_name(AlgorithmStage stage) {
    switch (stage) {
        case AlgorithmStage::Prepare: return "prepare";
        case AlgorithmStage::Plan: return "plan";
        case AlgorithmStage::Precision: return "precision";
        case AlgorithmStage::Parameters: return "parameters";
        case AlgorithmStage::Corrections: return "corrections";
        case AlgorithmStage::Written: return "written";
    }
    return "";
}

std::string AlgorithmSwitch::describe() const {
    return values.empty() ? setting : fmt::format("{}={}", setting, join(values, "|"));
}

namespace {

// The items of a descriptor list separated by `separator` and spaces (NULL: none).
std::vector<std::string> split_list(std::string_view text, char separator = ',') {
    std::vector<std::string> out;
    while (!text.empty()) {
        const auto end = std::min(text.find(separator), text.size());
        auto item = text.substr(0, end);
        const auto first = item.find_first_not_of(' ');
        if (first != std::string_view::npos)
            out.emplace_back(item.substr(first, item.find_last_not_of(' ') - first + 1));
        text.remove_prefix(std::min(end + 1, text.size()));
    }
    return out;
}

// Libraries stay loaded for the life of the process: objects, vtables and
// exception types from a plugin may outlive any handle we could drop. The
// vector is leaked on purpose so no static destructor unloads them at exit.
std::vector<boost::dll::shared_library>& loaded_libraries() {
    static auto* libraries = new std::vector<boost::dll::shared_library>();
    return *libraries;
}

bool matches_type(const nlohmann::json& value, vaiq_option_type type) {
    switch (type) {
        case VAIQ_OPTION_BOOL: return value.is_boolean();
        case VAIQ_OPTION_INT: return value.is_number_integer();
        case VAIQ_OPTION_FLOAT: return value.is_number();
        case VAIQ_OPTION_STRING: return value.is_string();
        case VAIQ_OPTION_STRING_LIST:
            return value.is_array() &&
                   std::all_of(value.begin(), value.end(), [](const auto& v) { return v.is_string(); });
        case VAIQ_OPTION_ANY: return true;
        case VAIQ_OPTION_FLOAT_LIST:
            return value.is_number() || (value.is_array() && std::all_of(value.begin(), value.end(),
                                                                         [](const auto& v) { return v.is_number(); }));
    }
    return false;
}

bool is_plugin_name(const std::string& name) {
    static const std::regex kName("[a-z][a-z0-9_]*");
    return std::regex_match(name, kName);
}

// An algorithm's enabled_by and may_try, checked; any other kind must have neither.
void read_switches(const vaiq_plugin_descriptor& d, const std::string& who, PluginInfo& info) {
    const auto clauses = split_list(d.enabled_by ? d.enabled_by : "");
    const auto others = split_list(d.may_try ? d.may_try : "");
    if (info.kind != PluginKind::Algorithm && (!clauses.empty() || !others.empty()))
        throw InputError(fmt::format("{} is a {} but declares enabled_by or may_try, which only algorithms have", who,
                                     kind_name(info.kind)));
    static const std::regex kSwitch(
        "([A-Za-z][A-Za-z0-9_]*(?:\\.[A-Za-z][A-Za-z0-9_]*)*)(?:=([A-Za-z0-9_.+-]+(?:\\|[A-Za-z0-9_.+-]+)*))?");
    for (const auto& clause : clauses) {
        std::smatch m;
        if (!std::regex_match(clause, m, kSwitch))
            throw InputError(
                fmt::format("{} is enabled by '{}', which is neither a setting nor setting=value|value", who, clause));
        info.enabled_by.push_back(
            {m[1].str(), m[2].matched ? split_list(m[2].str(), '|') : std::vector<std::string>{}});
    }
    for (const auto& other : others) {
        if (!is_plugin_name(other) || other == info.name)
            throw InputError(fmt::format("{} may try '{}', which is no other plugin's name", who, other));
        info.may_try.push_back(other);
    }
}

// Everything a descriptor must satisfy before the host calls into the plugin.
// Returns the accepted plugin or throws one sentence naming both sides.
PluginInfo check_descriptor(const vaiq_plugin_descriptor* d, const fs::path& file) {
    const std::string lib = file.filename().string();
    if (d == nullptr) throw InputError(fmt::format("plugin library {} returned a null descriptor", lib));
    // abi_version and struct_size come first in every ABI revision, and fields
    // are only ever appended, so `name` can be read whenever the struct is large enough.
    constexpr size_t kNameEnd = offsetof(vaiq_plugin_descriptor, name) + sizeof(const char*);
    const char* raw_name = d->struct_size >= kNameEnd && d->name ? d->name : nullptr;
    const std::string who =
        raw_name ? fmt::format("plugin '{}' ({})", raw_name, lib) : fmt::format("plugin library {}", lib);
    if (d->abi_version != VAIQ_ABI_VERSION)
        throw InputError(
            fmt::format("{} was built for ABI {}; this vaiq is ABI {}", who, d->abi_version, VAIQ_ABI_VERSION));
    if (d->struct_size < sizeof(vaiq_plugin_descriptor))
        throw InputError(fmt::format("{} has a {}-byte descriptor; this vaiq (ABI {}) needs {} bytes", who,
                                     d->struct_size, VAIQ_ABI_VERSION, sizeof(vaiq_plugin_descriptor)));
    const std::string toolchain = d->toolchain ? d->toolchain : "";
    if (toolchain != VAIQ_TOOLCHAIN_TAG)
        throw InputError(fmt::format("{} was built with toolchain '{}'; this vaiq was built with '{}'", who, toolchain,
                                     VAIQ_TOOLCHAIN_TAG));
    if (!raw_name || !is_plugin_name(raw_name))
        throw InputError(fmt::format("{} has the name '{}'; plugin names must match [a-z][a-z0-9_]*", who,
                                     raw_name ? raw_name : ""));
    const auto kind = static_cast<PluginKind>(d->kind);
    if (kind_name(kind) == "unknown")
        throw InputError(
            fmt::format("{} declares kind {}; this vaiq knows calibrator (1), format (2), target (3), "
                        "pass (4), algorithm (5), reader (6) and report (7)",
                        who, d->kind));
    static const std::regex kVersion("[0-9]+\\.[0-9]+\\.[0-9]+([-+][0-9A-Za-z.+-]*)?");
    const std::string version = d->version ? d->version : "";
    if (!std::regex_match(version, kVersion))
        throw InputError(fmt::format("{} has the version '{}'; this vaiq needs MAJOR.MINOR.PATCH", who, version));
    if (!d->create || !d->destroy)
        throw InputError(fmt::format("{} has no {} function", who, d->create ? "destroy" : "create"));
    if (d->option_count > 0 && !d->options)
        throw InputError(fmt::format("{} declares {} options but no option table", who, d->option_count));

    PluginInfo info{kind, raw_name, version, d->summary ? d->summary : "", {}, file, d, {}, {}};
    read_switches(*d, who, info);
    // A dotted name is a documented extra option of a nested section (FastFinetune.NumIterations) or
    // a key of a recipe section plugins own (image_preprocess.size).
    // (Compiled once: compiled for each option, it took 7 of the 17 ms of `vaiq plugins`.)
    static const std::regex kOptionName(
        "[A-Za-z][A-Za-z0-9_]*|[A-Z][A-Za-z0-9]*\\.[A-Z][A-Za-z0-9]*|[a-z][a-z0-9_]*\\.[a-z][a-z0-9_]*");
    for (size_t i = 0; i < d->option_count; ++i) {
        const auto& o = d->options[i];
        const std::string name = o.name ? o.name : "";
        if (!std::regex_match(name, kOptionName))
            throw InputError(fmt::format("{} declares an option named '{}', which is not a valid name", who, name));
        const auto type = static_cast<vaiq_option_type>(o.type);
        if (option_type_name(type) == "unknown")
            throw InputError(fmt::format("{} declares option '{}' of unknown type {}", who, name, o.type));
        nlohmann::json value;
        try {
            value = parse_yaml_value(o.default_value ? o.default_value : "");
        } catch (const std::exception&) {
            value = nullptr;
        }
        if (type == VAIQ_OPTION_STRING && !value.is_string() && o.default_value) value = std::string(o.default_value);
        // A number option may default to null: unset unless the recipe gives it (a target).
        const bool unset =
            value.is_null() && (type == VAIQ_OPTION_INT || type == VAIQ_OPTION_FLOAT || type == VAIQ_OPTION_FLOAT_LIST);
        if (!unset && !matches_type(value, type))
            throw InputError(fmt::format("{} declares option '{}' with the default '{}', which is not a {}", who, name,
                                         o.default_value ? o.default_value : "", option_type_name(type)));
        info.options.push_back({name, type, value, o.doc ? o.doc : ""});
    }
    return info;
}

}  // namespace

void PluginRegistry::load_library(const fs::path& file) {
    std::error_code ec;
    const fs::path canonical = fs::weakly_canonical(file, ec);
    if (std::find(loaded_files_.begin(), loaded_files_.end(), canonical) != loaded_files_.end()) return;
    if (!fs::exists(file, ec)) throw InputError(fmt::format("plugin library {} does not exist", file.string()));

    boost::dll::shared_library library;
    try {
        library.load(boost::dll::fs::path(canonical.string()), boost::dll::load_mode::rtld_now);
    } catch (const std::exception& e) {
        throw InputError(fmt::format("{} is not a loadable plugin library: {}", file.string(), e.what()));
    }
    if (!library.has(VAIQ_PLUGIN_ENTRY_NAME))
        throw InputError(
            fmt::format("{} is not a vaiq plugin: it exports no {} function", file.string(), VAIQ_PLUGIN_ENTRY_NAME));
    auto entry = library.get<std::remove_pointer_t<vaiq_plugin_entry_fn>>(VAIQ_PLUGIN_ENTRY_NAME);
    loaded_libraries().push_back(library);

    size_t count = 0;
    const vaiq_plugin_descriptor* const* descriptors = entry(&count);
    if (descriptors == nullptr || count == 0)
        throw InputError(fmt::format("plugin library {} describes no plugins", file.string()));

    // Check the whole library before registering any of it.
    std::vector<PluginInfo> accepted;
    for (size_t i = 0; i < count; ++i) {
        PluginInfo info = check_descriptor(descriptors[i], canonical);
        auto clash = [&](const PluginInfo& p) { return p.kind == info.kind && p.name == info.name; };
        const PluginInfo* existing = find(info.kind, info.name);
        if (!existing) {
            auto it = std::find_if(accepted.begin(), accepted.end(), clash);
            existing = it == accepted.end() ? nullptr : &*it;
        }
        if (existing)
            throw InputError(fmt::format("{} '{}' in {} is already provided by {}", kind_name(info.kind), info.name,
                                         file.string(), existing->library.string()));
        accepted.push_back(std::move(info));
    }
    loaded_files_.push_back(canonical);
    for (auto& info : accepted) {
        log_debug("loaded {} '{}' {} from {}", kind_name(info.kind), info.name, info.version, info.library.string());
        plugins_.push_back(std::move(info));
    }
}

void PluginRegistry::load_directory(const fs::path& dir) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
        log_debug("plugin folder {} does not exist; skipped", dir.string());
        return;
    }
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(dir, ec))
        if (entry.path().extension() == ".so") files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) load_library(f);
}

fs::path builtin_plugin_dir() {
    // The built-in plugins sit beside libvaiq in both the build tree and an
    // installation: <libdir>/libvaiq.so and <libdir>/vaiq/plugins/.
    return library_dir() / "vaiq" / "plugins";
}

void PluginRegistry::load_default_paths() {
    load_directory(builtin_plugin_dir());
    for (const auto& p : path_list_from_env("VAIQ_PLUGIN_PATH")) {
        try {
            load_path(p);
        } catch (const InputError& e) {
            throw InputError(fmt::format("VAIQ_PLUGIN_PATH: {}", e.what()));
        }
    }
}

void PluginRegistry::load_path(const fs::path& path) {
    std::error_code ec;
    if (fs::is_directory(path, ec))
        load_directory(path);
    else if (fs::exists(path, ec))
        load_library(path);
    else
        throw InputError(fmt::format("{} does not exist", path.string()));
}

const PluginInfo* PluginRegistry::find(PluginKind kind, std::string_view name) const {
    for (const auto& p : plugins_)
        if (p.kind == kind && p.name == name) return &p;
    return nullptr;
}

std::vector<std::string> PluginRegistry::names(PluginKind kind) const {
    std::vector<std::string> out;
    for (const auto* p : list(kind)) out.push_back(p->name);
    return out;
}

const PluginInfo& PluginRegistry::require(PluginKind kind, std::string_view name, std::string_view needed_by) const {
    if (const auto* p = find(kind, name)) return *p;
    const auto installed = names(kind);
    const std::string plural = kind == PluginKind::Pass ? "passes" : std::string(kind_name(kind)) + "s";
    throw InputError(fmt::format("{}no {} plugin named '{}' is installed{} (installed {}: {})",
                                 needed_by.empty() ? "" : fmt::format("{}: ", needed_by), kind_name(kind), name,
                                 did_you_mean(name, installed), plural, installed.empty() ? "none" : join(installed)));
}

std::vector<const PluginInfo*> PluginRegistry::list(std::optional<PluginKind> kind) const {
    std::vector<const PluginInfo*> out;
    for (const auto& p : plugins_)
        if (!kind || p.kind == *kind) out.push_back(&p);
    std::sort(out.begin(), out.end(),
              [](const auto* a, const auto* b) { return std::tie(a->kind, a->name) < std::tie(b->kind, b->name); });
    return out;
}

Options PluginRegistry::resolve_options(const PluginInfo& plugin, const nlohmann::json& given,
                                        const OptionOrigin& origin) const {
    auto where = [&](const std::string& option) {
        std::string at = origin ? origin(option) : std::string();
        return at.empty() ? std::string() : at + ": ";
    };
    if (!given.is_null() && !given.is_object())
        throw InputError(fmt::format("{}the options of {} '{}' must be a map of option: value", where(""),
                                     kind_name(plugin.kind), plugin.name));
    Options options;
    for (const auto& spec : plugin.options) options.set(spec.name, spec.default_value);
    if (given.is_null()) return options;
    std::vector<std::string> known;
    for (const auto& spec : plugin.options) known.push_back(spec.name);
    for (const auto& [key, value] : given.items()) {
        auto spec =
            std::find_if(plugin.options.begin(), plugin.options.end(), [&k = key](const auto& s) { return s.name == k; });
        if (spec == plugin.options.end())
            throw InputError(fmt::format("{}{} '{}' has no option '{}'{} (options: {})", where(key),
                                         kind_name(plugin.kind), plugin.name, key, did_you_mean(key, known),
                                         known.empty() ? "none" : join(known)));
        if (!matches_type(value, spec->type) && !(value.is_null() && spec->default_value.is_null()))
            throw InputError(fmt::format("{}option '{}' of {} '{}' must be a {}, not {}", where(key), key,
                                         kind_name(plugin.kind), plugin.name, option_type_name(spec->type),
                                         value.dump()));
        options.set(key, value);
    }
    return options;
}

void* PluginRegistry::create_raw(const PluginInfo& info) const {
    char error[512] = {0};
    void* instance = info.descriptor->create(error, sizeof error);
    if (!instance)
        throw InputError(fmt::format("{} '{}' ({}) failed to create an instance: {}", kind_name(info.kind), info.name,
                                     info.library.filename().string(), error[0] ? error : "no reason given"));
    return instance;
}

void PluginRegistry::check_configuration(const PluginInfo& info, const Options& options) const {
    switch (info.kind) {  // through the instance's own type, as the run creates it
        case PluginKind::Target: create<Target>(info.name, options); return;
        case PluginKind::Format: create<Format>(info.name, options); return;
        case PluginKind::Calibrator: create<Calibrator>(info.name, options); return;
        case PluginKind::Pass: create<Pass>(info.name, options); return;
        case PluginKind::Algorithm: create<Algorithm>(info.name, options); return;
        case PluginKind::Reader: create<Reader>(info.name, options); return;
        case PluginKind::Report: create<ReportWriter>(info.name, options); return;
    }
}

void PluginRegistry::configure(const PluginInfo& info, Plugin& plugin, const Options& options) const {
    try {
        plugin.configure(options);
    } catch (const InputError& e) {
        throw InputError(fmt::format("{} '{}': {}", kind_name(info.kind), info.name, e.what()));
    } catch (const std::exception& e) {
        throw InternalError(fmt::format("{} '{}' failed to configure: {}", kind_name(info.kind), info.name, e.what()));
    }
}

}  // namespace vaiq
