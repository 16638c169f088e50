#include <gtest/gtest.h>

#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/fold.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/vaiq_ops.hpp"

namespace {

using vaiq::QuantType;
using vaiq::TensorRole;
using vaiq::test::quant_entry;

void emit(vaiq::Model& model, const vaiq::QuantPlan& plan) { vaiq::test::emit_with_format("fixneuron", model, plan); }

// Power-of-two parameters of the NPU recipes: int8 x (2^-6), int8 w (2^-7),
// int32 b (2^-13), uint8 y symmetric (2^-4, zero point 128).
vaiq::QuantPlan npu_plan() {
    return {{quant_entry("x", TensorRole::Activation, QuantType::QInt8, {0x1p-6f}, {0}),
             quant_entry("w", TensorRole::Weight, QuantType::QInt8, {0x1p-7f}, {0}),
             quant_entry("b", TensorRole::Bias, QuantType::QInt32, {0x1p-13f}, {0}),
             quant_entry("y", TensorRole::Activation, QuantType::QUInt8, {0x1p-4f}, {128})}};
}

TEST(FixNeuron, OneFixNeuronPerTensorWithBitWidthAndPosition) {
    auto model = vaiq::test::conv_relu_model();
    emit(model, npu_plan());
    EXPECT_NO_THROW(vaiq::check_model(model));
    std::map<std::string, vaiq::FixNeuronAttributes> by_input;
    for (const auto& n : model.graph().node()) {
        if (n.op_type() != vaiq::kFixNeuronOp) continue;
        EXPECT_EQ(n.domain(), vaiq::kVaiqDomain);
        by_input[n.input(0)] = vaiq::fixneuron_attributes(n);
    }
    ASSERT_EQ(by_input.size(), 4u);
    EXPECT_EQ(by_input["x"].pos, 6);
    EXPECT_EQ(by_input["w"].pos, 7);
    EXPECT_EQ(by_input["b"].bit_width, 32);
    EXPECT_EQ(by_input["b"].pos, 13);
    EXPECT_EQ(by_input["w"].bit_width, 8);
    EXPECT_FALSE(by_input["y_QuantizeLinear_Input"].is_unsigned) << "uint8 at 128 is int8";
    EXPECT_NE(vaiq::GraphIndex(model.graph()).initializer("w"), nullptr) << "weights stay float";
}

// Rounds every value of a float tensor as a FixNeuron would.
vaiq::Tensor fix(const vaiq::Tensor& t, int bit_width, int pos) {
    const vaiq::FixNeuronAttributes a{bit_width, pos, false};
    std::vector<float> out;
    for (float v : t.data<float>()) out.push_back(vaiq::fixneuron_value(v, a));
    return vaiq::Tensor::from_values<float>(t.shape(), out);
}

TEST(FixNeuron, ComputesTheFloatModelOnRoundedValues) {
    const auto x = vaiq::test::ramp({1, 2, 4, 4}, -2.9f, 0.081f);  // reaches past int8 at 2^-6
    auto model = vaiq::test::conv_relu_model();
    emit(model, npu_plan());
    const auto y = vaiq::evaluate(model, {{"x", x}})[0];
    // The same: the float model on rounded x, w and b, its output rounded (uint8 at 128 is int8).
    auto reference = vaiq::test::conv_relu_model();
    for (auto& init : *reference.graph().mutable_initializer()) {
        const auto value = vaiq::Tensor::from_proto(init);
        init = init.name() == "w" ? fix(value, 8, 7).to_proto("w") : fix(value, 32, 13).to_proto("b");
    }
    const auto expected = fix(vaiq::evaluate(reference, {{"x", fix(x, 8, 6)}})[0], 8, 4);
    ASSERT_EQ(y.size(), expected.size());
    int saturated = 0;
    for (int64_t i = 0; i < y.size(); ++i) {
        EXPECT_EQ(y.data<float>()[i], expected.data<float>()[i]) << i;
        saturated += y.data<float>()[i] == 127.0f / 16;
    }
    EXPECT_GT(saturated, 0) << "the test should reach the saturation";
}

TEST(FixNeuron, RoundsHalfToEvenAndSaturates) {
    onnx::NodeProto node;
    node.set_name("fn");
    vaiq::set_attribute(node, "bit_width", 8);
    vaiq::set_attribute(node, "pos", 1);
    const auto a = vaiq::fixneuron_attributes(node);
    EXPECT_EQ(vaiq::fixneuron_integer(1.25f, a), 2);  // 2.5 -> 2
    EXPECT_EQ(vaiq::fixneuron_integer(1.75f, a), 4);  // 3.5 -> 4
    EXPECT_EQ(vaiq::fixneuron_integer(100.0f, a), 127);
    EXPECT_EQ(vaiq::fixneuron_integer(-100.0f, a), -128);
    EXPECT_EQ(vaiq::fixneuron_value(-0.74f, a), -0.5f);
    vaiq::set_attribute(node, "unsigned", 1);
    EXPECT_EQ(vaiq::fixneuron_integer(-3.0f, vaiq::fixneuron_attributes(node)), 0);
}

TEST(FixNeuron, ReadsAPositionWrittenAsAString) {
    onnx::NodeProto node;
    vaiq::set_attribute(node, "bit_width", 16);
    auto* pos = node.add_attribute();
    pos->set_name("pos");
    pos->set_type(onnx::AttributeProto::STRING);
    pos->set_s("-3");
    EXPECT_EQ(vaiq::fixneuron_attributes(node).pos, -3);
    pos->set_s("three");
    EXPECT_THROW(vaiq::fixneuron_attributes(node), vaiq::InputError);
}

TEST(FixNeuron, RefusesWhatItCannotExpress) {
    auto refuses = [](vaiq::TensorQuant t) {
        auto model = vaiq::test::conv_relu_model();
        EXPECT_THROW(emit(model, {{t}}), vaiq::InputError) << t.tensor;
    };
    refuses(quant_entry("x", TensorRole::Activation, QuantType::QInt8, {0.03f}, {0}));     // not a power of two
    refuses(quant_entry("x", TensorRole::Activation, QuantType::QUInt8, {0x1p-4f}, {3}));  // a zero point
    refuses(quant_entry("x", TensorRole::Activation, QuantType::QFloat16, {1.0f}, {0}));   // a float type
    refuses(quant_entry("w", TensorRole::Weight, QuantType::QInt8, {0x1p-4f, 0x1p-5f, 0x1p-6f}, {0, 0, 0}, 0));
}

}  // namespace
