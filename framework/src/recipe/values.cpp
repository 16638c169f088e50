// Recipe values as the schema reads them: a YAML node checked against its key's
// kind and normalized (documented spellings, Python's, plugin lists, overrides).
#include "recipe/values.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <regex>
#include <set>

#include "util/paths.hpp"
#include "util/yaml_json.hpp"
#include "vaiq/error.hpp"
#include "vaiq/quant.hpp"
#include "vaiq/text.hpp"

namespace fs = std::filesystem;

namespace vaiq {

// A key's name under extra_options ("FastFinetune.NumIterations" for
// extra_options.FastFinetune.NumIterations), or "" for a key elsewhere.
std::string extra_option_name(const std::string& path) {
    const std::string prefix = "extra_options.";
    return path.rfind(prefix, 0) == 0 ? path.substr(prefix.size()) : std::string();
}

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

namespace {

// YAML's nulls, and Python's None as a Python call would write it.
bool is_null(const YAML::Node& node) { return node.IsNull() || (node.IsScalar() && yaml_to_json(node).is_null()); }

}  // namespace

std::string scalar_string(const YAML::Node& node, const Source& src, std::string_view key) {
    if (!node.IsScalar()) src.fail(node, fmt::format("{} must be a string", key));
    return expand_variables(node.Scalar(), src, node);
}

namespace {

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

}  // namespace

namespace {

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

}  // namespace

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
            // QMX's element comes from MXAttributes.element_dtype (quant_request resolves it).
            if (raw == "QMX" || raw == "ExtendedQuantType.QMX") return std::string("QMX");
            std::vector<std::string> names;
            for (auto t : {QuantType::QInt8, QuantType::QUInt8, QuantType::QInt16, QuantType::QUInt16,
                           QuantType::QInt32, QuantType::QUInt32, QuantType::QFloat16, QuantType::QBFloat16,
                           QuantType::QInt4, QuantType::QUInt4, QuantType::QFloat8E4M3FN, QuantType::QFloat8E5M2,
                           QuantType::QBFP16, QuantType::QMXInt8, QuantType::QMXFP8E4M3, QuantType::QMXFP8E5M2,
                           QuantType::QMXFP6E3M2, QuantType::QMXFP6E2M3, QuantType::QMXFP4E2M1})
                names.push_back(quant_type_name(t));
            names.push_back("QMX");
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
        case ValueKind::Passes:
            return normalize_plugin_list(node, src,
                                         key == "algorithms" ? "algorithm"
                                         : key == "reports"  ? "report"
                                                             : "pass");
        case ValueKind::Overrides: return normalize_overrides(node, src);
    }
    throw InternalError("unhandled value kind for " + key);
}

}  // namespace vaiq
