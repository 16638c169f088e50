// Converting YAML nodes into JSON values.
#pragma once

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

namespace vaiq {

/// Converts with YAML 1.2 core-schema typing of plain scalars: true/false (any
/// case, as Python writes them), null/~/empty, integers, floats; quoted scalars
/// stay strings. Map keys are strings.
nlohmann::json yaml_to_json(const YAML::Node& node);

/// Parses a scalar written on a command line or as a plugin option default
/// ("true", "0.5", "[a, b]", "{x: 1}"); throws YAML::Exception when malformed.
nlohmann::json parse_yaml_value(const std::string& text);

}  // namespace vaiq
