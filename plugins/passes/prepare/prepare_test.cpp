#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>

#include "runtime/executor.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/pass.hpp"

namespace {

using vaiq::test::GraphBuilder;
using vaiq::test::ramp;
using vaiq::test::set_attribute;
using vaiq::test::set_ints_attribute;

bool run_pass(const std::string& name, vaiq::Model& model, const nlohmann::json& options = nullptr) {
    static auto registry = vaiq::test::registry_with_test_plugin();
    const auto& info = registry.require(vaiq::PluginKind::Pass, name);
    auto pass = registry.create<vaiq::Pass>(name, registry.resolve_options(info, options));
    const bool changed = pass->run(model);
    vaiq::check_model(model);
    return changed;
}

bool run_pass(vaiq::Model& model) { return run_pass("eliminate_identity", model); }

std::vector<std::string> op_types(const vaiq::Model& m) {
    std::vector<std::string> out;
    for (const auto& n : m.graph().node()) out.push_back(n.op_type());
    return out;
}

TEST(EliminateIdentity, RemovesIdentityBetweenNodes) {
    GraphBuilder b;
    b.input("x", {4}).output("y", {4});
    b.node("Relu", {"x"}, {"a"});
    b.node("Identity", {"a"}, {"b"});
    b.node("Sigmoid", {"b"}, {"y"});
    auto model = b.build();
    EXPECT_TRUE(run_pass(model));
    EXPECT_EQ(op_types(model), (std::vector<std::string>{"Relu", "Sigmoid"}));
    EXPECT_EQ(model.graph().node(1).input(0), "a");
    EXPECT_NO_THROW(vaiq::check_model(model));
}

TEST(EliminateIdentity, KeepsTheGraphOutputName) {
    GraphBuilder b;
    b.input("x", {4}).output("y", {4});
    b.node("Relu", {"x"}, {"a"});
    b.node("Identity", {"a"}, {"y"});
    auto model = b.build();
    EXPECT_TRUE(run_pass(model));
    EXPECT_EQ(op_types(model), (std::vector<std::string>{"Relu"}));
    EXPECT_EQ(model.graph().node(0).output(0), "y");
    EXPECT_EQ(model.graph().output(0).name(), "y");
}

TEST(EliminateIdentity, KeepsAnIdentityFromInputToOutput) {
    GraphBuilder b;
    b.input("x", {4}).output("y", {4});
    b.node("Identity", {"x"}, {"y"});
    auto model = b.build();
    EXPECT_FALSE(run_pass(model));
    EXPECT_EQ(op_types(model), (std::vector<std::string>{"Identity"}));
}

TEST(EliminateIdentity, RemovesChainsAndInferenceDropout) {
    GraphBuilder b;
    b.input("x", {4}).output("y", {4});
    b.node("Identity", {"x"}, {"a"});
    b.node("Dropout", {"a"}, {"b"});
    b.node("Identity", {"b"}, {"c"});
    b.node("Relu", {"c"}, {"y"});
    auto model = b.build();
    EXPECT_TRUE(run_pass(model));
    EXPECT_EQ(op_types(model), (std::vector<std::string>{"Relu"}));
    EXPECT_EQ(model.graph().node(0).input(0), "x");
}

TEST(EliminateIdentity, KeepsDropoutWhoseMaskIsRead) {
    GraphBuilder b;
    b.input("x", {4}).output("y", {4}).output("m", {4}, vaiq::DataType::Bool);
    b.node("Dropout", {"x"}, {"d", "m"});
    b.node("Relu", {"d"}, {"y"});
    auto model = b.build();
    EXPECT_FALSE(run_pass(model));
}

// ---- helpers for the numeric checks

// A float tensor whose element i is f(i).
vaiq::Tensor values(std::vector<int64_t> shape, const std::function<float(int64_t)>& f) {
    std::vector<float> v(vaiq::element_count(shape));
    for (size_t i = 0; i < v.size(); ++i) v[i] = f(static_cast<int64_t>(i));
    return vaiq::Tensor::from_values<float>(std::move(shape), v);
}

// Deterministic values in [-1, 1) that look random.
float noise(int64_t i) { return static_cast<float>(std::fmod(std::sin(double(i) * 12.9898) * 43758.5453, 1.0)); }

std::vector<vaiq::Tensor> run(const vaiq::Model& model, const std::map<std::string, vaiq::Tensor>& feeds) {
    vaiq::runtime::Executor executor(model);
    return executor.run(feeds);
}

// max |a - b| / max |a| over the first output.
double relative_difference(const vaiq::Tensor& a, const vaiq::Tensor& b) {
    EXPECT_EQ(a.shape(), b.shape());
    double diff = 0, peak = 0;
    for (int64_t i = 0; i < a.size(); ++i) {
        diff = std::max(diff, std::abs(double(a.data<float>()[i]) - b.data<float>()[i]));
        peak = std::max(peak, std::abs(double(a.data<float>()[i])));
    }
    return diff / std::max(peak, 1e-30);
}

// Runs `pass` and checks the rewritten model computes the same first output.
vaiq::Model expect_same_function(const std::string& pass, const vaiq::Model& model, const vaiq::Tensor& x,
                                 double tolerance = 1e-5, const nlohmann::json& options = nullptr) {
    auto rewritten = model;
    EXPECT_TRUE(run_pass(pass, rewritten, options));
    const std::string input = model.graph().input(0).name();
    EXPECT_LT(relative_difference(run(model, {{input, x}})[0], run(rewritten, {{input, x}})[0]), tolerance);
    return rewritten;
}

vaiq::Tensor int64s(std::vector<int64_t> v) { return vaiq::Tensor::from_values<int64_t>({int64_t(v.size())}, v); }

const onnx::TensorProto* find_initializer(const vaiq::Model& m, const std::string& name) {
    for (const auto& t : m.graph().initializer())
        if (t.name() == name) return &t;
    return nullptr;
}

// ---- optimization

TEST(FoldConstants, EvaluatesConstantSubgraphsAndStaticShapes) {
    GraphBuilder b;
    b.input("x", {2, 3}).output("y", {3, 2});
    auto& c = b.node("Constant", {}, {"c"});
    auto* value = c.add_attribute();
    value->set_name("value");
    value->set_type(onnx::AttributeProto::TENSOR);
    *value->mutable_t() = ramp({3}, 1.0f).to_proto("");
    b.node("Add", {"x", "c"}, {"a"});
    b.node("Shape", {"a"}, {"s"});  // [2, 3]: known statically
    b.initializer("order", int64s({1, 0}));
    b.node("Gather", {"s", "order"}, {"swapped"});  // [3, 2]
    b.node("Reshape", {"a", "swapped"}, {"y"});
    auto q = b.build();
    const auto folded = expect_same_function("fold_constants", q, ramp({2, 3}, -1.0f, 0.5f));
    EXPECT_EQ(op_types(folded), (std::vector<std::string>{"Add", "Reshape"}));
    const auto* shape = find_initializer(folded, "swapped");
    ASSERT_NE(shape, nullptr);
    const auto folded_shape = vaiq::Tensor::from_proto(*shape);
    EXPECT_EQ(folded_shape.data<int64_t>()[0], 3);
}

TEST(FoldConstants, KeepsQuantizationAndGraphInputs) {
    GraphBuilder b;
    b.input("x", {4}).output("y", {4});
    b.initializer("w", ramp({4}, -1.0f, 0.5f))
        .initializer("s", ramp({}, 0.1f))
        .initializer("z", vaiq::Tensor(vaiq::DataType::Int8, {}));
    b.node("QuantizeLinear", {"w", "s", "z"}, {"wq"});
    b.node("DequantizeLinear", {"wq", "s", "z"}, {"wd"});
    b.node("Mul", {"x", "wd"}, {"y"});
    auto model = b.build();
    EXPECT_FALSE(run_pass("fold_constants", model)) << "quantized weights stay as the model stores them";
}

TEST(FoldBatchNorm, IntoConvGemmAndConvTranspose) {
    auto bn_params = [](GraphBuilder& b, int64_t c) {
        b.initializer("gamma", values({c}, [](int64_t i) { return 0.5f + 0.3f * i; }))
            .initializer("beta", values({c}, [](int64_t i) { return 0.1f * i - 0.2f; }))
            .initializer("mean", values({c}, [](int64_t i) { return 0.05f * i; }))
            .initializer("var", values({c}, [](int64_t i) { return 0.7f + 0.2f * i; }));
    };
    {
        GraphBuilder b;
        b.input("x", {1, 2, 5, 5}).output("y", {1, 3, 5, 5});
        b.initializer("w", values({3, 2, 3, 3}, noise)).initializer("bias", ramp({3}, 0.1f, 0.1f));
        bn_params(b, 3);
        auto& conv = b.node("Conv", {"x", "w", "bias"}, {"c"});
        set_ints_attribute(conv, "pads", {1, 1, 1, 1});
        b.node("BatchNormalization", {"c", "gamma", "beta", "mean", "var"}, {"y"});
        const auto folded = expect_same_function("fold_batch_norm", b.build(), values({1, 2, 5, 5}, noise));
        EXPECT_EQ(op_types(folded), (std::vector<std::string>{"Conv"}));
    }
    {
        GraphBuilder b;  // Gemm with B as [K, N]: the channel is B's second axis
        b.input("x", {2, 4}).output("y", {2, 3});
        b.initializer("w", values({4, 3}, noise));
        bn_params(b, 3);
        b.node("Gemm", {"x", "w"}, {"g"});
        b.node("BatchNormalization", {"g", "gamma", "beta", "mean", "var"}, {"y"});
        const auto folded = expect_same_function("fold_batch_norm", b.build(), values({2, 4}, noise));
        EXPECT_EQ(op_types(folded), (std::vector<std::string>{"Gemm"}));
    }
    {
        GraphBuilder b;  // ConvTranspose weights are [C_in, C_out, k, k]
        b.input("x", {1, 2, 3, 3}).output("y", {1, 3, 5, 5});
        b.initializer("w", values({2, 3, 3, 3}, noise));
        bn_params(b, 3);
        b.node("ConvTranspose", {"x", "w"}, {"c"});
        b.node("BatchNormalization", {"c", "gamma", "beta", "mean", "var"}, {"y"});
        const auto folded = expect_same_function("fold_batch_norm", b.build(), values({1, 2, 3, 3}, noise));
        EXPECT_EQ(op_types(folded), (std::vector<std::string>{"ConvTranspose"}));
    }
}

// Paddle exports a ConvTranspose's bias as an Add after it: the Add goes into
// the layer (as BatchNorm does), so its output is quantized once, not twice.
TEST(FoldBiasAdd, IntoConvTransposeConvAndGemmWhenItLinesUpWithTheChannels) {
    {
        GraphBuilder b;
        b.input("x", {1, 2, 3, 3}).output("y", {1, 3, 6, 6});
        b.initializer("w", values({2, 3, 2, 2}, noise)).initializer("b", values({1, 3, 1, 1}, noise));
        set_ints_attribute(b.node("ConvTranspose", {"x", "w"}, {"c"}), "strides", {2, 2});
        b.node("Add", {"c", "b"}, {"y"});
        const auto folded = expect_same_function("fold_bias_add", b.build(), values({1, 2, 3, 3}, noise));
        EXPECT_EQ(op_types(folded), (std::vector<std::string>{"ConvTranspose"}));
    }
    {
        GraphBuilder b;  // a scalar on either side of the Add, onto an existing bias
        b.input("x", {1, 2, 4, 4}).output("y", {1, 3, 4, 4});
        b.initializer("w", values({3, 2, 1, 1}, noise))
            .initializer("bias", ramp({3}, 0.5f))
            .initializer("k", ramp({}, -0.25f));
        b.node("Conv", {"x", "w", "bias"}, {"c"});
        b.node("Add", {"k", "c"}, {"y"});
        const auto folded = expect_same_function("fold_bias_add", b.build(), values({1, 2, 4, 4}, noise));
        EXPECT_EQ(op_types(folded), (std::vector<std::string>{"Conv"}));
    }
    {
        GraphBuilder b;
        b.input("x", {2, 4}).output("y", {2, 3});
        b.initializer("w", values({3, 4}, noise)).initializer("b", values({1, 3}, noise));
        set_attribute(b.node("Gemm", {"x", "w"}, {"g"}), "transB", 1);
        b.node("Add", {"g", "b"}, {"y"});
        const auto folded = expect_same_function("fold_bias_add", b.build(), values({2, 4}, noise));
        EXPECT_EQ(op_types(folded), (std::vector<std::string>{"Gemm"}));
    }
    // Not a per-channel bias: values along the width, or a layer whose output another node reads.
    GraphBuilder b;
    b.input("x", {1, 2, 4, 4}).output("y", {1, 3, 4, 4}).output("z", {1, 3, 4, 4});
    b.initializer("w", values({3, 2, 1, 1}, noise)).initializer("row", values({4}, noise));
    b.initializer("w2", values({3, 2, 1, 1}, noise)).initializer("k", ramp({}, 1.0f));
    b.node("Conv", {"x", "w"}, {"c"});
    b.node("Add", {"c", "row"}, {"y"});
    b.node("Conv", {"x", "w2"}, {"d"});
    b.node("Add", {"d", "k"}, {"z"});
    b.node("Relu", {"d"}, {"unused"});
    auto kept = b.build();
    EXPECT_FALSE(run_pass("fold_bias_add", kept));
}

// PP-LCNetV3's learnable affine blocks: Conv -> Mul(scale) -> Add(bias), the
// scale first in the Mul. Both go into the Conv (ONNX Runtime's ConvMulFusion
// and ConvAddFusion), per channel or scalar.
TEST(FoldScaleMul, IntoTheLayerBeforeItPerChannelOrScalar) {
    {
        GraphBuilder b;
        b.input("x", {1, 2, 5, 5}).output("y", {1, 3, 5, 5});
        b.initializer("w", values({3, 2, 3, 3}, noise))
            .initializer("bias", ramp({3}, 0.1f, 0.1f))
            .initializer("s", values({3, 1, 1}, noise))
            .initializer("k", ramp({}, -0.7f));
        set_ints_attribute(b.node("Conv", {"x", "w", "bias"}, {"c"}), "pads", {1, 1, 1, 1});
        b.node("Mul", {"s", "c"}, {"m"});
        b.node("Add", {"m", "k"}, {"y"});
        auto folded = expect_same_function("fold_scale_mul", b.build(), values({1, 2, 5, 5}, noise));
        EXPECT_EQ(op_types(folded), (std::vector<std::string>{"Conv", "Add"}));
        folded = expect_same_function("fold_bias_add", folded, values({1, 2, 5, 5}, noise));
        EXPECT_EQ(op_types(folded), (std::vector<std::string>{"Conv"}));
    }
    {
        GraphBuilder b;
        b.input("x", {2, 4}).output("y", {2, 3});
        b.initializer("w", values({4, 3}, noise)).initializer("s", ramp({}, 0.25f));
        b.node("Gemm", {"x", "w"}, {"g"});
        b.node("Mul", {"g", "s"}, {"y"});
        const auto folded = expect_same_function("fold_scale_mul", b.build(), values({2, 4}, noise));
        EXPECT_EQ(op_types(folded), (std::vector<std::string>{"Gemm"}));
    }
    // Values along the width are not a channel scale.
    GraphBuilder b;
    b.input("x", {1, 2, 4, 4}).output("y", {1, 3, 4, 4});
    b.initializer("w", values({3, 2, 1, 1}, noise)).initializer("row", values({4}, noise));
    b.node("Conv", {"x", "w"}, {"c"});
    b.node("Mul", {"c", "row"}, {"y"});
    auto kept = b.build();
    EXPECT_FALSE(run_pass("fold_scale_mul", kept));
}

// The same affine after an activation goes into the layer after it: wholly
// into a Conv that does not pad, only the scale into one that does (the Add
// becomes x + b / a, which the zero padding then scales as before).
TEST(FoldAffineIntoNextLayer, ScaleAlwaysShiftOnlyWithoutPadding) {
    const auto build = [](std::vector<int64_t> pads, int64_t k) {
        GraphBuilder b;
        b.input("x", {1, 2, 5, 5}).output("y", {1, 3, 5 + pads[0] + pads[2] - k + 1, 5 + pads[1] + pads[3] - k + 1});
        b.initializer("a", ramp({}, 0.6f))
            .initializer("b", ramp({1}, -0.4f))
            .initializer("w", values({3, 2, k, k}, noise))
            .initializer("bias", ramp({3}, 0.1f, 0.1f));
        b.node("Relu", {"x"}, {"r"});
        b.node("Mul", {"a", "r"}, {"m"});
        b.node("Add", {"m", "b"}, {"s"});
        set_ints_attribute(b.node("Conv", {"s", "w", "bias"}, {"y"}), "pads", pads);
        return b.build();
    };
    const auto x = values({1, 2, 5, 5}, noise);
    auto unpadded = expect_same_function("fold_affine_into_next_layer", build({0, 0, 0, 0}, 1), x);
    unpadded = expect_same_function("fold_affine_into_next_layer", unpadded, x);  // the Add, on the second sweep
    EXPECT_EQ(op_types(unpadded), (std::vector<std::string>{"Relu", "Conv"}));

    auto padded = expect_same_function("fold_affine_into_next_layer", build({1, 1, 1, 1}, 3), x);
    EXPECT_EQ(op_types(padded), (std::vector<std::string>{"Relu", "Add", "Conv"}));
    EXPECT_FALSE(run_pass("fold_affine_into_next_layer", padded)) << "a padding Conv keeps the shift";
    // The sum holds another value now: it is not under the old name.
    EXPECT_EQ(padded.graph().node(1).output(0).find("s_"), 0u);

    // A scalar Mul before a MatMul with a constant B.
    GraphBuilder m;
    m.input("x", {2, 4}).output("y", {2, 3});
    m.initializer("a", ramp({}, -1.5f)).initializer("w", values({4, 3}, noise));
    m.node("Mul", {"x", "a"}, {"xa"});
    m.node("MatMul", {"xa", "w"}, {"y"});
    const auto matmul = expect_same_function("fold_affine_into_next_layer", m.build(), values({2, 4}, noise));
    EXPECT_EQ(op_types(matmul), (std::vector<std::string>{"MatMul"}));

    // Kept: a scale of zero, and a scaled tensor another node also reads.
    GraphBuilder k;
    k.input("x", {1, 2, 4, 4}).output("y", {1, 3, 4, 4}).output("z", {1, 3, 4, 4}).output("r", {1, 2, 4, 4});
    k.initializer("zero", ramp({}, 0.0f))
        .initializer("a", ramp({}, 2.0f))
        .initializer("w", values({3, 2, 1, 1}, noise));
    k.node("Mul", {"x", "zero"}, {"m0"});
    k.node("Conv", {"m0", "w"}, {"y"});
    k.node("Mul", {"x", "a"}, {"r"});
    k.node("Conv", {"r", "w"}, {"z"});
    auto kept = k.build();
    EXPECT_FALSE(run_pass("fold_affine_into_next_layer", kept));
}

// HardSwish as exported before opset 14, in both spellings of the division.
TEST(FuseHardSwish, SpelledOutToHardSigmoidTimesInput) {
    for (const bool div : {true, false}) {
        GraphBuilder b(11);
        b.input("x", {1, 2, 3, 3}).output("y", {1, 2, 3, 3});
        b.initializer("three", ramp({}, 3.0f))
            .initializer("zero", ramp({}, 0.0f))
            .initializer("six", ramp({}, 6.0f))
            .initializer("sixth", ramp({}, 1.0f / 6.0f));
        b.node("Add", {"three", "x"}, {"p"});
        b.node("Clip", {"p", "zero", "six"}, {"c"});
        b.node("Mul", {"x", "c"}, {"m"});
        if (div)
            b.node("Div", {"m", "six"}, {"y"});
        else
            b.node("Mul", {"sixth", "m"}, {"y"});
        const auto fused = expect_same_function("fuse_hard_swish", b.build(), ramp({1, 2, 3, 3}, -5.0f, 0.6f));
        EXPECT_EQ(op_types(fused), (std::vector<std::string>{"HardSigmoid", "Mul"}));
        EXPECT_EQ(fused.graph().node(1).output(0), "y");
    }
    // A Clip(x + 3, 0, 5), or one whose output is read elsewhere, is not HardSwish.
    for (const float high : {5.0f, 6.0f}) {
        GraphBuilder b(11);
        b.input("x", {4}).output("y", {4}).output("c", {4});
        b.initializer("three", ramp({}, 3.0f)).initializer("zero", ramp({}, 0.0f)).initializer("hi", ramp({}, high));
        b.initializer("six", ramp({}, 6.0f));
        b.node("Add", {"x", "three"}, {"p"});
        b.node("Clip", {"p", "zero", "hi"}, {"c"});
        b.node("Mul", {"x", "c"}, {"m"});
        b.node("Div", {"m", "six"}, {"y"});
        auto kept = b.build();
        EXPECT_FALSE(run_pass("fuse_hard_swish", kept));
    }
}

// LayerNorm as exporters spell it: (x - mean) / sqrt(mean((x - mean)^2) + eps) * gamma + beta.
GraphBuilder spelled_layer_norm(int64_t opset) {
    GraphBuilder b(opset);
    b.input("x", {2, 3, 8}).output("y", {2, 3, 8});
    vaiq::test::add_spelled_layer_norm(b, "x", "y", 8);
    return b;
}

TEST(FuseLayerNorm, SpelledOutToLayerNormalizationFromOpset17) {
    const auto x = values({2, 3, 8}, [](int64_t i) { return 3.0f * noise(i) + 1.0f; });
    const auto fused = expect_same_function("fuse_layer_norm", spelled_layer_norm(17).build(), x, 1e-5);
    EXPECT_EQ(op_types(fused), (std::vector<std::string>{"LayerNormalization"}));
    EXPECT_EQ(fused.graph().node(0).input_size(), 3);
    auto older = spelled_layer_norm(13).build();
    EXPECT_FALSE(run_pass("fuse_layer_norm", older)) << "no LayerNormalization before opset 17";
}

TEST(FuseGelu, EveryOrderExportersWrite) {
    const double kSqrt2 = std::sqrt(2.0);
    for (int variant = 0; variant < 3; ++variant) {
        GraphBuilder b;
        b.input("x", {2, 16}).output("y", {2, 16});
        b.initializer("root2", ramp({}, static_cast<float>(kSqrt2))).initializer("one", ramp({}, 1.0f));
        b.initializer("half", ramp({}, 0.5f));
        b.node("Div", {"x", "root2"}, {"a"});
        b.node("Erf", {"a"}, {"e"});
        b.node("Add", {"e", "one"}, {"p"});
        if (variant == 0) {  // (x * (1 + erf)) * 0.5
            b.node("Mul", {"x", "p"}, {"xp"});
            b.node("Mul", {"xp", "half"}, {"y"});
        } else if (variant == 1) {  // x * ((1 + erf) * 0.5)
            b.node("Mul", {"p", "half"}, {"ph"});
            b.node("Mul", {"x", "ph"}, {"y"});
        } else {  // (x * 0.5) * (1 + erf)
            b.node("Mul", {"x", "half"}, {"xh"});
            b.node("Mul", {"xh", "p"}, {"y"});
        }
        const auto fused =
            expect_same_function("fuse_gelu", b.build(), values({2, 16}, [](int64_t i) { return 4 * noise(i); }), 1e-6);
        EXPECT_EQ(op_types(fused), (std::vector<std::string>{"Gelu"})) << "variant " << variant;
        EXPECT_EQ(fused.graph().node(0).domain(), "com.microsoft");
        EXPECT_EQ(fused.opset("com.microsoft"), 1);
    }
}

// optimize_model fuses before it folds scalars into the next layer: a Gelu's
// trailing 0.5 read by a MatMul stays the Gelu's, not the MatMul weight's.
TEST(OptimizeModel, FusesAGeluBeforeFoldingItsHalfIntoTheNextMatMul) {
    GraphBuilder b;
    b.input("x", {2, 16}).output("y", {2, 4});
    b.initializer("root2", ramp({}, static_cast<float>(std::sqrt(2.0)))).initializer("one", ramp({}, 1.0f));
    b.initializer("half", ramp({}, 0.5f)).initializer("w", values({16, 4}, noise));
    b.node("Div", {"x", "root2"}, {"a"});
    b.node("Erf", {"a"}, {"e"});
    b.node("Add", {"e", "one"}, {"p"});
    b.node("Mul", {"x", "p"}, {"xp"});
    b.node("Mul", {"xp", "half"}, {"g"});
    b.node("MatMul", {"g", "w"}, {"y"});
    const auto optimized = expect_same_function("optimize_model", b.build(), values({2, 16}, noise), 1e-6);
    EXPECT_EQ(op_types(optimized), (std::vector<std::string>{"Gelu", "MatMul"}));
}

TEST(RemoveDeadNodes, OnlyWhatNothingReads) {
    GraphBuilder b;
    b.input("x", {4}).output("y", {4});
    b.initializer("k", ramp({4}));
    b.node("Relu", {"x"}, {"y"});
    b.node("Add", {"x", "k"}, {"unused"});
    b.node("Sigmoid", {"unused"}, {"unused2"});
    auto model = b.build();
    EXPECT_TRUE(run_pass("remove_dead_nodes", model));
    EXPECT_EQ(op_types(model), (std::vector<std::string>{"Relu"}));
    EXPECT_EQ(model.graph().initializer_size(), 0);
    EXPECT_FALSE(run_pass("remove_dead_nodes", model));
}

TEST(OptimizeModel, RunsEveryRewriteToAFixedPoint) {
    auto b = spelled_layer_norm(17);
    // In front of the LayerNorm: Identity, a Conv-free BatchNorm-able Gemm and a constant branch.
    auto model = b.build();
    auto& g = model.graph();
    g.mutable_node(0)->set_input(0, "x_id");
    g.mutable_node(1)->set_input(0, "x_id");
    auto* id = g.add_node();
    id->set_op_type("Identity");
    id->add_input("x");
    id->add_output("x_id");
    vaiq::sort_nodes(g);
    const auto x = values({2, 3, 8}, noise);
    const auto optimized = expect_same_function("optimize_model", model, x, 1e-5);
    EXPECT_EQ(op_types(optimized), (std::vector<std::string>{"LayerNormalization"}));
    auto again = optimized;
    EXPECT_FALSE(run_pass("optimize_model", again)) << "a second run changes nothing";
}

// ---- shape inference

TEST(InferSymbolicShapes, PropagatesComputedShapesAndCustomOps) {
    GraphBuilder b;
    b.input("x", {-1, 4, 6}).output("y", {-1, 24});
    auto model = b.build();
    auto* dim = model.graph().mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0);
    dim->clear_dim_value();
    dim->set_dim_param("batch");
    auto& g = model.graph();
    auto add = [&](const std::string& op, std::vector<std::string> in, std::string out,
                   const std::string& domain = "") {
        auto* n = g.add_node();
        n->set_op_type(op);
        n->set_domain(domain);
        for (auto& i : in) n->add_input(i);
        n->add_output(out);
        return n;
    };
    *g.add_initializer() = int64s({0}).to_proto("zero");
    *g.add_initializer() = int64s({24}).to_proto("flat");
    add("Gelu", {"x"}, "gx", "com.microsoft");
    add("Shape", {"gx"}, "s");
    set_attribute(*add("Gather", {"s", "zero"}, "n"), "axis", 0);
    set_attribute(*add("Concat", {"n", "flat"}, "target"), "axis", 0);
    add("Reshape", {"gx", "target"}, "r");
    add("Relu", {"r"}, "y");
    auto* o = model.proto().add_opset_import();
    o->set_domain("com.microsoft");
    o->set_version(1);

