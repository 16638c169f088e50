#include "vaiq/tensor.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>

#include "vaiq/error.hpp"

namespace vaiq {

size_t element_size(DataType type) {
    switch (type) {
        case DataType::Bool:
        case DataType::UInt8:
        case DataType::Int8:
        case DataType::Float8E4M3FN:
        case DataType::Float8E5M2:
        case DataType::UInt4:
        case DataType::Int4: return 1;
        case DataType::UInt16:
        case DataType::Int16:
        case DataType::Float16:
        case DataType::BFloat16: return 2;
        case DataType::Float:
        case DataType::Int32:
        case DataType::UInt32: return 4;
        case DataType::Double:
        case DataType::Int64:
        case DataType::UInt64: return 8;
        case DataType::String:
        case DataType::Undefined: return 0;
    }
    return 0;
}

int64_t stored_bytes(DataType type, int64_t count) {
    if (type == DataType::Int4 || type == DataType::UInt4) return count / 2 + count % 2;
    const auto size = static_cast<int64_t>(element_size(type));
    if (size > 0 && count > std::numeric_limits<int64_t>::max() / size)
        throw InputError(fmt::format("{} elements of {} overflow a 64-bit byte count", count, data_type_name(type)));
    return count * size;
}

std::string data_type_name(DataType type) {
    // Newer than the ONNX this build reads: its enum does not name them.
    if (type == DataType::Int4) return "int4";
    if (type == DataType::UInt4) return "uint4";
    auto name = onnx::TensorProto_DataType_Name(static_cast<onnx::TensorProto_DataType>(type));
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return name.empty() ? fmt::format("type {}", static_cast<int>(type)) : name;
}

int64_t element_count(std::span<const int64_t> shape) {
    int64_t count = 1;
    for (int64_t d : shape) {
        if (d < 0) throw InputError(fmt::format("negative dimension {} in a tensor shape", d));
        if (d != 0 && count > std::numeric_limits<int64_t>::max() / d)
            throw InputError("tensor shape overflows a 64-bit element count");
        count *= d;
    }
    return count;
}

Tensor::Tensor(DataType type, std::vector<int64_t> shape) : Tensor(uninitialized(type, std::move(shape))) {
    std::fill(bytes_.begin(), bytes_.end(), std::byte{0});
}

namespace {

// The largest tensor vaiq makes: this machine's memory (a model's Expand or
// ConstantOfShape may ask for terabytes), or VAIQ_MAX_TENSOR_BYTES when set.
uint64_t physical_memory_bytes() {
    static const uint64_t bytes = [] {
        if (const char* limit = std::getenv("VAIQ_MAX_TENSOR_BYTES"); limit && *limit)
            return static_cast<uint64_t>(std::strtoull(limit, nullptr, 10));
        const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
        return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page)
                                     : std::numeric_limits<uint64_t>::max();
    }();
    return bytes;
}

}  // namespace

Tensor::Tensor(const Tensor& other) : type_(other.type_), shape_(other.shape_), bytes_(other.bytes_.size()) {
    if (!bytes_.empty()) std::memcpy(bytes_.data(), other.bytes_.data(), bytes_.size());
}

Tensor& Tensor::operator=(const Tensor& other) {
    if (this != &other) *this = Tensor(other);
    return *this;
}

Tensor Tensor::uninitialized(DataType type, std::vector<int64_t> shape) {
    if (element_size(type) == 0) throw InputError(fmt::format("tensors of {} are not supported", data_type_name(type)));
    const auto count = static_cast<uint64_t>(element_count(shape));
    const uint64_t size = element_size(type);
    if (count > physical_memory_bytes() / size)
        throw InputError(fmt::format("a {} tensor of shape [{}] needs {:.1f} GB, more than the {:.1f} GB a tensor may take "
                                     "(this machine's memory, or VAIQ_MAX_TENSOR_BYTES)",
                                     data_type_name(type), fmt::join(shape, ", "), static_cast<double>(count) * size / 1e9,
                                     static_cast<double>(physical_memory_bytes()) / 1e9));
    Tensor t;
    t.type_ = type;
    t.shape_ = std::move(shape);
    t.bytes_.resize(static_cast<size_t>(count * size));
    return t;
}

