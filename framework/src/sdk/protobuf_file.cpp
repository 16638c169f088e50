#include "sdk/protobuf_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <limits>
#include <memory>

#include "vaiq/error.hpp"

namespace vaiq {

namespace {

// A file's bytes mapped read-only: parsing reads the page cache where it is,
// instead of a copy into fresh memory that the kernel zeroes first (half of
// loading a 100 MB model on a virtual machine).
class MappedFile {
  public:
    explicit MappedFile(const std::filesystem::path& file) {
        const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) return;
        struct stat st {};
        if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
            size_ = static_cast<size_t>(st.st_size);
            void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
            if (p != MAP_FAILED) {
                data_ = static_cast<const char*>(p);
                ::madvise(p, size_, MADV_SEQUENTIAL);
            }
        }
        ::close(fd);
    }
    ~MappedFile() {
        if (data_) ::munmap(const_cast<char*>(data_), size_);
    }
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const char* data() const { return data_; }
    size_t size() const { return size_; }

  private:
    const char* data_ = nullptr;
    size_t size_ = 0;
};

void check_size(const std::filesystem::path& file, std::streamoff size) {
    if (size > std::numeric_limits<int>::max())
        throw InputError(
            fmt::format("{}: {} bytes, over the 2 GiB a protobuf can hold (larger models keep their "
                        "tensors in external data)",
                        file.string(), size));
}

}  // namespace

bool parse_protobuf_file(const std::filesystem::path& file, google::protobuf::MessageLite& message) {
    if (const MappedFile mapped(file); mapped.data()) {
        check_size(file, static_cast<std::streamoff>(mapped.size()));
        return message.ParseFromArray(mapped.data(), static_cast<int>(mapped.size()));
    }
    // Not a regular file that maps (a pipe, an empty file): read it.
    std::ifstream in(file, std::ios::binary | std::ios::ate);
    if (!in) throw InputError(fmt::format("{}: cannot open for reading", file.string()));
    const std::streamoff size = in.tellg();
    if (size < 0) throw InputError(fmt::format("{}: cannot read its size", file.string()));
    check_size(file, size);
    // Uninitialised: the read fills every byte.
    const auto bytes = std::make_unique_for_overwrite<char[]>(static_cast<size_t>(size));
    in.seekg(0);
    if (!in.read(bytes.get(), size)) throw InputError(fmt::format("{}: could not be read whole", file.string()));
    return message.ParseFromArray(bytes.get(), static_cast<int>(size));
}

}  // namespace vaiq
