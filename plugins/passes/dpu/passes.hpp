// The enable_dpu transforms, one function per pass: each rewrites the model in
// place and returns whether it changed anything.
#pragma once

#include <vaiq/vaiq.hpp>

namespace dpu_passes {

// Legalisation: ops the DPU runs in another form.
bool convert_bn_to_conv(vaiq::Model& model);
bool convert_reduce_mean_to_global_avg_pool(vaiq::Model& model);
bool split_large_kernel_pool(vaiq::Model& model);
bool convert_split_to_slice(vaiq::Model& model);
bool fuse_instance_norm(vaiq::Model& model);
bool fuse_l2_norm(vaiq::Model& model);
bool convert_clip_to_relu(vaiq::Model& model);
bool replace_clip6_relu(vaiq::Model& model);

// Simulation: the DPU's approximations, so calibration and evaluation see what it computes.
bool convert_leaky_relu_to_dpu_version(vaiq::Model& model);
bool convert_sigmoid_to_hard_sigmoid(vaiq::Model& model);
bool convert_hard_sigmoid_to_dpu_version(vaiq::Model& model);
bool convert_avg_pool_to_dpu_version(vaiq::Model& model);
bool convert_reduce_mean_to_dpu_version(vaiq::Model& model);
bool convert_softmax_to_dpu_version(vaiq::Model& model);

}  // namespace dpu_passes