    EXPECT_TRUE(run_pass("infer_symbolic_shapes", model));
    std::map<std::string, std::string> shapes;
    for (const auto& v : model.graph().value_info()) {
        std::string text;
        for (const auto& d : v.type().tensor_type().shape().dim())
            text += (text.empty() ? "" : ",") + (d.has_dim_value() ? std::to_string(d.dim_value()) : d.dim_param());
        shapes[v.name()] = text;
    }
    EXPECT_EQ(shapes["gx"], "batch,4,6") << "the elementwise contrib op keeps its input's shape";
    EXPECT_EQ(shapes["r"], "batch,24") << "the Reshape's target is computed from the input's shape";
}

// ---- conversions

TEST(ConvertFp16ToFp32, WidensEverythingAndDropsIdleCasts) {
    GraphBuilder b;
    b.input("x", {4}, vaiq::DataType::Float16).output("y", {4}).output("z", {4}, vaiq::DataType::Float16);
    const auto k = ramp({4}, 0.1f, 0.3f).convert_float(vaiq::DataType::Float16);
    b.initializer("k", k);
    b.node("Add", {"x", "k"}, {"z"});
    set_attribute(b.node("Cast", {"z"}, {"y"}), "to", onnx::TensorProto::FLOAT);
    auto model = b.build();
    EXPECT_TRUE(run_pass("convert_fp16_to_fp32", model));
    EXPECT_EQ(op_types(model), (std::vector<std::string>{"Add", "Identity"})) << "the output's Cast ties two outputs";
    EXPECT_EQ(model.graph().input(0).type().tensor_type().elem_type(), onnx::TensorProto::FLOAT);
    EXPECT_EQ(model.graph().output(1).type().tensor_type().elem_type(), onnx::TensorProto::FLOAT);
    const auto widened = vaiq::Tensor::from_proto(*find_initializer(model, "k"));
    ASSERT_EQ(widened.type(), vaiq::DataType::Float);
    EXPECT_EQ(widened.data<float>()[1], vaiq::half_to_float(vaiq::float_to_half(0.4f)));
    const auto x = ramp({4}, 1.0f);
    EXPECT_EQ(run(model, {{"x", x}})[0].data<float>()[3], 4.0f + widened.data<float>()[3]);
    EXPECT_FALSE(run_pass("convert_fp16_to_fp32", model));
}

