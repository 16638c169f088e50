#include "fuzz_support.hpp"

#include <unistd.h>

#include <fstream>
#include <string>

namespace vaiq::fuzz {

const std::filesystem::path& scratch() {
    static const std::filesystem::path dir = [] {
        auto d = std::filesystem::temp_directory_path() / ("vaiq-fuzz-" + std::to_string(::getpid()));
        std::filesystem::create_directories(d);
        return d;
    }();
    return dir;
}

std::filesystem::path write_input(std::string_view name, const uint8_t* data, size_t size) {
    const auto path = scratch() / std::string(name);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    return path;
}

}  // namespace vaiq::fuzz
