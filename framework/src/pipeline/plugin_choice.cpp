// Which plugins a recipe runs, with their options: the target, format, calibrator, passes, algorithms and reports.
#include <fmt/format.h>

#include <algorithm>

#include "pipeline/preprocess.hpp"
#include "pipeline/run_state.hpp"
#include "recipe/defaults.hpp"
#include "recipe/schema.hpp"
#include "util/yaml_json.hpp"
#include "vaiq/error.hpp"
#include "vaiq/log.hpp"
#include "vaiq/text.hpp"

namespace vaiq {
namespace {

// Where `sw` is on in the recipe, the setting's origin; else nullopt.
std::optional<std::string> switched_on(const Recipe& recipe, const AlgorithmSwitch& sw) {
    const auto it = recipe.settings.find(sw.setting);
    if (it == recipe.settings.end() || !recipe.in_effect(sw.setting)) return std::nullopt;
    const auto& v = it->second.value;
    const bool on = sw.values.empty() ? (v.is_boolean() ? v.get<bool>() : !v.is_null())
                                      : v.is_string() && std::find(sw.values.begin(), sw.values.end(),
                                                                   v.get<std::string>()) != sw.values.end();
    return on ? std::optional(it->second.origin) : std::nullopt;
}

}  // namespace
}  // namespace vaiq

