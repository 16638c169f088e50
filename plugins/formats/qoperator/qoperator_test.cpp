#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "runtime/executor.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/format.hpp"
#include "vaiq/graph.hpp"

namespace {

using vaiq::QuantType;
using vaiq::TensorRole;
using vaiq::test::ramp;

vaiq::TensorQuant entry(std::string tensor, TensorRole role, QuantType type, float scale, int64_t zp) {
    vaiq::TensorQuant t;
    t.tensor = std::move(tensor);
    t.role = role;
    t.params = {type, {scale}, {zp}, -1};
    return t;
}

// x -> Conv(w, b) -> Relu -> MaxPool -> Reshape -> MatMul(k) -> Add(c) -> y
vaiq::Model chain() {
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 2, 4, 4}).output("y", {1, 5});
    b.initializer("w", ramp({3, 2, 3, 3}, -0.5f, 0.02f)).initializer("b", ramp({3}, 0.1f, 0.1f));
    b.initializer("shape", vaiq::Tensor::from_values<int64_t>({2}, std::vector<int64_t>{1, 12}));
    b.initializer("k", ramp({12, 5}, -0.3f, 0.01f)).initializer("c", ramp({5}, -0.2f, 0.1f));
    vaiq::test::set_ints_attribute(b.node("Conv", {"x", "w", "b"}, {"conv"}, "conv"), "pads", {1, 1, 1, 1});
    b.node("Relu", {"conv"}, {"r"}, "relu");
    auto& pool = b.node("MaxPool", {"r"}, {"p"}, "pool");
    vaiq::test::set_ints_attribute(pool, "kernel_shape", {2, 2});
    vaiq::test::set_ints_attribute(pool, "strides", {2, 2});
    b.node("Reshape", {"p", "shape"}, {"flat"}, "reshape");
    b.node("MatMul", {"flat", "k"}, {"mm"}, "matmul");
    b.node("Add", {"mm", "c"}, {"y"}, "add");
    return b.build();
}

// As the planner writes it for asymmetric uint8 activations: the Relu is absorbed
// (no entry for "conv"), MaxPool and Reshape share the Relu output's parameters.
vaiq::QuantPlan chain_plan() {
    const float sx = 0.02f, sw = 0.004f, sr = 0.06f;
    return {{entry("x", TensorRole::Activation, QuantType::QUInt8, sx, 128),
             entry("w", TensorRole::Weight, QuantType::QInt8, sw, 0),
             entry("b", TensorRole::Bias, QuantType::QInt32, sx * sw, 0),
             entry("r", TensorRole::Activation, QuantType::QUInt8, sr, 0),
             entry("p", TensorRole::Activation, QuantType::QUInt8, sr, 0),
             entry("flat", TensorRole::Activation, QuantType::QUInt8, sr, 0),
             entry("k", TensorRole::Weight, QuantType::QInt8, 0.003f, 0),
             entry("mm", TensorRole::Activation, QuantType::QUInt8, 0.05f, 120),
             entry("c", TensorRole::Weight, QuantType::QUInt8, 0.004f, 50),
             entry("y", TensorRole::Activation, QuantType::QUInt8, 0.05f, 110)}};
}

void emit(vaiq::Model& model, const vaiq::QuantPlan& plan) {
    auto registry = vaiq::test::registry_with_test_plugin();
    const auto& info = registry.require(vaiq::PluginKind::Format, "qoperator");
    registry.create<vaiq::Format>("qoperator", registry.resolve_options(info, nullptr))->emit(model, plan);
}

std::map<std::string, int> op_counts(const vaiq::Model& m) {
    std::map<std::string, int> out;
    for (const auto& n : m.graph().node()) ++out[n.op_type()];
    return out;
}

