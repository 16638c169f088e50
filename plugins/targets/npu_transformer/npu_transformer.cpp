// npu_transformer: transformer models on the NPU, as the documented "Transformers
// on NPU" configuration quantizes them (QDQ, MinMax, int8 activations and
// weights). The NPU computes per tensor with symmetric int8 weights and int32
// biases, or BFP16 activations and weights; the op set is what transformer
// blocks are made of (projections, attention, normalisation, activations) plus
// the data movement between them.
#include <vaiq/vaiq.hpp>

#include <set>

namespace {


class NpuTransformer final : public vaiq::Target {
  public:
    bool supports(const onnx::NodeProto& node) const override {
        static const std::set<std::string, std::less<>> kOps = {
            // compute
            "MatMul", "Gemm", "Conv", "Add", "Sub", "Mul", "Div", "Softmax", "LayerNormalization",
            "InstanceNormalization", "Gelu", "Relu", "Clip", "Sigmoid", "Tanh", "Erf", "LeakyRelu", "HardSigmoid",
            "GlobalAveragePool", "AveragePool", "MaxPool", "ReduceMean",
            // data movement
            "Reshape", "Transpose", "Concat", "Slice", "Split", "Gather", "Squeeze", "Unsqueeze", "Flatten", "Resize",
            "Pad", "Where", "Expand"};
        return vaiq::is_default_domain(node) && kOps.count(node.op_type()) > 0;
    }

    // check() has refused what the NPU cannot do, so the recipe's spec holds as it is.
    vaiq::QuantSpec default_spec(vaiq::TensorRole role, const vaiq::QuantRequest& request) const override {
        return vaiq::spec_from_request(role, request);
    }

    void check(const vaiq::QuantRequest& run) const override {
        auto refuse = [](const std::string& what) { throw vaiq::InputError("target 'npu_transformer' " + what); };
        if (run.per_channel) refuse("computes per tensor: set per_channel to false");
        if (run.reduce_range) refuse("uses the full 8-bit weight range: set reduce_range to false");
        if (!run.weight_symmetric) refuse("needs symmetric weights: set extra_options.WeightSymmetric to true");
        // BFP16 (transformer_npu_bfp16.yaml): activations and weights both, no scales to constrain.
        if (run.activation_type == vaiq::QuantType::QBFP16 && run.weight_type == vaiq::QuantType::QBFP16) return;
        if (run.weight_type != vaiq::QuantType::QInt8)
            refuse(
                fmt::format("takes int8 weights (weight_type: QInt8), not {}", vaiq::quant_type_name(run.weight_type)));
        if (!vaiq::is_eight_bit(run.activation_type))
            refuse(fmt::format("takes 8-bit activations (QInt8 or QUInt8), not {}",
                               vaiq::quant_type_name(run.activation_type)));
    }
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<NpuTransformer>(
    "npu_transformer", "0.1.0", "NPU for transformers: per-tensor int8, symmetric weights, int32 bias; or BFP16"))