namespace vaiq::phases {

namespace {

std::string who_needs(const Recipe& recipe, std::string_view key, const std::string& value) {
    const auto& origin = recipe.setting(key).origin;
    return origin == "default" ? fmt::format("{} {} (the default)", key, value)
                               : fmt::format("{}: {} {}", origin, key, value);
}

// A plugin option named like a documented extra option (CalibMovingAverage,
// DedicatedQDQPair, a device's AlignConcat: a capital first) takes the
// recipe's extra_options value, so a recipe moved from a Python call needs no
// second spelling of it.
// `given` holds the plugin's other options, `given_origin` says where each was set.
PluginChoice with_extra_options(const Recipe& recipe, const PluginRegistry& registry, const PluginInfo& info,
                                nlohmann::json given, const OptionOrigin& given_origin) {
    std::map<std::string, std::string> origins;
    if (given.is_object())
        for (const auto& [name, value] : given.items()) origins[name] = given_origin(name);
    for (const auto& spec : info.options) {
        if (const auto* key = find_key(spec.name); key && key->read_by_plugin) {  // enable_dpu
            const auto& setting = recipe.setting(spec.name);
            given[spec.name] = setting.value;
            origins[spec.name] = setting.origin;
            continue;
        }
        if (in_plugin_section(spec.name)) {  // image_preprocess.size
            if (auto it = recipe.settings.find(spec.name); it != recipe.settings.end()) {
                given[spec.name] = it->second.value;
                origins[spec.name] = it->second.origin;
            }
            continue;
        }
        if (!is_extra_option_name(spec.name)) continue;
        if (given.contains(spec.name))
            throw InputError(fmt::format("{}: {} is a documented extra option; set it under extra_options",
                                         given_origin(spec.name), spec.name));
        auto it = recipe.settings.find("extra_options." + spec.name);
        if (it == recipe.settings.end() || it->second.value.is_null()) continue;
        given[spec.name] = it->second.value;
        origins[spec.name] = it->second.origin;
    }
    Options options = registry.resolve_options(info, given, [&](const std::string& option) {
        auto it = origins.find(option);
        return it != origins.end() ? it->second : given_origin(option);
    });
    return {&info, std::move(options), std::move(origins)};
}

}  // namespace

PluginChoice choose(const Recipe& recipe, const PluginRegistry& registry, PluginKind kind, const std::string& name,
                    std::string_view key) {
    const auto& info = registry.require(kind, name, who_needs(recipe, key, recipe.value(key).get<std::string>()));
    const std::string kind_str(kind_name(kind));
    return with_extra_options(recipe, registry, info, recipe.plugin_options(kind_str),
                              [&](const std::string& option) { return recipe.plugin_option_origin(kind_str, option); });
}

PluginChoice choose_algorithm(const Recipe& recipe, const PluginRegistry& registry, const std::string& name,
                              const nlohmann::json& options, const std::string& origin) {
    const auto& info = registry.require(PluginKind::Algorithm, name, origin);
    return with_extra_options(recipe, registry, info, options, [&](const std::string&) { return origin; });
}

namespace {

// The recipe's algorithms in its order, after those its settings enable (in
// the registry's order; weight_only_algorithm: gptq); an algorithm named twice
// runs once, with the options the later naming gives (`algorithms: [{name:
// awq_clip, options: ...}]` next to weight_only_algorithm: awq_clip).
std::vector<PluginChoice> choose_algorithms(const Recipe& recipe, const PluginRegistry& registry) {
    std::vector<PluginChoice> out;
    auto add = [&](const std::string& name, const nlohmann::json& options, const std::string& origin) {
        const auto same =
            std::find_if(out.begin(), out.end(), [&](const PluginChoice& c) { return c.info->name == name; });
        if (same == out.end())
            out.push_back(choose_algorithm(recipe, registry, name, options, origin));
        else if (options.is_object() && !options.empty())
            *same = choose_algorithm(recipe, registry, name, options, origin);
    };
    for (const auto* info : registry.list(PluginKind::Algorithm))
        for (const auto& sw : info->enabled_by)
            if (const auto origin = switched_on(recipe, sw)) {
                add(info->name, nlohmann::json::object(), *origin);
                break;
            }
    for (const auto& a : recipe.value("algorithms"))
        add(a["name"].get<std::string>(), a["options"], a["origin"].get<std::string>());
    return out;
}

// report_html's page, then the recipe's reports (one named twice is written once,
// with the options of its later naming).
std::vector<PluginChoice> choose_reports(const Recipe& recipe, const PluginRegistry& registry) {
    std::vector<PluginChoice> out;
    auto add = [&](std::string_view name, const nlohmann::json& options, const std::string& origin) {
        const auto& info = registry.require(PluginKind::Report, name, origin);
        auto choice = with_extra_options(recipe, registry, info, options, [&](const std::string&) { return origin; });
        const auto same = std::find_if(out.begin(), out.end(), [&](const PluginChoice& c) { return c.info == &info; });
        if (same == out.end())
            out.push_back(std::move(choice));
        else
            *same = std::move(choice);
    };
    if (recipe.value("report_html").get<bool>())
        add(defaults::kHtmlReport, nullptr, who_needs(recipe, "report_html", "true"));
    for (const auto& r : recipe.value("reports"))
        add(r["name"].get<std::string>(), r["options"], r["origin"].get<std::string>());
    return out;
}

// The algorithms those chosen may try and the run does not run anyway.
std::vector<PluginChoice> choose_tried(const Recipe& recipe, const PluginRegistry& registry,
                                       const std::vector<PluginChoice>& chosen) {
    std::vector<PluginChoice> out;
    auto known = [&](const std::string& name) {
        auto named = [&](const PluginChoice& c) { return c.info->name == name; };
        return std::any_of(chosen.begin(), chosen.end(), named) || std::any_of(out.begin(), out.end(), named);
    };
    for (const auto& c : chosen)
        for (const auto& other : c.info->may_try)
            if (!known(other))
                out.push_back(choose_algorithm(recipe, registry, other, nlohmann::json::object(),
                                               fmt::format("algorithm '{}', which may try it", c.info->name)));
    return out;
}

}  // namespace

}  // namespace vaiq::phases