TEST(ConvertFp16ToFp32, RemovesCastPairsAroundFloat16Islands) {
    GraphBuilder b;
    b.input("x", {4}).output("y", {4});
    set_attribute(b.node("Cast", {"x"}, {"h"}), "to", onnx::TensorProto::FLOAT16);
    b.node("Relu", {"h"}, {"r"});
    set_attribute(b.node("Cast", {"r"}, {"y"}), "to", onnx::TensorProto::FLOAT);
    auto model = b.build();
    EXPECT_TRUE(run_pass("convert_fp16_to_fp32", model));
    EXPECT_EQ(op_types(model), (std::vector<std::string>{"Relu"}));
}

TEST(ConvertNchwToNhwc, TakesNhwcAndTransposesForTheConv) {
    const auto model = vaiq::test::conv_relu_model();
    auto converted = model;
    EXPECT_TRUE(run_pass("convert_nchw_to_nhwc", converted));
    const auto& dims = converted.graph().input(0).type().tensor_type().shape().dim();
    EXPECT_EQ(
        (std::vector<int64_t>{dims[0].dim_value(), dims[1].dim_value(), dims[2].dim_value(), dims[3].dim_value()}),
        (std::vector<int64_t>{1, 4, 4, 2}));
    EXPECT_EQ(converted.graph().node(0).op_type(), "Transpose");
    // The same image in either layout gives the same output.
    const auto nchw = values({1, 2, 4, 4}, noise);
    std::vector<float> nhwc(32);
    for (int c = 0; c < 2; ++c)
        for (int hw = 0; hw < 16; ++hw) nhwc[hw * 2 + c] = nchw.data<float>()[c * 16 + hw];
    const auto name = model.graph().input(0).name();
    EXPECT_LT(relative_difference(run(model, {{name, nchw}})[0],
                                  run(converted, {{name, vaiq::Tensor::from_values<float>({1, 4, 4, 2}, nhwc)}})[0]),
              1e-6);
    EXPECT_FALSE(run_pass("convert_nchw_to_nhwc", converted)) << "NHWC already";
}

