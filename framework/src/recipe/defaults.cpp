#include "recipe/defaults.hpp"

#include <cctype>
#include <utility>

#include "pipeline/preprocess.hpp"
#include "recipe/recipe.hpp"

namespace vaiq::defaults {

std::string format_plugin(std::string_view quant_format) {
    if (quant_format == "QDQ") return "qdq";
    if (quant_format == "QOperator" || quant_format == "QLinearOps") return "qoperator";
    if (quant_format == "IntegerOps") return "integer_ops";
    if (quant_format == "MatMulNBits") return "matmul_nbits";
    if (quant_format == "VitisQuantFormat.QDQ") return "vitis_qdq";
    if (quant_format == "VitisQuantFormat.FixNeuron") return "fixneuron";
    return std::string(quant_format);
}

std::string calibrator_plugin(std::string_view calibrate_method) {
    std::string m(calibrate_method);
    for (auto& c : m) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return m;
}

std::vector<PassRequest> preparation_passes(const Recipe& recipe) {
    std::vector<PassRequest> out;
    for (const auto& [key, pass] :
         {std::pair{"convert_fp16_to_fp32", "convert_fp16_to_fp32"},
          std::pair{"convert_nchw_to_nhwc", "convert_nchw_to_nhwc"}, std::pair{"optimize_model", "optimize_model"},
          std::pair{"extra_options.ReplaceClip6Relu", "replace_clip6_relu"},
          std::pair{"extra_options.ConvertClipToRelu", "convert_clip_to_relu"}})
        if (recipe.value(key).get<bool>()) out.push_back({pass, nullptr});
    return out;
}

std::vector<PassRequest> preprocess_passes_before(const PreprocessOptions& options) {
    std::vector<PassRequest> out;
    if (!options.skip_symbolic_shape)
        out.push_back({"infer_symbolic_shapes",
                       {{"auto_merge", options.auto_merge}, {"guess_output_rank", options.guess_output_rank}}});
    if (!options.skip_optimization) out.push_back({"optimize_model", nullptr});
    return out;
}

std::vector<PassRequest> preprocess_passes_after(const PreprocessOptions& options) {
    if (options.skip_onnx_shape) return {};
    return {{"infer_onnx_shapes", nullptr}};
}

namespace {

// Where the recipe sets a target of automatic mixed precision (an option of the
// mixed_precision algorithm), or nullopt.
std::optional<std::string> mixed_precision_target(const Recipe& recipe) {
    for (const char* key : {"SQNRTarget", "L2Target", "Top1AccTarget"}) {
        auto it = recipe.settings.find(std::string("extra_options.AutoMixprecision.") + key);
        if (it != recipe.settings.end() && !it->second.value.is_null()) return it->second.origin;
    }
    return std::nullopt;
}

}  // namespace

std::optional<AlgorithmRequest> next_lever(const Recipe& recipe) {
    const std::string key = "extra_options.AutoMixprecision.NextLever";
    if (!mixed_precision_target(recipe) || !recipe.value(key).get<bool>() || recipe.value("include_fast_ft").get<bool>())
        return std::nullopt;
    return AlgorithmRequest{"fast_finetune", nlohmann::json::object(), recipe.setting(key).origin};
}

std::vector<AlgorithmRequest> implied_algorithms(const Recipe& recipe) {
    std::vector<AlgorithmRequest> out;
    auto add = [&](const char* name, const char* key) {
        out.push_back({name, nlohmann::json::object(), recipe.setting(key).origin});
    };
    if (const auto origin = mixed_precision_target(recipe)) {
        const auto lever = next_lever(recipe);
        out.push_back({"mixed_precision", {{"next_lever", lever ? lever->name : ""}}, *origin});
    }
    if (recipe.value("include_fast_ft").get<bool>()) add("fast_finetune", "include_fast_ft");
    if (recipe.value("extra_options.BiasCorrection").get<bool>()) add("bias_correction", "extra_options.BiasCorrection");
    if (recipe.value("extra_options.SmoothQuant").get<bool>()) add("smooth_quant", "extra_options.SmoothQuant");
    const bool weight_only = recipe.value("weight_only").get<bool>();
    const auto& algorithm = recipe.value("weight_only_algorithm");
    if (weight_only && (algorithm == "awq_lite" || algorithm == "awq_full")) add("awq_lite", "weight_only_algorithm");
    if (weight_only && algorithm == "gptq") add("gptq", "weight_only_algorithm");
    if (weight_only && algorithm == "hqq") add("hqq", "weight_only_algorithm");
    if (weight_only && algorithm == "k_quant") add("k_quant", "weight_only_algorithm");
    if (weight_only && (algorithm == "awq_clip" || algorithm == "awq_full")) add("awq_clip", "weight_only_algorithm");
    return out;
}

}  // namespace vaiq::defaults
