// dump_model: the values a quantized model computes on one batch, tensor by
// tensor, for comparing vaiq's simulation with what the device computes.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>

#include "data/data_reader.hpp"

namespace vaiq {

struct DumpOptions {
    /// Data whose first batch is the input; without it, random inputs.
    std::optional<std::filesystem::path> data;
    /// The caller's data in place of `data` (the Python API's dump_data_reader).
    std::function<std::unique_ptr<DataReader>(const Model&)> reader;
    /// Shapes of the random inputs, as random_data_reader takes them ({input:
    /// shape}, a list, or [] for the model's own shapes with a dynamic leading
    /// dimension of 1).
    nlohmann::json random_input_shapes = nlohmann::json::object();
    /// Also every node's float output, as <name>_float.bin/.txt.
    bool dump_float = false;
    std::filesystem::path output_dir = "dump_results";
};

struct DumpResult {
    int quantized = 0;  ///< quantized tensors written (one per DequantizeLinear or FixNeuron)
    int floats = 0;     ///< float node outputs written
};

/// For every DequantizeLinear (or VitisDequantizeLinear), the quantized tensor
/// it reads, written as <its output's name>.bin (raw little-endian) and .txt
/// (one value per line), '/' in names replaced by '_'; for every FixNeuron, the
/// integers its output stands for (output * 2^pos), under its output's name.
/// Throws InputError for a model with nothing to dump (none of those and no
/// dump_float) or inputs that do not fit.
DumpResult dump_model(const std::filesystem::path& model_path, const DumpOptions& options);

}  // namespace vaiq
