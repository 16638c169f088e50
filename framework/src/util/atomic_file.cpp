#include "util/atomic_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <random>

#include "vaiq/error.hpp"

namespace fs = std::filesystem;

namespace vaiq {

namespace {

// Temporaries of `path` that a killed process left (".<name>.tmp-<pid>-<hex>",
// the pid no longer running) are removed before the file is written again.
void remove_stale_temporaries(const fs::path& path) {
    const std::string prefix = fmt::format(".{}.tmp-", path.filename().string());
    std::error_code ec;
    const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (name.rfind(prefix, 0) != 0) continue;
        const std::string rest = name.substr(prefix.size());  // "<pid>-<hex>"
        const auto dash = rest.find('-');
        if (dash == std::string::npos || dash == 0 || rest.size() - dash - 1 != 8 ||
            rest.find_first_not_of("0123456789") != dash ||
            rest.find_first_not_of("0123456789abcdef", dash + 1) != std::string::npos)
            continue;
        const long pid = std::strtol(rest.c_str(), nullptr, 10);
        if (pid <= 0 || pid == ::getpid()) continue;
        if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // running (or not ours to judge)
        std::error_code ignored;
        fs::remove(it->path(), ignored);
    }
}

}  // namespace

void write_file_atomically(const fs::path& path, const std::function<void(std::ostream&)>& write) {
    remove_stale_temporaries(path);
    std::random_device random;
    const fs::path temp =
        path.parent_path() / fmt::format(".{}.tmp-{}-{:08x}", path.filename().string(), ::getpid(), random());
    try {
        {
            std::ofstream out(temp, std::ios::binary | std::ios::trunc);
            if (!out) throw InputError(fmt::format("{}: cannot create {}", path.string(), temp.string()));
            write(out);
            out.flush();
            if (!out) throw InputError(fmt::format("{}: write failed (disk full?)", path.string()));
        }
        if (int fd = ::open(temp.c_str(), O_RDONLY); fd >= 0) {
            ::fsync(fd);
            ::close(fd);
        }
        std::error_code ec;
        fs::rename(temp, path, ec);
        if (ec)
            throw InputError(
                fmt::format("{}: cannot move the finished file into place: {}", path.string(), ec.message()));
    } catch (...) {
        std::error_code ignored;
        fs::remove(temp, ignored);
        throw;
    }
}

}  // namespace vaiq
