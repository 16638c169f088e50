#include "recipe/recipe.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdlib>
#include <regex>
#include <set>

#include "recipe/defaults.hpp"
#include "util/paths.hpp"
#include "util/text.hpp"
#include "util/yaml_json.hpp"
#include "vaiq/error.hpp"
#include "vaiq/quant.hpp"

namespace fs = std::filesystem;

namespace vaiq {

void resolve_original_tool_settings(Recipe& recipe);

namespace {

// A key's name under extra_options ("FastFinetune.NumIterations" for
// extra_options.FastFinetune.NumIterations), or "" for a key elsewhere.
std::string extra_option_name(const std::string& path) {
    const std::string prefix = "extra_options.";
    return path.rfind(prefix, 0) == 0 ? path.substr(prefix.size()) : std::string();
}

// Where values are read from: a recipe file, a --set assignment, or a default.
struct Source {
    std::string label;  // file path, or "--set key=value"
    fs::path dir;       // relative paths resolve against it
    bool has_marks;     // YAML marks point into a file

    std::string at(const YAML::Node& node) const {
        if (!has_marks) return label;
        const auto mark = node.Mark();
        if (mark.is_null()) return label;
        return fmt::format("{}:{}:{}", label, mark.line + 1, mark.column + 1);
    }
    [[noreturn]] void fail(const YAML::Node& node, const std::string& message) const {
        throw InputError(fmt::format("{}: {}", at(node), message));
    }
};

std::string expand_variables(const std::string& text, const Source& src, const YAML::Node& node) {
    static const std::regex kVariable(R"(\$\{([A-Za-z_][A-Za-z0-9_]*)\})");
    std::string out;
    auto begin = std::sregex_iterator(text.begin(), text.end(), kVariable);
    size_t last = 0;
    for (auto it = begin; it != std::sregex_iterator(); ++it) {
        const auto& m = *it;
        out += text.substr(last, m.position() - last);
        const std::string name = m[1];
        if (name == "RECIPE_DIR") {
            out += std::filesystem::absolute(src.dir).lexically_normal().string();
        } else if (const char* value = std::getenv(name.c_str())) {
            out += value;
        } else {
            src.fail(node,
                     fmt::format("'{}' uses ${{{}}}, but the environment variable {} is not set", text, name, name));
        }
        last = m.position() + m.length();
    }
    out += text.substr(last);
    return out;
}

// YAML's nulls, and Python's None as a Python call would write it.
bool is_null(const YAML::Node& node) { return node.IsNull() || (node.IsScalar() && yaml_to_json(node).is_null()); }

std::string scalar_string(const YAML::Node& node, const Source& src, std::string_view key) {
    if (!node.IsScalar()) src.fail(node, fmt::format("{} must be a string", key));
    return expand_variables(node.Scalar(), src, node);
}

std::string resolve_path(const std::string& text, const Source& src) {
    fs::path p(text);
    if (p.is_relative()) p = src.dir / p;
    return p.lexically_normal().string();
}

std::vector<std::string> string_list(const YAML::Node& node, const Source& src, std::string_view key) {
    if (is_null(node)) return {};
    if (!node.IsSequence()) src.fail(node, fmt::format("{} must be a list of strings, e.g. [a, b]", key));
    std::vector<std::string> out;
    for (const auto& item : node) out.push_back(scalar_string(item, src, fmt::format("each item of {}", key)));
    return out;
}

int64_t integer(const YAML::Node& node, const Source& src, std::string_view key) {
    const auto v = node.IsScalar() ? yaml_to_json(node) : nlohmann::json();
    if (!v.is_number_integer()) src.fail(node, fmt::format("{} must be an integer", key));
    return v.get<int64_t>();
}

double number(const YAML::Node& node, const Source& src, std::string_view key) {
    const auto v = node.IsScalar() ? yaml_to_json(node) : nlohmann::json();
    if (!v.is_number()) src.fail(node, fmt::format("{} must be a number", key));
    return v.get<double>();
}

bool is_plugin_name(const std::string& s) {
    static const std::regex kName("[a-z][a-z0-9_]*");
    return std::regex_match(s, kName);
}

std::string strip_prefix(std::string s, std::string_view prefix) {
    if (s.rfind(prefix, 0) == 0) s.erase(0, prefix.size());
    return s;
}

const std::vector<std::string> kQuantFormats = {"QDQ",         "QOperator",  "IntegerOps", "QLinearOps",
                                                "MatMulNBits", "VitisQuantFormat.QDQ", "VitisQuantFormat.FixNeuron"};
const std::vector<std::string> kFloatMethods = {"MinMax", "Entropy", "Percentile"};
const std::vector<std::string> kPowerOfTwoMethods = {"NonOverflow", "MinMSE"};

std::string normalize_quant_format(const YAML::Node& node, const Source& src) {
    const std::string raw = scalar_string(node, src, "quant_format");
    std::string s = strip_prefix(strip_prefix(raw, "vai_q_onnx."), "QuantFormat.");
    s = strip_prefix(s, "QuantizationMode.");  // the original tool's name for IntegerOps/QLinearOps
    if (std::find(kQuantFormats.begin(), kQuantFormats.end(), s) != kQuantFormats.end()) return s;
    if (is_plugin_name(s)) return s;
    src.fail(node, fmt::format("quant_format '{}' is not a quant format{} (choices: {}, or a format plugin's name)",
                               raw, did_you_mean(s, kQuantFormats), join(kQuantFormats)));
}

std::string normalize_calibrate_method(const YAML::Node& node, const Source& src) {
    const std::string raw = scalar_string(node, src, "calibrate_method");
    std::string s = strip_prefix(raw, "vai_q_onnx.");
    if (s == "naive") return "MinMax";  // the original tool's calib_mode: the extremes over all batches
    std::vector<std::string> allowed;
    if (s.rfind("CalibrationMethod.", 0) == 0) {
        s = strip_prefix(s, "CalibrationMethod.");
        allowed = kFloatMethods;
    } else if (s.rfind("PowerOfTwoMethod.", 0) == 0) {
        s = strip_prefix(s, "PowerOfTwoMethod.");
        allowed = kPowerOfTwoMethods;
    } else {
        allowed = kFloatMethods;
        allowed.insert(allowed.end(), kPowerOfTwoMethods.begin(), kPowerOfTwoMethods.end());
        if (is_plugin_name(s)) return s;
    }
    if (std::find(allowed.begin(), allowed.end(), s) != allowed.end()) return s;
    auto in = [&](const std::vector<std::string>& family) {
        return std::find(family.begin(), family.end(), s) != family.end();
    };
    if (in(kFloatMethods) || in(kPowerOfTwoMethods))
        src.fail(node, fmt::format("calibrate_method '{}': {} is a {}; write {}.{}", raw, s,
                                   in(kFloatMethods) ? "CalibrationMethod" : "PowerOfTwoMethod",
                                   in(kFloatMethods) ? "CalibrationMethod" : "PowerOfTwoMethod", s));
    src.fail(node, fmt::format("calibrate_method '{}' is not a calibration method{} (choices: {}, or a calibrator "
                               "plugin's name)",
                               raw, did_you_mean(s, allowed), join(allowed)));
}

nlohmann::json shape(const YAML::Node& node, const Source& src) {
    if (!node.IsSequence()) src.fail(node, "a shape must be a list of positive integers, e.g. [1, 3, 224, 224]");
    auto out = nlohmann::json::array();
    for (const auto& d : node) {
        const int64_t v = integer(d, src, "a dimension");
        if (v < 1) src.fail(d, fmt::format("dimension {} must be a positive integer", v));
        out.push_back(v);
    }
    return out;
}

nlohmann::json shape_spec(const YAML::Node& node, const Source& src) {
    if (is_null(node)) return nlohmann::json::array();
    if (node.IsMap()) {
        auto out = nlohmann::json::object();
        for (const auto& kv : node) out[kv.first.Scalar()] = shape(kv.second, src);
        return out;
    }
    if (!node.IsSequence())
        src.fail(node,
                 "random_data_reader_input_shape must be a shape, a list of shapes, or a map of input name to "
                 "shape");
    if (node.size() > 0 && node[0].IsSequence()) {
        auto out = nlohmann::json::array();
        for (const auto& s : node) out.push_back(shape(s, src));
        return out;
    }
    return node.size() == 0 ? nlohmann::json::array() : shape(node, src);
}

// A list of plugins of one kind (`noun`: "pass", "algorithm"), each a name or a {name, options} map.
nlohmann::json normalize_plugin_list(const YAML::Node& node, const Source& src, const std::string& noun) {
    const std::string one = (noun == "algorithm" ? "an " : "a ") + noun;
    if (is_null(node)) return nlohmann::json::array();
    if (!node.IsSequence())
        src.fail(node, fmt::format("{} must be a list of {} names or {{name, options}} maps",
                                   noun == "pass" ? "passes" : noun + "s", noun));
    auto out = nlohmann::json::array();
    for (const auto& item : node) {
        nlohmann::json pass = {{"options", nlohmann::json::object()}, {"origin", src.at(item)}};
        if (item.IsScalar()) {
            pass["name"] = scalar_string(item, src, one + " name");
        } else if (item.IsMap()) {
            for (const auto& kv : item) {
                const auto key = kv.first.Scalar();
                if (key == "name")
                    pass["name"] = scalar_string(kv.second, src, "name");
                else if (key == "options") {
                    if (!kv.second.IsMap() && !kv.second.IsNull()) src.fail(kv.second, "options must be a map");
                    if (kv.second.IsMap()) pass["options"] = yaml_to_json(kv.second);
                } else {
                    src.fail(kv.first, fmt::format("unknown key '{}' in {}{} (valid keys: name, options)", key, one,
                                                   did_you_mean(key, {"name", "options"})));
                }
            }
            if (!pass.contains("name")) src.fail(item, one + " needs a name");
        } else {
            src.fail(item, one + " is a name or a {name, options} map");
        }
        if (!is_plugin_name(pass["name"]))
            src.fail(item, fmt::format("'{}' is not a plugin name ([a-z][a-z0-9_]*)", pass["name"].get<std::string>()));
        out.push_back(pass);
    }
    return out;
}

nlohmann::json normalize(const KeySpec& spec, const YAML::Node& node, const Source& src);

nlohmann::json normalize_overrides(const YAML::Node& node, const Source& src) {
    if (is_null(node)) return nlohmann::json::array();
    if (!node.IsSequence()) src.fail(node, "overrides must be a list of {match, set} or {match, exclude} entries");
    std::vector<std::string> settable;
    for (const auto& k : override_keys()) settable.emplace_back(k.name);
    auto out = nlohmann::json::array();
    for (const auto& item : node) {
        if (!item.IsMap()) src.fail(item, "an override is a map with match and either set or exclude");
        nlohmann::json entry = {{"origin", src.at(item)}, {"exclude", false}, {"set", nlohmann::json::object()}};
        bool has_match = false;
        bool has_set = false;
        for (const auto& kv : item) {
            const auto key = kv.first.Scalar();
            if (key == "match") {
                has_match = true;
                if (!kv.second.IsMap()) src.fail(kv.second, "match must be a map of name, op_type and optional");
                nlohmann::json match = {
                    {"name", nlohmann::json::array()}, {"op_type", nlohmann::json::array()}, {"optional", false}};
                for (const auto& m : kv.second) {
                    const auto mk = m.first.Scalar();
                    if (mk == "name" || mk == "op_type") {
                        auto values = m.second.IsScalar() ? std::vector<std::string>{scalar_string(m.second, src, mk)}
                                                          : string_list(m.second, src, mk);
                        for (const auto& v : values) {
                            if (mk == "name" && v.rfind("re:", 0) == 0) {
                                try {
                                    std::regex check(v.substr(3));
                                } catch (const std::regex_error& e) {
                                    src.fail(m.second, fmt::format("'{}' is not a valid regular expression: {}",
                                                                   v.substr(3), e.what()));
                                }
                            }
                            match[mk].push_back(v);
                        }
                    } else if (mk == "optional") {
                        const auto v = yaml_to_json(m.second);
                        if (!v.is_boolean()) src.fail(m.second, "optional must be true or false");
                        match["optional"] = v;
                    } else {
                        src.fail(m.first,
                                 fmt::format("unknown key '{}' in match{} (valid keys: name, op_type, optional)", mk,
                                             did_you_mean(mk, {"name", "op_type", "optional"})));
                    }
                }
                if (match["name"].empty() && match["op_type"].empty())
                    src.fail(kv.second, "match needs a name or an op_type");
                entry["match"] = match;
            } else if (key == "exclude") {
                const auto v = yaml_to_json(kv.second);
                if (!v.is_boolean()) src.fail(kv.second, "exclude must be true or false");
                entry["exclude"] = v;
            } else if (key == "set") {
                has_set = true;
                if (!kv.second.IsMap()) src.fail(kv.second, "set must be a map of setting: value");
                for (const auto& s : kv.second) {
                    const auto sk = s.first.Scalar();
                    auto ok = std::find_if(override_keys().begin(), override_keys().end(),
                                           [&](const auto& k) { return k.name == sk; });
                    if (ok == override_keys().end())
                        src.fail(s.first, fmt::format("'{}' cannot be set per node{} (settable: {})", sk,
                                                      did_you_mean(sk, settable), join(settable)));
                    entry["set"][std::string(ok->recipe_key)] = normalize(*find_key(ok->recipe_key), s.second, src);
                }
            } else {
                src.fail(kv.first, fmt::format("unknown key '{}' in an override{} (valid keys: match, set, exclude)",
                                               key, did_you_mean(key, {"match", "set", "exclude"})));
            }
        }
        if (!has_match) src.fail(item, "an override needs a match");
        if (entry["exclude"].get<bool>() == has_set)
            src.fail(item, has_set ? "an override either sets values or excludes nodes, not both"
                                   : "an override needs either set or exclude: true");
        out.push_back(entry);
    }
    return out;
}

nlohmann::json normalize(const KeySpec& spec, const YAML::Node& node, const Source& src) {
    const std::string key(spec.path);
    switch (spec.kind) {
        case ValueKind::SchemaVersion: {
            const int64_t v = integer(node, src, key);
            if (v != 1) src.fail(node, fmt::format("recipe_version {} is not supported; this vaiq reads version 1", v));
            return v;
        }
        case ValueKind::Bool: {
            const auto v = node.IsScalar() || node.IsNull() ? yaml_to_json(node) : nlohmann::json();
            if (v.is_null() && spec.default_yaml == "null") return v;
            if (!v.is_boolean())
                src.fail(node, fmt::format("{} must be true or false, not '{}'", key,
                                           node.IsScalar() ? node.Scalar() : "a collection"));
            return v;
        }
        case ValueKind::Int:
            if (is_null(node) && spec.default_yaml == "null") return nullptr;
            return integer(node, src, key);
        case ValueKind::Float:
            if (is_null(node) && spec.default_yaml == "null") return nullptr;
            return number(node, src, key);
        case ValueKind::String: return is_null(node) ? std::string() : scalar_string(node, src, key);
        case ValueKind::Path: return resolve_path(scalar_string(node, src, key), src);
        case ValueKind::OptionalPath:
            if (is_null(node)) return nullptr;
            return resolve_path(scalar_string(node, src, key), src);
        case ValueKind::PathList: {
            auto out = nlohmann::json::array();
            for (const auto& p : string_list(node, src, key)) out.push_back(resolve_path(p, src));
            return out;
        }
        case ValueKind::StringList: return string_list(node, src, key);
        case ValueKind::NumberList: {
            if (is_null(node)) return nlohmann::json::array();
            if (!node.IsSequence()) src.fail(node, fmt::format("{} must be a list of numbers", key));
            auto out = nlohmann::json::array();
            for (const auto& item : node) {
                const double v = number(item, src, key);
                if (!std::isfinite(v)) src.fail(item, fmt::format("{} holds {}, not a finite number", key, v));
                out.push_back(v);
            }
            return out;
        }
        case ValueKind::QuantType: {
            const auto raw = scalar_string(node, src, key);
            if (auto t = parse_quant_type(raw)) return quant_type_name(*t);
            std::vector<std::string> names;
            for (auto t : {QuantType::QInt8, QuantType::QUInt8, QuantType::QInt16, QuantType::QUInt16,
                           QuantType::QInt32, QuantType::QUInt32, QuantType::QFloat16, QuantType::QBFloat16,
                           QuantType::QInt4, QuantType::QUInt4})
                names.push_back(quant_type_name(t));
            src.fail(node, fmt::format("{} '{}' is not a quant type{} (choices: {})", key, raw,
                                       did_you_mean(raw, names), join(names)));
        }
        case ValueKind::QuantFormat: return normalize_quant_format(node, src);
        case ValueKind::CalibrateMethod: return normalize_calibrate_method(node, src);
        case ValueKind::PluginName: {
            const auto s = scalar_string(node, src, key);
            if (!is_plugin_name(s))
                src.fail(node, fmt::format("{} '{}' is not a plugin name ([a-z][a-z0-9_]*)", key, s));
            return s;
        }
        case ValueKind::Choice: {
            const auto s = scalar_string(node, src, key);
            std::vector<std::string> choices(spec.choices.begin(), spec.choices.end());
            if (std::find(choices.begin(), choices.end(), s) == choices.end())
                src.fail(node, fmt::format("{} '{}' is not valid{} (choices: {})", key, s, did_you_mean(s, choices),
                                           join(choices)));
            return s;
        }
        case ValueKind::ShapeSpec: return shape_spec(node, src);
        case ValueKind::IntMap: {
            if (is_null(node)) return nlohmann::json::object();
            if (!node.IsMap())
                src.fail(node, fmt::format("{} must be a map of op type to axis, e.g. {{MatMul: 1}}", key));
            auto out = nlohmann::json::object();
            for (const auto& kv : node) out[kv.first.Scalar()] = integer(kv.second, src, "an axis");
            return out;
        }
        case ValueKind::RangeMap: {
            if (is_null(node)) return nullptr;
            if (!node.IsMap()) src.fail(node, fmt::format("{} must be a map of input name to [low, high]", key));
            auto out = nlohmann::json::object();
            for (const auto& kv : node) {
                if (!kv.second.IsSequence() || kv.second.size() != 2)
                    src.fail(kv.second, "a data range is [low, high]");
                const double lo = number(kv.second[0], src, "low");
                const double hi = number(kv.second[1], src, "high");
                if (lo > hi) src.fail(kv.second, fmt::format("the range [{}, {}] has low above high", lo, hi));
                out[kv.first.Scalar()] = {lo, hi};
            }
            return out;
        }
        case ValueKind::ParamsMap: {
            if (is_null(node)) return nlohmann::json::object();
            if (!node.IsMap()) src.fail(node, fmt::format("{} must be a map of tensor name to [zero_point, scale]", key));
            auto out = nlohmann::json::object();
            for (const auto& kv : node) {
                if (!kv.second.IsSequence() || kv.second.size() != 2)
                    src.fail(kv.second, "quantization parameters are [zero_point, scale]");
                const int64_t zero_point = integer(kv.second[0], src, "the zero point");
                const double scale = number(kv.second[1], src, "the scale");
                if (!(scale > 0) || !std::isfinite(scale))
                    src.fail(kv.second[1], fmt::format("the scale of '{}' must be positive and finite, not {}",
                                                       kv.first.Scalar(), scale));
                out[kv.first.Scalar()] = {zero_point, scale};
            }
            return out;
        }
        case ValueKind::Providers: {
            const auto providers = string_list(node, src, key);
            for (const auto& p : providers)
                if (p != "CPUExecutionProvider")
                    src.fail(node, fmt::format("vaiq calibrates on its own CPU executor; execution_providers accepts "
                                               "only CPUExecutionProvider, not '{}'",
                                               p));
            return providers;
        }
        case ValueKind::Passes: return normalize_plugin_list(node, src, key == "algorithms" ? "algorithm" : "pass");
        case ValueKind::Overrides: return normalize_overrides(node, src);
    }
    throw InternalError("unhandled value kind for " + key);
}

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
        } else if (is_plugin_options_section(section)) {
            auto value = yaml_to_json(kv.second);
            if (value.is_string()) value = expand_variables(value.get<std::string>(), src, kv.second);
            out.settings[path] = {value, src.at(kv.first)};
        } else if (const KeySpec* spec = find_key(path)) {
            out.settings[path] = {normalize(*spec, kv.second, src), src.at(kv.first)};
            if (path == "recipe_version") out.has_version = true;
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

QuantRequest quant_request(const Options& config) {
    QuantRequest r;
    r.activation_type = *parse_quant_type(config.get_string("activation_type"));
    r.weight_type = *parse_quant_type(config.get_string("weight_type"));
    r.activation_symmetric = config.get_bool("extra_options.ActivationSymmetric");
    r.weight_symmetric = config.get_bool("extra_options.WeightSymmetric");
    r.per_channel = config.get_bool("per_channel");
    r.reduce_range = config.get_bool("reduce_range");
    r.block_size = config.get_int("block_size");
    r.quantize_bias = config.get_bool("extra_options.QuantizeBias");
    r.int16_scale = config.get_bool("extra_options.Int16Scale");
    r.enable_dpu = config.get_bool("enable_dpu");
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
    if (const auto eq = spec->enabled_by.find('='); eq != std::string_view::npos) {  // "key=value"
        const auto& v = value(spec->enabled_by.substr(0, eq));
        return v.is_string() && v.get<std::string>() == spec->enabled_by.substr(eq + 1);
    }
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
    if (is_section(path))
        throw InputError(
            fmt::format("{}: {} is a section; set one key in it, e.g. {}.<key>=...", src.label, path, path));
    if (is_plugin_options_section(section)) {
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
    ParsedFile parsed = parse_chain(file, chain, files);
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