void Tensor::reshape(std::vector<int64_t> shape) {
    if (element_count(shape) != size())
        throw InternalError(fmt::format("cannot view {} elements as {}", size(), element_count(shape)));
    shape_ = std::move(shape);
}

void Tensor::check_type(DataType wanted) const {
    // 4-bit values are held one per byte: read as int8 / uint8.
    if ((type_ == DataType::Int4 && wanted == DataType::Int8) || (type_ == DataType::UInt4 && wanted == DataType::UInt8))
        return;
    if (wanted != type_)
        throw InternalError(fmt::format("tensor of {} read as {}", data_type_name(type_), data_type_name(wanted)));
}

void Tensor::check_count(size_t count) const {
    if (count != static_cast<size_t>(size()))
        throw InputError(fmt::format("tensor has {} elements but {} values were given", size(), count));
}

namespace {

// Copies a typed repeated field into `out`, narrowing each value to T.
template <typename T, typename Field, typename Bytes>
void copy_field(const Field& field, Bytes& out) {
    auto* dst = reinterpret_cast<T*>(out.data());
    for (int i = 0; i < field.size(); ++i) dst[i] = static_cast<T>(field.Get(i));
}

// 4-bit values, packed two to a byte (low nibble first), one per byte; Int4 sign-extended.
template <typename Bytes>
void unpack_4bit(const uint8_t* packed, Bytes& out, bool is_signed) {
    for (size_t i = 0; i < out.size(); ++i) {
        const uint8_t nibble = (packed[i / 2] >> (4 * (i % 2))) & 0xF;
        out[i] = std::byte{static_cast<uint8_t>(is_signed && nibble >= 8 ? nibble | 0xF0 : nibble)};
    }
}

bool is_4bit(DataType type) { return type == DataType::Int4 || type == DataType::UInt4; }

int typed_field_size(const onnx::TensorProto& proto, DataType type) {
    switch (type) {
        case DataType::Float: return proto.float_data_size();
        case DataType::Double: return proto.double_data_size();
        case DataType::Int64: return proto.int64_data_size();
        case DataType::UInt32:
        case DataType::UInt64: return proto.uint64_data_size();
        default: return proto.int32_data_size();
    }
}

}  // namespace

namespace {
std::string tensor_label(const onnx::TensorProto& proto) {
    return proto.name().empty() ? std::string("a tensor") : fmt::format("tensor '{}'", proto.name());
}
}  // namespace

void check_tensor_data(const onnx::TensorProto& proto) {
    const auto type = static_cast<DataType>(proto.data_type());
    if (proto.data_location() == onnx::TensorProto::EXTERNAL) return;  // checked when read
    if (type == DataType::String) {
        if (proto.string_data_size() != element_count({proto.dims().data(), static_cast<size_t>(proto.dims_size())}))
            throw InputError(fmt::format("{} declares a shape that does not match its {} strings", tensor_label(proto),
                                         proto.string_data_size()));
        return;
    }
    if (element_size(type) == 0)
        throw InputError(fmt::format("{} has the unsupported element type {}", tensor_label(proto), proto.data_type()));
    const int64_t count = element_count({proto.dims().data(), static_cast<size_t>(proto.dims_size())});
    const auto bytes = static_cast<size_t>(stored_bytes(type, count));
    if (proto.has_raw_data()) {
        if (proto.raw_data().size() != bytes)
            throw InputError(fmt::format("{} declares {} elements of {} ({} bytes) but holds {} bytes",
                                         tensor_label(proto), count, data_type_name(type), bytes,
                                         proto.raw_data().size()));
    } else if (is_4bit(type)) {
        // int32_data holds one packed byte per entry.
        if (static_cast<size_t>(proto.int32_data_size()) != bytes)
            throw InputError(fmt::format("{} declares {} elements of {} but holds {} packed bytes",
                                         tensor_label(proto), count, data_type_name(type), proto.int32_data_size()));
    } else if (typed_field_size(proto, type) != count) {
        throw InputError(fmt::format("{} declares {} elements of {} but holds {}", tensor_label(proto), count,
                                     data_type_name(type), typed_field_size(proto, type)));
    }
}

