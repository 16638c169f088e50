#include <gtest/gtest.h>

#include "recipe/recipe.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/target.hpp"

namespace {

// The run request a recipe with `yaml` makes.
vaiq::QuantRequest config(const std::string& yaml) {
    const auto file = vaiq::test::write_text(vaiq::test::temp_dir() / "r.yaml", "recipe_version: 1\n" + yaml);
    return vaiq::quant_request(vaiq::load_recipe(file).quantize_config());
}

onnx::NodeProto node(const std::string& op) {
    onnx::NodeProto n;
    n.set_op_type(op);
    return n;
}

class NpuTransformer : public ::testing::Test {
  protected:
    void SetUp() override {
        const auto& info = registry_.require(vaiq::PluginKind::Target, "npu_transformer");
        target_ = registry_.create<vaiq::Target>("npu_transformer", registry_.resolve_options(info, nullptr));
    }
    std::string refusal(const std::string& yaml) {
        try {
            target_->check(config(yaml));
        } catch (const vaiq::InputError& e) {
            return e.what();
        }
        return "accepted";
    }
    vaiq::PluginRegistry registry_ = vaiq::test::registry_with_test_plugin();
    vaiq::PluginInstance<vaiq::Target> target_;
};

TEST_F(NpuTransformer, QuantizesTransformerBlocks) {
    for (const char* op : {"MatMul", "Gemm", "Softmax", "LayerNormalization", "Add", "Mul", "Div", "Transpose", "Gelu"})
        EXPECT_TRUE(target_->supports(node(op))) << op;
    for (const char* op : {"LSTM", "Shape", "Cast", "ArgMax"}) EXPECT_FALSE(target_->supports(node(op))) << op;
}

TEST_F(NpuTransformer, AcceptsTheDocumentedConfigurationAndRefusesWhatTheNpuCannotDo) {
    EXPECT_EQ(refusal("activation_type: QInt8\nweight_type: QInt8\n"), "accepted");
    EXPECT_NE(refusal("per_channel: true\n").find("per tensor"), std::string::npos);
    EXPECT_NE(refusal("reduce_range: true\n").find("reduce_range"), std::string::npos);
    EXPECT_NE(refusal("weight_type: QUInt8\n").find("int8 weights"), std::string::npos);
    EXPECT_NE(refusal("activation_type: QInt16\n").find("8-bit activations"), std::string::npos);
    EXPECT_NE(refusal("extra_options: {WeightSymmetric: false}\n").find("symmetric weights"), std::string::npos);
    // BFP16 (transformer_npu_bfp16.yaml) for activations and weights together, not one of them.
    EXPECT_EQ(refusal("activation_type: QBFP16\nweight_type: QBFP16\n"), "accepted");
    EXPECT_NE(refusal("activation_type: QBFP16\nweight_type: QInt8\n").find("8-bit activations"), std::string::npos);
}

TEST_F(NpuTransformer, WeightsAreSymmetricPerTensorAndBiasIsInt32) {
    const auto c = config("activation_type: QInt8\nweight_type: QInt8\n");
    const auto w = target_->default_spec(vaiq::TensorRole::Weight, c);
    EXPECT_TRUE(w.symmetric);
    EXPECT_FALSE(w.per_channel);
    EXPECT_EQ(target_->default_spec(vaiq::TensorRole::Activation, c).type, vaiq::QuantType::QInt8);
    EXPECT_EQ(target_->default_spec(vaiq::TensorRole::Bias, c).type, vaiq::QuantType::QInt32);
}

}  // namespace
