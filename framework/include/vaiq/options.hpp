// vaiq/options.hpp - typed option values handed to plugins.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "vaiq/export.hpp"

namespace vaiq {

/// A set of named, already-validated option values. The host fills it from the
/// plugin's schema defaults and the recipe, checking names and types first, so
/// a plugin never sees an unknown key or a value of the wrong type.
class VAIQ_API Options {
  public:
    bool has(std::string_view name) const;
    bool get_bool(std::string_view name) const;
    int64_t get_int(std::string_view name) const;
    double get_float(std::string_view name) const;  ///< accepts integers too
    std::string get_string(std::string_view name) const;
    std::vector<std::string> get_string_list(std::string_view name) const;
    /// Any value, including lists of lists and maps (e.g. shape specs).
    const nlohmann::json& get(std::string_view name) const;

    void set(std::string name, nlohmann::json value);
    const std::map<std::string, nlohmann::json, std::less<>>& values() const { return values_; }

  private:
    std::map<std::string, nlohmann::json, std::less<>> values_;
};

}  // namespace vaiq
