#include <gtest/gtest.h>

#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/format.hpp"
#include "vaiq/graph.hpp"

namespace {

using vaiq::QuantType;
using vaiq::TensorRole;

using vaiq::test::quant_entry;

// x (uint8), w (int8), b (int32 at sx * sw) and the output y (uint8).
vaiq::QuantPlan conv_plan() {
    return {{quant_entry("x", TensorRole::Activation, QuantType::QUInt8, {0.02f}, {128}),
             quant_entry("w", TensorRole::Weight, QuantType::QInt8, {0.01f}, {0}),
             quant_entry("b", TensorRole::Bias, QuantType::QInt32, {0.0002f}, {0}),
             quant_entry("y", TensorRole::Activation, QuantType::QUInt8, {0.05f}, {0})}};
}

void emit(vaiq::Model& model, const vaiq::QuantPlan& plan, const nlohmann::json& options = nullptr) {
    vaiq::test::emit_with_format("qdq", model, plan, options);
}

int count_ops(const vaiq::Model& m, const std::string& op) {
    int n = 0;
    for (const auto& node : m.graph().node()) n += node.op_type() == op;
    return n;
}

const onnx::TensorProto* initializer(const vaiq::Model& m, const std::string& name) {
    return vaiq::GraphIndex(m.graph()).initializer(name);
}

TEST(Qdq, WritesAValidModelWithWeightsStoredQuantized) {
    auto model = vaiq::test::conv_relu_model();
    emit(model, conv_plan());
    EXPECT_NO_THROW(vaiq::check_model(model));
    EXPECT_EQ(count_ops(model, "QuantizeLinear"), 2);    // x and y
    EXPECT_EQ(count_ops(model, "DequantizeLinear"), 4);  // x, w, b, y
    EXPECT_EQ(initializer(model, "w"), nullptr) << "the float weight should be gone";
    const auto* wq = initializer(model, "w_quantized");
    ASSERT_NE(wq, nullptr);
    EXPECT_EQ(wq->data_type(), onnx::TensorProto::INT8);
    const auto w_tensor = vaiq::Tensor::from_proto(*wq);
    const auto w = w_tensor.data<int8_t>();
    // w starts at -0.5 with step 0.02: -0.5 / 0.01 = -50, -0.48 / 0.01 = -48.
    EXPECT_EQ(w[0], -50);
    EXPECT_EQ(w[1], -48);
    const auto* bq = initializer(model, "b_quantized");
    ASSERT_NE(bq, nullptr);
    EXPECT_EQ(bq->data_type(), onnx::TensorProto::INT32);
    const auto bias = vaiq::Tensor::from_proto(*bq);
    EXPECT_EQ(bias.data<int32_t>()[0], 500);  // 0.1 / 0.0002
}

TEST(Qdq, GraphOutputKeepsItsName) {
    auto model = vaiq::test::conv_relu_model();
    emit(model, conv_plan());
    ASSERT_EQ(model.graph().output_size(), 1);
    EXPECT_EQ(model.graph().output(0).name(), "y");
    const vaiq::GraphIndex index(model.graph());
    const int producer = index.producer("y");
    ASSERT_GE(producer, 0);
    EXPECT_EQ(model.graph().node(producer).op_type(), "DequantizeLinear");
}

TEST(Qdq, NodesStayTopologicallyOrdered) {
    auto model = vaiq::test::conv_relu_model();
    emit(model, conv_plan());
    const auto order = vaiq::topological_order(model.graph());
    for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], static_cast<int>(i));
}

TEST(Qdq, PerChannelWeightsGetAnAxis) {
    auto model = vaiq::test::conv_relu_model();
    emit(model, {{quant_entry("w", TensorRole::Weight, QuantType::QInt8, {0.01f, 0.02f, 0.04f}, {0, 0, 0}, 0)}});
    EXPECT_NO_THROW(vaiq::check_model(model));
    const auto w_tensor = vaiq::Tensor::from_proto(*initializer(model, "w_quantized"));
    const auto w = w_tensor.data<int8_t>();
    // Channel 1 starts at element 18: -0.5 + 18 * 0.02 = -0.14 -> -0.14 / 0.02 = -7.
    EXPECT_EQ(w[18], -7);
    bool has_axis = false;
    for (const auto& n : model.graph().node())
        if (n.op_type() == "DequantizeLinear")
            for (const auto& a : n.attribute()) has_axis |= a.name() == "axis" && a.i() == 0;
    EXPECT_TRUE(has_axis);
}