// ---- cross layer equalization

// Per output channel of the first layer and input channel of the second: their largest |weight|.
std::pair<std::vector<float>, std::vector<float>> ranges(const vaiq::Model& m, const std::string& w1,
                                                         const std::string& w2) {
    const auto a = vaiq::Tensor::from_proto(*find_initializer(m, w1));
    const auto b = vaiq::Tensor::from_proto(*find_initializer(m, w2));
    const int64_t c = a.shape()[0], per_a = a.size() / c;
    std::vector<float> ra(c, 0), rb(c, 0);
    for (int64_t i = 0; i < a.size(); ++i) ra[i / per_a] = std::max(ra[i / per_a], std::abs(a.data<float>()[i]));
    const int64_t inner = b.size() / (b.shape()[0] * b.shape()[1]);
    for (int64_t i = 0; i < b.size(); ++i) {
        const int64_t ch = (i / inner) % b.shape()[1];
        rb[ch] = std::max(rb[ch], std::abs(b.data<float>()[i]));
    }
    return {ra, rb};
}

vaiq::Model conv_relu_conv() {
    GraphBuilder b;
    b.input("x", {1, 2, 6, 6}).output("y", {1, 3, 6, 6});
    // Channel c of the first layer spans 10^(c-2): badly balanced for one per-tensor scale.
    b.initializer("w1", values({4, 2, 3, 3}, [](int64_t i) { return noise(i) * std::pow(10.0f, float(i / 18) - 2); }));
    b.initializer("b1", ramp({4}, 0.01f, 0.01f));
    b.initializer("w2", values({3, 4, 1, 1}, [](int64_t i) { return 0.5f + noise(i + 100); }));
    set_ints_attribute(b.node("Conv", {"x", "w1", "b1"}, {"c1"}), "pads", {1, 1, 1, 1});
    b.node("Relu", {"c1"}, {"r"});
    b.node("Conv", {"r", "w2"}, {"y"});
    return b.build();
}

