// The default recipe: the built-in plugins that the documented settings stand
// for (quant_format: QDQ is the qdq format, optimize_model the optimize_model
// pass, ...). The one place in the host that names built-in plugins; anything
// else reaches plugins through what a recipe names and their interfaces.
// Algorithms are not named here: each declares the settings that run it (its
// descriptor's enabled_by).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace vaiq {

class Recipe;
struct PreprocessOptions;

namespace defaults {

/// The target a recipe that names none quantizes for.
inline constexpr std::string_view kTarget = "cpu";
/// The target a recipe that names none but sets enable_dpu quantizes for:
/// vai_q_onnx's enable_dpu=True means the CNN NPU.
inline constexpr std::string_view kDpuTarget = "npu_cnn";

/// The format plugin for a documented quant_format (a plugin name stays as it is).
std::string format_plugin(std::string_view quant_format);
/// The calibrator plugin for a documented calibrate_method (its lower-case name).
std::string calibrator_plugin(std::string_view calibrate_method);

/// A pass a documented setting asks for, with its options (null: defaults).
struct PassRequest {
    std::string name;
    nlohmann::json options;
};

/// The documented preparation steps the recipe switches on, in the order they
/// run before the target's legalisation passes.
std::vector<PassRequest> preparation_passes(const Recipe& recipe);
/// The pass include_cle runs after the target's passes; the CLE* extra options
/// are its options.
inline constexpr std::string_view kEqualizationPass = "cross_layer_equalization";
/// The report report_html: true writes: the HTML page.
inline constexpr std::string_view kHtmlReport = "html";
/// The reader of a run without calibration data (the documented random data reader).
inline constexpr std::string_view kRandomReader = "random";
/// quant_pre_process's steps: those before the caller's own passes, and after.
std::vector<PassRequest> preprocess_passes_before(const PreprocessOptions& options);
std::vector<PassRequest> preprocess_passes_after(const PreprocessOptions& options);

}  // namespace defaults
}  // namespace vaiq
