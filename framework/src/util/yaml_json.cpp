#include "util/yaml_json.hpp"

#include <regex>

namespace vaiq {

namespace {
nlohmann::json plain_scalar(const std::string& s) {
    static const std::regex kInt(R"([-+]?(0|[1-9][0-9]*))");
    static const std::regex kFloat(R"([-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?)");
    if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL" || s == "None") return nullptr;
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
    if (std::regex_match(s, kInt)) {
        try {
            return std::stoll(s);
        } catch (const std::out_of_range&) {
            return s;
        }
    }
    if (std::regex_match(s, kFloat)) return std::stod(s);
    if (s == ".inf" || s == "+.inf") return std::numeric_limits<double>::infinity();
    if (s == "-.inf") return -std::numeric_limits<double>::infinity();
    return s;
}
}  // namespace

nlohmann::json yaml_to_json(const YAML::Node& node) {
    switch (node.Type()) {
        case YAML::NodeType::Null:
        case YAML::NodeType::Undefined: return nullptr;
        case YAML::NodeType::Scalar:
            // yaml-cpp tags quoted scalars "!" and plain ones "?".
            return node.Tag() == "!" ? nlohmann::json(node.Scalar()) : plain_scalar(node.Scalar());
        case YAML::NodeType::Sequence: {
            auto array = nlohmann::json::array();
            for (const auto& item : node) array.push_back(yaml_to_json(item));
            return array;
        }
        case YAML::NodeType::Map: {
            auto object = nlohmann::json::object();
            for (const auto& kv : node) object[kv.first.Scalar()] = yaml_to_json(kv.second);
            return object;
        }
    }
    return nullptr;
}

nlohmann::json parse_yaml_value(const std::string& text) { return yaml_to_json(YAML::Load(text)); }

}  // namespace vaiq
