#include "vaiq/reader.hpp"

#include <fmt/format.h>

#include <fstream>
#include <regex>

#include "sdk/atomic_file.hpp"
#include "sdk/protobuf_file.hpp"
#include "vaiq/error.hpp"
#include "vaiq/text.hpp"

namespace fs = std::filesystem;

namespace vaiq {

namespace {

struct NpyType {
    const char* descr;
    DataType type;
};

constexpr NpyType kTypes[] = {
    {"<f4", DataType::Float},  {"<f8", DataType::Double}, {"<f2", DataType::Float16}, {"<i8", DataType::Int64},
    {"<i4", DataType::Int32},  {"<i2", DataType::Int16},  {"|i1", DataType::Int8},    {"<u8", DataType::UInt64},
    {"<u4", DataType::UInt32}, {"<u2", DataType::UInt16}, {"|u1", DataType::UInt8},   {"|b1", DataType::Bool},
};

}  // namespace

Tensor read_npy(const fs::path& file) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw InputError(fmt::format("{}: cannot open", file.string()));
    char magic[8];
    if (!in.read(magic, 8) || std::string(magic, 6) != "\x93NUMPY")
        throw InputError(fmt::format("{}: not a .npy file", file.string()));
    const int major = static_cast<unsigned char>(magic[6]);
    uint32_t header_len = 0;
    if (major == 1) {
        unsigned char len[2];
        in.read(reinterpret_cast<char*>(len), 2);
        header_len = len[0] | (len[1] << 8);
    } else if (major == 2 || major == 3) {
        unsigned char len[4];
        in.read(reinterpret_cast<char*>(len), 4);
        header_len = len[0] | (len[1] << 8) | (len[2] << 16) | (static_cast<uint32_t>(len[3]) << 24);
    } else {
        throw InputError(fmt::format("{}: .npy format version {} is not supported", file.string(), major));
    }
    if (!in || header_len > (1u << 20)) throw InputError(fmt::format("{}: truncated .npy header", file.string()));
    std::string header(header_len, '\0');
    if (!in.read(header.data(), header_len)) throw InputError(fmt::format("{}: truncated .npy header", file.string()));

    // Compiled once: compiling costs more than reading a small sample.
    static const std::regex kDescr(R"('descr'\s*:\s*'([^']*)')");
    static const std::regex kFortran(R"('fortran_order'\s*:\s*True)");
    static const std::regex kShape(R"('shape'\s*:\s*\(([^)]*)\))");
    std::smatch m;
    if (!std::regex_search(header, m, kDescr))
        throw InputError(fmt::format("{}: the .npy header has no descr", file.string()));
    const std::string descr = m[1];
    if (std::regex_search(header, kFortran))
        throw InputError(
            fmt::format("{}: Fortran-order arrays are not supported; save with np.ascontiguousarray", file.string()));
    if (!std::regex_search(header, m, kShape))
        throw InputError(fmt::format("{}: the .npy header has no shape", file.string()));
    std::vector<int64_t> shape;
    const std::string dims = m[1];
    static const std::regex kNumber("[0-9]+");
    for (auto it = std::sregex_iterator(dims.begin(), dims.end(), kNumber); it != std::sregex_iterator(); ++it) {
        try {
            shape.push_back(std::stoll(it->str()));
        } catch (const std::out_of_range&) {
            throw InputError(fmt::format("{}: the .npy header's dimension {} is too large", file.string(), it->str()));
        }
    }

    const NpyType* type = nullptr;
    for (const auto& t : kTypes)
        if (descr == t.descr) type = &t;
    if (!type) {
        std::vector<std::string> known;
        for (const auto& t : kTypes) known.emplace_back(t.descr);
        throw InputError(
            fmt::format("{}: element type '{}' is not supported (supported: {})", file.string(), descr, join(known)));
    }
    Tensor t(type->type, shape);
    auto bytes = t.mutable_bytes();
    if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size())))
        throw InputError(fmt::format("{}: holds fewer values than its shape ({}) needs", file.string(), t.size()));
    return t;
}

void write_npy(const fs::path& file, const Tensor& tensor) {
    const NpyType* type = nullptr;
    for (const auto& t : kTypes)
        if (t.type == tensor.type()) type = &t;
    if (!type) throw InputError(fmt::format("cannot write {} tensors as .npy", data_type_name(tensor.type())));
    std::string dims;
    for (auto d : tensor.shape()) dims += std::to_string(d) + ", ";
    if (tensor.shape().size() > 1) dims.resize(dims.size() - 2);
    std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", type->descr, dims);
    // Pad so the data starts on a 64-byte boundary, ending the header with '\n'.
    const size_t total = 10 + header.size() + 1;
    header.append((64 - total % 64) % 64, ' ');
    header += '\n';
    write_file_atomically(file, [&](std::ostream& out) {
        out.write("\x93NUMPY\x01\x00", 8);
        const auto len = static_cast<uint16_t>(header.size());
        const char le[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
        out.write(le, 2);
        out << header;
        out.write(reinterpret_cast<const char*>(tensor.bytes().data()),
                  static_cast<std::streamsize>(tensor.bytes().size()));
    });
}

Tensor read_tensor_proto(const fs::path& file, std::string* name) {
    onnx::TensorProto proto;
    if (!parse_protobuf_file(file, proto))
        throw InputError(fmt::format("{}: not an ONNX TensorProto file", file.string()));
    if (name) *name = proto.name();
    try {
        return Tensor::from_proto(proto);
    } catch (const InputError& e) {
        throw InputError(fmt::format("{}: {}", file.string(), e.what()));
    }
}

Tensor read_tensor_file(const fs::path& file, std::string* name) {
    if (file.extension() == ".npy") return read_npy(file);
    if (file.extension() == ".pb") return read_tensor_proto(file, name);
    throw InputError(fmt::format("{}: expected a .npy or .pb file", file.string()));
}

}  // namespace vaiq
