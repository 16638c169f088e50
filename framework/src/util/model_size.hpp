// Over protobuf's 2 GB limit a model can only be written with its tensors in
// external data: the commands turn that on themselves instead of failing after
// the work is done.
#pragma once

#include <filesystem>
#include <string_view>

#include "vaiq/model.hpp"

namespace vaiq {

/// The bytes `model` would take written as one file, its deferred tensors included.
size_t single_file_bytes(const Model& model);

/// Turns on external data in `save` when `model` would not fit in one file, and
/// says so, naming the setting that asks for it (`option`; empty: none does).
void store_externally_if_oversize(const Model& model, SaveOptions& save, const std::filesystem::path& output,
                                  std::string_view option);

}  // namespace vaiq
