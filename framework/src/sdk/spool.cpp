#include "vaiq/spool.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "vaiq/error.hpp"

namespace vaiq {

namespace {

// A file without a name in the temporary folder ($TMPDIR): nothing to clean up.
int open_unnamed_file() {
    std::error_code ec;
    const auto dir = std::filesystem::temp_directory_path(ec);
    if (ec)
        throw InputError(
            fmt::format("cannot create a temporary file: the temporary folder (TMPDIR): {}", ec.message()));
#ifdef O_TMPFILE
    const int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) return fd;
#endif
    // File systems without O_TMPFILE: a named file, unlinked at once.
    std::string name = (dir / "vaiq-spool-XXXXXX").string();
    const int named = ::mkostemp(name.data(), O_CLOEXEC);
    if (named < 0)
        throw InputError(
            fmt::format("cannot create a temporary file in {} (TMPDIR): {}", dir.string(), std::strerror(errno)));
    ::unlink(name.c_str());
    return named;
}

}  // namespace

TensorSpool::TensorSpool(size_t memory_budget) : budget_(memory_budget) {}

TensorSpool::~TensorSpool() {
    if (fd_ >= 0) ::close(fd_);
}

size_t TensorSpool::put(const Tensor& value) {
    Entry entry;
    entry.type = value.type();
    entry.shape = value.shape();
    const auto bytes = value.bytes();
    if (held_bytes_ + bytes.size() <= budget_) {
        entry.held = value;
        held_bytes_ += bytes.size();
    } else {
        entry.in_file = true;
        entry.offset = append(bytes);
    }
    entries_.push_back(std::move(entry));
    return entries_.size() - 1;
}

size_t TensorSpool::append(std::span<const std::byte> bytes) {
    if (fd_ < 0) fd_ = open_unnamed_file();
    const size_t offset = file_bytes_;
    for (size_t done = 0; done < bytes.size();) {
        const auto n = ::pwrite(fd_, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            throw InputError(
                fmt::format("cannot write {} bytes of put-aside values to a temporary file (disk full? "
                            "TMPDIR chooses the folder): {}",
                            bytes.size(), std::strerror(errno)));
        done += static_cast<size_t>(n);
    }
    file_bytes_ += bytes.size();
    return offset;
}

size_t TensorSpool::park_initializers(Model& model, size_t min_bytes) {
    size_t moved = 0;
    for (auto& init : *model.graph().mutable_initializer()) {
        if (init.raw_data().size() < std::max<size_t>(min_bytes, 1) || is_deferred(init)) continue;
        const auto& raw = init.raw_data();
        const size_t offset = append(std::as_bytes(std::span(raw.data(), raw.size())));
        // The file has no name; this process reaches it through its descriptor.
        for (const auto& [key, value] :
             {std::pair<std::string, std::string>{"location", fmt::format("/proc/self/fd/{}", fd_)},
              {"offset", std::to_string(offset)},
              {"length", std::to_string(raw.size())}}) {
            auto* entry = init.add_external_data();
            entry->set_key(key);
            entry->set_value(value);
        }
        moved += raw.size();
        std::string().swap(*init.mutable_raw_data());  // clear_raw_data() would keep the memory
        init.set_data_location(onnx::TensorProto::EXTERNAL);
    }
    if (moved >= kReturnedFreeBytes) return_freed_memory();
    return moved;
}

void TensorSpool::drop(size_t index) {
    auto& entry = entries_.at(index);
    if (!entry.in_file && !entry.dropped) held_bytes_ -= entry.held.bytes().size();
    entry.held = Tensor();
    entry.dropped = true;
}

Tensor TensorSpool::get(size_t index) const {
    const auto& entry = entries_.at(index);
    if (entry.dropped) throw InternalError(fmt::format("put-aside value {} was read after it was dropped", index));
    if (!entry.in_file) return entry.held;
    auto out = Tensor::uninitialized(entry.type, entry.shape);
    auto bytes = out.mutable_bytes();
    for (size_t done = 0; done < bytes.size();) {
        const auto n = ::pread(fd_, bytes.data() + done, bytes.size() - done, static_cast<off_t>(entry.offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            throw InputError(fmt::format("cannot read put-aside values back from a temporary file: {}",
                                         n == 0 ? "it ended early" : std::strerror(errno)));
        done += static_cast<size_t>(n);
    }
    return out;
}

}  // namespace vaiq
