// Inputs the fuzz targets (fuzz/) found to crash or misbehave, reduced to what
// triggered each; the earlier findings have their tests beside the code they
// fixed (model_io_test: ConvTranspose ranks; integer_kernels_test: zero points).
#include <gtest/gtest.h>

#include <limits>

#include "runtime/executor.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/quant.hpp"

using namespace vaiq;

namespace {

// Integer Pow of 0 to a negative power is infinite in double: it used to be
// converted to int64 out of range (undefined behaviour); it saturates.
TEST(FuzzRegressions, IntegerPowOfZeroToANegativePowerSaturates) {
    test::GraphBuilder b(13);
    b.input("x", {2}, DataType::Int64).input("e", {2}, DataType::Int64).output("y", {2}, DataType::Int64);
    b.node("Pow", {"x", "e"}, {"y"}, "pow");
    const Model model = b.build();
    runtime::Executor executor(model);
    const auto y = executor.run({{"x", Tensor::from_values<int64_t>({2}, std::vector<int64_t>{0, 3})},
                                 {"e", Tensor::from_values<int64_t>({2}, std::vector<int64_t>{-1, 2})}});
    EXPECT_EQ(y[0].data<int64_t>()[0], std::numeric_limits<int64_t>::max());
    EXPECT_EQ(y[0].data<int64_t>()[1], 9);
}

// A fuzzed graph asked for an 8.8 TB tensor: the allocator's out-of-memory
// failure is now a clear refusal before any allocation.
TEST(FuzzRegressions, ATensorLargerThanTheMachineIsRefused) {
    try {
        Tensor t(DataType::Float, {int64_t{1} << 20, int64_t{1} << 20, 1 << 10});
        FAIL() << "a 4 PB tensor was made";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("a float tensor of shape [1048576, 1048576, 1024] needs"),
                  std::string::npos)
            << e.what();
    }
    test::GraphBuilder b(13);
    b.input("shape", {3}, DataType::Int64).output("y", {-1, -1, -1});
    b.node("ConstantOfShape", {"shape"}, {"y"}, "huge");
    const Model model = b.build();
    runtime::Executor executor(model);
    EXPECT_THROW(executor.run({{"shape", Tensor::from_values<int64_t>({3}, std::vector<int64_t>{1 << 20, 1 << 20, 1 << 12})}}),
                 InputError);
}

// Reshape multiplied the requested dimensions without checking for overflow.
TEST(FuzzRegressions, AReshapeToAShapeThatOverflowsIsRefused) {
    test::GraphBuilder b(13);
    b.input("x", {2}).input("shape", {3}, DataType::Int64).output("y", {-1, -1, -1});
    b.node("Reshape", {"x", "shape"}, {"y"}, "reshape");
    const Model model = b.build();
    runtime::Executor executor(model);
    const auto x = Tensor::from_values<float>({2}, std::vector<float>{1, 2});
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{int64_t{1} << 40, int64_t{1} << 40, -1},
                                              std::vector<int64_t>{2, -3, 1}})
        EXPECT_THROW(executor.run({{"x", x}, {"shape", Tensor::from_values<int64_t>({3}, shape)}}), InputError);
}

// Resize built its per-axis coordinate tables before allocating the output, so
// sizes of 10^17 ran for minutes; the output is made (and refused) first.
TEST(FuzzRegressions, AResizeToAnImpossibleSizeIsRefusedAtOnce) {
    test::GraphBuilder b(13);
    b.input("x", {1, 1, 4, 4}).input("sizes", {4}, DataType::Int64).output("y", {-1, -1, -1, -1});
    auto& node = b.node("Resize", {"x", "", "", "sizes"}, {"y"}, "resize");
    auto* mode = node.add_attribute();
    mode->set_name("mode");
    mode->set_type(onnx::AttributeProto::STRING);
    mode->set_s("cubic");
    const Model model = b.build();
    runtime::Executor executor(model);
    const Tensor x(DataType::Float, {1, 1, 4, 4});
    for (const std::vector<int64_t>& sizes : {std::vector<int64_t>{1, 1, int64_t{1} << 56, int64_t{1} << 56 >> 20},
                                              std::vector<int64_t>{1, 1, -4, 4}})
        EXPECT_THROW(executor.run({{"x", x}, {"sizes", Tensor::from_values<int64_t>({4}, sizes)}}), InputError);
}