namespace {

struct DeferredData {
    std::string file;
    int64_t offset = 0, length = 0;
};

// The location, offset and length the loader wrote for a deferred tensor.
std::optional<DeferredData> deferred_data(const onnx::TensorProto& proto) {
    if (proto.data_location() != onnx::TensorProto::EXTERNAL) return std::nullopt;
    DeferredData d;
    try {
        for (const auto& entry : proto.external_data()) {
            if (entry.key() == "location") d.file = entry.value();
            if (entry.key() == "offset") d.offset = std::stoll(entry.value());
            if (entry.key() == "length") d.length = std::stoll(entry.value());
        }
    } catch (const std::exception&) {
        return std::nullopt;  // not what the loader writes
    }
    if (d.file.empty() || !std::filesystem::path(d.file).is_absolute()) return std::nullopt;
    return d;
}

}  // namespace

Tensor slice_at(const Tensor& t, int64_t axis, int64_t index) {
    std::vector<int64_t> shape = t.shape();
    int64_t before = 1, after = 1;
    for (int64_t d = 0; d < axis; ++d) before *= shape[d];
    for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d) after *= shape[d];
    const int64_t length = shape[axis];
    shape.erase(shape.begin() + axis);
    Tensor out(t.type(), shape);
    const size_t row = static_cast<size_t>(after) * element_size(t.type());
    for (int64_t o = 0; o < before; ++o)
        std::memcpy(out.mutable_bytes().data() + static_cast<size_t>(o) * row,
                    t.bytes().data() + static_cast<size_t>(o * length + index) * row, row);
    return out;
}

Tensor convert_float_type(const Tensor& t, DataType to) {
    auto is_float_type = [](DataType d) {
        return d == DataType::Float || d == DataType::Float16 || d == DataType::BFloat16;
    };
    if (!is_float_type(t.type()) || !is_float_type(to))
        throw InputError(fmt::format("cannot convert {} to {}", data_type_name(t.type()), data_type_name(to)));
    if (t.type() == to) return t;
    Tensor out(to, t.shape());
    const auto n = static_cast<size_t>(t.size());
    auto read = [&](size_t i) {
        if (t.type() == DataType::Float) return t.data<float>()[i];
        const uint16_t bits = reinterpret_cast<const uint16_t*>(t.bytes().data())[i];
        return t.type() == DataType::Float16 ? half_to_float(bits) : bfloat16_to_float(bits);
    };
    for (size_t i = 0; i < n; ++i) {
        const float v = read(i);
        if (to == DataType::Float)
            out.mutable_data<float>()[i] = v;
        else
            reinterpret_cast<uint16_t*>(out.mutable_bytes().data())[i] =
                to == DataType::Float16 ? float_to_half(v) : float_to_bfloat16(v);
    }
    return out;
}

// Under AddressSanitizer glibc's heap serves nothing and was never set up:
// trimming it from two threads at once races on that set-up and crashes.
#if defined(__SANITIZE_ADDRESS__)
#define VAIQ_SANITIZED_HEAP 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define VAIQ_SANITIZED_HEAP 1
#endif
#endif

void return_freed_memory() noexcept {
#ifndef VAIQ_SANITIZED_HEAP
    // Only where the heap holds that much unused: a trim hands back every free
    // page, which the next allocations fault in again.
    if (mallinfo2().fordblks >= kReturnedFreeBytes) malloc_trim(0);
#endif
}

