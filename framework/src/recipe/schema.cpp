#include "recipe/schema.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <string>

#include "recipe/defaults.hpp"

namespace vaiq {

std::string_view phase_name(Phase phase) {
    switch (phase) {
        case Phase::Setup: return "setup";
        case Phase::Load: return "load";
        case Phase::Prepare: return "prepare";
        case Phase::Plan: return "plan";
        case Phase::Calibrate: return "calibrate";
        case Phase::Parameters: return "parameters";
        case Phase::Emit: return "emit";
        case Phase::Check: return "check";
        case Phase::Evaluate: return "evaluate";
        case Phase::Save: return "save";
    }
    return "unknown";
}

namespace {
using K = ValueKind;
using P = Phase;
constexpr bool yes = true;
}  // namespace

// Defaults and wording follow the Vitis AI ONNX quantizer reference
// (quantize_static arguments and extra_options). `implemented` says whether
// this build's pipeline honours the key; see Pipeline for how that is enforced.
const std::vector<KeySpec>& recipe_keys() {
    static const std::vector<KeySpec> keys = {
        // --- the recipe itself --------------------------------------------------
        {"recipe_version", K::SchemaVersion, "1", P::Setup, yes, "Recipe schema version; this vaiq reads version 1."},
        {"name", K::String, "''", P::Setup, yes, "A short name for reports."},
        {"description", K::String, "''", P::Setup, yes, "What the recipe is for."},
        {"plugin_paths", K::PathList, "[]", P::Setup, yes,
         "Extra plugin libraries or folders, relative to the recipe, loaded before the recipe's plugins are resolved."},
        {"target", K::PluginName, defaults::kTarget, P::Setup, yes,
         "The target plugin: what the device supports and requires."},
        {"passes", K::Passes, "[]", P::Prepare, yes,
         "Pass plugins run in order in the prepare phase: a name, or {name, options}."},
        {"algorithms", K::Passes, "[]", P::Prepare, yes,
         "Algorithm plugins run in order, each at its stage (the end of preparation, or once the parameters are "
         "computed): a name, or {name, options}. Those the documented settings imply (SmoothQuant, "
         "weight_only_algorithm) run first."},
        {"overrides", K::Overrides, "[]", P::Plan, yes,
         "Ordered per-node and per-op-type settings and exclusions; the last matching entry wins per setting."},
        {"report", K::OptionalPath, "null", P::Save, yes,
         "Where to write the JSON report (default: <model_output>.report.json)."},
        {"report_html", K::Bool, "true", P::Save, yes,
         "Also write the report as one self-contained HTML page beside the JSON one (<report>.html): summary, "
         "per-tensor error, activation histograms with the chosen ranges, the plan, device adjustments, phase "
         "times (the html report plugin). Its per-tensor figures cost one more run of both models on one "
         "evaluation batch."},
        {"reports", K::Passes, "[]", P::Save, yes,
         "Report plugins that render the JSON report as other documents beside it (<report> with each one's "
         "extension): a name, or {name, options}. report_html: true adds the HTML page. With any report, "
         "evaluation measures every tensor's error on one batch for them."},
        {"dump_output_dir", K::OptionalPath, "null", P::Save, yes,
         "After saving, dump the quantized model's values on the first calibration batch here (dump_model)."},
        {"dump_float", K::Bool, "false", P::Save, yes, "With dump_output_dir: every node's float output too."},
        {"evaluation_data", K::OptionalPath, "null", P::Evaluate, yes,
         "Held-out samples to compare the quantized model with the float one (default: the calibration data)."},
        {"evaluation_labels", K::OptionalPath, "null", P::Evaluate, yes,
         "A .npy of integer class labels, one per evaluation sample, for top-1 accuracy."},
        {"evaluation_batches", K::Int, "null", P::Evaluate, yes,
         "Evaluate at most this many batches (0: all). Default: all of evaluation_data, or the first 32 batches of "
         "the calibration data, which calibration has already run through the float model."},
        {"warn_output_sqnr_db", K::Float, "10", P::Evaluate, yes,
         "Warn when an output's SQNR on the evaluation data is below this many dB, naming the first tensor whose "
         "SQNR falls below it."},
        {"min_output_sqnr_db", K::Float, "null", P::Evaluate, yes,
         "Fail (exit 1, nothing written) when an output's SQNR on the evaluation data is below this many dB."},
        {"sensitivity_analysis",
         K::Bool,
         "false",
         P::Parameters,
         yes,
         "Add every quantized tensor's error to the report, most harmful first: its own SQNR after "
         "quantize-dequantize and the output's SQNR with only it quantized (`vaiq analyze` prints it).",
         {},
         {},
         true},
        {"sensitivity_batches",
         K::Int,
         "4",
         P::Parameters,
         yes,
         "Batches of the calibration data the sensitivity analysis (and mixed precision's ranking) runs on "
         "(0: all): each tensor costs one run of the model per batch.",
         {},
         {},
         true},
        {"sensitivity_tensors",
         K::Int,
         "null",
         P::Parameters,
         yes,
         "Tensors the sensitivity analysis measures (0: every one): those whose own error after quantize-dequantize "
         "is largest; the others follow them in the ranking by that error, unmeasured. Default: every tensor, unless "
         "the plan's activations times the tensors exceed 5e10 values (a large model at a large input: IMG.LY's ISNet "
         "at 1024x1024 measures 59 of 471).",
         {},
         {},
         true},

        {"float_fragile_inputs",
         K::Bool,
         "true",
         P::Plan,
         yes,
         "Ops whose meaning breaks under rounding read float values: what comparisons (Equal, Greater, Less, ...) and "
         "rankings (ArgMax, ArgMin, TopK) read, since an 8-bit grid turns near values into equal ones (a peak test "
         "Equal(MaxPool(x), x) then finds peaks everywhere), and what Log and Reciprocal read, since "
         "a grid rounds small values to 0; with the tensors those come from through ops that keep equal values "
         "equal (MaxPool, Reshape, Slice, a Sigmoid, an eps Clip, a scale by a constant); and a score the model "
         "outputs (a graph output a Sigmoid or Softmax computes), since an 8-bit grid rounds every probability below "
         "0.002 to 0 and ties what users rank. false quantizes them as any activation.",
         {},
         {},
         true},

        {"mixed_scale_ratio",
         K::Float,
         "16",
         P::Plan,
         yes,
         "Channels on different scales: where a tensor the graph splits (every reader a Slice or Split), a Concat's "
         "output or a Conv head's graph output has a channel whose largest |value| on the first calibration "
         "batches exceeds this many times another's, the tensor is named in the log and the report's "
         "notes with what to do; one the graph splits stays float and each Slice/Split output is quantized on its "
         "own range. 0 turns the check off.",
         {},
         {},
         true},
        {"mixed_scale_batches",
         K::Int,
         "4",
         P::Plan,
         yes,
         "Calibration batches the channel-scale check measures (one float run of each).",
         {},
         {},
         true},

        // --- quantize_static arguments -------------------------------------------
        {"model_input", K::OptionalPath, "null", P::Load, yes, "The float model to quantize."},
        {"model_output", K::OptionalPath, "null", P::Save, yes, "Where to write the quantized model."},
        {"calibration_data_reader", K::OptionalPath, "null", P::Calibrate, yes,
         "Calibration data: a folder of .npy or TensorProto .pb files, or of JPEG/PNG images (see "
         "data_preprocess); null uses random data."},
        {"data_preprocess",
         K::Choice,
         "None",
         P::Calibrate,
         yes,
         "How images become inputs: preprocess_method1 (MLPerf 0.5 MobileNet: aspect-preserving bilinear resize to "
         "size / 0.875, centre crop, pixels to [-1, 1]), preprocess_method2 (MLPerf 0.5 ResNet: the same with area "
         "resampling, ImageNet channel means subtracted), None (image_preprocess alone). image_preprocess keys "
         "(options of the images reader) set explicitly override the preset's.",
         {},
         {"None", "preprocess_method1", "preprocess_method2"},
         true},
        {"quant_format", K::QuantFormat, "QDQ", P::Emit, yes,
         "QDQ, QOperator, IntegerOps, QLinearOps (= QOperator), MatMulNBits, VitisQuantFormat.QDQ, "
         "VitisQuantFormat.FixNeuron, or the name of a format plugin."},
        {"calibrate_method", K::CalibrateMethod, "MinMSE", P::Calibrate, yes,
         "MinMax (naive, the original tool's name), Entropy, Percentile (float scales), NonOverflow, MinMSE "
         "(power-of-two), or a calibrator plugin."},
        {"input_nodes", K::StringList, "[]", P::Plan, yes, "Start nodes: nodes before them are not quantized."},
        {"output_nodes", K::StringList, "[]", P::Plan, yes, "End nodes: nodes after them are not quantized."},
        {"op_types_to_quantize", K::StringList, "[]", P::Plan, yes,
         "Only quantize these op types (empty: every op type the target supports)."},
        {"random_data_reader_input_shape",
         K::ShapeSpec,
         "[]",
         P::Calibrate,
         yes,
         "Input shapes for the random data reader: [1, 3, 224, 224], [[...], [...]] or {name: [...]}.",
         {},
         {},
         true},
        {"per_channel", K::Bool, "false", P::Plan, yes, "Quantize weights per channel."},
        {"reduce_range", K::Bool, "false", P::Plan, yes, "Quantize weights with 7 bits."},
        {"weight_only", K::Bool, "false", P::Plan, yes,
         "Quantize only the constant weights of MatMul; activations stay float (INT4 weight-only for language "
         "models)."},
        {"weight_only_algorithm",
         K::String,
         "rtn",
         P::Prepare,
         yes,
         "How weight-only weights are chosen: rtn (each block rounded to nearest), or a value that runs the "
         "algorithm plugins enabled by it (`vaiq plugins` lists them under 'enabled by').",
         "weight_only",
         {},
         true},
        {"block_size", K::Int, "0", P::Plan, yes,
         "> 0: MatMul weights get a scale per block of this many values along K (16 to 256, a power of two for "
         "MatMulNBits; 128 is the usual); -1: one block spanning K, a scale per column; 0: per tensor or per "
         "channel."},
        {"activation_type", K::QuantType, "QInt8", P::Plan, yes, "Quant type of activations."},
        {"weight_type", K::QuantType, "QInt8", P::Plan, yes, "Quant type of weights."},
        {"nodes_to_quantize", K::StringList, "[]", P::Plan, yes, "Only quantize these nodes (empty: all)."},
        {"nodes_to_exclude", K::StringList, "[]", P::Plan, yes, "Never quantize these nodes."},
        {"optimize_model", K::Bool, "true", P::Prepare, yes, "Optimize the float model before quantizing."},
        {"use_external_data_format", K::Bool, "false", P::Save, yes,
         "Store tensors in a .data file beside the output model (required over 2 GB)."},
        {"external_data_name", K::String, "'{model}.data'", P::Save, yes,
         "The external data file's name, {model} standing for the output model's file name ('{model}_data': as "
         "onnx.save_model(location=basename + '_data'))."},
        {"external_data_size_threshold", K::Int, "1024", P::Save, yes,
         "Tensors of fewer bytes stay inside the model file when use_external_data_format is set (0: none)."},
        {"execution_providers", K::Providers, "[CPUExecutionProvider]", P::Calibrate, yes,
         "vaiq calibrates on its own CPU executor: only CPUExecutionProvider is accepted."},
        {"enable_dpu",
         K::Bool,
         "false",
         P::Prepare,
         yes,
         "Apply the DPU/NPU transforms and limitations (an option of the targets that have them).",
         {},
         {},
         true},
        {"convert_fp16_to_fp32", K::Bool, "false", P::Prepare, yes, "Convert a float16 model to float32 first."},
        {"convert_nchw_to_nhwc", K::Bool, "false", P::Prepare, yes,
         "Convert an NCHW-input model to NHWC inputs first."},
        {"include_cle", K::Bool, "false", P::Prepare, yes, "Apply Cross Layer Equalization."},
        {"include_fast_ft",
         K::Bool,
         "false",
         P::Parameters,
         yes,
         "Fast finetune: fit each Conv/Gemm/MatMul's quantized weights to reproduce the float layer's output (the "
         "algorithm plugin it enables; its options under extra_options).",
         {},
         {},
         true},
        {"cle_guard", K::Bool, "true", P::Evaluate, yes,
         "Also quantize without CLE and keep CLE only if the output SQNR on the evaluation data is no lower.",
         "include_cle"},

        // --- the original ONNX Runtime tool's quantize() --------------------------
        {"static", K::Bool, "true", P::Plan, yes,
         "false: activations are quantized at run time by DynamicQuantizeLinear (uint8) and need no calibration "
         "(quantize_dynamic, and the IntegerOps/QLinearOps dynamic modes)."},
        {"input_quantization_params", K::ParamsMap, "{}", P::Parameters, yes,
         "{tensor: [zero_point, scale]}: parameters of activations read by quantized nodes, used as given instead "
         "of calibrated or computed at run time."},
        {"output_quantization_params", K::ParamsMap, "{}", P::Parameters, yes,
         "{tensor: [zero_point, scale]}: the same for outputs of quantized nodes (QLinearOps needs them)."},
        {"asymmetric_input_types", K::Bool, "null", P::Plan, yes,
         "true: int8 weights and uint8 activations; false: uint8 for both, weights asymmetric. Sets weight_type, "
         "activation_type and WeightSymmetric."},
        {"nbits", K::Int, "8", P::Plan, yes, "Bits of the quantized data; only 8."},

        // --- extra_options ------------------------------------------------------
        {"extra_options.ActivationSymmetric", K::Bool, "false", P::Plan, yes, "Symmetric activation ranges."},
        {"extra_options.WeightSymmetric", K::Bool, "true", P::Plan, yes, "Symmetric weight ranges."},
        {"extra_options.UseUnsignedReLU", K::Bool, "false", P::Plan, yes,
         "Force outputs of ReLU and Clip with min 0 to be asymmetric."},
        {"extra_options.QuantizeBias", K::Bool, "true", P::Plan, yes, "Quantize biases as normal weights."},
        {"extra_options.FloatLayerNormStatistics", K::Bool, "true", P::Plan, yes,
         "A LayerNorm spelled out in ops (before opset 17) keeps its mean, variance and division float, as a "
         "LayerNormalization op computes them: a variance below half a step rounds to zero, and dividing by "
         "it writes infinities. Its scale and shift are quantized as usual."},
        {"extra_options.RemoveInputInit", K::Bool, "true", P::Prepare, yes,
         "Remove initializers from the graph inputs so they are treated as constants."},
        {"extra_options.EnableSubgraph", K::Bool, "false", P::Emit, yes,
         "Quantize the bodies of If, Loop and Scan nodes too: an If's branches each on the calibration batches "
         "that take it, a Loop's or Scan's body on its iterations (up to 256 a batch, drawn from the whole run)."},
        {"extra_options.ForceQuantizeNoInputCheck", K::Bool, "false", P::Plan, yes,
         "Quantize latent operators (MaxPool, Transpose, ...) even when their input is not quantized."},
        {"extra_options.MatMulConstBOnly", K::Bool, "false", P::Plan, yes,
         "Only quantize MatMuls whose B is constant."},
        {"extra_options.OpTypesToExcludeOutputQuantization", K::StringList, "[]", P::Plan, yes,
         "Op types whose outputs are not quantized."},
        {"extra_options.QDQOpTypePerChannelSupportToAxis", K::IntMap, "{}", P::Plan, yes,
         "Per-channel axis by op type, e.g. {MatMul: 1} (only with per_channel)."},
        {"extra_options.RandomDataReaderInputDataRange", K::RangeMap, "null", P::Calibrate, yes,
         "Value range per input for the random data reader."},
        {"extra_options.BFPAttributes.bfp_method",
         K::Choice,
         "to_bfp",
         P::Plan,
         yes,
         "QBFP16's method: to_bfp (one shared exponent a block); to_bfp_prime (MicroeXponents) is not computed.",
         {},
         {"to_bfp", "to_bfp_prime"}},
        {"extra_options.BFPAttributes.axis", K::Int, "1", P::Plan, yes,
         "The axis QBFP16's blocks run along (a vector's only axis; negative: from the end)."},
        {"extra_options.BFPAttributes.bit_width", K::Int, "16", P::Plan, yes,
         "QBFP16's bits a value with its shared exponent (vaiq computes 16)."},
        {"extra_options.BFPAttributes.block_size", K::Int, "8", P::Plan, yes, "Values sharing an exponent in QBFP16."},
        {"extra_options.BFPAttributes.rounding_mode", K::Int, "2", P::Plan, yes,
         "QBFP16's rounding of ties: 0 away from zero, 1 upward, 2 to even (Quark's BFP16 configuration)."},
        {"extra_options.MXAttributes.element_dtype",
         K::Choice,
         "int8",
         P::Plan,
         yes,
         "The element of activation_type/weight_type QMX: int8, fp8_e4m3, fp8_e5m2, fp6_e3m2, fp6_e2m3 or "
         "fp4_e2m1 (QMXINT8, QMXFP8E4M3, ... name one directly).",
         {},
         {"int8", "fp8_e4m3", "fp8_e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1"}},
        {"extra_options.MXAttributes.axis", K::Int, "1", P::Plan, yes,
         "The axis the MX types' blocks run along (a vector's only axis; negative: from the end)."},
        {"extra_options.MXAttributes.block_size", K::Int, "32", P::Plan, yes,
         "Values sharing an E8M0 scale in the MX types."},
        {"extra_options.MXAttributes.rounding_mode", K::Int, "2", P::Plan, yes,
         "The MX types' rounding of ties: 0 away from zero, 1 upward, 2 to even (Quark's MX configurations)."},
        {"extra_options.Int16Scale", K::Bool, "false", P::Parameters, yes,
         "Replace float scales by the nearest M * 2^-N, M a positive int16 and N a uint16 shift."},
        {"extra_options.ConvertClipToRelu", K::Bool, "false", P::Prepare, yes,
         "Clip with min 0 and no max to Relu (a finite max is kept: dropping it changes the function)."},
        {"extra_options.ReplaceClip6Relu", K::Bool, "false", P::Prepare, yes, "Replace Clip(0, 6) with Relu."},
        {"extra_options.SmoothQuant",
         K::Bool,
         "false",
         P::Prepare,
         yes,
         "Move activation outliers into the weights of MatMul/Gemm nodes before calibration (the algorithm plugin "
         "it enables).",
         {},
         {},
         true},
        {"extra_options.BiasCorrection",
         K::Bool,
         "false",
         P::Parameters,
         yes,
         "Add to each Conv/Gemm bias the mean shift its quantized weight causes, measured on the calibration "
         "data through the quantized model (the algorithm plugin it enables).",
         {},
         {},
         true},
    };
    return keys;
}

bool is_extra_option_name(std::string_view name) {
    auto word = [](std::string_view w) {
        return !w.empty() && std::isupper(static_cast<unsigned char>(w[0])) &&
               std::all_of(w.begin(), w.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)); });
    };
    // A dotted name is an option of a plugin's section (a map under extra_options).
    const auto dot = name.find('.');
    if (dot == std::string_view::npos) return word(name);
    return word(name.substr(0, dot)) && word(name.substr(dot + 1));
}

