// vaiq/tensor.hpp - dense tensors and read-only views of them.
#pragma once

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "vaiq/export.hpp"

namespace vaiq {

/// Element types, numbered as onnx::TensorProto::DataType.
enum class DataType : int32_t {
    Undefined = 0,
    Float = 1,
    UInt8 = 2,
    Int8 = 3,
    UInt16 = 4,
    Int16 = 5,
    Int32 = 6,
    Int64 = 7,
    String = 8,
    Bool = 9,
    Float16 = 10,
    Double = 11,
    UInt32 = 12,
    UInt64 = 13,
    BFloat16 = 16,
    Float8E4M3FN = 17,  ///< 8-bit float: 4 exponent bits, 3 mantissa bits, no infinity (largest 448)
    Float8E5M2 = 19,    ///< 8-bit float: 5 exponent bits, 2 mantissa bits (largest finite 57344)
    UInt4 = 21,         ///< one value per byte in memory; two per byte, low nibble first, in a TensorProto
    Int4 = 22,
};

/// memcpy that accepts empty ranges (whose pointers may be null).
inline void copy_bytes(void* dst, const void* src, size_t n) {
    if (n > 0) std::memcpy(dst, src, n);
}

/// Bytes per element; 0 for String and Undefined.
VAIQ_API size_t element_size(DataType type);
/// Bytes that `count` elements take in a TensorProto's raw data (or external
/// data): count x element_size, but two 4-bit values to a byte.
VAIQ_API int64_t stored_bytes(DataType type, int64_t count);
/// "float", "uint8", ... as ONNX spells them.
VAIQ_API std::string data_type_name(DataType type);
/// Product of the dimensions; throws InputError on a negative dimension or overflow.
VAIQ_API int64_t element_count(std::span<const int64_t> shape);

template <typename T>
constexpr DataType data_type_of();
template <>
constexpr DataType data_type_of<float>() {
    return DataType::Float;
}
template <>
constexpr DataType data_type_of<double>() {
    return DataType::Double;
}
template <>
constexpr DataType data_type_of<uint8_t>() {
    return DataType::UInt8;
}
template <>
constexpr DataType data_type_of<int8_t>() {
    return DataType::Int8;
}
template <>
constexpr DataType data_type_of<uint16_t>() {
    return DataType::UInt16;
}
template <>
constexpr DataType data_type_of<int16_t>() {
    return DataType::Int16;
}
template <>
constexpr DataType data_type_of<int32_t>() {
    return DataType::Int32;
}
template <>
constexpr DataType data_type_of<uint32_t>() {
    return DataType::UInt32;
}
template <>
constexpr DataType data_type_of<int64_t>() {
    return DataType::Int64;
}
template <>
constexpr DataType data_type_of<uint64_t>() {
    return DataType::UInt64;
}

/// IEEE half and bfloat16 from and to float, rounding to nearest even (as
/// ONNX Runtime's Cast does); NaN stays NaN, overflow becomes infinity.
VAIQ_API uint16_t float_to_half(float value);
VAIQ_API float half_to_float(uint16_t bits);
inline bool is_float8(DataType type) { return type == DataType::Float8E4M3FN || type == DataType::Float8E5M2; }
/// A float as a float8 of `type` (Float8E4M3FN or Float8E5M2), rounded to the
/// nearest value, ties to even; with `saturate` (QuantizeLinear's default)
/// values beyond the largest finite one, infinities included, become it, else
/// they become infinity (E5M2) or NaN (E4M3FN). The sign of a zero is kept.
VAIQ_API uint8_t float_to_float8(float value, DataType type, bool saturate = true);
VAIQ_API float float8_to_float(uint8_t bits, DataType type);
/// The largest finite float8 of `type`: 448 (E4M3FN), 57344 (E5M2).
VAIQ_API float float8_max(DataType type);
VAIQ_API uint16_t float_to_bfloat16(float value);
VAIQ_API float bfloat16_to_float(uint16_t bits);

/// Checks that a tensor's stored data matches its declared shape and type
/// (raw_data bytes or typed-field count), without copying it. Throws InputError.
VAIQ_API void check_tensor_data(const onnx::TensorProto& proto);

/// Whether a tensor's data is deferred: the loader leaves large external
/// tensors in their file (location made absolute once validated) and
/// Tensor::from_proto reads them when asked, so a model's weights need not
/// all be in memory at once. save_model writes them out like any tensor.
VAIQ_API bool is_deferred(const onnx::TensorProto& proto);
/// A deferred tensor's stored bytes, handed to `sink` in pieces of at most
/// 16 MiB. Throws InputError when the file cannot be read.
VAIQ_API void read_deferred(const onnx::TensorProto& proto, const std::function<void(const char*, size_t)>& sink);
/// Bytes a tensor holds in raw_data or in its deferred file (0 otherwise).
VAIQ_API size_t stored_data_bytes(const onnx::TensorProto& proto);

/// A read-only view of a batch of values, as calibrators receive them.
template <typename T>
struct TensorView {
    std::span<const int64_t> shape;
    std::span<const T> data;
};

/// Hands memory the C library's heap keeps after frees back to the system,
/// when it keeps kReturnedFreeBytes or more. Called when a large tensor is
/// freed: a smaller long-lived allocation above a freed block pins it, so that
/// reading a model's weights one at a time (their serialized bytes are heap
/// blocks) would otherwise grow the process by a weight per tensor.
VAIQ_API void return_freed_memory() noexcept;

/// Frees of at least this many bytes call return_freed_memory(). Smaller ones
/// leave the memory to the next run, which would otherwise fault every page of
/// it in again (zeroed by the kernel): on a virtual machine, handing back what
/// evaluation's set-up freed cost vit_small's run 0.55 s.
inline constexpr size_t kReturnedFreeBytes = size_t{64} << 20;

/// Storage for tensors: 64-byte aligned, not zero-filled. A block of 16 KiB to
/// 1 MiB freed here is kept by the freeing thread (up to 64 MiB each) for its
/// next request of the same size: an executor's runs allocate and free the
/// same activations over and over, which the C library's one shared heap
/// served with its bookkeeping and lock each time. Larger blocks are mapped
/// from the system on their own; one freed while a KeptLargeBlocks lives is kept,
/// up to 512 MiB in all, for any thread's next request that fits in one (else
/// it is unmapped at once). Not kept under AddressSanitizer.
VAIQ_API void* allocate_tensor_bytes(size_t bytes);
VAIQ_API void free_tensor_bytes(void* block, size_t bytes) noexcept;

/// While one lives, in any thread, freed tensor blocks over 1 MiB are kept for
/// later requests (see allocate_tensor_bytes). An executor's run holds one: its
/// steps and its next runs allocate the same activations again. Elsewhere (a
/// model's weights converted one by one) a freed block goes back at once.
class VAIQ_API KeptLargeBlocks {
  public:
    KeptLargeBlocks() noexcept;
    ~KeptLargeBlocks();
    KeptLargeBlocks(const KeptLargeBlocks&) = delete;
    KeptLargeBlocks& operator=(const KeptLargeBlocks&) = delete;
};

/// Hands the kept blocks over 1 MiB back to the system (a run's phase is over).
VAIQ_API void release_kept_large_blocks() noexcept;

/// Allocates without zero-filling, for buffers that are written in full anyway,
/// on 64-byte boundaries: a vector register or cache line never straddles two
/// lines at the start of a tensor (oneDNN's and the AVX-512 kernels' loads).
template <typename T>
struct DefaultInitAllocator : std::allocator<T> {
    template <typename U>
    struct rebind {
        using other = DefaultInitAllocator<U>;
    };
    using std::allocator<T>::allocator;
    T* allocate(size_t n) { return static_cast<T*>(allocate_tensor_bytes(n * sizeof(T))); }
    void deallocate(T* p, size_t n) noexcept { free_tensor_bytes(p, n * sizeof(T)); }
    template <typename U>
    void construct(U* p) noexcept {
        ::new (static_cast<void*>(p)) U;
    }
    template <typename U, typename... Args>
    void construct(U* p, Args&&... args) {
        ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
};

/// An owning dense tensor in row-major order.
class VAIQ_API Tensor {
  public:
    Tensor() = default;
    /// Zero-filled.
    Tensor(DataType type, std::vector<int64_t> shape);
    /// A copy of the values in one block copy: the vector's own copy constructs
    /// them byte by byte through the allocator (13 times slower on a 4.9 MB image).
    Tensor(const Tensor& other);
    Tensor& operator=(const Tensor& other);
    Tensor(Tensor&&) noexcept = default;
    Tensor& operator=(Tensor&&) noexcept = default;
    /// Contents undefined: for outputs a kernel writes in full.
    static Tensor uninitialized(DataType type, std::vector<int64_t> shape);

