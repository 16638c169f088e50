// cpu: the x86/ARM CPU as ONNX Runtime runs quantized models. It quantizes the
// op types ONNX Runtime's static quantizer handles by default (the union of its
// QLinear and QDQ registries), and LSTM and com.microsoft Attention, which its
// dynamic quantizer does, with the recipe's types and symmetry.
#include <vaiq/vaiq.hpp>

#include <set>

namespace {

class Cpu final : public vaiq::Target {
  public:
    bool supports(const onnx::NodeProto& node) const override {
        static const std::set<std::string, std::less<>> kOps = {"Add",
                                                                "ArgMax",
                                                                "AveragePool",
                                                                "BatchNormalization",
                                                                "Clip",
                                                                "Concat",
                                                                "Conv",
                                                                "ConvTranspose",
                                                                "Gather",
                                                                "GatherElements",
                                                                "Gemm",
                                                                "GlobalAveragePool",
                                                                "InstanceNormalization",
                                                                "LSTM",
                                                                "LayerNormalization",
                                                                "LeakyRelu",
                                                                "MatMul",
                                                                "MaxPool",
                                                                "Mul",
                                                                "Pad",
                                                                "Relu",
                                                                "Reshape",
                                                                "Resize",
                                                                "Sigmoid",
                                                                "Slice",
                                                                "Softmax",
                                                                "Split",
                                                                "Squeeze",
                                                                "Transpose",
                                                                "Unsqueeze",
                                                                "Where"};
        if (node.domain() == "com.microsoft") return node.op_type() == "Attention";
        return vaiq::is_default_domain(node) && kOps.count(node.op_type()) > 0;
    }

    vaiq::QuantSpec default_spec(vaiq::TensorRole role, const vaiq::QuantRequest& request) const override {
        return vaiq::spec_from_request(role, request);
    }
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<Cpu>("cpu", "0.1.0", "CPU as ONNX Runtime runs QDQ models: float scales, any layout"))