namespace vaiq {

namespace {

bool declares(const PluginInfo& info, const std::string& option) {
    return std::any_of(info.options.begin(), info.options.end(), [&](const auto& o) { return o.name == option; });
}

// Algorithm `info`'s switch on `setting`, or null.
const AlgorithmSwitch* switch_on(const PluginInfo& info, const std::string& setting) {
    const auto it = std::find_if(info.enabled_by.begin(), info.enabled_by.end(),
                                 [&](const auto& sw) { return sw.setting == setting; });
    return it == info.enabled_by.end() ? nullptr : &*it;
}

// Every extra option the schema does not have must be an option of a chosen
// plugin. One of a plugin the recipe does not use has no effect (a warning, as
// for a switch that is off); one no plugin declares is a typo.
void check_extra_options(const Recipe& recipe, const PluginRegistry& registry, const ResolvedPlugins& chosen) {
    std::vector<const PluginInfo*> used = {chosen.target.info, chosen.format.info, chosen.calibrator.info};
    for (const auto& p : chosen.passes) used.push_back(p.info);
    if (chosen.equalization) used.push_back(chosen.equalization->info);
    for (const auto* list : {&chosen.algorithms, &chosen.tried, &chosen.readers, &chosen.reports})
        for (const auto& a : *list) used.push_back(a.info);
    const auto algorithms = registry.list(PluginKind::Algorithm);
    // A setting that runs an algorithm, on or off (for one with values: one of them).
    auto switches = [&](const std::string& setting) {
        return std::any_of(algorithms.begin(), algorithms.end(), [&](const auto* info) {
            const auto* sw = switch_on(*info, setting);
            return sw && (sw->values.empty() || switched_on(recipe, *sw));
        });
    };
    // A documented argument only plugins read, set where none of the chosen ones does.
    for (const auto& key : recipe_keys()) {
        const std::string name(key.path);
        if (!key.read_by_plugin || !recipe.in_effect(name) ||
            recipe.value(name) == parse_yaml_value(std::string(key.default_yaml)))
            continue;
        // An option of a chosen plugin (enable_dpu), or a switch that runs one (weight_only_algorithm: gptq,
        // float_fragile_inputs: false).
        if (std::any_of(used.begin(), used.end(), [&](const auto* info) { return declares(*info, name); }) ||
            switches(name))
            continue;
        std::vector<std::string> readers;
        for (const auto* info : registry.list()) {
            if (declares(*info, name)) readers.push_back(fmt::format("{} '{}'", kind_name(info->kind), info->name));
            if (const auto* sw = switch_on(*info, name))
                readers.push_back(fmt::format("{} '{}' ({})", kind_name(info->kind), info->name, sw->describe()));
        }
        throw InputError(fmt::format("{}: {} is read by none of this recipe's plugins (target '{}', format '{}'){}",
                                     recipe.setting(name).origin, name, chosen.target.info->name,
                                     chosen.format.info->name,
                                     readers.empty() ? std::string() : "; it applies to " + join(readers, ", ")));
    }
    // A key of a plugins' section (image_preprocess) that no loaded plugin declares is a typo.
    for (const auto& [name, setting] : recipe.settings) {
        if (!in_plugin_section(name)) continue;
        std::vector<std::string> known;
        for (const auto* info : registry.list())
            for (const auto& o : info->options)
                if (in_plugin_section(o.name) && o.name.substr(0, o.name.rfind('.')) == name.substr(0, name.rfind('.')))
                    known.push_back(o.name);
        if (std::find(known.begin(), known.end(), name) == known.end())
            throw InputError(fmt::format("{}: unknown key '{}'{}", setting.origin, name,
                                         known.empty()
                                             ? std::string(" (no loaded plugin reads this section)")
                                             : did_you_mean(name, known) + " (valid keys: " + join(known) + ")"));
    }
    for (const auto& [name, setting] : recipe.plugin_extra_options()) {
        if (std::any_of(used.begin(), used.end(), [&n = name](const auto* info) { return declares(*info, n); }) ||
            switches("extra_options." + name))
            continue;
        std::vector<std::string> owners, known;
        for (const auto* info : registry.list()) {
            if (declares(*info, name)) owners.push_back(fmt::format("{} '{}'", kind_name(info->kind), info->name));
            for (const auto& o : info->options)
                if (is_extra_option_name(o.name)) known.push_back(o.name);
        }
        if (!owners.empty()) {
            log_warn("{}: extra_options.{} has no effect: it is an option of {}, which this recipe does not use",
                     setting->origin, name, join(owners, ", "));
            continue;
        }
        for (const auto& k : keys_in_section("extra_options")) known.push_back(k);
        std::string hint = did_you_mean(name, known);
        throw InputError(fmt::format("{}: unknown key '{}' in extra_options{}", setting->origin, name,
                                     hint.empty() ? " (neither quantize_static nor a loaded plugin has it; "
                                                    "`vaiq plugins` lists the plugins' options)"
                                                  : hint));
    }
}

// A value the plugin refuses, found before anything runs; the message points at
// the recipe line of the option it names.
void check_configuration(const PluginRegistry& registry, const PluginChoice& choice) {
    try {
        registry.check_configuration(*choice.info, choice.options);
    } catch (const InputError& e) {
        const std::string what = e.what();
        for (const auto& [option, origin] : choice.set_by)
            if (what.find(option) != std::string::npos) throw InputError(fmt::format("{}: {}", origin, what));
        throw;
    }
}

}  // namespace

}  // namespace vaiq

