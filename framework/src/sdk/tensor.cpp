#include "vaiq/tensor.hpp"

#include <fmt/format.h>

#include <cctype>
#include <limits>

#include "vaiq/error.hpp"

namespace vaiq {

size_t element_size(DataType type) {
    switch (type) {
        case DataType::Bool:
        case DataType::UInt8:
        case DataType::Int8: return 1;
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

std::string data_type_name(DataType type) {
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

Tensor Tensor::uninitialized(DataType type, std::vector<int64_t> shape) {
    if (element_size(type) == 0) throw InputError(fmt::format("tensors of {} are not supported", data_type_name(type)));
    Tensor t;
    t.type_ = type;
    t.shape_ = std::move(shape);
    t.bytes_.resize(static_cast<size_t>(element_count(t.shape_)) * element_size(type));
    return t;
}

void Tensor::check_type(DataType wanted) const {
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
    const size_t bytes = static_cast<size_t>(count) * element_size(type);
    if (proto.has_raw_data()) {
        if (proto.raw_data().size() != bytes)
            throw InputError(fmt::format("{} declares {} elements of {} ({} bytes) but holds {} bytes",
                                         tensor_label(proto), count, data_type_name(type), bytes,
                                         proto.raw_data().size()));
    } else if (typed_field_size(proto, type) != count) {
        throw InputError(fmt::format("{} declares {} elements of {} but holds {}", tensor_label(proto), count,
                                     data_type_name(type), typed_field_size(proto, type)));
    }
}

Tensor Tensor::from_proto(const onnx::TensorProto& proto) {
    const auto type = static_cast<DataType>(proto.data_type());
    if (proto.data_location() == onnx::TensorProto::EXTERNAL)
        throw InternalError(fmt::format("{} still refers to external data; load it with load_model()",
                                        tensor_label(proto)));
    if (element_size(type) == 0)
        throw InputError(fmt::format("{} has element type {}, which vaiq cannot read", tensor_label(proto),
                                     data_type_name(type)));
    check_tensor_data(proto);
    Tensor t;
    t.type_ = type;
    t.shape_.assign(proto.dims().begin(), proto.dims().end());
    const size_t bytes = static_cast<size_t>(element_count(t.shape_)) * element_size(type);
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
        case DataType::UInt8: copy_field<uint8_t>(proto.int32_data(), t.bytes_); break;
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
    proto.set_raw_data(reinterpret_cast<const char*>(bytes_.data()), bytes_.size());
    return proto;
}

}  // namespace vaiq
