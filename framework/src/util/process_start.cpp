#include "util/process_start.hpp"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace vaiq {

std::optional<std::string> openmp_spin_count(const char* wait_policy, const char* spin_count) {
    if (wait_policy || spin_count) return std::nullopt;
    return "5000";
}

void restart_tuned(char** argv) {
    const char* ld_preload = std::getenv("LD_PRELOAD");
    if (ld_preload && std::string_view(ld_preload).find("vgpreload") != std::string_view::npos) return;
    const auto spins = openmp_spin_count(std::getenv("OMP_WAIT_POLICY"), std::getenv("GOMP_SPINCOUNT"));
    if (!spins || ::setenv("GOMP_SPINCOUNT", spins->c_str(), 1) != 0) return;
    // By its own path, not /proc/self/exe, so that the process keeps its name (ps, top, pkill).
    std::error_code error;
    const auto self = std::filesystem::read_symlink("/proc/self/exe", error);
    if (error) return;
    ::execv(self.c_str(), argv);  // returns only when it failed: go on as started
}

}  // namespace vaiq