TEST(CrossLayerEqualization, EqualizesChannelRangesAndKeepsTheFunction) {
    const auto model = conv_relu_conv();
    const auto x = values({1, 2, 6, 6}, noise);
    const auto equalized =
        expect_same_function("cross_layer_equalization", model, x, 1e-5, {{"CLEScaleAppendBias", false}});
    const auto [before1, before2] = ranges(model, "w1", "w2");
    const auto [r1, r2] = ranges(equalized, "w1", "w2");
    for (size_t c = 0; c < r1.size(); ++c) {
        EXPECT_NEAR(r1[c], r2[c], 1e-5 * r1[c]) << "channel " << c;
        EXPECT_NEAR(r1[c], std::sqrt(before1[c] * before2[c]), 1e-5 * r1[c]) << "channel " << c;
    }
    // The spread of the first layer's channel ranges shrinks (10^3 before).
    EXPECT_LT(
        *std::max_element(r1.begin(), r1.end()) / *std::min_element(r1.begin(), r1.end()),
        *std::max_element(before1.begin(), before1.end()) / *std::min_element(before1.begin(), before1.end()) / 10);
}

TEST(CrossLayerEqualization, DepthwiseGemmAndAdaptiveSteps) {
    GraphBuilder b;
    b.input("x", {1, 2, 5, 5}).output("y", {1, 3});
    b.initializer("w1", values({4, 2, 1, 1}, [](int64_t i) { return noise(i) * (1 + 3 * (i / 2)); }));
    b.initializer("dw", values({4, 1, 3, 3}, [](int64_t i) { return noise(i + 7); }));
    b.initializer("w3", values({4, 4, 1, 1}, [](int64_t i) { return noise(i + 50); }));
    b.initializer("g1", values({16, 8}, [](int64_t i) { return noise(i + 3) * (i % 8 + 1); }));
    b.initializer("g2", values({8, 3}, [](int64_t i) { return noise(i + 9); }));
    b.initializer("flat", int64s({1, 16}));
    b.node("Conv", {"x", "w1"}, {"a"});
    b.node("Relu", {"a"}, {"ar"});
    auto& dw = b.node("Conv", {"ar", "dw"}, {"d"});
    set_attribute(dw, "group", 4);
    set_ints_attribute(dw, "pads", {1, 1, 1, 1});
    b.node("LeakyRelu", {"d"}, {"dr"});
    set_ints_attribute(b.node("Conv", {"dr", "w3"}, {"p"}), "strides", {3, 3});
    b.node("Reshape", {"p", "flat"}, {"f"});
    b.node("Gemm", {"f", "g1"}, {"h"});
    b.node("Relu", {"h"}, {"hr"});
    b.node("Gemm", {"hr", "g2"}, {"y"});
    const auto model = b.build();
    const auto x = values({1, 2, 5, 5}, noise);
    const auto one = expect_same_function("cross_layer_equalization", model, x, 1e-5);
    const auto adaptive = expect_same_function("cross_layer_equalization", model, x, 1e-5, {{"CLESteps", -1}});
    auto bad = model;
    EXPECT_THROW(run_pass("cross_layer_equalization", bad, {{"CLESteps", 0}}), vaiq::InputError);
    // A triple (conv -> depthwise -> conv) and a pair (gemm -> gemm); all weights moved.
    for (const auto* w : {"w1", "dw", "w3", "g1", "g2"})
        EXPECT_NE(find_initializer(one, w)->raw_data(), find_initializer(model, w)->raw_data()) << w;
    // In the triple each channel's three ranges become their geometric mean.
    const auto plain =
        expect_same_function("cross_layer_equalization", model, x, 1e-5, {{"CLEScaleAppendBias", false}});
    const auto before_conv = ranges(model, "w1", "w3").first, after_conv = ranges(plain, "w1", "w3").first;
    const auto [before_dw, before_pw] = ranges(model, "dw", "w3");
    const auto [after_dw, after_pw] = ranges(plain, "dw", "w3");
    for (size_t c = 0; c < 4; ++c) {
        const float mean = std::cbrt(before_conv[c] * before_dw[c] * before_pw[c]);
        EXPECT_NEAR(after_conv[c], mean, 1e-5 * mean) << c;
        EXPECT_NEAR(after_dw[c], mean, 1e-5 * mean) << c;
        EXPECT_NEAR(after_pw[c], mean, 1e-5 * mean) << c;
    }
}

