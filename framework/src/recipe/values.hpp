// Reading recipe values: where they come from and how a node becomes a setting
// (internal to the recipe loader).
#pragma once

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <string>
#include <string_view>

#include "recipe/schema.hpp"
#include "vaiq/error.hpp"

namespace vaiq {

// Where values are read from: a recipe file, a --set assignment, or a default.
struct Source {
    std::string label;  // file path, or "--set key=value"
    std::filesystem::path dir;  // relative paths resolve against it
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

// A key's name under extra_options ("FastFinetune.NumIterations" for
// extra_options.FastFinetune.NumIterations), or "" for a key elsewhere.
std::string extra_option_name(const std::string& path);

/// `text` with ${VAR} replaced by the environment's value (${RECIPE_DIR}: the
/// recipe's folder); an unset variable is an error at `node`.
std::string expand_variables(const std::string& text, const Source& src, const YAML::Node& node);

/// A scalar's text; anything else is an error naming `key`.
std::string scalar_string(const YAML::Node& node, const Source& src, std::string_view key);

/// `node` as the setting `spec` describes, checked and in its documented spelling.
nlohmann::json normalize(const KeySpec& spec, const YAML::Node& node, const Source& src);

}  // namespace vaiq