namespace {

#ifdef VAIQ_SANITIZED_HEAP
constexpr bool kKeepBlocks = false;  // every block from the heap, of its exact size, so that misuse is caught
#else
constexpr bool kKeepBlocks = true;
#endif

constexpr std::align_val_t kTensorAlignment{64};
constexpr size_t kSmallestKept = size_t{16} << 10, kLargestKept = size_t{1} << 20;  // by the thread
constexpr size_t kKeptBytesPerThread = size_t{64} << 20, kKeptBlocksPerThread = 256;

// Kept sizes are whole pages (larger blocks: 64 KiB), so that blocks of nearly
// the same size serve each other.
size_t block_size(size_t bytes) {
    const size_t unit = bytes > kLargestKept ? size_t{64} << 10 : 4096;
    return kKeepBlocks && bytes >= kSmallestKept ? (bytes + unit - 1) / unit * unit : bytes;
}

void release_block(void* block, [[maybe_unused]] size_t size) noexcept {
#if defined(__cpp_sized_deallocation)
    ::operator delete(block, size, kTensorAlignment);
#else  // clang declares sized deallocation only with -fsized-deallocation
    ::operator delete(block, kTensorAlignment);
#endif
}

// One thread's freed blocks, oldest first; the oldest go back to the heap
// when more would be kept than the limits allow.
class KeptBlocks {
  public:
    ~KeptBlocks();
    void* take(size_t size) {
        for (size_t i = blocks_.size(); i-- > 0;)  // the most recently freed is the likeliest in cache
            if (blocks_[i].size == size) {
                void* block = blocks_[i].block;
                bytes_ -= size;
                blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(i));
                return block;
            }
        return nullptr;
    }
    void keep(void* block, size_t size) noexcept {
        while (!blocks_.empty() && (blocks_.size() >= kKeptBlocksPerThread || bytes_ + size > kKeptBytesPerThread)) {
            release_block(blocks_.front().block, blocks_.front().size);
            bytes_ -= blocks_.front().size;
            blocks_.erase(blocks_.begin());
        }
        blocks_.push_back({block, size});  // capacity reserved: cannot throw
        bytes_ += size;
    }
    KeptBlocks() { blocks_.reserve(kKeptBlocksPerThread); }

  private:
    struct Block {
        void* block;
        size_t size;
    };
    std::vector<Block> blocks_;
    size_t bytes_ = 0;
};

thread_local KeptBlocks kept_blocks;

// Blocks over kLargestKept are mapped from the system on their own and, freed
// during a run (KeptLargeBlocks), kept up to kLargeKeptBytes in all for the
// next request that fits, from any thread. An executor's runs free such
// activations and allocate them again at the next steps and runs: from the C
// library's heap, which a large free trimmed (return_freed_memory(): every free
// page handed back, else the heap grew around them), they were faulted in anew
// each time, 39 % of a 1024 x 1024 segmentation model's simulated runs in the
// kernel. Unmapped, a block returns to the system whole. (In 4 KB pages: see
// docs/performance.md on huge pages.)
class LargeBlocks {
  public:
    static constexpr size_t kLargeKeptBytes = size_t{512} << 20;

    // The smallest kept block that holds `size` (the most recently freed of
    // those), its pages past `size` unmapped; else a new one.
    void* take(size_t size) {
        Block best{nullptr, 0};
        {
            std::lock_guard lock(mutex_);
            size_t at = blocks_.size();
            for (size_t i = blocks_.size(); i-- > 0;)  // of equal sizes the most recently freed
                if (blocks_[i].size >= size && (at == blocks_.size() || blocks_[i].size < blocks_[at].size)) at = i;
            if (at < blocks_.size()) {
                best = blocks_[at];
                bytes_ -= best.size;
                blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(at));
            }
        }
        if (!best.block) return map(size);
        if (best.size > size) munmap(static_cast<std::byte*>(best.block) + size, best.size - size);
        return best.block;
    }

    // Kept while a KeptLargeBlocks lives (the oldest unmapped to make room), else unmapped.
    void keep(void* block, size_t size) noexcept {
        std::lock_guard lock(mutex_);
        if (keepers_ == 0 || size > kLargeKeptBytes || blocks_.size() >= kMostBlocks) {
            munmap(block, size);
            return;
        }
        while (bytes_ + size > kLargeKeptBytes) {
            munmap(blocks_.front().block, blocks_.front().size);
            bytes_ -= blocks_.front().size;
            blocks_.erase(blocks_.begin());
        }
        blocks_.push_back({block, size});  // capacity reserved: cannot throw
        bytes_ += size;
    }

    void release_all() noexcept {
        std::lock_guard lock(mutex_);
        for (const auto& b : blocks_) munmap(b.block, b.size);
        blocks_.clear();
        bytes_ = 0;
    }

    void add_keeper(int by) noexcept {
        std::lock_guard lock(mutex_);
        keepers_ += by;
    }

    LargeBlocks() { blocks_.reserve(kMostBlocks); }

  private:
    static constexpr size_t kMostBlocks = 256;
    struct Block {
        void* block;
        size_t size;
    };

    static void* map(size_t size) {
        void* block = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (block == MAP_FAILED) throw std::bad_alloc();
        return block;
    }

    std::mutex mutex_;
    std::vector<Block> blocks_;  // oldest first
    size_t bytes_ = 0;
    int keepers_ = 0;  // KeptLargeBlocks alive
};