TEST(Qdq, PerChannelNeedsOpset13) {
    auto model = vaiq::test::conv_relu_model(11);
    EXPECT_THROW(
        emit(model, {{quant_entry("w", TensorRole::Weight, QuantType::QInt8, {0.01f, 0.02f, 0.04f}, {0, 0, 0}, 0)}}),
        vaiq::InputError);
}

TEST(Qdq, RefusesTypesItCannotWrite) {
    auto model = vaiq::test::conv_relu_model();
    try {
        emit(model, {{quant_entry("x", TensorRole::Activation, QuantType::QInt32, {0.01f}, {0})}});
        FAIL() << "a QInt32 activation was accepted";
    } catch (const vaiq::InputError& e) {
        EXPECT_NE(std::string(e.what()).find("VitisQuantFormat.QDQ"), std::string::npos) << e.what();
    }
}

TEST(Qdq, SixteenBitPairsAreOnnxRuntimesMicrosoftDomainOps) {
    auto model = vaiq::test::conv_relu_model();
    emit(model, {{quant_entry("x", TensorRole::Activation, QuantType::QInt16, {0.001f}, {0}),
                  quant_entry("w", TensorRole::Weight, QuantType::QInt8, {0.01f}, {0}),
                  quant_entry("y", TensorRole::Activation, QuantType::QUInt16, {0.0001f}, {32768})}});
    EXPECT_NO_THROW(vaiq::check_model(model));
    EXPECT_EQ(model.opset("com.microsoft"), 1);
    for (const auto& n : model.graph().node()) {
        if (n.op_type() != "QuantizeLinear" && n.op_type() != "DequantizeLinear") continue;
        const bool weight = n.input(0) == "w_quantized";
        EXPECT_EQ(n.domain(), weight ? "" : "com.microsoft") << n.name();
    }
    EXPECT_EQ(initializer(model, "x_zero_point")->data_type(), onnx::TensorProto::INT16);
    EXPECT_EQ(initializer(model, "y_zero_point")->data_type(), onnx::TensorProto::UINT16);
    // The executor runs it: y = relu(conv(x)) within one 16-bit step of the float model.
    const auto reference = vaiq::test::conv_relu_model();
    const auto x = vaiq::test::ramp({1, 2, 4, 4}, -0.5f, 0.03f);
    const auto exact = vaiq::evaluate(reference, {{"x", x}})[0];
    const auto quantized = vaiq::evaluate(model, {{"x", x}})[0];
    for (int64_t i = 0; i < exact.size(); ++i)
        EXPECT_NEAR(quantized.data<float>()[i], exact.data<float>()[i], 0.01f) << i;  // int8 weights dominate
}

TEST(Qdq, SixteenBitPairsUseTheDefaultDomainFromOpset21) {
    auto model = vaiq::test::conv_relu_model(21);
    emit(model, {{quant_entry("x", TensorRole::Activation, QuantType::QInt16, {0.001f}, {0}),
                  quant_entry("w", TensorRole::Weight, QuantType::QInt16, {0.0001f}, {0})}});
    EXPECT_EQ(model.opset("com.microsoft"), 0) << "nothing needs ONNX Runtime's domain";
    int pairs = 0;
    for (const auto& n : model.graph().node())
        if (n.op_type() == "QuantizeLinear" || n.op_type() == "DequantizeLinear") {
            EXPECT_EQ(n.domain(), "") << n.name();
            ++pairs;
        }
    EXPECT_EQ(pairs, 3);
    const auto x = vaiq::test::ramp({1, 2, 4, 4}, -0.5f, 0.03f);
    const auto exact = vaiq::evaluate(vaiq::test::conv_relu_model(21), {{"x", x}})[0];
    const auto quantized = vaiq::evaluate(model, {{"x", x}})[0];
    for (int64_t i = 0; i < exact.size(); ++i)
        EXPECT_NEAR(quantized.data<float>()[i], exact.data<float>()[i], 2e-3f) << i;
}