// QuantizeLinear of NaN converted NaN to uint8 (undefined behaviour); it gives
// the type's minimum, as the vectorised path does.
TEST(FuzzRegressions, QuantizingNanGivesTheTypesMinimum) {
    test::GraphBuilder b(13);
    b.input("x", {3}).output("y", {3}, DataType::UInt8);
    b.initializer("scale", Tensor::from_values<float>({}, std::vector<float>{0.5f}));
    b.initializer("zp", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{10}));
    b.node("QuantizeLinear", {"x", "scale", "zp"}, {"y"}, "q");
    const Model model = b.build();
    runtime::Executor executor(model);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const auto y = executor.run({{"x", Tensor::from_values<float>({3}, std::vector<float>{nan, 1.0f, nan})}});
    EXPECT_EQ(y[0].data<uint8_t>()[0], 0);
    EXPECT_EQ(y[0].data<uint8_t>()[1], 12);
    EXPECT_EQ(y[0].data<uint8_t>()[2], 0);
}

// An RNN whose sequence_lens exceeded the sequence read past its input.
TEST(FuzzRegressions, RecurrentSequenceLengthsBeyondTheSequenceAreRefused) {
    test::GraphBuilder b(13);
    b.input("x", {2, 1, 3}).input("lens", {1}, DataType::Int32).output("y", {-1, -1, -1, -1});
    b.initializer("w", Tensor(DataType::Float, {1, 4, 3})).initializer("r", Tensor(DataType::Float, {1, 4, 4}));
    auto& node = b.node("RNN", {"x", "w", "r", "", "lens"}, {"y"}, "rnn");
    auto* hidden = node.add_attribute();
    hidden->set_name("hidden_size");
    hidden->set_type(onnx::AttributeProto::INT);
    hidden->set_i(4);
    const Model model = b.build();
    runtime::Executor executor(model);
    const Tensor x(DataType::Float, {2, 1, 3});
    EXPECT_THROW(executor.run({{"x", x}, {"lens", Tensor::from_values<int32_t>({1}, std::vector<int32_t>{7})}}),
                 InputError);
    EXPECT_NO_THROW(executor.run({{"x", x}, {"lens", Tensor::from_values<int32_t>({1}, std::vector<int32_t>{2})}}));
}

// ConvInteger indexed the kernel shape by the input's rank without checking the
// weight's.
TEST(FuzzRegressions, AConvIntegerWhoseWeightRankDiffersIsRefused) {
    test::GraphBuilder b(13);
    b.input("x", {1, 1, 3, 3}, DataType::UInt8).output("y", {-1, -1, -1, -1}, DataType::Int32);
    b.initializer("w", Tensor(DataType::UInt8, {1, 1, 2}));
    b.node("ConvInteger", {"x", "w"}, {"y"}, "conv");
    const Model model = b.build();
    runtime::Executor executor(model);
    EXPECT_THROW(executor.run({{"x", Tensor(DataType::UInt8, {1, 1, 3, 3})}}), InputError);
}

// Per-axis scales for a scalar input read its (absent) axis.
TEST(FuzzRegressions, PerAxisScalesForAScalarAreRefused) {
    test::GraphBuilder b(13);
    b.input("x", {}, DataType::Int8).output("y", {});
    b.initializer("scale", Tensor::from_values<float>({2}, std::vector<float>{1, 2}));
    b.node("DequantizeLinear", {"x", "scale"}, {"y"}, "dq");
    const Model model = b.build();
    runtime::Executor executor(model);
    EXPECT_THROW(executor.run({{"x", Tensor(DataType::Int8, {})}}), InputError);
}

// Blocked dequantization of a scalar read its (absent) blocked axis.
TEST(FuzzRegressions, BlockedDequantizationOfAScalarIsRefused) {
    test::GraphBuilder b(21);
    b.input("x", {}, DataType::Int8).output("y", {});
    b.initializer("scale", Tensor::from_values<float>({}, std::vector<float>{1}));
    auto& node = b.node("DequantizeLinear", {"x", "scale"}, {"y"}, "dq");
    auto* block = node.add_attribute();
    block->set_name("block_size");
    block->set_type(onnx::AttributeProto::INT);
    block->set_i(2);
    const Model model = b.build();
    runtime::Executor executor(model);
    EXPECT_THROW(executor.run({{"x", Tensor(DataType::Int8, {})}}), InputError);
}

