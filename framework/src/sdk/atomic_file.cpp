#include "sdk/atomic_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <random>
#include <regex>
#include <set>
#include <utility>

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

PendingFile::PendingFile(const fs::path& path, const std::function<void(std::ostream&)>& write) : path_(path) {
    remove_stale_temporaries(path.has_parent_path() ? path.parent_path() : fs::path("."));
    std::random_device random;
    temp_ = path.parent_path() / fmt::format(".{}.tmp-{}-{:08x}", path.filename().string(), ::getpid(), random());
    try {
        {
            std::ofstream out(temp_, std::ios::binary | std::ios::trunc);
            if (!out) throw InputError(fmt::format("{}: cannot create {}", path.string(), temp_.string()));
            write(out);
            out.flush();
            if (!out) throw InputError(fmt::format("{}: write failed (disk full?)", path.string()));
        }
        if (int fd = ::open(temp_.c_str(), O_RDONLY); fd >= 0) {
            ::fsync(fd);
            ::close(fd);
        }
    } catch (...) {
        std::error_code ignored;
        fs::remove(temp_, ignored);
        throw;
    }
}

PendingFile::PendingFile(PendingFile&& other) noexcept
    : path_(std::move(other.path_)), temp_(std::exchange(other.temp_, {})) {}

PendingFile::~PendingFile() {
    if (temp_.empty()) return;
    std::error_code ignored;
    fs::remove(temp_, ignored);
}

void PendingFile::commit() {
    std::error_code ec;
    fs::rename(temp_, path_, ec);
    if (ec)
        throw InputError(fmt::format("{}: cannot move the finished file into place: {}", path_.string(), ec.message()));
    temp_.clear();
}

void failpoint(std::string_view point) {
    const char* wanted = std::getenv("VAIQ_FAILPOINT");
    if (wanted && point == wanted) ::raise(SIGKILL);
}

void write_file_atomically(const fs::path& path, const std::function<void(std::ostream&)>& write) {
    PendingFile(path, write).commit();
}

}  // namespace vaiq
