#include "recipe/recipe.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <regex>
#include <set>

#include "recipe/defaults.hpp"
#include "recipe/values.hpp"
#include "util/paths.hpp"
#include "util/yaml_json.hpp"
#include "vaiq/block_float.hpp"
#include "vaiq/error.hpp"
#include "vaiq/quant.hpp"
#include "vaiq/text.hpp"
#include "vaiq/vaiq_ops.hpp"

namespace fs = std::filesystem;

namespace vaiq {

void resolve_original_tool_settings(Recipe& recipe);

namespace {

using Settings = std::map<std::string, Setting, std::less<>>;

struct ParsedFile {
    Settings settings;
    std::optional<std::string> extends;
    bool has_version = false;
};

[[noreturn]] void unknown_key(const YAML::Node& key_node, const std::string& key, const std::string& section,
                              const Source& src) {
    const auto valid = keys_in_section(section);
    std::string hint = did_you_mean(key, valid);
    // A documented name in the wrong place: point at the right section.
    if (hint.empty() && section.empty() && find_key("extra_options." + key))
        hint = fmt::format("; {} belongs under extra_options", key);
    if (hint.empty() && section == "extra_options" && find_key(key))
        hint = fmt::format("; {} is a top-level key, not an extra option", key);
    const std::string where = section.empty() ? "the recipe" : section;
    src.fail(key_node, fmt::format("unknown key '{}' in {}{}{}", key, where, hint,
                                   hint.empty() ? fmt::format(" (valid keys: {})", join(valid)) : ""));
}

void flatten(const YAML::Node& map, const std::string& section, const Source& src, ParsedFile& out) {
    std::set<std::string> seen;
    for (const auto& kv : map) {
        if (!kv.first.IsScalar()) src.fail(kv.first, "keys must be plain names");
        const std::string key = kv.first.Scalar();
        if (!seen.insert(key).second) src.fail(kv.first, fmt::format("'{}' appears twice", key));
        const std::string path = section.empty() ? key : section + "." + key;
        if (section.empty() && key == "extends") {
            out.extends = scalar_string(kv.second, src, "extends");
        } else if (is_section(path)) {
            if (kv.second.IsNull()) continue;
            if (!kv.second.IsMap()) src.fail(kv.second, fmt::format("{} must be a map", path));
            flatten(kv.second, path, src, out);
        } else if (is_plugin_options_section(section) || in_plugin_section(path)) {
            auto value = yaml_to_json(kv.second);
            if (value.is_string()) value = expand_variables(value.get<std::string>(), src, kv.second);
            out.settings[path] = {value, src.at(kv.first)};
        } else if (const KeySpec* spec = find_key(path)) {
            out.settings[path] = {normalize(*spec, kv.second, src), src.at(kv.first)};
            if (path == "recipe_version") out.has_version = true;
        } else if (section == "extra_options" && kv.second.IsMap() && is_extra_option_name(key)) {
            flatten(kv.second, path, src, out);  // a plugin's section (AutoMixprecision): checked with its options
        } else if (is_extra_option_name(extra_option_name(path))) {
            // A plugin's documented option (a device's AlignConcat, fast finetune's
            // FastFinetune.NumIterations): checked against the plugins once they
            // are known (check_extra_options).
            out.settings[path] = {yaml_to_json(kv.second), src.at(kv.first)};
        } else {
            unknown_key(kv.first, key, section, src);
        }
    }
}

// A parent named relatively is looked for beside the recipe first, then on
// VAIQ_RECIPE_PATH and among the shipped recipes, so a customer recipe can
// say `extends: cnn_npu.yaml` from anywhere.
fs::path find_parent(const std::string& name, const fs::path& dir) {
    fs::path p(name);
    if (p.is_absolute()) return p;
    std::error_code ec;
    if (fs::exists(dir / p, ec)) return (dir / p).lexically_normal();
    for (const auto& d : recipe_search_path())
        if (fs::exists(d / p, ec)) return (d / p).lexically_normal();
    return (dir / p).lexically_normal();
}

ParsedFile parse_chain(const fs::path& file, std::vector<fs::path>& chain, std::vector<fs::path>& files);

// One recipe document merged over the chain it extends.
ParsedFile parse_document(const YAML::Node& root, const Source& src, std::vector<fs::path>& chain,
                          std::vector<fs::path>& files) {
    if (root.IsNull()) throw InputError(fmt::format("{}: the recipe is empty", src.label));
    if (!root.IsMap()) src.fail(root, "a recipe is a YAML map of key: value");

    ParsedFile mine;
    flatten(root, "", src, mine);
    if (!mine.extends) return mine;

    std::error_code ec;
    const fs::path parent_path = find_parent(*mine.extends, src.dir);
    ParsedFile merged;
    try {
        merged = parse_chain(parent_path, chain, files);
    } catch (const InputError& e) {
        if (!fs::exists(parent_path, ec))
            src.fail(root["extends"], fmt::format("extends '{}', which was found neither beside the recipe nor among "
                                                  "the shipped recipes",
                                                  *mine.extends));
        throw;
    }
    // The child wins key by key: maps merge deeply, lists and values replace.
    for (auto& [path, setting] : mine.settings) merged.settings[path] = std::move(setting);
    merged.has_version = merged.has_version || mine.has_version;
    merged.extends.reset();
    return merged;
}

ParsedFile parse_chain(const fs::path& file, std::vector<fs::path>& chain, std::vector<fs::path>& files) {
    std::error_code ec;
    const fs::path canonical = fs::weakly_canonical(file, ec);
    if (std::find(chain.begin(), chain.end(), canonical) != chain.end()) {
        std::vector<std::string> names;
        for (const auto& c : chain) names.push_back(c.filename().string());
        names.push_back(canonical.filename().string());
        throw InputError(
            fmt::format("{}: recipes extend each other in a cycle: {}", file.string(), join(names, " -> ")));
    }
    if (!fs::is_regular_file(file, ec)) throw InputError(fmt::format("{}: no such recipe file", file.string()));
    const Source src{file.string(), file.has_parent_path() ? file.parent_path() : fs::path("."), true};
    YAML::Node root;
    try {
        root = YAML::LoadFile(file.string());
    } catch (const YAML::Exception& e) {
        throw InputError(
            fmt::format("{}:{}:{}: YAML syntax error: {}", file.string(), e.mark.line + 1, e.mark.column + 1, e.msg));
    }
    files.push_back(file);
    chain.push_back(canonical);
    auto parsed = parse_document(root, src, chain, files);
    chain.pop_back();
    return parsed;
}

// Every key the parsed files did not set gets its documented default.
Recipe complete(ParsedFile parsed, std::vector<fs::path> files, const std::string& label,
                const std::vector<std::string>& assignments) {
    if (!parsed.has_version)
        throw InputError(
            fmt::format("{}: recipe_version is missing; start the recipe with 'recipe_version: 1'", label));
    Recipe recipe;
    recipe.files = std::move(files);
    recipe.settings = std::move(parsed.settings);
    for (const auto& a : assignments) apply_setting(recipe, a, fs::current_path());
    const Source defaults{"default", fs::current_path(), false};
    for (const auto& spec : recipe_keys()) {
        if (recipe.settings.count(spec.path)) continue;
        recipe.settings[std::string(spec.path)] = {
            normalize(spec, YAML::Load(std::string(spec.default_yaml)), defaults), "default"};
    }
    resolve_original_tool_settings(recipe);
    if (recipe.setting("target").is_default() && recipe.value("enable_dpu") == true)
        recipe.settings["target"] = {std::string(defaults::kDpuTarget), recipe.setting("enable_dpu").origin};
    return recipe;
}

}  // namespace

const Setting& Recipe::setting(std::string_view path) const {
    auto it = settings.find(path);
    if (it == settings.end()) throw InternalError(fmt::format("recipe key '{}' is not in the schema", path));
    return it->second;
}

nlohmann::json Recipe::plugin_options(std::string_view kind) const {
    const std::string prefix = fmt::format("plugin_options.{}.", kind);
    auto out = nlohmann::json::object();
    for (auto it = settings.lower_bound(prefix); it != settings.end() && it->first.rfind(prefix, 0) == 0; ++it)
        out[it->first.substr(prefix.size())] = it->second.value;
    return out;
}

std::string Recipe::plugin_option_origin(std::string_view kind, const std::string& option) const {
    auto it = settings.find(fmt::format("plugin_options.{}.{}", kind, option));
    return it == settings.end() ? std::string() : it->second.origin;
}

Options Recipe::quantize_config() const {
    Options options;
    for (const auto& [path, s] : settings)
        if (find_key(path)) options.set(path, s.value);
    return options;
}

std::map<std::string, const Setting*> Recipe::plugin_extra_options() const {
    std::map<std::string, const Setting*> out;
    const std::string prefix = "extra_options.";
    for (auto it = settings.lower_bound(prefix); it != settings.end() && it->first.rfind(prefix, 0) == 0; ++it)
        if (!find_key(it->first)) out[it->first.substr(prefix.size())] = &it->second;
    return out;
}

namespace {

// activation_type/weight_type: QMX (ExtendedQuantType.QMX) takes its element from
// MXAttributes.element_dtype; BFPAttributes and MXAttributes must be what vaiq computes.
QuantType resolved_quant_type(const Options& config, const std::string& key) {
    const auto name = config.get_string(key);
    const auto type = name == "QMX" ? *mx_type_of_element(config.get_string("extra_options.MXAttributes.element_dtype"))
                                    : *parse_quant_type(name);
    if (type == QuantType::QBFP16) {
        if (config.get_string("extra_options.BFPAttributes.bfp_method") != "to_bfp")
            throw InputError(
                fmt::format("{} QBFP16: BFPAttributes.bfp_method to_bfp_prime (MicroeXponents) is not "
                            "supported yet; use to_bfp or an MX type",
                            key));
        if (const auto bits = config.get_int("extra_options.BFPAttributes.bit_width"); bits != 16)
            throw InputError(fmt::format("{} QBFP16: BFPAttributes.bit_width {} is not computed (16 is)", key, bits));
    }
    const auto* mode_key = type == QuantType::QBFP16 ? "extra_options.BFPAttributes.rounding_mode"
                                                     : "extra_options.MXAttributes.rounding_mode";
    if (const auto mode = config.get_int(mode_key); is_block_float(type) && (mode < 0 || mode > 2))
        throw InputError(
            fmt::format("{} {}: {} {} is not 0 (half away from zero), 1 (half upward) or 2 (half to "
                        "even)",
                        key, quant_type_name(type),
                        std::string_view(mode_key).substr(std::string_view("extra_options.").size()), mode));
    return type;
}

SharedExponentBlocks blocks_of(const Options& config, const std::string& section) {
    SharedExponentBlocks b;
    b.axis = static_cast<int>(config.get_int(section + ".axis"));
    b.size = config.get_int(section + ".block_size");
    if (b.size < 1) throw InputError(fmt::format("{}.block_size {} is not a block size", section, b.size));
    b.rounding_mode = static_cast<int>(std::clamp<int64_t>(config.get_int(section + ".rounding_mode"), 0, 2));
    return b;
}

}  // namespace

QuantRequest quant_request(const Options& config) {
    QuantRequest r;
    r.activation_type = resolved_quant_type(config, "activation_type");
    r.weight_type = resolved_quant_type(config, "weight_type");
    r.bfp_blocks = blocks_of(config, "extra_options.BFPAttributes");
    r.mx_blocks = blocks_of(config, "extra_options.MXAttributes");
    r.activation_symmetric = config.get_bool("extra_options.ActivationSymmetric");
    r.weight_symmetric = config.get_bool("extra_options.WeightSymmetric");
    r.per_channel = config.get_bool("per_channel");
    r.reduce_range = config.get_bool("reduce_range");
    r.block_size = config.get_int("block_size");
    r.quantize_bias = config.get_bool("extra_options.QuantizeBias");
    r.int16_scale = config.get_bool("extra_options.Int16Scale");
    return r;
}

std::vector<std::string> Recipe::explicit_keys() const {
    std::vector<std::string> out;
    for (const auto& [path, s] : settings)
        if (!s.is_default()) out.push_back(path);
    return out;
}

bool Recipe::in_effect(std::string_view path) const {
    const KeySpec* spec = find_key(path);
    if (!spec || spec->enabled_by.empty()) return true;
    const auto& v = value(spec->enabled_by);
    return v.is_boolean() && v.get<bool>() && in_effect(spec->enabled_by);
}

std::string Recipe::format_plugin() const { return defaults::format_plugin(value("quant_format").get<std::string>()); }

std::string Recipe::calibrator_plugin() const {
    return defaults::calibrator_plugin(value("calibrate_method").get<std::string>());
}

void apply_setting(Recipe& recipe, const std::string& assignment, const fs::path& base_dir) {
    const auto eq = assignment.find('=');
    const Source src{"--set " + assignment, base_dir, false};
    if (eq == std::string::npos || eq == 0)
        throw InputError(fmt::format("--set {}: expected key.path=value", assignment));
    const std::string path = assignment.substr(0, eq);
    const std::string text = assignment.substr(eq + 1);
    YAML::Node node;
    try {
        node = YAML::Load(text);
    } catch (const YAML::Exception&) {
        node = YAML::Node(text);
    }
    const auto dot = path.rfind('.');
    const std::string section = dot == std::string::npos ? "" : path.substr(0, dot);
    // A host section, or a plugin's (a map under extra_options that is no host key).
    if (is_section(path) || (section == "extra_options" && node.IsMap() && !find_key(path)))
        throw InputError(
            fmt::format("{}: {} is a section; set one key in it, e.g. {}.<key>=...", src.label, path, path));
    if (is_plugin_options_section(section) || in_plugin_section(path)) {
        auto value = yaml_to_json(node);
        if (value.is_string()) value = expand_variables(value.get<std::string>(), src, node);
        recipe.settings[path] = {value, "--set"};
        return;
    }
    const KeySpec* spec = find_key(path);
    if (!spec && is_extra_option_name(extra_option_name(path))) {
        recipe.settings[path] = {yaml_to_json(node), "--set"};
        return;
    }
    if (!spec) {
        std::vector<std::string> all;
        for (const auto& k : recipe_keys()) all.emplace_back(k.path);
        throw InputError(fmt::format("{}: unknown key '{}'{}", src.label, path, did_you_mean(path, all)));
    }
    recipe.settings[path] = {normalize(*spec, node, src), "--set"};
}

// The original tool's settings in terms of the documented ones: nbits (only 8)
// and asymmetric_input_types (the types of weights and activations).
void resolve_original_tool_settings(Recipe& recipe) {
    if (const auto& nbits = recipe.setting("nbits"); nbits.value.get<int64_t>() != 8)
        throw InputError(fmt::format("{}: nbits {} is not supported: quantized data has 8 bits (use "
                                     "activation_type/weight_type QInt16 for 16)",
                                     nbits.origin, nbits.value.get<int64_t>()));
    const Setting asymmetric = recipe.setting("asymmetric_input_types");
    if (asymmetric.value.is_null()) return;
    const bool signed_weights = asymmetric.value.get<bool>();
    const std::pair<const char*, nlohmann::json> implied[] = {
        {"weight_type", signed_weights ? "QInt8" : "QUInt8"},
        {"activation_type", "QUInt8"},
        {"extra_options.WeightSymmetric", signed_weights}};
    for (const auto& [key, value] : implied) {
        auto& s = recipe.settings.at(key);
        if (!s.is_default() && s.value != value)
            throw InputError(fmt::format("{}: asymmetric_input_types {} means {} {}, but {} sets it to {}",
                                         asymmetric.origin, signed_weights, key, value.dump(), s.origin,
                                         s.value.dump()));
        s = {value, asymmetric.origin};
    }
}

Recipe load_recipe(const fs::path& file, const std::vector<std::string>& assignments) {
    std::vector<fs::path> chain, files;
    // A bare name not in the current folder is a shipped recipe (`vaiq run cnn_npu.yaml` anywhere).
    ParsedFile parsed = parse_chain(file.has_parent_path() ? file : find_parent(file.string(), "."), chain, files);
    return complete(std::move(parsed), std::move(files), file.string(), assignments);
}

Recipe load_recipe_text(const std::string& text, const std::string& label, const fs::path& base_dir) {
    YAML::Node root;
    try {
        root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
        throw InputError(fmt::format("{}: YAML syntax error: {}", label, e.msg));
    }
    const Source src{label, base_dir, false};
    std::vector<fs::path> chain, files;
    ParsedFile parsed = parse_document(root, src, chain, files);
    return complete(std::move(parsed), std::move(files), label, {});
}

}  // namespace vaiq