// Never destroyed: tensors that static objects hold may be freed after any other static is.
LargeBlocks& large_blocks() {
    static auto* blocks = new LargeBlocks;
    return *blocks;
}
// Set once the thread's blocks are gone: another thread-local object's
// destructor may still free a tensor after them.
thread_local bool blocks_gone = false;

bool kept(size_t size) {
    return kKeepBlocks && size >= kSmallestKept && size <= kLargestKept && !blocks_gone;
}

KeptBlocks::~KeptBlocks() {
    blocks_gone = true;
    for (const auto& b : blocks_) release_block(b.block, b.size);
}

}  // namespace

KeptLargeBlocks::KeptLargeBlocks() noexcept { large_blocks().add_keeper(1); }
KeptLargeBlocks::~KeptLargeBlocks() { large_blocks().add_keeper(-1); }

void release_kept_large_blocks() noexcept { large_blocks().release_all(); }

void* allocate_tensor_bytes(size_t bytes) {
    const size_t size = block_size(bytes);
    if (kKeepBlocks && size > kLargestKept) return large_blocks().take(size);
    if (kept(size))
        if (void* block = kept_blocks.take(size)) return block;
    return ::operator new(size, kTensorAlignment);
}

void free_tensor_bytes(void* block, size_t bytes) noexcept {
    if (!block) return;
    const size_t size = block_size(bytes);
    if (kept(size)) return kept_blocks.keep(block, size);
    if (kKeepBlocks && size > kLargestKept)
        large_blocks().keep(block, size);
    else
        release_block(block, size);
    // Also after a block outside the heap: the heap's own frees (a model's weights read one by one).
    if (size >= kReturnedFreeBytes) return_freed_memory();
}

bool is_deferred(const onnx::TensorProto& proto) { return deferred_data(proto).has_value(); }

size_t stored_data_bytes(const onnx::TensorProto& proto) {
    if (const auto d = deferred_data(proto)) return static_cast<size_t>(d->length);
    return proto.raw_data().size();
}

void read_deferred(const onnx::TensorProto& proto, const std::function<void(const char*, size_t)>& sink) {
    const auto d = deferred_data(proto);
    if (!d) throw InternalError(fmt::format("{} is not deferred external data", tensor_label(proto)));
    std::ifstream in(d->file, std::ios::binary);
    in.seekg(d->offset);
    constexpr int64_t kPiece = int64_t{16} << 20;
    std::vector<char> piece(static_cast<size_t>(std::min(kPiece, d->length)));
    for (int64_t done = 0; done < d->length;) {
        const int64_t n = std::min(kPiece, d->length - done);
        in.read(piece.data(), n);
        if (!in)
            throw InputError(fmt::format("{}: cannot read its external data from '{}' (changed since the model was "
                                         "loaded?)",
                                         tensor_label(proto), d->file));
        sink(piece.data(), static_cast<size_t>(n));
        done += n;
    }
}

