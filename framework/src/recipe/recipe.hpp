// Recipes: loading, merging (extends), command-line overrides, resolution.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "recipe/schema.hpp"
#include "vaiq/options.hpp"
#include "vaiq/target.hpp"

namespace vaiq {

/// One resolved recipe value and where it came from.
struct Setting {
    nlohmann::json value;
    std::string origin;  ///< "recipes/cpu.yaml:4:1", "--set", or "default"
    bool is_default() const { return origin == "default"; }
};

/// A recipe after `extends:` and --set are applied: every schema key has a
/// value (its default where nothing set it), normalised (quant types in their
/// canonical spelling, paths absolute, passes and overrides as objects).
class Recipe {
  public:
    /// The recipe file and the files it extends, the named file first.
    std::vector<std::filesystem::path> files;
    /// Schema keys and plugin options ("plugin_options.calibrator.bins").
    std::map<std::string, Setting, std::less<>> settings;

    const Setting& setting(std::string_view path) const;
    const nlohmann::json& value(std::string_view path) const { return setting(path).value; }
    /// The options given for the target, format or calibrator plugin, as an object.
    nlohmann::json plugin_options(std::string_view kind) const;
    /// The origin of one of those options.
    std::string plugin_option_origin(std::string_view kind, const std::string& option) const;
    /// The quantize_static settings by documented name, for targets and formats.
    Options quantize_config() const;
    /// extra_options that are not quantize_static's own but a plugin's (by
    /// option name), as given: check_extra_options() checks them.
    std::map<std::string, const Setting*> plugin_extra_options() const;
    /// Keys whose value is not the default.
    std::vector<std::string> explicit_keys() const;
    /// Whether a key takes effect: false when a switch it depends on is off.
    bool in_effect(std::string_view path) const;

    /// The plugin names the documented values map to.
    std::string format_plugin() const;
    std::string calibrator_plugin() const;
};

/// The documented settings of `config` (the run's, or a node's after its
/// overrides) as targets take them; power_of_two is left to the caller.
QuantRequest quant_request(const Options& config);

/// Applies "key.path=value" (value as YAML) on top of a recipe.
void apply_setting(Recipe& recipe, const std::string& assignment, const std::filesystem::path& base_dir);

/// Loads a recipe file, its `extends:` chain and the --set assignments.
/// Throws InputError "file:line:column: message" for anything invalid.
Recipe load_recipe(const std::filesystem::path& file, const std::vector<std::string>& assignments = {});

/// Loads a recipe held in memory (the Python API's arguments as a document):
/// checked like a file, messages start with `label`, relative paths and
/// `extends:` resolve against `base_dir`.
Recipe load_recipe_text(const std::string& text, const std::string& label, const std::filesystem::path& base_dir);

}  // namespace vaiq
