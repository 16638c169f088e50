#include "sdk/protobuf_file.hpp"

#include <fmt/format.h>

#include <fstream>
#include <limits>
#include <memory>

#include "vaiq/error.hpp"

namespace vaiq {

bool parse_protobuf_file(const std::filesystem::path& file, google::protobuf::MessageLite& message) {
    std::ifstream in(file, std::ios::binary | std::ios::ate);
    if (!in) throw InputError(fmt::format("{}: cannot open for reading", file.string()));
    const std::streamoff size = in.tellg();
    if (size < 0) throw InputError(fmt::format("{}: cannot read its size", file.string()));
    if (size > std::numeric_limits<int>::max())
        throw InputError(
            fmt::format("{}: {} bytes, over the 2 GiB a protobuf can hold (larger models keep their "
                        "tensors in external data)",
                        file.string(), size));
    // Uninitialised: the read fills every byte.
    const auto bytes = std::make_unique_for_overwrite<char[]>(static_cast<size_t>(size));
    in.seekg(0);
    if (!in.read(bytes.get(), size)) throw InputError(fmt::format("{}: could not be read whole", file.string()));
    return message.ParseFromArray(bytes.get(), static_cast<int>(size));
}

}  // namespace vaiq
