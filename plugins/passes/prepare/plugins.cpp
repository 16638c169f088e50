// prepare: the documented preparation steps (quant_pre_process, optimize_model,
// include_cle, convert_fp16_to_fp32, convert_nchw_to_nhwc), one pass each,
// plus the rewrites optimize_model is made of.
#include "cle.hpp"
#include "passes.hpp"

using vaiq::FunctionPass;
// What only changes how the model computes, not what (Pass::keeps_function).
constexpr bool kKeepsFunction = true;
namespace p = prepare_passes;

namespace {

// Named as the documented extra options, which set them (include_cle turns the pass on).
const vaiq_option_descriptor kCleOptions[] = {
    {"CLESteps", VAIQ_OPTION_INT, "1", "Equalization sweeps over every pair; -1 sweeps until the change is small."},
    {"CLETotalLayerDiffThreshold", VAIQ_OPTION_FLOAT, "2e-7",
     "Adaptive steps stop when the summed mean weight change of a sweep falls below this."},
    {"CLEScaleAppendBias", VAIQ_OPTION_BOOL, "true", "Count the first layer's bias in its channel ranges."},
    {"CLEActivationAware", VAIQ_OPTION_BOOL, "false",
     "Balance each channel's scale between the weights and the activation they produce, measured on the "
     "calibration data, instead of the weights alone."},
};

const vaiq_option_descriptor kSymbolicOptions[] = {
    {"auto_merge", VAIQ_OPTION_BOOL, "false", "On a conflict keep the declared dimension instead of failing."},
    {"guess_output_rank", VAIQ_OPTION_BOOL, "false",
     "Shape the output of an op without a schema like its first input."},
};

}  // namespace

VAIQ_PLUGINS(
    vaiq::describe<FunctionPass<p::optimize_model, kKeepsFunction>>(
        "optimize_model", "0.1.0",
        "Constant folding, BatchNorm and bias-Add folding, scalar affine maps into the next layer, "
        "Identity/Dropout and dead-node removal, LayerNorm, Gelu and HardSwish fusion"),
    vaiq::describe<FunctionPass<p::eliminate_identity, kKeepsFunction>>(
        "eliminate_identity", "0.1.0", "Remove Identity nodes and inference-time Dropout"),
    vaiq::describe<FunctionPass<p::fold_constants, kKeepsFunction>>(
        "fold_constants", "0.1.0", "Evaluate nodes whose inputs are all constant; Shape of static shapes"),
    vaiq::describe<FunctionPass<p::fold_batch_norm, kKeepsFunction>>(
        "fold_batch_norm", "0.1.0", "BatchNormalization into the Conv, ConvTranspose or Gemm before it"),
    vaiq::describe<FunctionPass<p::fold_bias_add, kKeepsFunction>>(
        "fold_bias_add", "0.1.0", "An Add of a constant bias into the Conv, ConvTranspose or Gemm before it"),
    vaiq::describe<FunctionPass<p::fold_scale_mul, kKeepsFunction>>(
        "fold_scale_mul", "0.1.0",
        "A Mul by a constant per-channel scale into the Conv, ConvTranspose or Gemm before it"),
    vaiq::describe<FunctionPass<p::fold_affine_into_next_layer, kKeepsFunction>>(
        "fold_affine_into_next_layer", "0.1.0",
        "A scalar Mul (and Add) read only by a Conv, Gemm or MatMul into its weight (and bias)"),
    vaiq::describe<FunctionPass<p::fuse_layer_norm, kKeepsFunction>>(
        "fuse_layer_norm", "0.1.0", "A spelled-out LayerNorm to LayerNormalization (opset 17 and later)"),
    vaiq::describe<FunctionPass<p::fuse_gelu, kKeepsFunction>>("fuse_gelu", "0.1.0",
                                                               "An Erf-spelled Gelu to com.microsoft Gelu"),
    vaiq::describe<FunctionPass<p::fuse_hard_swish, kKeepsFunction>>("fuse_hard_swish", "0.1.0",
                                                                     "x * Clip(x + 3, 0, 6) / 6 to x * HardSigmoid(x)"),
    vaiq::describe<FunctionPass<p::remove_dead_nodes, kKeepsFunction>>("remove_dead_nodes", "0.1.0",
                                                                       "Remove nodes and initializers nothing reads"),
    vaiq::describe<FunctionPass<p::infer_onnx_shapes, kKeepsFunction>>("infer_onnx_shapes", "0.1.0",
                                                                       "ONNX shape inference, stored as value_info"),
    vaiq::describe<p::SymbolicShapeInference>("infer_symbolic_shapes", "0.1.0",
                                              "Shape inference propagating computed shapes and symbolic dimensions",
                                              kSymbolicOptions),
    vaiq::describe<FunctionPass<p::convert_fp16_to_fp32>>(
        "convert_fp16_to_fp32", "0.1.0", "A float16 model to float32, without the Casts that leaves idle"),
    vaiq::describe<FunctionPass<p::convert_nchw_to_nhwc>>("convert_nchw_to_nhwc", "0.1.0",
                                                          "NCHW image inputs taken as NHWC (a Transpose after each)"),
    vaiq::describe<p::CrossLayerEqualization>("cross_layer_equalization", "0.1.0",
                                              "Equalize the weight ranges of consecutive Conv/Gemm layers",
                                              kCleOptions))
