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

}  // namespace vaiq::defaults