TEST(QOperator, WritesQuantizedOperatorsAndFoldsTheRelu) {
    auto model = chain();
    emit(model, chain_plan());
    EXPECT_NO_THROW(vaiq::check_model(model));
    const auto ops = op_counts(model);
    EXPECT_EQ(ops.count("Relu"), 0u) << "folded into QLinearConv's output range";
    EXPECT_EQ(ops.at("QLinearConv"), 1);
    EXPECT_EQ(ops.at("QLinearMatMul"), 1);
    EXPECT_EQ(ops.at("QLinearAdd"), 1);
    EXPECT_EQ(ops.at("MaxPool"), 1);
    EXPECT_EQ(ops.at("Reshape"), 1);
    EXPECT_EQ(ops.at("QuantizeLinear"), 1) << "only the graph input";
    EXPECT_EQ(ops.at("DequantizeLinear"), 1) << "only the graph output";
    for (const auto& n : model.graph().node())
        if (n.op_type() == "QLinearAdd") {
            EXPECT_EQ(n.domain(), "com.microsoft");
        }
    bool microsoft = false;
    for (const auto& o : model.proto().opset_import()) microsoft = microsoft || o.domain() == "com.microsoft";
    EXPECT_TRUE(microsoft);
    EXPECT_EQ(model.graph().output(0).name(), "y") << "the interface keeps its names";
    EXPECT_EQ(vaiq::GraphIndex(model.graph()).initializer("w"), nullptr) << "float weights are gone";
}

TEST(QOperator, RunsAndStaysWithinAFewStepsOfTheFloatModel) {
    const auto float_model = chain();
    auto model = chain();
    emit(model, chain_plan());
    const auto input = ramp({1, 2, 4, 4}, -1.0f, 0.06f);
    vaiq::runtime::Executor reference(float_model), quantized(model);
    const auto want = reference.run({{"x", input}})[0];
    const auto got = quantized.run({{"x", input}})[0];
    ASSERT_EQ(got.type(), vaiq::DataType::Float);
    ASSERT_EQ(got.size(), 5);
    for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(got.data<float>()[i], want.data<float>()[i], 4 * 0.05f) << i;
}

TEST(QOperator, KeepsFloatWhatHasNoQuantizedForm) {
    // Without parameters for the Add's constant, the Add stays float behind a DequantizeLinear.
    auto plan = chain_plan();
    plan.tensors.erase(plan.tensors.begin() + 8);
    auto model = chain();
    emit(model, plan);
    const auto ops = op_counts(model);
    EXPECT_EQ(ops.at("Add"), 1);
    EXPECT_EQ(ops.count("QLinearAdd"), 0u);
    EXPECT_EQ(ops.at("DequantizeLinear"), 1) << "mm back to float for the Add";
    EXPECT_EQ(ops.at("QuantizeLinear"), 1);
    EXPECT_NO_THROW(vaiq::check_model(model));
}

TEST(QOperator, RefusesTypesItCannotWrite) {
    auto plan = chain_plan();
    plan.tensors[0].params.type = QuantType::QInt16;
    auto model = chain();
    EXPECT_THROW(emit(model, plan), vaiq::InputError);
}

}  // namespace

namespace {

TEST(QOperator, LayoutMatchesTheGoldenDump) {
    auto model = chain();
    emit(model, chain_plan());
    EXPECT_EQ(vaiq::test::compare_golden(VAIQ_QOPERATOR_GOLDEN_DIR "/chain.txt", vaiq::test::dump_graph(model)), "");
}

}  // namespace

namespace {

TEST(QOperator, GemmBecomesQGemmWithTheInt32Bias) {
    vaiq::test::GraphBuilder b;
    b.input("x", {2, 4}).output("y", {2, 3});
    b.initializer("w", ramp({3, 4}, -0.3f, 0.05f)).initializer("c", ramp({3}, 0.1f, 0.1f));
    vaiq::test::set_attribute(b.node("Gemm", {"x", "w", "c"}, {"y"}, "gemm"), "transB", 1);
    const auto float_model = b.build();
    auto model = b.build();
    const float sx = 0.01f, sw = 0.003f;
    emit(model, {{entry("x", TensorRole::Activation, QuantType::QUInt8, sx, 128),
                  entry("w", TensorRole::Weight, QuantType::QInt8, sw, 0),
                  entry("c", TensorRole::Bias, QuantType::QInt32, sx * sw, 0),
                  entry("y", TensorRole::Activation, QuantType::QUInt8, 0.01f, 128)}});
    EXPECT_NO_THROW(vaiq::check_model(model));
    const auto ops = op_counts(model);
    EXPECT_EQ(ops.at("QGemm"), 1);
    EXPECT_EQ(ops.count("Gemm"), 0u);
    const auto input = ramp({2, 4}, -1.0f, 0.25f);
    vaiq::runtime::Executor reference(float_model), quantized(model);
    const auto want = reference.run({{"x", input}})[0];
    const auto got = quantized.run({{"x", input}})[0];
    for (int64_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got.data<float>()[i], want.data<float>()[i], 0.03f) << i;
}

}  // namespace