// Blocked DequantizeLinear read the zero point as the input's type without
// checking it was (an int16 input with a uint8 zero point: an internal error).
TEST(FuzzRegressions, BlockedDequantizationWithAZeroPointOfAnotherTypeIsRefused) {
    test::GraphBuilder b(21);
    b.input("x", {4}, DataType::Int16).output("y", {4});
    b.initializer("scale", Tensor::from_values<float>({2}, std::vector<float>{1, 2}));
    b.initializer("zp", Tensor::from_values<uint8_t>({2}, std::vector<uint8_t>{1, 2}));
    auto& node = b.node("DequantizeLinear", {"x", "scale", "zp"}, {"y"}, "dq");
    test::set_attribute(node, "block_size", 2);
    test::set_attribute(node, "axis", 0);
    const Model model = b.build();
    runtime::Executor executor(model);
    EXPECT_THROW(executor.run({{"x", Tensor(DataType::Int16, {4})}}), InputError);
}

// A stored tensor whose element count fits in 64 bits but whose byte count does
// not: the byte count overflowed (undefined) before the size check.
TEST(FuzzRegressions, ATensorWhoseByteCountOverflowsIsRefused) {
    onnx::TensorProto proto;
    proto.set_name("t");
    proto.set_data_type(static_cast<int>(DataType::Int64));
    proto.add_dims(4731284999171808000);
    proto.set_raw_data(std::string(8, '\0'));
    EXPECT_THROW(Tensor::from_proto(proto), InputError);
}

// BatchNormalization and InstanceNormalization read one scale, bias (and mean,
// variance) per channel without checking that many were given.
TEST(FuzzRegressions, NormalizationParametersThatDoNotMatchTheChannelsAreRefused) {
    for (const char* op : {"BatchNormalization", "InstanceNormalization"}) {
        SCOPED_TRACE(op);
        const bool batch = std::string(op) == "BatchNormalization";
        test::GraphBuilder b(13);
        b.input("x", {1, 4, 2, 2}).output("y", {1, 4, 2, 2});
        const Tensor one_value = Tensor::from_values<float>({1}, std::vector<float>{1});
        std::vector<std::string> inputs{"x", "p1", "p2"};
        b.initializer("p1", one_value).initializer("p2", one_value);
        if (batch) {
            b.initializer("p3", one_value).initializer("p4", one_value);
            inputs.insert(inputs.end(), {"p3", "p4"});
        }
        b.node(op, inputs, {"y"}, "norm");
        const Model model = b.build();
        runtime::Executor executor(model);
        EXPECT_THROW(executor.run({{"x", Tensor(DataType::Float, {1, 4, 2, 2})}}), InputError);
    }
}

// LayerNormalization indexed a scale that does not broadcast to the normalized
// shape as if it did.
TEST(FuzzRegressions, ALayerNormScaleThatDoesNotBroadcastIsRefused) {
    test::GraphBuilder b(17);
    b.input("x", {2, 3}).output("y", {2, 3});
    b.initializer("scale", Tensor::from_values<float>({2, 3}, std::vector<float>{1, 1, 1, 1, 1, 1}));
    b.node("LayerNormalization", {"x", "scale"}, {"y"}, "ln");
    const Model model = b.build();
    runtime::Executor executor(model);
    EXPECT_THROW(executor.run({{"x", Tensor(DataType::Float, {2, 3})}}), InputError);
}

// Where read its second choice as the first one's type, Max its operands as the
// first one's (internal errors): the executor checks that inputs the op's schema
// binds to one type parameter have one type.
TEST(FuzzRegressions, InputsOfOneTypeParameterWithTwoTypesAreRefused) {
    test::GraphBuilder b(13);
    b.input("x", {2}).input("y", {2}, DataType::Int16).output("z", {2});
    b.node("Max", {"x", "y"}, {"z"}, "max");
    const Model model = b.build();
    runtime::Executor executor(model);
    try {
        executor.run({{"x", Tensor(DataType::Float, {2})}, {"y", Tensor(DataType::Int16, {2})}});
        FAIL() << "expected InputError";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("node 'max' (Max, opset 13): inputs 0 and 1 must have one element type, "
                                             "not float and int16"),
                  std::string::npos)
            << e.what();
    }
}

// Resize read int64 scales as float (an internal error): inputs whose schema
// allows one type are checked against it too.
TEST(FuzzRegressions, AnInputOfAnotherTypeThanItsSchemaAllowsIsRefused) {
    test::GraphBuilder b(13);
    b.input("x", {1, 1, 2, 2}).input("scales", {4}, DataType::Int64).output("y", {});
    b.node("Resize", {"x", "", "scales"}, {"y"}, "resize");
    const Model model = b.build();
    runtime::Executor executor(model);
    try {
        executor.run({{"x", Tensor(DataType::Float, {1, 1, 2, 2})}, {"scales", Tensor(DataType::Int64, {4})}});
        FAIL() << "expected InputError";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("input 2 must be float, not int64"), std::string::npos) << e.what();
    }
}

