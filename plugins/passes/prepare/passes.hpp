// Model preparation: the rewrites run before quantization (quant_pre_process,
// optimize_model, the fp16 and layout conversions), one function per pass.
// Each rewrites the model in place and returns whether it changed anything.
#pragma once

#include <vaiq/vaiq.hpp>

#include <limits>
#include <optional>
#include <string>

namespace prepare_passes {

// A finite float constant with one element, of rank `max_rank` or less; nullopt else.
std::optional<float> scalar_constant(const vaiq::GraphIndex& index, const std::string& name,
                                     size_t max_rank = std::numeric_limits<size_t>::max());

// Optimization (optimize_model runs them all to a fixed point).
bool eliminate_identity(vaiq::Model& model);
bool fold_constants(vaiq::Model& model);
bool fold_batch_norm(vaiq::Model& model);
bool fold_bias_add(vaiq::Model& model);
bool fold_scale_mul(vaiq::Model& model);
bool fold_affine_into_next_layer(vaiq::Model& model);
bool fuse_layer_norm(vaiq::Model& model);
bool fuse_gelu(vaiq::Model& model);
bool fuse_hard_swish(vaiq::Model& model);
bool remove_dead_nodes(vaiq::Model& model);
bool optimize_model(vaiq::Model& model);

// ONNX shape inference, its results stored as value_info.
bool infer_onnx_shapes(vaiq::Model& model);

// The same with computed shape values propagated (quant_pre_process's
// symbolic shape inference, for transformer graphs).
class SymbolicShapeInference final : public vaiq::Pass {
  public:
    void configure(const vaiq::Options& options) override;
    bool run(vaiq::Model& model) override;
    bool keeps_function() const override { return true; }  // declares shapes only

  private:
    vaiq::ShapeInferenceOptions options_;
};

// Conversions.
bool convert_fp16_to_fp32(vaiq::Model& model);
bool convert_nchw_to_nhwc(vaiq::Model& model);

}  // namespace prepare_passes