    /// Decodes an initializer (raw_data, the typed fields, or deferred data read
    /// from its file). Other external data must already be resolved (the model
    /// loader does that). Throws InputError when the data does not match the
    /// declared shape and type.
    static Tensor from_proto(const onnx::TensorProto& proto);
    /// Encodes as raw_data.
    onnx::TensorProto to_proto(const std::string& name) const;

    template <typename T>
    static Tensor from_values(std::vector<int64_t> shape, std::span<const T> values) {
        Tensor t(data_type_of<T>(), std::move(shape));
        t.check_count(values.size());
        vaiq::copy_bytes(t.bytes_.data(), values.data(), values.size_bytes());
        return t;
    }

    DataType type() const { return type_; }
    const std::vector<int64_t>& shape() const { return shape_; }
    /// The same values under `shape`, which must hold as many elements.
    void reshape(std::vector<int64_t> shape);
    int64_t size() const { return static_cast<int64_t>(bytes_.size() / std::max<size_t>(element_size(type_), 1)); }
    std::span<const std::byte> bytes() const { return bytes_; }
    std::span<std::byte> mutable_bytes() { return bytes_; }

    template <typename T>
    std::span<const T> data() const& {
        check_type(data_type_of<T>());
        return {reinterpret_cast<const T*>(bytes_.data()), bytes_.size() / sizeof(T)};
    }
    /// A view of a temporary would dangle at the end of the statement: keep the tensor.
    template <typename T>
    std::span<const T> data() const&& = delete;
    template <typename T>
    std::span<T> mutable_data() {
        check_type(data_type_of<T>());
        return {reinterpret_cast<T*>(bytes_.data()), bytes_.size() / sizeof(T)};
    }
    template <typename T>
    TensorView<T> view() const& {
        return {shape_, data<T>()};
    }
    template <typename T>
    TensorView<T> view() const&& = delete;

    /// A tensor of float16, bfloat16, float or double converted to `to` (one of
    /// those four), element by element through float (double directly).
    Tensor convert_float(DataType to) const;

  private:
    void check_type(DataType wanted) const;
    void check_count(size_t count) const;

    DataType type_ = DataType::Undefined;
    std::vector<int64_t> shape_;
    std::vector<std::byte, DefaultInitAllocator<std::byte>> bytes_;
};

/// Slice `index` of `t` along `axis`, that axis removed (a Scan's step).
VAIQ_API Tensor slice_at(const Tensor& t, int64_t axis, int64_t index);

/// `t` (float, float16 or bfloat16) as `to` (one of the three), rounding to
/// nearest even; a copy when the types agree.
VAIQ_API Tensor convert_float_type(const Tensor& t, DataType to);

}  // namespace vaiq