namespace vaiq {

using namespace phases;

ResolvedPlugins resolve_plugins(const Recipe& recipe, PluginRegistry& registry) {
    for (const auto& p : recipe.value("plugin_paths")) {
        try {
            registry.load_path(p.get<std::string>());
        } catch (const InputError& e) {
            throw InputError(fmt::format("{}: plugin_paths: {}", recipe.setting("plugin_paths").origin, e.what()));
        }
    }
    ResolvedPlugins out;
    out.target = choose(recipe, registry, PluginKind::Target, recipe.value("target").get<std::string>(), "target");
    out.format = choose(recipe, registry, PluginKind::Format, recipe.format_plugin(), "quant_format");
    out.calibrator = choose(recipe, registry, PluginKind::Calibrator, recipe.calibrator_plugin(), "calibrate_method");
    for (const auto& pass : recipe.value("passes")) {
        const auto name = pass["name"].get<std::string>();
        const auto origin = pass["origin"].get<std::string>();
        const auto& info = registry.require(PluginKind::Pass, name, origin);
        out.passes.push_back(
            with_extra_options(recipe, registry, info, pass["options"], [&](const std::string&) { return origin; }));
    }
    if (recipe.value("include_cle").get<bool>()) {
        const auto origin = who_needs(recipe, "include_cle", "true");
        const auto& info = registry.require(PluginKind::Pass, defaults::kEqualizationPass, origin);
        out.equalization =
            with_extra_options(recipe, registry, info, nullptr, [&](const std::string&) { return origin; });
    }
    out.algorithms = choose_algorithms(recipe, registry);
    out.tried = choose_tried(recipe, registry, out.algorithms);
    for (const auto* info : registry.list(PluginKind::Reader))
        out.readers.push_back(
            with_extra_options(recipe, registry, *info, nullptr, [](const std::string&) { return std::string(); }));
    out.reports = choose_reports(recipe, registry);
    check_extra_options(recipe, registry, out);
    for (const auto* choice : {&out.target, &out.format, &out.calibrator}) check_configuration(registry, *choice);
    for (const auto* list : {&out.passes, &out.algorithms, &out.tried, &out.readers, &out.reports})
        for (const auto& choice : *list) check_configuration(registry, choice);
    if (out.equalization) check_configuration(registry, *out.equalization);
    return out;
}

std::vector<std::string> unsupported_settings(const Recipe& recipe, Phase last) {
    std::vector<std::string> out;
    for (const auto& spec : recipe_keys()) {
        const auto& s = recipe.setting(spec.path);
        if (spec.implemented || s.is_default() || spec.phase > last || !recipe.in_effect(spec.path)) continue;
        out.push_back(fmt::format("{} ({})", spec.path, s.origin));
    }
    return out;
}

}  // namespace vaiq