Tensor Tensor::from_proto(const onnx::TensorProto& proto) {
    const auto type = static_cast<DataType>(proto.data_type());
    if (is_deferred(proto)) {
        // Read from its file straight into the tensor (4-bit values through their packed bytes).
        if (element_size(type) == 0 || type == DataType::String)
            throw InputError(fmt::format("{} has element type {}, which vaiq cannot read", tensor_label(proto),
                                         data_type_name(type)));
        Tensor t;
        t.type_ = type;
        t.shape_.assign(proto.dims().begin(), proto.dims().end());
        const int64_t count = element_count(t.shape_);
        if (stored_data_bytes(proto) != static_cast<size_t>(stored_bytes(type, count)))
            throw InputError(fmt::format("{} declares {} elements but its external data holds {} bytes",
                                         tensor_label(proto), count, stored_data_bytes(proto)));
        t.bytes_.resize(static_cast<size_t>(count) * element_size(type));
        std::vector<uint8_t> packed;
        size_t at = 0;
        read_deferred(proto, [&](const char* p, size_t n) {
            if (is_4bit(type)) {
                packed.insert(packed.end(), reinterpret_cast<const uint8_t*>(p), reinterpret_cast<const uint8_t*>(p) + n);
            } else {
                vaiq::copy_bytes(t.bytes_.data() + at, p, n);
                at += n;
            }
        });
        if (is_4bit(type)) unpack_4bit(packed.data(), t.bytes_, type == DataType::Int4);
        return t;
    }
    if (proto.data_location() == onnx::TensorProto::EXTERNAL)
        throw InternalError(
            fmt::format("{} still refers to external data; load it with load_model()", tensor_label(proto)));
    if (element_size(type) == 0)
        throw InputError(
            fmt::format("{} has element type {}, which vaiq cannot read", tensor_label(proto), data_type_name(type)));
    check_tensor_data(proto);
    Tensor t;
    t.type_ = type;
    t.shape_.assign(proto.dims().begin(), proto.dims().end());
    const size_t bytes = static_cast<size_t>(element_count(t.shape_)) * element_size(type);
    if (is_4bit(type)) {
        t.bytes_.resize(bytes);
        std::vector<uint8_t> packed;
        if (proto.has_raw_data())
            packed.assign(proto.raw_data().begin(), proto.raw_data().end());
        else
            for (int32_t v : proto.int32_data()) packed.push_back(static_cast<uint8_t>(v));
        unpack_4bit(packed.data(), t.bytes_, type == DataType::Int4);
        return t;
    }
    if (proto.has_raw_data()) {
        t.bytes_.resize(bytes);
        vaiq::copy_bytes(t.bytes_.data(), proto.raw_data().data(), bytes);
        return t;
    }
    t.bytes_.resize(bytes);
    switch (type) {
        case DataType::Float: copy_field<float>(proto.float_data(), t.bytes_); break;
        case DataType::Double: copy_field<double>(proto.double_data(), t.bytes_); break;
        case DataType::Int64: copy_field<int64_t>(proto.int64_data(), t.bytes_); break;
        case DataType::UInt32: copy_field<uint32_t>(proto.uint64_data(), t.bytes_); break;
        case DataType::UInt64: copy_field<uint64_t>(proto.uint64_data(), t.bytes_); break;
        case DataType::Int32: copy_field<int32_t>(proto.int32_data(), t.bytes_); break;
        case DataType::Int16: copy_field<int16_t>(proto.int32_data(), t.bytes_); break;
        case DataType::Int8: copy_field<int8_t>(proto.int32_data(), t.bytes_); break;
        case DataType::Bool:
        case DataType::UInt8:
        case DataType::Float8E4M3FN:  // float8s travel as their bit patterns too
        case DataType::Float8E5M2: copy_field<uint8_t>(proto.int32_data(), t.bytes_); break;
        // 16-bit floats travel as their bit patterns in the low half of int32_data.
        case DataType::UInt16:
        case DataType::Float16:
        case DataType::BFloat16: copy_field<uint16_t>(proto.int32_data(), t.bytes_); break;
        default: throw InternalError("unreachable tensor type");
    }
    return t;
}

