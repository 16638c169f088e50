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
using vaiq::Tensor;
using vaiq::TensorRole;
using vaiq::test::ramp;

vaiq::TensorQuant entry(std::string tensor, TensorRole role, QuantType type, std::vector<float> scale,
                        std::vector<int64_t> zp, int axis = -1) {
    vaiq::TensorQuant t;
    t.tensor = std::move(tensor);
    t.role = role;
    t.params = {type, std::move(scale), std::move(zp), axis};
    return t;
}

vaiq::TensorQuant dynamic(std::string tensor) {
    vaiq::TensorQuant t;
    t.tensor = std::move(tensor);
    t.spec.dynamic = true;
    t.spec.type = QuantType::QUInt8;
    t.params.type = QuantType::QUInt8;
    return t;
}

// x -> Conv(w, b) -> Relu -> Reshape -> MatMul(k) -> y
vaiq::Model chain() {
    vaiq::test::GraphBuilder b(13);
    b.input("x", {1, 2, 4, 4}).output("y", {1, 5});
    b.initializer("w", ramp({3, 2, 3, 3}, -0.5f, 0.02f)).initializer("b", ramp({3}, 0.1f, 0.1f));
    b.initializer("shape", Tensor::from_values<int64_t>({2}, std::vector<int64_t>{1, 48}));
    b.initializer("k", ramp({48, 5}, -0.3f, 0.0025f));
    vaiq::test::set_ints_attribute(b.node("Conv", {"x", "w", "b"}, {"conv"}, "conv"), "pads", {1, 1, 1, 1});
    b.node("Relu", {"conv"}, {"r"}, "relu");
    b.node("Reshape", {"r", "shape"}, {"flat"}, "reshape");
    b.node("MatMul", {"flat", "k"}, {"y"}, "matmul");
    return b.build();
}

// What the planner writes under static: false (the bias stays float, the Relu's tensors are planned too).
vaiq::QuantPlan dynamic_plan() {
    return {{dynamic("x"), entry("w", TensorRole::Weight, QuantType::QInt8, {0.0045f}, {0}), dynamic("conv"),
             dynamic("r"), dynamic("flat"), entry("k", TensorRole::Weight, QuantType::QInt8, {0.0024f}, {0}),
             dynamic("y")}};
}

void emit(vaiq::Model& model, const vaiq::QuantPlan& plan) {
    auto registry = vaiq::test::registry_with_test_plugin();
    const auto& info = registry.require(vaiq::PluginKind::Format, "integer_ops");
    registry.create<vaiq::Format>("integer_ops", registry.resolve_options(info, nullptr))->emit(model, plan);
}

std::map<std::string, int> op_counts(const vaiq::Model& m) {
    std::map<std::string, int> out;
    for (const auto& n : m.graph().node()) ++out[n.op_type()];
    return out;
}

// The largest error relative to the largest float output.
float max_error(const vaiq::Model& float_model, const vaiq::Model& model, const Tensor& input) {
    vaiq::runtime::Executor reference(float_model), quantized(model);
    const auto want = reference.run({{"x", input}})[0];
    const auto got = quantized.run({{"x", input}})[0];
    EXPECT_EQ(got.shape(), want.shape());
    float worst = 0, largest = 0;
    for (int64_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, std::abs(got.data<float>()[i] - want.data<float>()[i]));
        largest = std::max(largest, std::abs(want.data<float>()[i]));
    }
    return worst / largest;
}

