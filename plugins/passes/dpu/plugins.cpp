// dpu: the graph transforms enable_dpu switches on (each under its documented
// extra_options key; the npu_cnn target decides which run) and the Clip
// rewrites any recipe can ask for.
#include "passes.hpp"

using vaiq::FunctionPass;
// What only changes how the model computes, not what (Pass::keeps_function).
constexpr bool kKeepsFunction = true;
namespace p = dpu_passes;

VAIQ_PLUGINS(
    vaiq::describe<FunctionPass<p::convert_bn_to_conv, kKeepsFunction>>(
        "convert_bn_to_conv", "0.1.0", "BatchNormalization folded into the Conv before it, else a depthwise 1x1 Conv"),
    vaiq::describe<FunctionPass<p::convert_reduce_mean_to_global_avg_pool, kKeepsFunction>>(
        "convert_reduce_mean_to_global_avg_pool", "0.1.0", "ReduceMean over the spatial axes to GlobalAveragePool"),
    vaiq::describe<FunctionPass<p::split_large_kernel_pool, kKeepsFunction>>(
        "split_large_kernel_pool", "0.1.0",
        "GlobalAveragePool over more than 512 elements to AveragePool + GlobalAveragePool"),
    vaiq::describe<FunctionPass<p::convert_split_to_slice, kKeepsFunction>>("convert_split_to_slice", "0.1.0",
                                                                            "Split to one Slice per output"),
    vaiq::describe<FunctionPass<p::fuse_instance_norm, kKeepsFunction>>(
        "fuse_instance_norm", "0.1.0", "A spelled-out instance normalisation to InstanceNormalization"),
    vaiq::describe<FunctionPass<p::fuse_l2_norm>>("fuse_l2_norm", "0.1.0",
                                                  "x / sqrt(sum(x^2)) over one axis to LpNormalization(p=2)"),
    vaiq::describe<FunctionPass<p::convert_clip_to_relu, kKeepsFunction>>("convert_clip_to_relu", "0.1.0",
                                                                          "Clip with min 0 and no max to Relu"),
    vaiq::describe<FunctionPass<p::replace_clip6_relu>>("replace_clip6_relu", "0.1.0",
                                                        "Clip(0, 6) to Relu (changes the function; for CLE)"),
    vaiq::describe<FunctionPass<p::convert_leaky_relu_to_dpu_version>>(
        "convert_leaky_relu_to_dpu_version", "0.1.0", "LeakyRelu's alpha to the DPU's round(256 alpha) / 256"),
    vaiq::describe<FunctionPass<p::convert_sigmoid_to_hard_sigmoid>>("convert_sigmoid_to_hard_sigmoid", "0.1.0",
                                                                     "Sigmoid to HardSigmoid(alpha 1/6, beta 1/2)"),
    vaiq::describe<FunctionPass<p::convert_hard_sigmoid_to_dpu_version>>(
        "convert_hard_sigmoid_to_dpu_version", "0.1.0", "HardSigmoid times the DPU's 2731/16384 over 1/6"),
    vaiq::describe<FunctionPass<p::convert_avg_pool_to_dpu_version>>(
        "convert_avg_pool_to_dpu_version", "0.1.0", "Square average pools times the DPU's rounding of 1/k^2"),
    vaiq::describe<FunctionPass<p::convert_reduce_mean_to_dpu_version>>("convert_reduce_mean_to_dpu_version", "0.1.0",
                                                                        "ReduceMean times the DPU's rounding of 1/n"),
    vaiq::describe<FunctionPass<p::convert_softmax_to_dpu_version>>(
        "convert_softmax_to_dpu_version", "0.1.0", "Softmax as the DPU computes it: bfloat16 with a polynomial exp"))