// Past the newest opset the ONNX library knows there is no schema to check
// against: Max (opset 21) still refuses operands of two types.
TEST(FuzzRegressions, OperandsOfTwoTypesAreRefusedPastTheKnownOpsets) {
    test::GraphBuilder b(21);
    b.input("x", {2}, DataType::Int64).input("y", {2}, DataType::Int8).output("z", {2}, DataType::Int64);
    b.node("Max", {"x", "y"}, {"z"}, "max");
    const Model model = b.build();
    runtime::Executor executor(model);
    EXPECT_THROW(executor.run({{"x", Tensor(DataType::Int64, {2})}, {"y", Tensor(DataType::Int8, {2})}}),
                 InputError);
}

TEST(FuzzRegressions, AWhereOfTwoTypesIsRefused) {
    test::GraphBuilder b(16);
    b.input("c", {2}, DataType::Bool).input("x", {2}).input("y", {2}, DataType::Int16).output("z", {2});
    b.node("Where", {"c", "x", "y"}, {"z"}, "where");
    const Model model = b.build();
    runtime::Executor executor(model);
    EXPECT_THROW(executor.run({{"c", Tensor(DataType::Bool, {2})},
                               {"x", Tensor(DataType::Float, {2})},
                               {"y", Tensor(DataType::Int16, {2})}}),
                 InputError);
}

// CumSum of a scalar read its (absent) axis.
TEST(FuzzRegressions, CumSumOfAScalarIsRefused) {
    test::GraphBuilder b(14);
    b.input("x", {}).input("axis", {}, DataType::Int64).output("y", {});
    b.node("CumSum", {"x", "axis"}, {"y"}, "cumsum");
    const Model model = b.build();
    runtime::Executor executor(model);
    EXPECT_THROW(executor.run({{"x", Tensor(DataType::Float, {})}, {"axis", Tensor(DataType::Int64, {})}}),
                 InputError);
}

// The executor's axis check let axis 0 through on a scalar, so kernels indexed
// the absent axis (ReduceSum wrote past its table of reduced axes). Every op
// with an axis refuses a scalar now.
TEST(FuzzRegressions, AnAxisOfAScalarIsRefusedByEveryOpWithOne) {
    struct Case {
        const char* op;
        int64_t opset;
        const char* attribute;  // 0 (a list [0] for axes): the first axis, which a scalar lacks
        int inputs;             // x repeated
    };
    for (const Case& c : {Case{"Softmax", 13, "axis", 1}, Case{"LogSoftmax", 13, "axis", 1},
                          Case{"Hardmax", 13, "axis", 1}, Case{"ArgMax", 13, "axis", 1}, Case{"ArgMin", 13, "axis", 1},
                          Case{"Concat", 13, "axis", 2}, Case{"Split", 11, "axis", 1}, Case{"ReduceSum", 11, "axes", 1},
                          Case{"ReduceMax", 13, "axes", 1}, Case{"ReduceMean", 13, "axes", 1}}) {
        SCOPED_TRACE(c.op);
        test::GraphBuilder b(c.opset);
        b.input("x", {}).output("y", {});
        auto& node = b.node(c.op, std::vector<std::string>(static_cast<size_t>(c.inputs), "x"), {"y"}, "n");
        if (std::string(c.attribute) == "axes")
            test::set_ints_attribute(node, "axes", {0});
        else
            test::set_attribute(node, c.attribute, 0);
        const Model model = b.build();
        try {
            runtime::Executor executor(model);
            EXPECT_THROW(executor.run({{"x", Tensor(DataType::Float, {})}}), InputError);
        } catch (const InputError&) {
            // refused when the executor was built: fine too
        }
    }
}

// ConvTranspose took output_shape's last entries, one per spatial axis, without
// checking there were that many (it indexed before the start of the list).
TEST(FuzzRegressions, AConvTransposeOutputShapeShorterThanItsAxesIsRefused) {
    test::GraphBuilder b(13);
    b.input("x", {1, 1, 3, 3}).output("y", {});
    b.initializer("w", Tensor(DataType::Float, {1, 1, 2, 2}));
    auto& node = b.node("ConvTranspose", {"x", "w"}, {"y"}, "deconv");
    test::set_ints_attribute(node, "output_shape", {4});
    const Model model = b.build();
    runtime::Executor executor(model);
    EXPECT_THROW(executor.run({{"x", Tensor(DataType::Float, {1, 1, 3, 3})}}), InputError);
}

