#include "util/model_size.hpp"

#include <limits>

#include "vaiq/log.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {

size_t single_file_bytes(const Model& model) {
    size_t size = model.proto().ByteSizeLong();
    for (const auto& init : model.graph().initializer())
        if (is_deferred(init)) size += stored_data_bytes(init);
    return size;
}

void store_externally_if_oversize(const Model& model, SaveOptions& save, const std::filesystem::path& output,
                                  std::string_view option) {
    if (save.use_external_data_format) return;
    const size_t size = single_file_bytes(model);
    if (size <= static_cast<size_t>(std::numeric_limits<int32_t>::max())) return;
    save.use_external_data_format = true;
    save.all_tensors_to_one_file = true;  // asked for no external data, so for no file per tensor either
    const std::string data = save.external_data_file.empty() ? output.filename().string() + ".data"
                                                             : save.external_data_file;
    log_warn("{} is {:.2f} GB, over protobuf's 2 GB limit for one file: its tensors go to {}{}{}",
             output.filename().string(), static_cast<double>(size) / 1e9, data, option.empty() ? "" : ", as with ",
             option);
}

}  // namespace vaiq