onnx::TensorProto Tensor::to_proto(const std::string& name) const {
    onnx::TensorProto proto;
    proto.set_name(name);
    proto.set_data_type(static_cast<int32_t>(type_));
    for (int64_t d : shape_) proto.add_dims(d);
    if (is_4bit(type_)) {
        std::string packed(static_cast<size_t>(stored_bytes(type_, size())), '\0');
        for (size_t i = 0; i < bytes_.size(); ++i)
            packed[i / 2] = static_cast<char>(static_cast<uint8_t>(packed[i / 2]) |
                                              ((static_cast<uint8_t>(bytes_[i]) & 0xF) << (4 * (i % 2))));
        proto.set_raw_data(std::move(packed));
        return proto;
    }
    proto.set_raw_data(reinterpret_cast<const char*>(bytes_.data()), bytes_.size());
    return proto;
}

uint16_t float_to_half(float value) {
    uint32_t u = std::bit_cast<uint32_t>(value);
    const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
    u &= 0x7fffffffu;
    if (u >= 0x47800000u)  // >= 2^16: infinity, or NaN (kept quiet)
        return sign | (u > 0x7f800000u ? 0x7e00u : 0x7c00u);
    if (u < 0x38800000u) {
        // Below 2^-14 the result is subnormal: adding 0.5 lines the ten mantissa
        // bits up at the bottom and lets the float addition round to nearest even.
        const float aligned = std::bit_cast<float>(u) + 0.5f;
        return sign | static_cast<uint16_t>(std::bit_cast<uint32_t>(aligned) - 0x3f000000u);
    }
    const uint32_t odd = (u >> 13) & 1u;
    u += 0xc8000fffu + odd;  // rebias the exponent (-112) and round half to even
    return sign | static_cast<uint16_t>(u >> 13);
}