TEST(Qdq, FloatTypesAreCastPairsAndStoredWeights) {
    for (const auto type : {QuantType::QFloat16, QuantType::QBFloat16}) {
        auto model = vaiq::test::conv_relu_model();
        emit(model, {{quant_entry("x", TensorRole::Activation, type, {1.0f}, {0}),
                      quant_entry("w", TensorRole::Weight, type, {1.0f}, {0}),
                      quant_entry("b", TensorRole::Bias, type, {1.0f}, {0}),
                      quant_entry("y", TensorRole::Activation, type, {1.0f}, {0})}});
        EXPECT_NO_THROW(vaiq::check_model(model));
        EXPECT_EQ(count_ops(model, "Cast"), 6);  // x and y: two each; w and b: one each
        EXPECT_EQ(count_ops(model, "QuantizeLinear") + count_ops(model, "DequantizeLinear"), 0);
        const auto* w = initializer(model, "w_quantized");
        ASSERT_NE(w, nullptr);
        EXPECT_EQ(static_cast<vaiq::DataType>(w->data_type()), vaiq::storage_type(type));
        EXPECT_EQ(initializer(model, "x_scale"), nullptr) << "a Cast pair has no parameters";
        // Every value is the float one rounded to the type: within its relative precision.
        const auto x = vaiq::test::ramp({1, 2, 4, 4}, -0.5f, 0.03f);
        const auto exact = vaiq::evaluate(vaiq::test::conv_relu_model(), {{"x", x}})[0];
        const auto rounded = vaiq::evaluate(model, {{"x", x}})[0];
        const float tolerance = type == QuantType::QFloat16 ? 2e-3f : 2e-2f;
        for (int64_t i = 0; i < exact.size(); ++i)
            EXPECT_NEAR(rounded.data<float>()[i], exact.data<float>()[i], tolerance * (1 + exact.data<float>()[i]))
                << i;
    }
}

TEST(Qdq, RefusesAScaledFloatType) {
    auto model = vaiq::test::conv_relu_model();
    EXPECT_THROW(emit(model, {{quant_entry("x", TensorRole::Activation, QuantType::QFloat16, {0.5f}, {0})}}),
                 vaiq::InputError);
}

TEST(Qdq, RefusesATensorTheModelLacks) {
    auto model = vaiq::test::conv_relu_model();
    EXPECT_THROW(emit(model, {{quant_entry("nope", TensorRole::Activation, QuantType::QUInt8, {0.1f}, {0})}}),
                 vaiq::InputError);
}

TEST(Qdq, RefusesATensorPlannedTwice) {
    auto model = vaiq::test::conv_relu_model();
    auto plan = conv_plan();
    plan.tensors.push_back(plan.tensors[0]);
    try {
        emit(model, plan);
        FAIL() << "expected InputError";
    } catch (const vaiq::InputError& e) {
        EXPECT_NE(std::string(e.what()).find("the plan quantizes tensor 'x' twice"), std::string::npos) << e.what();
    }
}

TEST(Qdq, AddQDQPairToWeightKeepsTheFloatWeight) {
    auto model = vaiq::test::conv_relu_model();
    emit(model, {{quant_entry("w", TensorRole::Weight, QuantType::QInt8, {0.01f}, {0})}},
         {{"AddQDQPairToWeight", true}});
    EXPECT_NE(initializer(model, "w"), nullptr);
    EXPECT_EQ(count_ops(model, "QuantizeLinear"), 1);
    EXPECT_EQ(count_ops(model, "DequantizeLinear"), 1);
}

TEST(Qdq, DedicatedQDQPairGivesEachConsumerItsOwnPair) {
    vaiq::test::GraphBuilder b;
    b.input("x", {4}).output("a", {4}).output("b", {4});
    b.node("Relu", {"x"}, {"r"});
    b.node("Sigmoid", {"r"}, {"a"});
    b.node("Tanh", {"r"}, {"b"});
    const vaiq::QuantPlan plan{{quant_entry("r", TensorRole::Activation, QuantType::QUInt8, {0.1f}, {0})}};
    auto shared = b.build();
    emit(shared, plan);
    EXPECT_EQ(count_ops(shared, "QuantizeLinear"), 1);
    auto dedicated = b.build();
    emit(dedicated, plan, {{"DedicatedQDQPair", true}});
    EXPECT_EQ(count_ops(dedicated, "QuantizeLinear"), 2);
    EXPECT_NO_THROW(vaiq::check_model(dedicated));
}

}  // namespace

namespace {

// The whole layout, node by node, against checked-in text.
TEST(Qdq, LayoutMatchesTheGoldenDump) {
    auto model = vaiq::test::conv_relu_model();
    emit(model, conv_plan());
    const auto diff = vaiq::test::compare_golden(VAIQ_QDQ_GOLDEN_DIR "/conv_relu.txt", vaiq::test::dump_graph(model));
    EXPECT_EQ(diff, "");
    auto pair = vaiq::test::conv_relu_model();
    emit(pair, conv_plan(), {{"AddQDQPairToWeight", true}, {"DedicatedQDQPair", true}});
    EXPECT_EQ(
        vaiq::test::compare_golden(VAIQ_QDQ_GOLDEN_DIR "/conv_relu_weight_pair.txt", vaiq::test::dump_graph(pair)), "");
}

}  // namespace