TEST(IntegerOps, WritesOnnxRuntimesDynamicForm) {
    auto model = chain();
    emit(model, dynamic_plan());
    EXPECT_NO_THROW(vaiq::check_model(model));
    const auto ops = op_counts(model);
    EXPECT_EQ(ops.at("DynamicQuantizeLinear"), 2) << "the Conv's and the MatMul's activation inputs";
    EXPECT_EQ(ops.at("ConvInteger"), 1);
    EXPECT_EQ(ops.at("MatMulInteger"), 1);
    EXPECT_EQ(ops.at("Cast"), 2);
    EXPECT_EQ(ops.at("Mul"), 4) << "scale products and the scaled outputs";
    EXPECT_EQ(ops.at("Add"), 1) << "the Conv's float bias";
    EXPECT_EQ(ops.at("Relu"), 1) << "IntegerOps has no integer Relu";
    EXPECT_EQ(ops.count("Conv") + ops.count("MatMul") + ops.count("QuantizeLinear"), 0u);
    const vaiq::GraphIndex index(model.graph());
    EXPECT_EQ(index.initializer("w"), nullptr) << "float weights are gone";
    ASSERT_NE(index.initializer("w_quantized"), nullptr);
    EXPECT_EQ(index.initializer("w_quantized")->data_type(), onnx::TensorProto::INT8);
    EXPECT_EQ(model.graph().output(0).name(), "y") << "the interface keeps its names";
    // The MatMul chain as ONNX Runtime's fusion looks for it: DQL -> MatMulInteger -> Cast -> Mul(., Mul(scales)).
    const int mm = index.producer("y");
    ASSERT_GE(mm, 0);
    EXPECT_EQ(model.graph().node(mm).op_type(), "Mul");
    EXPECT_EQ(model.graph().node(index.producer(model.graph().node(mm).input(0))).op_type(), "Cast");
    EXPECT_EQ(model.graph().node(index.producer(model.graph().node(mm).input(1))).op_type(), "Mul");
}

TEST(IntegerOps, ComputesCloseToTheFloatModel) {
    auto model = chain();
    emit(model, dynamic_plan());
    // int8 weights and run-time uint8 inputs: within 2 % of the output's range.
    EXPECT_LT(max_error(chain(), model, ramp({1, 2, 4, 4}, -1.0f, 0.06f)), 0.02f);
}

TEST(IntegerOps, GivenParametersAreQuantizeLinearWithThemExactly) {
    // y = x k on integers: with x = [0.5, -0.25] (scale 0.25, zero point 10: q = [12, 9]) and k's
    // integers [[1], [-2]] (scale 0.5), y = ((12-10)*1 + (9-10)*(-2)) * 0.25 * 0.5 = 0.5.
    vaiq::test::GraphBuilder b(13);
    b.input("x", {1, 2}).output("y", {1, 1});
    b.initializer("k", Tensor::from_values<float>({2, 1}, std::vector<float>{0.5f, -1.0f}));
    b.node("MatMul", {"x", "k"}, {"y"}, "matmul");
    auto model = b.build();
    emit(model, {{entry("x", TensorRole::Activation, QuantType::QUInt8, {0.25f}, {10}),
                  entry("k", TensorRole::Weight, QuantType::QInt8, {0.5f}, {0})}});
    const auto ops = op_counts(model);
    EXPECT_EQ(ops.at("QuantizeLinear"), 1);
    EXPECT_EQ(ops.count("DynamicQuantizeLinear"), 0u);
    vaiq::runtime::Executor run(model);
    const auto y = run.run({{"x", Tensor::from_values<float>({1, 2}, std::vector<float>{0.5f, -0.25f})}})[0];
    EXPECT_EQ(y.data<float>()[0], 0.5f);
}

TEST(IntegerOps, PerChannelWeights) {
    // MatMul: one B zero point per column. Conv: symmetric per-channel scales move into the float multiply.
    auto model = chain();
    auto plan = dynamic_plan();
    plan.tensors[1] = entry("w", TensorRole::Weight, QuantType::QInt8, {0.004f, 0.0016f, 0.0045f}, {0, 0, 0}, 0);
    const std::vector<float> k_scales = {0.3f / 127, 0.2975f / 127, 0.295f / 127, 0.295f / 127, 0.2975f / 127};
    plan.tensors[5] = entry("k", TensorRole::Weight, QuantType::QInt8, k_scales, std::vector<int64_t>(5, 0), 1);
    emit(model, plan);
    EXPECT_NO_THROW(vaiq::check_model(model));
    const vaiq::GraphIndex index(model.graph());
    ASSERT_NE(index.initializer("w_scale"), nullptr);
    EXPECT_EQ(Tensor::from_proto(*index.initializer("w_scale")).shape(), (std::vector<int64_t>{1, 3, 1, 1}));
    EXPECT_EQ(Tensor::from_proto(*index.initializer("w_zero_point")).shape(), std::vector<int64_t>{});
    EXPECT_EQ(Tensor::from_proto(*index.initializer("k_zero_point")).shape(), std::vector<int64_t>{5});
    EXPECT_LT(max_error(chain(), model, ramp({1, 2, 4, 4}, -1.0f, 0.06f)), 0.02f);
}

