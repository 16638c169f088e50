#include <gtest/gtest.h>

#include "recipe/recipe.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/target.hpp"

namespace {

vaiq::PluginInstance<vaiq::Target> make_cpu(vaiq::PluginRegistry& registry) {
    const auto& info = registry.require(vaiq::PluginKind::Target, "cpu");
    return registry.create<vaiq::Target>("cpu", registry.resolve_options(info, nullptr));
}

// The run request a recipe with `yaml` makes.
vaiq::QuantRequest config(const std::string& yaml) {
    const auto file = vaiq::test::write_text(vaiq::test::temp_dir() / "r.yaml", "recipe_version: 1\n" + yaml);
    return vaiq::quant_request(vaiq::load_recipe(file).quantize_config());
}

onnx::NodeProto node(const std::string& op, const std::string& domain = "") {
    onnx::NodeProto n;
    n.set_op_type(op);
    n.set_domain(domain);
    return n;
}

TEST(CpuTarget, QuantizesOnnxRuntimeDefaultOps) {
    auto registry = vaiq::test::registry_with_test_plugin();
    auto cpu = make_cpu(registry);
    for (const char* op : {"Conv", "MatMul", "Gemm", "Add", "MaxPool", "Concat", "Softmax"})
        EXPECT_TRUE(cpu->supports(node(op))) << op;
    for (const char* op : {"Erf", "GRU", "Shape", "Cast"}) EXPECT_FALSE(cpu->supports(node(op))) << op;
    EXPECT_FALSE(cpu->supports(node("Conv", "com.example")));
}

TEST(CpuTarget, DefaultSpecsFollowTheRecipe) {
    auto registry = vaiq::test::registry_with_test_plugin();
    auto cpu = make_cpu(registry);
    const auto c = config(
        "activation_type: QUInt8\nweight_type: QInt8\nper_channel: true\n"
        "extra_options: {ActivationSymmetric: false, WeightSymmetric: true}\n");
    const auto act = cpu->default_spec(vaiq::TensorRole::Activation, c);
    EXPECT_EQ(act.type, vaiq::QuantType::QUInt8);
    EXPECT_FALSE(act.symmetric);
    const auto w = cpu->default_spec(vaiq::TensorRole::Weight, c);
    EXPECT_EQ(w.type, vaiq::QuantType::QInt8);
    EXPECT_TRUE(w.symmetric);
    EXPECT_TRUE(w.per_channel);
    EXPECT_EQ(cpu->default_spec(vaiq::TensorRole::Bias, c).type, vaiq::QuantType::QInt32);
}

}  // namespace
