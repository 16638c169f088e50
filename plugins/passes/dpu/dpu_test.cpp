#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "dpu_arithmetic.hpp"
#include "runtime/executor.hpp"
#include "test_support.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/pass.hpp"

namespace {

using vaiq::test::GraphBuilder;
using vaiq::test::ramp;
using vaiq::test::set_attribute;
using vaiq::test::set_ints_attribute;

bool run_pass(const std::string& name, vaiq::Model& model) {
    static auto registry = vaiq::test::registry_with_test_plugin();
    const auto& info = registry.require(vaiq::PluginKind::Pass, name);
    auto pass = registry.create<vaiq::Pass>(name, registry.resolve_options(info, nullptr));
    const bool changed = pass->run(model);
    vaiq::check_model(model);
    return changed;
}

std::vector<std::string> op_types(const vaiq::Model& m) {
    std::vector<std::string> out;
    for (const auto& n : m.graph().node()) out.push_back(n.op_type());
    return out;
}

std::vector<vaiq::Tensor> run(const vaiq::Model& model, const vaiq::Tensor& x) {
    vaiq::runtime::Executor executor(model);
    return executor.run({{executor.input_names()[0], x}});
}

// max |a - b| / max |a| over the first output.
double relative_difference(const vaiq::Model& before, const vaiq::Model& after, const vaiq::Tensor& x) {
    const auto a = run(before, x)[0], b = run(after, x)[0];
    EXPECT_EQ(a.shape(), b.shape());
    double diff = 0, peak = 0;
    for (int64_t i = 0; i < a.size(); ++i) {
        diff = std::max(diff, std::abs(double(a.data<float>()[i]) - b.data<float>()[i]));
        peak = std::max(peak, std::abs(double(a.data<float>()[i])));
    }
    return diff / std::max(peak, 1e-30);
}

// Runs `pass` and checks the result computes what the model did.
void expect_same_function(const std::string& pass, const vaiq::Model& model, const vaiq::Tensor& x,
                          std::vector<std::string> ops_after) {
    auto rewritten = model;
    EXPECT_TRUE(run_pass(pass, rewritten));
    EXPECT_EQ(op_types(rewritten), ops_after);
    EXPECT_LT(relative_difference(model, rewritten, x), 1e-5);
    EXPECT_FALSE(run_pass(pass, rewritten)) << "a second run changes nothing";
}

void float_attribute(onnx::NodeProto& n, const std::string& name, float v) {
    auto* a = n.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(v);
}

vaiq::Tensor int64s(std::vector<int64_t> v) { return vaiq::Tensor::from_values<int64_t>({int64_t(v.size())}, v); }

GraphBuilder& batch_norm_params(GraphBuilder& b, int64_t c) {
    return b.initializer("gamma", ramp({c}, 0.5f, 0.25f))
        .initializer("beta", ramp({c}, -0.2f, 0.1f))
        .initializer("mean", ramp({c}, 0.1f, 0.05f))
        .initializer("var", ramp({c}, 0.8f, 0.3f));
}

TEST(ConvertBnToConv, FoldsIntoTheConvBefore) {
    GraphBuilder b;
    b.input("x", {1, 2, 5, 5}).output("y", {1, 3, 5, 5});
    b.initializer("w", ramp({3, 2, 3, 3}, -0.4f, 0.02f)).initializer("b", ramp({3}, 0.1f, 0.1f));
    batch_norm_params(b, 3);
    set_ints_attribute(b.node("Conv", {"x", "w", "b"}, {"c"}), "pads", {1, 1, 1, 1});
    b.node("BatchNormalization", {"c", "gamma", "beta", "mean", "var"}, {"y"});
    expect_same_function("convert_bn_to_conv", b.build(), ramp({1, 2, 5, 5}, -1.0f, 0.04f), {"Conv"});
}

TEST(ConvertBnToConv, AStandaloneOneBecomesADepthwiseConv) {
    GraphBuilder b;
    b.input("x", {1, 3, 4, 4}).output("y", {1, 3, 4, 4});
    batch_norm_params(b, 3);
    b.node("BatchNormalization", {"x", "gamma", "beta", "mean", "var"}, {"y"});
    const auto model = b.build();
    expect_same_function("convert_bn_to_conv", model, ramp({1, 3, 4, 4}, -2.0f, 0.09f), {"Conv"});
    auto rewritten = model;
    run_pass("convert_bn_to_conv", rewritten);
    const auto& conv = rewritten.graph().node(0);
    EXPECT_EQ(conv.attribute(0).name(), "group");
    EXPECT_EQ(conv.attribute(0).i(), 3);
}

TEST(ConvertReduceMeanToGlobalAvgPool, SpatialMeansOnly) {
    for (int keepdims : {0, 1}) {
        GraphBuilder b;
        b.input("x", {1, 2, 3, 3})
            .output("y", keepdims ? std::vector<int64_t>{1, 2, 1, 1} : std::vector<int64_t>{1, 2});
        auto& mean = b.node("ReduceMean", {"x"}, {"y"});
        set_ints_attribute(mean, "axes", {-2, -1});
        set_attribute(mean, "keepdims", keepdims);
        expect_same_function("convert_reduce_mean_to_global_avg_pool", b.build(), ramp({1, 2, 3, 3}, 0.0f, 0.3f),
                             keepdims ? std::vector<std::string>{"GlobalAveragePool"}
                                      : std::vector<std::string>{"GlobalAveragePool", "Squeeze"});
    }
    GraphBuilder b;
    b.input("x", {1, 2, 3, 3}).output("y", {1, 1, 3, 3});
    set_ints_attribute(b.node("ReduceMean", {"x"}, {"y"}), "axes", {1});
    auto model = b.build();
    EXPECT_FALSE(run_pass("convert_reduce_mean_to_global_avg_pool", model));
}

// A LayerNorm's means are no pooling and no DPU arithmetic: both passes leave
// them, and with them the pattern the planner keeps float.
TEST(ConvertReduceMeanToGlobalAvgPool, LeavesALayerNormsMeans) {
    GraphBuilder ln;
    ln.input("x", {1, 4, 6}).output("y", {1, 4, 6});
    vaiq::test::add_spelled_layer_norm(ln, "x", "y", 6);
    for (const char* pass : {"convert_reduce_mean_to_global_avg_pool", "convert_reduce_mean_to_dpu_version"}) {
        auto model = ln.build();
        EXPECT_FALSE(run_pass(pass, model)) << pass;
        GraphBuilder b;  // the same mean outside a LayerNorm (1/6 is no power of two)
        b.input("x", {1, 4, 6}).output("y", {1, 4, 1});
        set_ints_attribute(b.node("ReduceMean", {"x"}, {"y"}), "axes", {-1});
        auto mean = b.build();
        EXPECT_TRUE(run_pass(pass, mean)) << pass;
    }
}

TEST(SplitLargeKernelPool, TilesAPoolOverMoreThan512Elements) {
    GraphBuilder b;
    b.input("x", {1, 2, 32, 24}).output("y", {1, 2, 1, 1});
    b.node("GlobalAveragePool", {"x"}, {"y"});
    const auto model = b.build();
    expect_same_function("split_large_kernel_pool", model, ramp({1, 2, 32, 24}, -1.0f, 0.001f),
                         {"AveragePool", "GlobalAveragePool"});
    GraphBuilder small;
    small.input("x", {1, 2, 7, 7}).output("y", {1, 2, 1, 1});
    small.node("GlobalAveragePool", {"x"}, {"y"});
    auto kept = small.build();
    EXPECT_FALSE(run_pass("split_large_kernel_pool", kept));
}

TEST(ConvertSplitToSlice, GivenAndEqualSizes) {
    GraphBuilder given;
    given.input("x", {1, 6, 2}).output("a", {1, 2, 2}).output("c", {1, 4, 2});
    given.initializer("sizes", int64s({2, 4}));
    set_attribute(given.node("Split", {"x", "sizes"}, {"a", "c"}), "axis", 1);
    expect_same_function("convert_split_to_slice", given.build(), ramp({1, 6, 2}), {"Slice", "Slice"});

    GraphBuilder equal;
    equal.input("x", {1, 6, 2}).output("a", {1, 3, 2}).output("c", {1, 3, 2});
    set_attribute(equal.node("Split", {"x"}, {"a", "c"}), "axis", -2);
    auto model = equal.build();
    auto rewritten = model;
    EXPECT_TRUE(run_pass("convert_split_to_slice", rewritten));
    const auto x = ramp({1, 6, 2});
    const auto before = run(model, x), after = run(rewritten, x);
    for (size_t o = 0; o < 2; ++o)
        for (int64_t i = 0; i < before[o].size(); ++i) EXPECT_EQ(before[o].data<float>()[i], after[o].data<float>()[i]);
}

TEST(FuseInstanceNorm, SpelledOutWithScaleAndBias) {
    GraphBuilder b;
    b.input("x", {1, 2, 3, 3}).output("y", {1, 2, 3, 3});
    b.initializer("eps", ramp({}, 1e-5f)).initializer("two", ramp({}, 2.0f));
    b.initializer("gamma", ramp({2, 1, 1}, 0.5f, 1.0f)).initializer("beta", ramp({2, 1, 1}, 0.1f, 0.2f));
    set_ints_attribute(b.node("ReduceMean", {"x"}, {"m"}), "axes", {2, 3});
    b.node("Sub", {"x", "m"}, {"d"});
    b.node("Pow", {"d", "two"}, {"sq"});
    set_ints_attribute(b.node("ReduceMean", {"sq"}, {"v"}), "axes", {2, 3});
    b.node("Add", {"v", "eps"}, {"ve"});
    b.node("Sqrt", {"ve"}, {"s"});
    b.node("Div", {"d", "s"}, {"n"});
    b.node("Mul", {"n", "gamma"}, {"g"});
    b.node("Add", {"g", "beta"}, {"y"});
    expect_same_function("fuse_instance_norm", b.build(), ramp({1, 2, 3, 3}, -1.0f, 0.13f), {"InstanceNormalization"});
}

TEST(FuseL2Norm, SquareRootOfSumOfSquares) {
    GraphBuilder b;
    b.input("x", {2, 4}).output("y", {2, 4});
    b.initializer("axes", int64s({1}));
    b.node("Mul", {"x", "x"}, {"sq"});
    b.node("ReduceSum", {"sq", "axes"}, {"s"});
    b.node("Sqrt", {"s"}, {"n"});
    b.node("Div", {"x", "n"}, {"y"});
    expect_same_function("fuse_l2_norm", b.build(), ramp({2, 4}, -1.0f, 0.3f), {"LpNormalization"});
}

vaiq::Model clip_model(float lo, std::optional<float> hi) {
    GraphBuilder b;
    b.input("x", {4}).output("y", {4});
    b.initializer("lo", ramp({}, lo));
    if (hi) b.initializer("hi", ramp({}, *hi));
    b.node("Clip", hi ? std::vector<std::string>{"x", "lo", "hi"} : std::vector<std::string>{"x", "lo"}, {"y"});
    return b.build();
}

TEST(ClipToRelu, OnlyWhereTheFunctionStaysTheSame) {
    expect_same_function("convert_clip_to_relu", clip_model(0.0f, std::nullopt), ramp({4}, -2.0f, 1.5f), {"Relu"});
    for (auto [lo, hi] : {std::pair{0.0f, 6.0f}, std::pair{0.5f, 1e30f}}) {
        auto kept = clip_model(lo, hi);
        EXPECT_FALSE(run_pass("convert_clip_to_relu", kept));
    }
}

// A layer's ReLU6 becomes a Relu (for CLE); the Clip(0, 6) inside a spelled-out
// HardSwish, x * clip(x + 3, 0, 6) / 6, stays: as a Relu it grows without bound.
TEST(ClipToRelu, ReplaceClip6ReluTurnsOnlyALayersActivation) {
    GraphBuilder b;
    b.input("x", {1, 2, 3, 3}).output("y", {1, 2, 3, 3});
    b.initializer("w", ramp({2, 2, 1, 1}, -0.5f, 0.25f));
    b.initializer("zero", ramp({}, 0.0f));
    b.initializer("six", ramp({}, 6.0f));
    b.initializer("three", ramp({}, 3.0f));
    b.node("Conv", {"x", "w"}, {"c"});
    b.node("Clip", {"c", "zero", "six"}, {"r6"});
    b.node("Add", {"r6", "three"}, {"p3"});
    b.node("Clip", {"p3", "zero", "six"}, {"gate"});
    b.node("Mul", {"r6", "gate"}, {"m"});
    b.node("Div", {"m", "six"}, {"y"});
    auto model = b.build();
    EXPECT_TRUE(run_pass("replace_clip6_relu", model));
    EXPECT_EQ(op_types(model), (std::vector<std::string>{"Conv", "Relu", "Add", "Clip", "Mul", "Div"}));
    EXPECT_FALSE(run_pass("replace_clip6_relu", model)) << "a second run changes nothing";
    // Where a Clip(0, 6) reads no layer at all, nothing changes.
    auto alone = clip_model(0.0f, 6.0f);
    EXPECT_FALSE(run_pass("replace_clip6_relu", alone));
}

TEST(SimulateDpu, LeakyReluAndSigmoid) {
    GraphBuilder b;
    b.input("x", {4}).output("y", {4});
    float_attribute(b.node("LeakyRelu", {"x"}, {"l"}), "alpha", 0.1f);
    b.node("Sigmoid", {"l"}, {"s"});
    b.node("Relu", {"s"}, {"y"});
    auto model = b.build();
    EXPECT_TRUE(run_pass("convert_leaky_relu_to_dpu_version", model));
    EXPECT_FLOAT_EQ(model.graph().node(0).attribute(0).f(), 26.0f / 256.0f);
    EXPECT_TRUE(run_pass("convert_sigmoid_to_hard_sigmoid", model));
    EXPECT_TRUE(dpu::is_dpu_hard_sigmoid(model.graph().node(1)));
    EXPECT_TRUE(run_pass("convert_hard_sigmoid_to_dpu_version", model));
    EXPECT_EQ(op_types(model), (std::vector<std::string>{"LeakyRelu", "HardSigmoid", "Mul", "Relu"}));
    EXPECT_TRUE(model.marked(model.graph().node(2), vaiq::kDeviceRescale));
    EXPECT_EQ(model.graph().node(2).output(0), "s");
    // HardSigmoid(0) = 0.5, times the DPU's 2731/16384 x 6.
    const auto y = run(model, vaiq::Tensor::from_values<float>({4}, std::vector<float>{0, 0, 0, 0}))[0];
    EXPECT_FLOAT_EQ(y.data<float>()[0], static_cast<float>(0.5f * static_cast<float>(dpu::kHardSigmoidScale)));
    EXPECT_FALSE(run_pass("convert_hard_sigmoid_to_dpu_version", model));
}

TEST(SimulateDpu, ASigmoidTheModelOutputsStaysASigmoid) {
    // A score: HardSigmoid would tie every logit below -3 at 0.
    GraphBuilder b;
    b.input("x", {4}).output("score", {4});
    b.node("Sigmoid", {"x"}, {"score"});
    auto model = b.build();
    EXPECT_FALSE(run_pass("convert_sigmoid_to_hard_sigmoid", model));
    EXPECT_EQ(op_types(model), (std::vector<std::string>{"Sigmoid"}));
}

TEST(SimulateDpu, AveragesAreRescaledByTheDpuFactor) {
    EXPECT_DOUBLE_EQ(dpu::average_pool_factor(3, 3), 63.0 / 64.0);
    EXPECT_DOUBLE_EQ(dpu::average_pool_factor(7, 7), 49.0 * 21.0 / 1024.0);
    EXPECT_DOUBLE_EQ(dpu::mean_factor(49), 49.0 * 21.0 / 1024.0);  // the table agrees with the rule
    EXPECT_DOUBLE_EQ(dpu::mean_factor(4), 1.0);
    EXPECT_DOUBLE_EQ(dpu::average_pool_factor(300, 300), 1.0);

    GraphBuilder b;
    b.input("x", {1, 1, 3, 3}).output("y", {1, 1, 1, 1});
    b.node("GlobalAveragePool", {"x"}, {"y"});
    const auto model = b.build();
    auto simulated = model;
    EXPECT_TRUE(run_pass("convert_avg_pool_to_dpu_version", simulated));
    const auto x = ramp({1, 1, 3, 3}, 1.0f);
    EXPECT_FLOAT_EQ(run(simulated, x)[0].data<float>()[0], run(model, x)[0].data<float>()[0] * 63.0f / 64.0f);

    GraphBuilder m;
    m.input("x", {1, 1, 7, 7}).output("y", {1, 1, 1, 1});
    set_ints_attribute(m.node("ReduceMean", {"x"}, {"y"}), "axes", {2, 3});
    auto mean = m.build();
    EXPECT_TRUE(run_pass("convert_reduce_mean_to_dpu_version", mean));
    EXPECT_EQ(op_types(mean), (std::vector<std::string>{"ReduceMean", "Mul"}));
}

// The DPU's softmax of one row, written out with the SDK's bfloat16 rounding.
std::vector<float> dpu_softmax(const std::vector<float>& row) {
    const auto bf = [](double v) { return vaiq::bfloat16_to_float(vaiq::float_to_bfloat16(static_cast<float>(v))); };
    const float peak = *std::max_element(row.begin(), row.end());
    std::vector<float> e;
    for (float v : row) {
        const float x = bf(v - peak);
        const float n = std::floor(bf(x * bf(1.0 / std::log(2.0))));
        const float r = bf(x - bf(n * bf(std::log(2.0))));
        float p = bf(r * 0.21875f + 0.486328125f);
        p = bf(r * p + 1.0f);
        p = bf(r * p + 1.0f);
        e.push_back(bf(std::exp2(n) * p));
    }
    float sum = 0;
    for (float v : e) sum += v;
    for (auto& v : e) v = bf(v / bf(sum));
    return e;
}

TEST(SimulateDpu, SoftmaxInBfloat16WithThePolynomialExp) {
    for (int64_t opset : {13, 17}) {
        GraphBuilder b(opset);
        b.input("x", {2, 12}).output("y", {2, 12});
        set_attribute(b.node("Softmax", {"x"}, {"y"}), "axis", 1);
        const auto model = b.build();
        auto simulated = model;
        EXPECT_TRUE(run_pass("convert_softmax_to_dpu_version", simulated));
        EXPECT_FALSE(run_pass("convert_softmax_to_dpu_version", simulated)) << "no Softmax left";
        for (const auto& n : simulated.graph().node())
            EXPECT_TRUE(simulated.marked(n, vaiq::kFloatOnly)) << n.op_type();
        EXPECT_EQ(simulated.graph().output(0).name(), "y");

        const auto x = ramp({2, 12}, -9.0f, 2.5f);  // up to 50.5: exp would overflow without the shift
        const auto exact = run(model, x)[0], dpu = run(simulated, x)[0];
        double worst = 0;
        for (int row = 0; row < 2; ++row) {
            const auto xs = x.data<float>().subspan(row * 12, 12);
            const auto want = dpu_softmax({xs.begin(), xs.end()});
            for (int i = 0; i < 12; ++i) {
                EXPECT_NEAR(dpu.data<float>()[row * 12 + i], want[i], 1e-6) << "row " << row << " element " << i;
                worst = std::max(worst,
                                 std::abs(double(dpu.data<float>()[row * 12 + i]) - exact.data<float>()[row * 12 + i]));
            }
        }
        // bfloat16 keeps 8 significant bits: close to the true softmax, and not equal to it.
        EXPECT_LT(worst, 8e-3);
        EXPECT_GT(worst, 0.0);
    }
}

TEST(SimulateDpu, SoftmaxBeforeOpset13IsKept) {
    GraphBuilder b(12);
    b.input("x", {2, 3}).output("y", {2, 3});
    b.node("Softmax", {"x"}, {"y"});
    auto model = b.build();
    EXPECT_FALSE(run_pass("convert_softmax_to_dpu_version", model));
    EXPECT_EQ(op_types(model), (std::vector<std::string>{"Softmax"}));
}

}  // namespace
