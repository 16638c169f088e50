// Reading a whole protobuf file (a model, a TensorProto) into its message.
#pragma once

#include <google/protobuf/message_lite.h>

#include <filesystem>

namespace vaiq {

/// Parses `file` into `message` from the whole file read at once: protobuf then
/// copies each bytes field in one piece, where from a stream it grew them block
/// by block (resnet50's 100 MB parsed in 0.29 s that way, 0.03 s this way). False
/// when the bytes do not parse; InputError when the file cannot be read or is
/// over protobuf's 2 GiB limit.
bool parse_protobuf_file(const std::filesystem::path& file, google::protobuf::MessageLite& message);

}  // namespace vaiq
