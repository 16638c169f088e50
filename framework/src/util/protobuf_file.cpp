#include "util/protobuf_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <limits>

#include "vaiq/error.hpp"

namespace vaiq {

bool parse_protobuf_file(const std::filesystem::path& file, google::protobuf::MessageLite& message) {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0) {
        if (fd >= 0) ::close(fd);
        throw InputError(fmt::format("{}: cannot open for reading", file.string()));
    }
    const auto size = static_cast<size_t>(st.st_size);
    if (size > static_cast<size_t>(std::numeric_limits<int>::max())) {
        ::close(fd);
        throw InputError(fmt::format("{}: {} bytes, over the 2 GiB a protobuf can hold (larger models keep their "
                                     "tensors in external data)",
                                     file.string(), size));
    }
    if (size == 0) {  // nothing to map: an empty message
        ::close(fd);
        return message.ParseFromArray(nullptr, 0);
    }
    void* bytes = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (bytes == MAP_FAILED) throw InputError(fmt::format("{}: cannot map for reading", file.string()));
    ::madvise(bytes, size, MADV_SEQUENTIAL);
    const bool parsed = message.ParseFromArray(bytes, static_cast<int>(size));
    ::munmap(bytes, size);
    return parsed;
}

}  // namespace vaiq
