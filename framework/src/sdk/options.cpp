#include "vaiq/options.hpp"

#include <fmt/format.h>

#include "vaiq/error.hpp"

namespace vaiq {

namespace {
[[noreturn]] void wrong_type(std::string_view name, const char* wanted, const nlohmann::json& value) {
    throw InternalError(fmt::format("option '{}' is read as {} but holds {}", name, wanted, value.dump()));
}
}  // namespace

bool Options::has(std::string_view name) const { return values_.find(name) != values_.end(); }

const nlohmann::json& Options::get(std::string_view name) const {
    auto it = values_.find(name);
    if (it == values_.end()) throw InternalError(fmt::format("option '{}' is not set", name));
    return it->second;
}

bool Options::get_bool(std::string_view name) const {
    const auto& v = get(name);
    if (!v.is_boolean()) wrong_type(name, "a bool", v);
    return v.get<bool>();
}

int64_t Options::get_int(std::string_view name) const {
    const auto& v = get(name);
    if (!v.is_number_integer()) wrong_type(name, "an integer", v);
    return v.get<int64_t>();
}

double Options::get_float(std::string_view name) const {
    const auto& v = get(name);
    if (!v.is_number()) wrong_type(name, "a number", v);
    return v.get<double>();
}

std::string Options::get_string(std::string_view name) const {
    const auto& v = get(name);
    if (!v.is_string()) wrong_type(name, "a string", v);
    return v.get<std::string>();
}

std::vector<std::string> Options::get_string_list(std::string_view name) const {
    const auto& v = get(name);
    if (v.is_null()) return {};
    if (!v.is_array()) wrong_type(name, "a list of strings", v);
    std::vector<std::string> out;
    for (const auto& item : v) {
        if (!item.is_string()) wrong_type(name, "a list of strings", v);
        out.push_back(item.get<std::string>());
    }
    return out;
}

void Options::set(std::string name, nlohmann::json value) { values_[std::move(name)] = std::move(value); }

}  // namespace vaiq
