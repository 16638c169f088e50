#include "util/process_start.hpp"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

namespace vaiq {

std::optional<std::string> tunables_for_huge_pages(const char* current, std::string_view thp_enabled,
                                                   const char* ld_preload) {
    constexpr std::string_view kTunable = "glibc.malloc.hugetlb";
    const std::string tunables = current ? current : "";
    if (tunables.find(kTunable) != std::string::npos) return std::nullopt;
    if (ld_preload && std::string_view(ld_preload).find("vgpreload") != std::string_view::npos) return std::nullopt;
    if (thp_enabled.find("[madvise]") == std::string_view::npos) return std::nullopt;
    return (tunables.empty() ? "" : tunables + ":") + std::string(kTunable) + "=1";
}

std::optional<std::string> openmp_spin_count(const char* wait_policy, const char* spin_count) {
    if (wait_policy || spin_count) return std::nullopt;
    return "5000";
}

void restart_tuned(char** argv) {
    const char* ld_preload = std::getenv("LD_PRELOAD");
    if (ld_preload && std::string_view(ld_preload).find("vgpreload") != std::string_view::npos) return;
    std::ifstream mode("/sys/kernel/mm/transparent_hugepage/enabled");
    const std::string thp((std::istreambuf_iterator<char>(mode)), std::istreambuf_iterator<char>());
    const auto tunables = tunables_for_huge_pages(std::getenv("GLIBC_TUNABLES"), thp, ld_preload);
    const auto spins = openmp_spin_count(std::getenv("OMP_WAIT_POLICY"), std::getenv("GOMP_SPINCOUNT"));
    if (!tunables && !spins) return;
    if (tunables && ::setenv("GLIBC_TUNABLES", tunables->c_str(), 1) != 0) return;
    if (spins && ::setenv("GOMP_SPINCOUNT", spins->c_str(), 1) != 0) return;
    ::execv("/proc/self/exe", argv);  // returns only when it failed: go on as started
}

}  // namespace vaiq