const KeySpec* find_key(std::string_view path) {
    for (const auto& k : recipe_keys())
        if (k.path == path) return &k;
    return nullptr;
}

namespace {
constexpr std::string_view kPluginOptionSections[] = {"plugin_options.target", "plugin_options.format",
                                                      "plugin_options.calibrator"};
}

bool is_plugin_options_section(std::string_view path) {
    for (auto s : kPluginOptionSections)
        if (s == path) return true;
    return false;
}

bool in_plugin_section(std::string_view path) {
    const auto dot = path.rfind('.');
    return dot != std::string_view::npos && path.substr(0, dot) == "image_preprocess";
}

bool is_section(std::string_view path) {
    return path == "extra_options" || path == "image_preprocess" || path == "extra_options.BFPAttributes" ||
           path == "extra_options.MXAttributes" || path == "plugin_options" || is_plugin_options_section(path);
}

std::vector<std::string> keys_in_section(std::string_view section) {
    std::vector<std::string> out;
    const std::string prefix = section.empty() ? std::string() : std::string(section) + ".";
    auto direct_child = [&](std::string_view path) -> std::string {
        if (path.substr(0, prefix.size()) != prefix) return {};
        auto rest = path.substr(prefix.size());
        return std::string(rest.substr(0, rest.find('.')));
    };
    for (const auto& k : recipe_keys()) {
        auto child = direct_child(k.path);
        if (!child.empty() && std::find(out.begin(), out.end(), child) == out.end()) out.push_back(child);
    }
    for (std::string_view s :
         {"extra_options", "extra_options.BFPAttributes", "extra_options.MXAttributes", "plugin_options",
          "plugin_options.target", "plugin_options.format", "plugin_options.calibrator", "extends"}) {
        auto child = direct_child(s);
        if (!child.empty() && std::find(out.begin(), out.end(), child) == out.end()) out.push_back(child);
    }
    return out;
}

const std::vector<OverrideKey>& override_keys() {
    static const std::vector<OverrideKey> keys = {
        {"activation_type", "activation_type"},
        {"weight_type", "weight_type"},
        {"per_channel", "per_channel"},
        {"reduce_range", "reduce_range"},
        {"block_size", "block_size"},
        {"calibrate_method", "calibrate_method"},
        {"ActivationSymmetric", "extra_options.ActivationSymmetric"},
        {"WeightSymmetric", "extra_options.WeightSymmetric"},
        {"UseUnsignedReLU", "extra_options.UseUnsignedReLU"},
        {"QuantizeBias", "extra_options.QuantizeBias"},
    };
    return keys;
}

}  // namespace vaiq