// ConvTranspose with pads larger than its output handed oneDNN a shape with no
// rows (its own error type escaped).
TEST(FuzzRegressions, AConvTransposeWhosePadsLeaveNoOutputIsRefused) {
    test::GraphBuilder b(13);
    b.input("x", {1, 1, 3, 3}).output("y", {});
    b.initializer("w", Tensor(DataType::Float, {1, 1, 2, 2}));
    auto& node = b.node("ConvTranspose", {"x", "w"}, {"y"}, "deconv");
    test::set_ints_attribute(node, "pads", {3, 0, 3, 0});
    const Model model = b.build();
    runtime::Executor executor(model);
    EXPECT_THROW(executor.run({{"x", Tensor(DataType::Float, {1, 1, 3, 3})}}), InputError);
}

// Range converted a count of 6.6e35 to int64 (undefined).
TEST(FuzzRegressions, ARangeTooLongToCountIsRefused) {
    test::GraphBuilder b(11);
    b.input("start", {}).input("limit", {}).input("delta", {}).output("y", {});
    b.node("Range", {"start", "limit", "delta"}, {"y"}, "range");
    const Model model = b.build();
    runtime::Executor executor(model);
    auto scalar = [](float v) { return Tensor::from_values<float>({}, std::vector<float>{v}); };
    EXPECT_THROW(executor.run({{"start", scalar(0)}, {"limit", scalar(1e30f)}, {"delta", scalar(1e-6f)}}), InputError);
    const float nan = std::numeric_limits<float>::quiet_NaN();  // no count at all: an empty range
    EXPECT_EQ(executor.run({{"start", scalar(0)}, {"limit", scalar(nan)}, {"delta", scalar(1)}})[0].size(), 0);
}

// Transpose took a perm naming an axis twice (its output then had more values
// than its input to read from).
TEST(FuzzRegressions, ATransposeWhosePermRepeatsAnAxisIsRefused) {
    test::GraphBuilder b(13);
    b.input("x", {2, 3, 4}).output("y", {});
    test::set_ints_attribute(b.node("Transpose", {"x"}, {"y"}, "t"), "perm", {2, 2, 0});
    const Model model = b.build();
    runtime::Executor executor(model);
    EXPECT_THROW(executor.run({{"x", Tensor(DataType::Float, {2, 3, 4})}}), InputError);
}

// Cast converted NaN and out-of-range floats to integers (undefined): NaN is 0,
// the rest saturates.
TEST(FuzzRegressions, CastOfNanAndOutOfRangeFloatsToIntegersIsDefined) {
    test::GraphBuilder b(13);
    b.input("x", {4}).output("y", {4}, DataType::UInt8);
    test::set_attribute(b.node("Cast", {"x"}, {"y"}, "cast"), "to", static_cast<int64_t>(DataType::UInt8));
    const Model model = b.build();
    runtime::Executor executor(model);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const auto y = executor.run({{"x", Tensor::from_values<float>({4}, std::vector<float>{nan, -7.0f, 1e9f, 42.9f})}})[0];
    EXPECT_EQ(std::vector<uint8_t>(y.data<uint8_t>().begin(), y.data<uint8_t>().end()),
              (std::vector<uint8_t>{0, 0, 255, 42}));
}

// MatMulInteger of a scalar took the last two dimensions of an empty shape.
TEST(FuzzRegressions, AnIntegerMatrixProductOfAScalarIsRefused) {
    test::GraphBuilder b(10);
    b.input("a", {}, DataType::UInt8).input("b", {2, 2}, DataType::UInt8).output("y", {}, DataType::Int32);
    b.node("MatMulInteger", {"a", "b"}, {"y"}, "mm");
    const Model model = b.build();
    runtime::Executor executor(model);
    EXPECT_THROW(executor.run({{"a", Tensor(DataType::UInt8, {})}, {"b", Tensor(DataType::UInt8, {2, 2})}}),
                 InputError);
}

// quantize_value (what formats write and kernels compute) converted NaN to an
// integer (undefined behaviour): a custom op with a NaN scale reached it.
TEST(FuzzRegressions, QuantizeValueOfNanIsTheTypesMinimum) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(quantize_value<int16_t>(nan, 0.0), std::numeric_limits<int16_t>::min());
    EXPECT_EQ(quantize_value<uint8_t>(nan, 3.0), 0);
    EXPECT_EQ(quantize_value<int32_t>(nan, 0.0), std::numeric_limits<int32_t>::min());
    EXPECT_EQ(quantize_value<int8_t>(1e9f, 0.0), 127);
    EXPECT_EQ(quantize_value<int8_t>(-2.5f, 1.0), -1);  // half to even, then the zero point
}

}  // namespace
