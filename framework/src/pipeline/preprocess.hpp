// Model preparation: the documented preparation steps as pass plugins, run
// by `vaiq preprocess` (quant_pre_process) and by the prepare phase of a run.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "pipeline/pipeline.hpp"
#include "plugin/registry.hpp"
#include "vaiq/model.hpp"
#include "vaiq/pass.hpp"

namespace vaiq {

/// Measures what a data-aware pass asks for on the model as it stands.
using ChannelMeasurer = std::function<ChannelRanges(const Model&, const std::vector<ChannelRangeRequest>&)>;

/// Runs each pass on the model in order, checking the model after each one
/// that changed it; appends {name, changed, keeps_function, seconds} to
/// `report`. A pass that asks for channel ranges gets them from `measure` when
/// there is one (a run with calibration data), else runs without them.
/// Returns whether every pass that changed the model kept its function.
bool run_passes(const std::vector<PluginChoice>& passes, PluginRegistry& registry, Model& model, nlohmann::json& report,
                const ChannelMeasurer& measure = {});

/// A pass by name with options (null for the defaults), found in the registry.
PluginChoice pass_choice(PluginRegistry& registry, const std::string& name, const nlohmann::json& options,
                         const std::string& origin);

/// Converts the model to `opset`, declaring shapes with the symbolic shape
/// inference pass where ONNX's adapters need them (convert_opset).
Model convert_opset_with_shapes(const Model& model, int64_t opset, PluginRegistry& registry);

/// The oldest opset a model to quantize may have: one of 7 to 9 is converted
/// to kConvertedOpset as it is loaded (ONNX Runtime's quantize_static upgrades
/// such models too); one before 7 is refused with advice.
inline constexpr int64_t kOldestConvertedOpset = 7;
inline constexpr int64_t kConvertedOpset = 13;

/// Loads `path` to quantize or prepare it: an opset-7-to-9 model is converted
/// to opset 13 (convert_opset_with_shapes) with one warning, and `converted`
/// (when given) gets {from, to, why}; the input file is not touched.
Model load_model_to_quantize(const std::filesystem::path& path, PluginRegistry& registry,
                             nlohmann::json* converted = nullptr);

/// quant_pre_process's arguments, with their documented defaults.
struct PreprocessOptions {
    bool skip_optimization = false;
    bool skip_onnx_shape = false;
    bool skip_symbolic_shape = false;
    bool auto_merge = false;
    int64_t int_max = 2147483647;
    bool guess_output_rank = false;
    int verbose = 0;
    bool save_as_external_data = false;
    bool all_tensors_to_one_file = false;
    std::string external_data_location = "./";
    size_t external_data_size_threshold = 1024;
    /// Further pass plugins after optimization, in order (vaiq's own addition).
    std::vector<std::string> passes;
};

/// Symbolic shape inference, optimization and ONNX shape inference (each
/// unless skipped), then `passes`; writes `output` atomically and returns what
/// ran as JSON.
nlohmann::json preprocess(const std::filesystem::path& input, const std::filesystem::path& output,
                          const PreprocessOptions& options, PluginRegistry& registry);

}  // namespace vaiq