TEST(IntegerOps, RefusesWhatItCannotWrite) {
    auto plan = dynamic_plan();
    plan.tensors[1].params.type = QuantType::QInt16;
    auto model = chain();
    EXPECT_THROW(emit(model, plan), vaiq::InputError);

    plan = dynamic_plan();  // ConvInteger has one weight zero point
    plan.tensors[1] = entry("w", TensorRole::Weight, QuantType::QUInt8, {0.004f, 0.002f, 0.001f}, {120, 128, 128}, 0);
    model = chain();
    EXPECT_THROW(emit(model, plan), vaiq::InputError);

    vaiq::test::GraphBuilder b(10);  // DynamicQuantizeLinear needs opset 11
    b.input("x", {1, 2}).output("y", {1, 1});
    b.initializer("k", Tensor::from_values<float>({2, 1}, std::vector<float>{0.5f, -1.0f}));
    b.node("MatMul", {"x", "k"}, {"y"}, "matmul");
    model = b.build();
    EXPECT_THROW(emit(model, {{dynamic("x"), entry("k", TensorRole::Weight, QuantType::QInt8, {0.5f}, {0})}}),
                 vaiq::InputError);
}

}  // namespace

namespace {

TEST(IntegerOps, AnLstmBecomesDynamicQuantizeLstmWithTransposedWeights) {
    vaiq::test::GraphBuilder b(13);
    b.input("x", {3, 1, 2}).output("y", {3, 1, 1, 1});
    b.initializer("w", ramp({1, 4, 2}, -0.4f, 0.1f)).initializer("r", ramp({1, 4, 1}, 0.1f, 0.1f));
    vaiq::test::set_attribute(b.node("LSTM", {"x", "w", "r"}, {"y"}, "lstm"), "hidden_size", 1);
    auto model = b.build();
    const vaiq::QuantPlan plan{{dynamic("x"), entry("w", TensorRole::Weight, QuantType::QInt8, {0.01f}, {0}),
                                entry("r", TensorRole::Weight, QuantType::QInt8, {0.1f, 0.2f, 0.3f, 0.4f}, {0, 0, 0, 0}, 1)}};
    const auto reference = vaiq::runtime::Executor(model).run({{"x", ramp({3, 1, 2}, -1.0f, 0.3f)}})[0];
    emit(model, plan);
    ASSERT_EQ(model.graph().node_size(), 1);
    const auto& node = model.graph().node(0);
    EXPECT_EQ(node.op_type(), "DynamicQuantizeLSTM");
    EXPECT_EQ(node.domain(), "com.microsoft");
    ASSERT_EQ(node.input_size(), 12);
    EXPECT_EQ(node.input(3), "") << "no bias";
    const vaiq::GraphIndex index(model.graph());
    // W [1, 4, 2] = -0.4 .. 0.3 by 0.1, stored as [1, 2, 4]: row 0 holds W[0, :, 0] / 0.01.
    const auto w = Tensor::from_proto(*index.initializer(node.input(1)));
    EXPECT_EQ(w.shape(), (std::vector<int64_t>{1, 2, 4}));
    EXPECT_EQ(std::vector<int8_t>(w.data<int8_t>().begin(), w.data<int8_t>().begin() + 4),
              (std::vector<int8_t>{-40, -20, 0, 20}));
    EXPECT_EQ(index.initializer(node.input(8))->dims_size(), 1) << "W per tensor: one scale per direction";
    EXPECT_EQ(index.initializer(node.input(10))->dims_size(), 2) << "R per gate row: [dirs, 4 x hidden]";
    bool imports = false;
    for (const auto& o : model.proto().opset_import()) imports |= o.domain() == "com.microsoft";
    EXPECT_TRUE(imports);
    // vaiq runs it too, close to the float LSTM.
    const auto quantized = vaiq::runtime::Executor(model).run({{"x", ramp({3, 1, 2}, -1.0f, 0.3f)}})[0];
    ASSERT_EQ(quantized.size(), reference.size());
    for (int64_t i = 0; i < reference.size(); ++i)
        EXPECT_NEAR(quantized.data<float>()[i], reference.data<float>()[i], 0.02f) << i;
}

}  // namespace
