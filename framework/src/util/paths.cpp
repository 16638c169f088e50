#include "util/paths.hpp"

#include <boost/dll/runtime_symbol_info.hpp>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "vaiq/error.hpp"

namespace fs = std::filesystem;

namespace vaiq {

fs::path output_folder(const fs::path& output) {
    const fs::path dir = output.has_parent_path() ? output.parent_path() : fs::path(".");
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
        throw InputError(fmt::format("{}: the output folder {} does not exist", output.string(), dir.string()));
    return dir;
}

fs::path library_dir() { return fs::path(boost::dll::this_line_location().parent_path().string()); }

std::vector<fs::path> path_list_from_env(const char* variable) {
    std::vector<fs::path> out;
    const char* value = std::getenv(variable);
    if (!value) return out;
    const std::string s = value;
    for (size_t start = 0; start <= s.size();) {
        size_t end = s.find(':', start);
        if (end == std::string::npos) end = s.size();
        if (end > start) out.emplace_back(s.substr(start, end - start));
        start = end + 1;
    }
    return out;
}

std::vector<fs::path> recipe_search_path() {
    std::vector<fs::path> dirs = path_list_from_env("VAIQ_RECIPE_PATH");
    dirs.push_back((library_dir() / VAIQ_RECIPES_FROM_LIBDIR).lexically_normal());
    dirs.emplace_back(VAIQ_SOURCE_RECIPES_DIR);
    return dirs;
}

}  // namespace vaiq
