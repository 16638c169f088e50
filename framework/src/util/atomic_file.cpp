#include "util/atomic_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <random>
#include <regex>
#include <set>

#include "vaiq/error.hpp"

namespace fs = std::filesystem;

namespace vaiq {

namespace {

// Temporaries that killed processes left in `dir` (".<name>.tmp-<pid>-<hex>",
// the pid no longer running) are removed before the first file this process
// writes there: once per folder, so a dump of thousands of files scans it once.
void remove_stale_temporaries(const fs::path& dir) {
    static std::mutex mutex;
    static std::set<fs::path> cleaned;
    {
        std::lock_guard lock(mutex);
        if (!cleaned.insert(dir).second) return;
    }
    static const std::regex kTemporary(R"(\..+\.tmp-(\d+)-[0-9a-f]{8})");
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        std::smatch m;
        if (!std::regex_match(name, m, kTemporary)) continue;
        const long pid = std::strtol(m[1].str().c_str(), nullptr, 10);
        if (pid <= 0 || pid == ::getpid()) continue;
        if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // running (or not ours to judge)
        std::error_code ignored;
        fs::remove(it->path(), ignored);
    }
}

}  // namespace

void write_file_atomically(const fs::path& path, const std::function<void(std::ostream&)>& write) {
    remove_stale_temporaries(path.has_parent_path() ? path.parent_path() : fs::path("."));
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