float half_to_float(uint16_t bits) {
    const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
    const uint32_t exponent = (bits >> 10) & 0x1fu;
    const uint32_t mantissa = bits & 0x3ffu;
    if (exponent == 0) {
        const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
        return std::bit_cast<float>(std::bit_cast<uint32_t>(magnitude) | sign);
    }
    if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
    return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

namespace {

// A float8 layout: mantissa bits, exponent bias, the largest finite value's bits
// and value, and infinity's bits (0 where there is none).
struct Float8Layout {
    int mantissa_bits, bias;
    uint8_t max_bits;
    float max;
    uint8_t infinity;
};

Float8Layout float8_layout(DataType type) {
    if (type == DataType::Float8E4M3FN) return {3, 7, 0x7e, 448.0f, 0};
    if (type == DataType::Float8E5M2) return {2, 15, 0x7b, 57344.0f, 0x7c};
    throw InternalError(fmt::format("{} is not a float8 type", static_cast<int>(type)));
}

}  // namespace

float float8_max(DataType type) { return float8_layout(type).max; }

uint8_t float_to_float8(float value, DataType type, bool saturate) {
    const auto f = float8_layout(type);
    const uint32_t bits = std::bit_cast<uint32_t>(value);
    const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
    const uint32_t u = bits & 0x7fffffffu;
    const uint8_t beyond = saturate ? f.max_bits : (f.infinity != 0 ? f.infinity : 0x7f);
    if (u > 0x7f800000u) return sign | 0x7f;  // NaN
    const int shift = 23 - f.mantissa_bits;
    const auto min_normal = static_cast<uint32_t>(127 + 1 - f.bias) << 23;
    uint32_t code = 0;
    if (u < min_normal) {
        // Subnormal: adding 2^(24 - bias - mantissa bits) lines the float's last
        // mantissa bit up with float8's smallest step, and the addition rounds to
        // nearest even; what is left over counts the steps (8 of them: the smallest normal).
        const float offset = std::ldexp(1.0f, 24 - f.bias - f.mantissa_bits);
        code = std::bit_cast<uint32_t>(std::bit_cast<float>(u) + offset) - std::bit_cast<uint32_t>(offset);
    } else {
        // Normal: round the mantissa half to even in the integer bits, then rebias the exponent
        // (infinity lands beyond every finite code).
        const uint32_t rounded = u + (1u << (shift - 1)) - 1 + ((u >> shift) & 1u);
        code = (rounded >> shift) - (static_cast<uint32_t>(127 - f.bias) << f.mantissa_bits);
    }
    return sign | (code > f.max_bits ? beyond : static_cast<uint8_t>(code));
}

namespace {

// Every float8 code's value, computed once per type.
std::array<float, 256> float8_values(DataType type) {
    const auto f = float8_layout(type);
    std::array<float, 256> values{};
    for (int bits = 0; bits < 256; ++bits) {
        const float sign = (bits & 0x80) != 0 ? -1.0f : 1.0f;
        const int magnitude = bits & 0x7f;
        const int field = magnitude >> f.mantissa_bits;
        const int mantissa = magnitude & ((1 << f.mantissa_bits) - 1);
        float& v = values[static_cast<size_t>(bits)];
        if (magnitude == 0x7f || (f.infinity != 0 && magnitude > f.infinity))
            v = std::numeric_limits<float>::quiet_NaN();
        else if (f.infinity != 0 && magnitude == f.infinity)
            v = sign * std::numeric_limits<float>::infinity();
        else if (field == 0)
            v = sign * std::ldexp(static_cast<float>(mantissa), 1 - f.bias - f.mantissa_bits);
        else
            v = sign * std::ldexp(1.0f + static_cast<float>(mantissa) / static_cast<float>(1 << f.mantissa_bits),
                                  field - f.bias);
    }
    return values;
}

}  // namespace

float float8_to_float(uint8_t bits, DataType type) {
    static const auto e4m3 = float8_values(DataType::Float8E4M3FN), e5m2 = float8_values(DataType::Float8E5M2);
    if (type == DataType::Float8E4M3FN) return e4m3[bits];
    if (type == DataType::Float8E5M2) return e5m2[bits];
    float8_layout(type);  // throws: not a float8 type
    return 0.0f;
}

uint16_t float_to_bfloat16(float value) {
    const auto u = std::bit_cast<uint32_t>(value);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float bfloat16_to_float(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

namespace {

bool is_float_type(DataType t) {
    return t == DataType::Float || t == DataType::Double || t == DataType::Float16 || t == DataType::BFloat16;
}

template <typename Fn>
void for_each_as_float(const Tensor& t, Fn&& fn) {
    switch (t.type()) {
        case DataType::Float:
            for (float v : t.data<float>()) fn(static_cast<double>(v));
            break;
        case DataType::Double:
            for (double v : t.data<double>()) fn(v);
            break;
        default: {
            const auto* bits = reinterpret_cast<const uint16_t*>(t.bytes().data());
            const bool half = t.type() == DataType::Float16;
            for (int64_t i = 0; i < t.size(); ++i)
                fn(static_cast<double>(half ? half_to_float(bits[i]) : bfloat16_to_float(bits[i])));
        }
    }
}

}  // namespace

Tensor Tensor::convert_float(DataType to) const {
    if (!is_float_type(type_) || !is_float_type(to))
        throw InputError(fmt::format("cannot convert a {} tensor to {}: both must be floating point",
                                     data_type_name(type_), data_type_name(to)));
    Tensor out = uninitialized(to, shape_);
    std::byte* dst = out.bytes_.data();
    size_t i = 0;
    for_each_as_float(*this, [&](double v) {
        switch (to) {
            case DataType::Float: reinterpret_cast<float*>(dst)[i] = static_cast<float>(v); break;
            case DataType::Double: reinterpret_cast<double*>(dst)[i] = v; break;
            case DataType::Float16: reinterpret_cast<uint16_t*>(dst)[i] = float_to_half(static_cast<float>(v)); break;
            default: reinterpret_cast<uint16_t*>(dst)[i] = float_to_bfloat16(static_cast<float>(v));
        }
        ++i;
    });
    return out;
}

}  // namespace vaiq
