// cpu: the x86/ARM CPU as ONNX Runtime runs quantized models. It quantizes the
// op types ONNX Runtime's static quantizer handles by default (the union of its
// QLinear and QDQ registries), with the recipe's types and symmetry.
#include <vaiq/vaiq.hpp>

#include <set>

namespace {

class Cpu final : public vaiq::Target {
  public:
    bool supports(const onnx::NodeProto& node) const override {
        static const std::set<std::string, std::less<>> kOps = {
            "Add",        "ArgMax",         "AveragePool",  "BatchNormalization", "Clip",         "Concat",
            "Conv",       "ConvTranspose",  "Gather",       "GatherElements",     "Gemm",         "GlobalAveragePool",
            "InstanceNormalization",        "LayerNormalization",                 "LeakyRelu",    "MatMul",
            "MaxPool",    "Mul",            "Pad",          "Relu",               "Reshape",      "Resize",
            "Sigmoid",    "Slice",          "Softmax",      "Split",              "Squeeze",      "Transpose",
            "Unsqueeze",  "Where"};
        return (node.domain().empty() || node.domain() == "ai.onnx") && kOps.count(node.op_type()) > 0;
    }

    vaiq::QuantSpec default_spec(vaiq::TensorRole role, const vaiq::Options& config) const override {
        vaiq::QuantSpec spec;
        switch (role) {
            case vaiq::TensorRole::Activation:
                spec.type = *vaiq::parse_quant_type(config.get_string("activation_type"));
                spec.symmetric = config.get_bool("extra_options.ActivationSymmetric");
                break;
            case vaiq::TensorRole::Weight:
                spec.type = *vaiq::parse_quant_type(config.get_string("weight_type"));
                spec.symmetric = config.get_bool("extra_options.WeightSymmetric");
                spec.per_channel = config.get_bool("per_channel");
                spec.reduce_range = config.get_bool("reduce_range");
                break;
            case vaiq::TensorRole::Bias:
                spec.type = vaiq::QuantType::QInt32;
                spec.symmetric = true;
                break;
        }
        return spec;
    }

    void check(const vaiq::Options& config) const override {
        if (config.get_bool("enable_dpu"))
            throw vaiq::InputError("target 'cpu' has no DPU: enable_dpu needs an NPU target (target: npu_cnn)");
    }
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<Cpu>("cpu", "0.1.0", "CPU as ONNX Runtime runs QDQ models: float scales, any layout"))