// Largest |value| per channel (axis 1) of tensor `name` when the model runs on x.
std::vector<float> channel_maxima(const vaiq::Model& model, const vaiq::Tensor& x, const std::string& name) {
    vaiq::runtime::ExecutorOptions options;
    options.taps.insert(name);
    vaiq::runtime::Executor executor(model, options);
    std::vector<float> out;
    executor.run({{model.graph().input(0).name(), x}}, {name}, [&](const std::string&, const vaiq::Tensor& v) {
        const int64_t channels = v.shape()[1], inner = v.size() / (v.shape()[0] * channels);
        out.assign(channels, 0.0f);
        for (int64_t i = 0; i < v.size(); ++i)
            out[(i / inner) % channels] = std::max(out[(i / inner) % channels], std::abs(v.data<float>()[i]));
    });
    return out;
}

float spread(const std::vector<float>& r) {
    return *std::max_element(r.begin(), r.end()) / *std::min_element(r.begin(), r.end());
}

TEST(CrossLayerEqualization, ActivationAwareBalancesTheTensorBetweenTheLayers) {
    // Balanced weights, but channel 0's bias makes its activation 100x the others':
    // weights alone see nothing to equalize; the activation does.
    GraphBuilder b;
    b.input("x", {1, 2, 6, 6}).output("y", {1, 3, 6, 6});
    b.initializer("w1", values({4, 2, 3, 3}, [](int64_t i) { return 0.2f * noise(i); }));
    b.initializer("b1", vaiq::Tensor::from_values<float>({4}, std::vector<float>{100.0f, 0.5f, 0.5f, 0.5f}));
    b.initializer("w2", values({3, 4, 1, 1}, [](int64_t i) { return 0.5f + noise(i + 100); }));
    set_ints_attribute(b.node("Conv", {"x", "w1", "b1"}, {"c1"}), "pads", {1, 1, 1, 1});
    b.node("Relu", {"c1"}, {"r"});
    b.node("Conv", {"r", "w2"}, {"y"});
    const auto model = b.build();
    const auto x = values({1, 2, 6, 6}, noise);
    const nlohmann::json options = {{"CLEScaleAppendBias", false}, {"CLEActivationAware", true}};

    static auto registry = vaiq::test::registry_with_test_plugin();
    const auto& info = registry.require(vaiq::PluginKind::Pass, "cross_layer_equalization");
    auto pass = registry.create<vaiq::Pass>("cross_layer_equalization", registry.resolve_options(info, options));
    const auto wanted = pass->channel_ranges_wanted(model);
    ASSERT_EQ(wanted.size(), 1u);
    EXPECT_EQ(wanted[0].tensor, "r");
    EXPECT_EQ(wanted[0].axis, 1);
    const auto before = channel_maxima(model, x, "r");
    ASSERT_GT(spread(before), 50.0f);

    auto aware = model;
    pass->set_channel_ranges({{"r", before}});
    EXPECT_TRUE(pass->run(aware));
    vaiq::check_model(aware);
    EXPECT_LT(relative_difference(run(model, {{"x", x}})[0], run(aware, {{"x", x}})[0]), 1e-5);
    const auto weights_only =
        expect_same_function("cross_layer_equalization", model, x, 1e-5, {{"CLEScaleAppendBias", false}});
    const float plain_spread = spread(channel_maxima(weights_only, x, "r"));
    const float aware_spread = spread(channel_maxima(aware, x, "r"));
    EXPECT_GT(plain_spread, 50.0f) << "weights alone leave the activation as it was";
    // Channel 0's range is blended as sqrt(r0 * 100 r0): 10x, so its scale falls by sqrt(10).
    EXPECT_NEAR(aware_spread, plain_spread / std::sqrt(10.0f), 0.1f * aware_spread)
        << "the activation's channels come closer";

    // Without ranges (vaiq preprocess: no data) the option falls back to the weights alone.
    auto no_data = model;
    run_pass("cross_layer_equalization", no_data, options);
    EXPECT_EQ(find_initializer(no_data, "w1")->raw_data(), find_initializer(weights_only, "w1")->raw_data());
}

}  // namespace
