#include "util/atomic_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
#include <random>

#include "vaiq/error.hpp"

namespace fs = std::filesystem;

namespace vaiq {

void write_file_atomically(const fs::path& path, const std::function<void(std::ostream&)>& write) {
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
