// The layout rewrites: NHWC chains, fused activations, the depthwise pair, residual adds.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <set>

#include "executor_test_support.hpp"
#include "runtime/executor.hpp"
#include "runtime/infer.hpp"
#include "runtime/kernels/ort_float.hpp"
#include "runtime/layout.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/quant.hpp"
#include "vaiq/reader.hpp"

namespace fs = std::filesystem;

namespace {

using vaiq::DataType;
using vaiq::Tensor;
using vaiq::runtime::Executor;
using vaiq::runtime::test::compare_rewrites;
using vaiq::runtime::test::error_of;
using vaiq::runtime::test::reference_conv_relu;

// The transposes of `graph` that run: those read by a node or giving the
// output `y` (a transpose back left unread is there for a tap, run only for one).
int transposes_that_run(const onnx::GraphProto& graph) {
    std::set<std::string> read{"y"};
    for (const auto& n : graph.node()) read.insert(n.input().begin(), n.input().end());
    int transposes = 0;
    for (const auto& n : graph.node()) transposes += n.op_type() == "Transpose" && read.count(n.output(0));
    return transposes;
}

// x -> Conv -> Relu -> Conv -> Add(with the Relu output) -> MaxPool -> y
vaiq::Model residual_block() {
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 3, 8, 8}).output("y", {1, 3, 4, 4});
    b.initializer("w1", vaiq::test::ramp({3, 3, 3, 3}, -0.4f, 0.01f));
    b.initializer("w2", vaiq::test::ramp({3, 3, 1, 1}, 0.3f, -0.07f));
    vaiq::test::set_ints_attribute(b.node("Conv", {"x", "w1"}, {"c1"}, "conv1"), "pads", {1, 1, 1, 1});
    b.node("Relu", {"c1"}, {"r1"}, "relu1");
    b.node("Conv", {"r1", "w2"}, {"c2"}, "conv2");
    b.node("Add", {"c2", "r1"}, {"s"}, "add");
    auto& pool = b.node("MaxPool", {"s"}, {"y"}, "pool");
    vaiq::test::set_ints_attribute(pool, "kernel_shape", {2, 2});
    vaiq::test::set_ints_attribute(pool, "strides", {2, 2});
    return b.build();
}

TEST(Layout, TransposesBetweenConvolutionsCancel) {
    auto model = residual_block();
    ASSERT_TRUE(vaiq::runtime::optimize_layout(model.graph()));
    int to_nhwc = 0, nhwc_ops = 0, relus = 0, fused = 0;
    for (const auto& n : model.graph().node()) {
        nhwc_ops += n.domain() == vaiq::runtime::kInternalDomain;
        relus += n.op_type() == "Relu";
        for (const auto& a : n.attribute()) fused += a.name() == "activation_min";
        if (n.op_type() == "Transpose" && n.attribute(0).ints(1) == 2) ++to_nhwc;
    }
    // The two convolutions, the pool, the first convolution again with the Relu
    // fused in (the plain one stays for a tap of c1), and the second again with
    // the residual Add.
    EXPECT_EQ(nhwc_ops, 5);
    EXPECT_EQ(relus, 0);
    EXPECT_EQ(fused, 1);
    EXPECT_EQ(to_nhwc, 1) << "only the graph input is transposed into NHWC";
}

// Conv -> Relu -> Clip: the Relu fuses into the convolution, and the Clip after
// it still runs (a fused convolution takes no second activation).
TEST(Layout, OnlyTheFirstActivationAfterAConvolutionFuses) {
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 2, 4, 4}).output("y", {1, 3, 4, 4});
    b.initializer("w", vaiq::test::ramp({3, 2, 1, 1}, -0.4f, 0.15f));
    b.initializer("hi", Tensor::from_values<float>({}, std::vector<float>{0.3f}));
    b.initializer("lo", Tensor::from_values<float>({}, std::vector<float>{0.0f}));
    b.node("Conv", {"x", "w"}, {"c"}, "conv");
    b.node("Relu", {"c"}, {"r"}, "relu");
    b.node("Clip", {"r", "lo", "hi"}, {"y"}, "clip");
    const auto model = b.build();
    const Tensor x = vaiq::test::ramp({1, 2, 4, 4}, -2.0f, 0.13f);
    const auto plain = Executor(model, {.threads = 1, .optimize_layout = false}).run({{"x", x}})[0];
    const auto fused = Executor(model, {.threads = 1, .optimize_layout = true}).run({{"x", x}})[0];
    float largest = 0;
    for (int64_t i = 0; i < plain.size(); ++i) {
        EXPECT_NEAR(fused.data<float>()[i], plain.data<float>()[i], 1e-6f) << i;
        largest = std::max(largest, fused.data<float>()[i]);
    }
    EXPECT_EQ(largest, 0.3f) << "the Clip's bound must hold";
}

// Convolutions left in float between int8 QuantizeLinear/DequantizeLinear pairs
// (as x86 runs an int8-activation QDQ Conv), their weights dequantized from int8:
// they run channels-last like stored-weight ones, so no transpose sits between
// them, and they compute the same values.
TEST(Layout, FloatConvolutionsOfDequantizedWeightsChainChannelsLast) {
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 4, 6, 6}).output("y", {1, 4, 6, 6});
    b.initializer("s", Tensor::from_values<float>({}, std::vector<float>{0.05f}));
    b.initializer("z", Tensor::from_values<int8_t>({}, std::vector<int8_t>{3}));
    b.initializer("ws", Tensor::from_values<float>({}, std::vector<float>{0.01f}));
    for (int i = 1; i <= 2; ++i) {
        std::vector<int8_t> codes(4 * 4 * 3 * 3);
        for (size_t k = 0; k < codes.size(); ++k) codes[k] = static_cast<int8_t>((k * 37 + i * 11) % 255 - 127);
        const auto n = std::to_string(i);
        b.initializer("wq" + n, Tensor::from_values<int8_t>({4, 4, 3, 3}, codes));
        b.initializer("b" + n, vaiq::test::ramp({4}, -0.1f, 0.07f));
        const std::string in = i == 1 ? "x" : "c1";
        b.node("QuantizeLinear", {in, "s", "z"}, {"q" + n});
        b.node("DequantizeLinear", {"q" + n, "s", "z"}, {"d" + n});
        b.node("DequantizeLinear", {"wq" + n, "ws"}, {"w" + n});
        auto& conv = b.node("Conv", {"d" + n, "w" + n, "b" + n}, {i == 1 ? "c1" : "y"}, "conv" + n);
        vaiq::test::set_ints_attribute(conv, "pads", {1, 1, 1, 1});
    }
    const auto model = b.build();
    auto rewritten = model;
    ASSERT_TRUE(vaiq::runtime::optimize_layout(rewritten.graph()));
    int nhwc_convs = 0;
    for (const auto& n : rewritten.graph().node()) nhwc_convs += n.op_type() == "NhwcConv";
    EXPECT_EQ(nhwc_convs, 2);
    EXPECT_EQ(transposes_that_run(rewritten.graph()), 2) << "one into NHWC at the input, one back at the output";
    const Tensor x = vaiq::test::ramp({1, 4, 6, 6}, -3.0f, 0.041f);
    const auto plain = Executor(model, {.threads = 1, .optimize_layout = false}).run({{"x", x}})[0];
    const auto nhwc = Executor(model, {.threads = 1, .optimize_layout = true}).run({{"x", x}})[0];
    ASSERT_EQ(nhwc.shape(), plain.shape());
    for (int64_t i = 0; i < plain.size(); ++i) EXPECT_EQ(nhwc.data<float>()[i], plain.data<float>()[i]) << i;
}

TEST(Layout, ThePlainConvolutionBehindAFusedReluRunsOnlyForATap) {
    const auto model = residual_block();
    Executor executor(model, {.threads = 1, .profile = true, .optimize_layout = true});
    const Tensor x = vaiq::test::ramp({1, 3, 8, 8}, -2.0f, 0.02f);
    auto convolutions = [&] {
        for (const auto& p : executor.profile())
            if (p.op_type == "NhwcConv") return p.calls;
        return int64_t{0};
    };
    executor.run({{"x", x}});
    EXPECT_EQ(convolutions(), 2);
    executor.run({{"x", x}}, {"c1"}, [](const std::string&, const Tensor&) {});
    EXPECT_EQ(convolutions(), 5) << "the tap of c1 runs the plain convolution too";
}

TEST(Layout, EveryTensorReadsTheSameWithAndWithoutIt) {
    const auto model = residual_block();
    Executor plain(model, {.threads = 1, .optimize_layout = false});
    Executor nhwc(model, {.threads = 1, .optimize_layout = true});
    const std::vector<std::string> taps{"c1", "r1", "c2", "s"};
    std::map<std::string, Tensor> a, b;
    const Tensor x = vaiq::test::ramp({1, 3, 8, 8}, -2.0f, 0.02f);
    const auto ya = plain.run({{"x", x}}, taps, [&](const std::string& n, const Tensor& t) { a[n] = t; });
    const auto yb = nhwc.run({{"x", x}}, taps, [&](const std::string& n, const Tensor& t) { b[n] = t; });
    ASSERT_EQ(b.size(), taps.size());
    a["y"] = ya[0];
    b["y"] = yb[0];
    for (const auto& [name, t] : a) {
        ASSERT_EQ(b[name].shape(), t.shape()) << name;
        const auto p = t.data<float>(), q = b[name].data<float>();
        for (size_t i = 0; i < p.size(); ++i) ASSERT_NEAR(p[i], q[i], 1e-5f) << name << "[" << i << "]";
    }
}

// A TensorFlow export's own transposes around each convolution (NHWC between
// layers) cancel against the layout's; one that a tap asks for stays, computed
// for the tap alone (a diagnosis comparing such a model once failed the run).
TEST(Layout, AnExportersTransposeThatATapWantsIsStillComputed) {
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 6, 6, 2}).output("y", {1, 6, 6, 3});
    b.initializer("w1", vaiq::test::ramp({3, 2, 3, 3}, -0.4f, 0.015f));
    b.initializer("w2", vaiq::test::ramp({3, 3, 1, 1}, 0.3f, -0.07f));
    vaiq::test::set_ints_attribute(b.node("Transpose", {"x"}, {"x_nchw"}), "perm", {0, 3, 1, 2});
    vaiq::test::set_ints_attribute(b.node("Conv", {"x_nchw", "w1"}, {"c1"}), "pads", {1, 1, 1, 1});
    vaiq::test::set_ints_attribute(b.node("Transpose", {"c1"}, {"BiasAdd__128:0"}), "perm", {0, 2, 3, 1});
    b.node("Relu", {"BiasAdd__128:0"}, {"r1"});
    vaiq::test::set_ints_attribute(b.node("Transpose", {"r1"}, {"r1_nchw"}), "perm", {0, 3, 1, 2});
    b.node("Conv", {"r1_nchw", "w2"}, {"c2"});
    vaiq::test::set_ints_attribute(b.node("Transpose", {"c2"}, {"y"}), "perm", {0, 2, 3, 1});
    const auto model = b.build();
    const std::vector<std::string> taps{"BiasAdd__128:0", "r1"};
    Executor plain(model, {.threads = 1, .optimize_layout = false});
    Executor nhwc(model, {.threads = 1, .optimize_layout = true, .taps = {taps.begin(), taps.end()}});
    for (const auto& t : taps) EXPECT_TRUE(nhwc.can_tap(t)) << t;
    std::map<std::string, Tensor> a, c;
    const Tensor x = vaiq::test::ramp({1, 6, 6, 2}, -1.0f, 0.03f);
    plain.run({{"x", x}}, taps, [&](const std::string& n, const Tensor& t) { a[n] = t; });
    nhwc.run({{"x", x}}, taps, [&](const std::string& n, const Tensor& t) { c[n] = t; });
    ASSERT_EQ(c.size(), taps.size());
    for (const auto& [name, t] : a) {
        ASSERT_EQ(c[name].shape(), t.shape()) << name;
        const auto p = t.data<float>(), q = c[name].data<float>();
        for (size_t i = 0; i < p.size(); ++i) ASSERT_NEAR(p[i], q[i], 1e-5f) << name << "[" << i << "]";
    }
}

// An any-order tap (a range observer's) of a tensor held in NHWC gets it as
// held: the same values in NHWC order, and no transpose back runs for it.
TEST(Layout, AnAnyOrderTapGetsTheTensorAsHeldWithoutATranspose) {
    const auto model = residual_block();
    const std::vector<std::string> taps{"r1", "s"};
    Executor exact(model, {.threads = 1, .profile = true, .optimize_layout = true, .taps = {"r1", "s"}});
    Executor any(
        model,
        {.threads = 1, .profile = true, .optimize_layout = true, .taps = {"r1", "s"}, .any_order_taps = {"r1", "s"}});
    std::map<std::string, Tensor> a, b;
    const Tensor x = vaiq::test::ramp({1, 3, 8, 8}, -2.0f, 0.02f);
    exact.run({{"x", x}}, taps, [&](const std::string& n, const Tensor& t) { a[n] = t; });
    const auto y = any.run({{"x", x}}, taps, [&](const std::string& n, const Tensor& t) { b[n] = t; });
    ASSERT_EQ(b.size(), 2u);
    for (const auto& name : taps) {
        const auto& [n, c, h, w] =
            std::array{a[name].shape()[0], a[name].shape()[1], a[name].shape()[2], a[name].shape()[3]};
        EXPECT_EQ(b[name].shape(), (std::vector<int64_t>{n, h, w, c})) << name << " comes in NHWC";
        const auto p = a[name].data<float>(), q = b[name].data<float>();
        for (int64_t ci = 0; ci < c; ++ci)
            for (int64_t i = 0; i < h * w; ++i) ASSERT_EQ(q[i * c + ci], p[ci * h * w + i]) << name;
    }
    auto transposes = [](const Executor& e) {
        for (const auto& p : e.profile())
            if (p.op_type == "Transpose") return p.calls;
        return int64_t{0};
    };
    EXPECT_EQ(transposes(exact) - transposes(any), 2) << "neither tapped tensor transposed back";
    EXPECT_EQ(y[0].shape(), (std::vector<int64_t>{1, 3, 4, 4})) << "the graph's outputs stay NCHW";
}

// MobileNetV2's inverted residual: 1x1 expansion -> Clip -> depthwise 3x3 (stride 2) -> Clip -> 1x1 projection.
// With a skip (stride 1), the block reads a 1x1 convolution of x (an NHWC value, as between blocks), and
// the projection adds that value or a second 1x1 convolution of it.
enum class Skip { none, input, convolution };
vaiq::Model inverted_residual(int64_t stride = 2, int64_t batch = 1, int64_t size = 9, int64_t expanded = 12,
                              Skip skip = Skip::none) {
    vaiq::test::GraphBuilder b;
    const int64_t out = (size - 1) / stride + 1, projected = skip == Skip::none ? 4 : 3;
    b.input("x", {batch, 3, size, size}).output("y", {batch, projected, out, out});
    std::string in = "x";
    if (skip != Skip::none) {
        b.initializer("wi", vaiq::test::ramp({3, 3, 1, 1}, -0.3f, 0.1f));
        b.node("Conv", {"x", "wi"}, {"i"}, "in");
        in = "i";
    }
    b.initializer("we", vaiq::test::ramp({expanded, 3, 1, 1}, -0.5f, 0.03f));
    b.initializer("be", vaiq::test::ramp({expanded}, -0.2f, 0.05f));
    b.initializer("wd", vaiq::test::ramp({expanded, 1, 3, 3}, 0.4f, -0.007f));
    b.initializer("wp", vaiq::test::ramp({projected, expanded, 1, 1}, 0.2f, -0.01f));
    b.initializer("bp", vaiq::test::ramp({projected}, 0.1f, -0.1f));
    b.initializer("lo", Tensor::from_values<float>({}, std::vector<float>{0.0f}));
    b.initializer("hi", Tensor::from_values<float>({}, std::vector<float>{6.0f}));
    b.node("Conv", {in, "we", "be"}, {"e"}, "expand");
    b.node("Clip", {"e", "lo", "hi"}, {"e6"}, "expand_clip");
    auto& dw = b.node("Conv", {"e6", "wd"}, {"d"}, "depthwise");
    vaiq::test::set_attribute(dw, "group", expanded);
    vaiq::test::set_ints_attribute(dw, "pads", {1, 1, 1, 1});
    vaiq::test::set_ints_attribute(dw, "strides", {stride, stride});
    b.node("Clip", {"d", "lo", "hi"}, {"d6"}, "depthwise_clip");
    if (skip == Skip::none) {
        b.node("Conv", {"d6", "wp"}, {"y"}, "project");
        return b.build();
    }
    b.node("Conv", {"d6", "wp", "bp"}, {"p"}, "project");
    if (skip == Skip::convolution) {
        b.initializer("ws", vaiq::test::ramp({3, 3, 1, 1}, 0.5f, -0.1f));
        b.node("Conv", {"i", "ws"}, {"s"}, "skip");
    }
    b.node("Add", {"p", skip == Skip::input ? "i" : "s"}, {"y"}, "residual");
    return b.build();
}

TEST(Layout, ExpansionAndDepthwiseConvolutionRunAsOneStep) {
    const auto model = inverted_residual();
    const Tensor x = vaiq::test::ramp({1, 3, 9, 9}, -3.0f, 0.025f);
    auto calls = compare_rewrites(model, x, {}, 1e-5f);
    EXPECT_EQ(calls["NhwcConvDepthwise"], 1) << "the projection runs inside it too";
    EXPECT_EQ(calls.count("NhwcConv"), 0u);
    // Tapping the expanded tensor runs the 1x1 convolution for it as well...
    calls = compare_rewrites(model, x, {"e6"}, 1e-5f);
    EXPECT_EQ(calls["NhwcConvDepthwise"], 1);
    EXPECT_EQ(calls["NhwcConv"], 1);
    // ...and tapping the depthwise outputs the pair that makes them.
    calls = compare_rewrites(model, x, {"d6"}, 1e-5f);
    EXPECT_EQ(calls["NhwcConvDepthwise"], 2);
    calls = compare_rewrites(model, x, {"d6"}, 1e-5f, true);
    EXPECT_EQ(calls["NhwcConvDepthwise"], 1) << "known beforehand, the projection stays on its own";
    EXPECT_EQ(calls["NhwcConv"], 1);
    // ...unless the executor knows the taps beforehand: then nothing computes twice.
    calls = compare_rewrites(model, x, {"e6"}, 1e-5f, true);
    EXPECT_EQ(calls.count("NhwcConvDepthwise"), 0u);
    EXPECT_EQ(calls["NhwcConv"], 3);
    calls = compare_rewrites(model, x, {"e", "e6", "d", "d6"}, 1e-5f, true);
    EXPECT_EQ(calls["NhwcConv"], 3) << "each convolution once";
    EXPECT_EQ(calls["Clip"], 2) << "the activations on their own, their inputs being tapped";
}

// Three images whose expanded tensors (72 x 64 x 64 floats, over 1 MB each) go
// through the pair one at a time.
TEST(Layout, ABatchGoesThroughTheFusedPairInGroupsOfImages) {
    const auto model = inverted_residual(1, 3, 64, 72);
    const auto calls = compare_rewrites(model, vaiq::test::ramp({3, 3, 64, 64}, -3.0f, 0.0005f), {}, 1e-4f);
    EXPECT_EQ(calls.at("NhwcConvDepthwise"), 1);
}

// Expanded widths of one, three and five blocks of 16 channels (the AVX-512
// kernel's unit; five go through as passes of three and two), rows whose width
// is no multiple of the kernel's pixel tiles, both strides, a batch, two
// threads; the projection to 4 channels fills part of a block.
TEST(Layout, TheFusedPairMatchesTheTwoConvolutionsForEveryBlockCountAndStride) {
    for (const int64_t expanded : {16, 48, 80})
        for (const int64_t stride : {1, 2})
            for (const int64_t size : {7, 13})
                for (const int threads : {1, 2}) {
                    SCOPED_TRACE(fmt::format("{} channels, stride {}, {}x{}, {} threads", expanded, stride, size, size,
                                             threads));
                    const int64_t batch = threads == 2 ? 3 : 1;
                    const auto model = inverted_residual(stride, batch, size, expanded);
                    const Tensor x = vaiq::test::ramp({batch, 3, size, size}, -1.0f, 0.004f);
                    const auto calls = compare_rewrites(model, x, {}, 1e-4f, false, threads);
                    EXPECT_EQ(calls.at("NhwcConvDepthwise"), 1);
                    EXPECT_EQ(calls.count("NhwcConv"), 0u);
                }
}

// One image tall enough that two threads take half of its rows each (the
// expanded rows at the cut made by both), with and without a residual.
TEST(Layout, TwoThreadsShareATallImageByRows) {
    for (const auto skip : {Skip::none, Skip::convolution})
        for (const int64_t stride : {1, 2}) {
            if (skip != Skip::none && stride != 1) continue;
            SCOPED_TRACE(fmt::format("skip {}, stride {}", static_cast<int>(skip), stride));
            const auto model = inverted_residual(stride, 1, 49, 48, skip);
            const Tensor x = vaiq::test::ramp({1, 3, 49, 49}, -1.0f, 0.0008f);
            const auto calls = compare_rewrites(model, x, {}, 1e-4f, false, 2);
            EXPECT_EQ(calls.at("NhwcConvDepthwise"), 1);
        }
}

// The projection adds the block's input (read again by the expansion: a copy
// is kept) or a skip convolution's output (read last here: written over).
TEST(Layout, TheProjectionAddsTheResidual) {
    for (const auto skip : {Skip::input, Skip::convolution})
        for (const int64_t expanded : {12, 48})
            for (const int threads : {1, 2}) {
                SCOPED_TRACE(
                    fmt::format("skip {}, {} channels, {} threads", static_cast<int>(skip), expanded, threads));
                const auto model = inverted_residual(1, 1, 11, expanded, skip);
                const Tensor x = vaiq::test::ramp({1, 3, 11, 11}, -1.0f, 0.005f);
                const auto calls = compare_rewrites(model, x, {}, 1e-4f, false, threads);
                EXPECT_EQ(calls.at("NhwcConvDepthwise"), 1);
                EXPECT_EQ(calls.count("Add"), 0u);
                EXPECT_EQ(calls.at("NhwcConv"), skip == Skip::convolution ? 2 : 1)
                    << "only the 1x1 convolutions before";
            }
}

// Weights stored as Constant nodes (as exports from other frameworks write
// them) are weights to the layout too: the convolutions run channels-last,
// and a Constant that is a graph output stays one.
TEST(Layout, ConvolutionsWhoseWeightsConstantNodesGiveRunChannelsLast) {
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 3, 8, 8}).output("y", {1, 3, 8, 8}).output("k", {1});
    auto constant = [&](const std::string& name, const Tensor& value) {
        auto& c = b.node("Constant", {}, {name}, name + "_node");
        auto* a = c.add_attribute();
        a->set_name("value");
        a->set_type(onnx::AttributeProto::TENSOR);
        *a->mutable_t() = value.to_proto(name);
    };
    constant("w1", vaiq::test::ramp({3, 3, 3, 3}, -0.4f, 0.01f));
    constant("w2", vaiq::test::ramp({3, 3, 1, 1}, 0.3f, -0.07f));
    constant("k", Tensor::from_values<float>({1}, std::vector<float>{2.5f}));
    vaiq::test::set_ints_attribute(b.node("Conv", {"x", "w1"}, {"c1"}, "conv1"), "pads", {1, 1, 1, 1});
    b.node("Relu", {"c1"}, {"r1"}, "relu1");
    b.node("Conv", {"r1", "w2"}, {"y"}, "conv2");
    const auto model = b.build();
    const Tensor x = vaiq::test::ramp({1, 3, 8, 8}, -1.0f, 0.01f);
    const auto calls = compare_rewrites(model, x, {}, 1e-5f);
    EXPECT_EQ(calls.at("NhwcConv"), 2);
    EXPECT_EQ(calls.count("Conv"), 0u);
    Executor executor(model);
    const auto out = executor.run({{"x", x}});
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[1].data<float>()[0], 2.5f);
}

TEST(Layout, ADepthwiseConvolutionOfAnotherStrideIsNotFused) {
    const auto model = inverted_residual(3);
    const Tensor x = vaiq::test::ramp({1, 3, 9, 9}, -3.0f, 0.025f);
    const auto calls = compare_rewrites(model, x, {}, 1e-5f);
    EXPECT_EQ(calls.count("NhwcConvDepthwise"), 0u);
    EXPECT_EQ(calls.at("NhwcConv"), 3);
}

// Conv -> Add(skip) -> Relu, the skip also read after the Add (so not reused in
// place), and a second residual whose other input broadcasts ([1, 3, 1, 1]).
TEST(Layout, ResidualAddsFuseIntoTheConvolutionAndStillBroadcast) {
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 3, 4, 4}).output("y", {1, 3, 4, 4}).output("z", {1, 3, 4, 4});
    b.initializer("w1", vaiq::test::ramp({3, 3, 3, 3}, -0.4f, 0.01f));
    b.initializer("w2", vaiq::test::ramp({3, 3, 1, 1}, 0.3f, -0.07f));
    b.initializer("b2", vaiq::test::ramp({3}, -0.1f, 0.1f));
    vaiq::test::set_ints_attribute(b.node("Conv", {"x", "w1"}, {"c1"}), "pads", {1, 1, 1, 1});
    b.node("Relu", {"c1"}, {"r1"});
    b.node("Conv", {"r1", "w2", "b2"}, {"c2"});
    b.node("Add", {"r1", "c2"}, {"s"});
    b.node("Relu", {"s"}, {"y"});
    auto& pool = b.node("AveragePool", {"r1"}, {"p"});  // reads r1 after the Add
    vaiq::test::set_ints_attribute(pool, "kernel_shape", {4, 4});
    b.node("Conv", {"y", "w2"}, {"c3"});
    b.node("Add", {"c3", "p"}, {"z"});  // [1, 3, 4, 4] + [1, 3, 1, 1]
    const auto model = b.build();
    const auto calls = compare_rewrites(model, vaiq::test::ramp({1, 3, 4, 4}, -1.5f, 0.05f), {}, 1e-5f);
    EXPECT_EQ(calls.count("Add"), 0u) << "both Adds run inside convolutions";
    EXPECT_EQ(calls.count("Relu"), 0u);
    EXPECT_EQ(calls.at("NhwcConv"), 3);
}

}  // namespace

// DenseNet's pattern: two branches' convolutions joined by a Concat, then a
// BatchNormalization that no convolution folds, a Relu and the next 1x1
// convolution. The Concat (along the channels, now the last axis) and the
// BatchNormalization run channels-last too, so no transpose sits between the
// convolutions, and every value is what the channels-first ops compute, to the bit.
TEST(Layout, ConcatAndBatchNormalizationRunChannelsLastBetweenConvolutions) {
    vaiq::test::GraphBuilder b;
    b.input("x", {2, 3, 6, 5}).output("y", {2, 4, 6, 5});
    b.initializer("w1", vaiq::test::ramp({5, 3, 3, 3}, -0.4f, 0.013f));
    b.initializer("w2", vaiq::test::ramp({3, 3, 1, 1}, 0.3f, -0.07f));
    b.initializer("w3", vaiq::test::ramp({4, 8, 1, 1}, -0.2f, 0.011f));
    b.initializer("gamma", vaiq::test::ramp({8}, 0.5f, 0.1f));
    b.initializer("beta", vaiq::test::ramp({8}, -0.3f, 0.07f));
    b.initializer("mean", vaiq::test::ramp({8}, 0.1f, -0.05f));
    b.initializer("var", vaiq::test::ramp({8}, 0.2f, 0.3f));
    vaiq::test::set_ints_attribute(b.node("Conv", {"x", "w1"}, {"c1"}, "conv1"), "pads", {1, 1, 1, 1});
    b.node("Conv", {"x", "w2"}, {"c2"}, "conv2");
    vaiq::test::set_attribute(b.node("Concat", {"c1", "c2"}, {"cat"}, "concat"), "axis", int64_t{-3});
    b.node("BatchNormalization", {"cat", "gamma", "beta", "mean", "var"}, {"bn"}, "bn");
    b.node("Relu", {"bn"}, {"r"}, "relu");
    b.node("Conv", {"r", "w3"}, {"y"}, "conv3");
    const auto model = b.build();
    const Tensor x = vaiq::test::ramp({2, 3, 6, 5}, -1.5f, 0.017f);
    auto calls = compare_rewrites(model, x, {"c1", "c2", "cat", "bn", "r"}, 0.0f);
    EXPECT_EQ(calls["NhwcBatchNormalization"], 1);
    EXPECT_EQ(calls["BatchNormalization"], 0);
    // What runs: the input into channels-last once per convolution that reads
    // it, the output back (the other transposes back are there for taps alone).
    auto optimized = model;
    ASSERT_TRUE(vaiq::runtime::optimize_layout(optimized.graph()));
    const int transposes = transposes_that_run(optimized.graph());
    int concat_axis = -1;
    for (const auto& n : optimized.graph().node())
        if (n.op_type() == "Concat") concat_axis = static_cast<int>(n.attribute(0).i());
    EXPECT_EQ(concat_axis, 3);
    EXPECT_EQ(transposes, 3);
}

// A squeeze-excitation block: the convolution's output is pooled where it is,
// channels-last (average for the scale, max for a second output), on one
// thread and on two, to the bit of the channels-first pools; no transpose of
// the whole map runs for the pools.
TEST(Layout, GlobalPoolsOfAConvolutionRunChannelsLast) {
    vaiq::test::GraphBuilder b;
    b.input("x", {2, 3, 9, 7}).output("y", {2, 40, 9, 7}).output("m", {2, 40, 1, 1});
    b.initializer("w1", vaiq::test::ramp({40, 3, 3, 3}, -0.4f, 0.0013f));
    b.initializer("w2", vaiq::test::ramp({40, 40, 1, 1}, 0.3f, -0.00037f));
    vaiq::test::set_ints_attribute(b.node("Conv", {"x", "w1"}, {"c"}, "conv"), "pads", {1, 1, 1, 1});
    b.node("GlobalAveragePool", {"c"}, {"avg"}, "avg");
    b.node("GlobalMaxPool", {"c"}, {"m"}, "max");
    b.node("Conv", {"avg", "w2"}, {"e"}, "excite");
    b.node("HardSigmoid", {"e"}, {"s"}, "gate");
    b.node("Mul", {"c", "s"}, {"y"}, "scale");
    const auto model = b.build();
    const Tensor x = vaiq::test::ramp({2, 3, 9, 7}, -1.5f, 0.0071f);
    for (int threads : {1, 2}) {
        auto calls = compare_rewrites(model, x, {"avg", "m", "e"}, 0.0f, false, threads);
        EXPECT_EQ(calls["NhwcGlobalAveragePool"], 1) << threads;
        EXPECT_EQ(calls["NhwcGlobalMaxPool"], 1) << threads;
        EXPECT_EQ(calls["GlobalAveragePool"] + calls["GlobalMaxPool"], 0) << threads;
    }
    auto optimized = model;
    ASSERT_TRUE(vaiq::runtime::optimize_layout(optimized.graph()));
    const vaiq::GraphIndex index(optimized.graph());
    for (const auto& n : optimized.graph().node())
        if (n.op_type() == "NhwcGlobalAveragePool" || n.op_type() == "NhwcGlobalMaxPool") {
            const int producer = index.producer(n.input(0));
            ASSERT_GE(producer, 0);
            EXPECT_NE(optimized.graph().node(producer).op_type(), "Transpose") << n.op_type();
        }
}

// A feature pyramid's top-down path: a coarse map upsampled by a nearest
// Resize (by scales, and by sizes), added to the finer one and joined along the
// channels. The Resizes, the Add and the Concat run channels-last between the
// convolutions, on one thread and on two, to the bit; of the transposes only
// the input's and the output's run.
TEST(Layout, NearestResizesRunChannelsLastBetweenConvolutions) {
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 3, 8, 10}).output("y", {1, 4, 8, 10});
    b.initializer("w_fine", vaiq::test::ramp({24, 3, 3, 3}, -0.4f, 0.0013f));
    b.initializer("w_coarse", vaiq::test::ramp({24, 3, 3, 3}, 0.3f, -0.0011f));
    b.initializer("w_out", vaiq::test::ramp({4, 48, 1, 1}, -0.2f, 0.0023f));
    b.initializer("scales", Tensor::from_values<float>({4}, std::vector<float>{1, 1, 2, 2}));
    b.initializer("sizes", Tensor::from_values<int64_t>({4}, std::vector<int64_t>{1, 24, 8, 10}));
    vaiq::test::set_ints_attribute(b.node("Conv", {"x", "w_fine"}, {"fine"}, "fine"), "pads", {1, 1, 1, 1});
    auto& coarse = b.node("Conv", {"x", "w_coarse"}, {"coarse"}, "coarse");
    vaiq::test::set_ints_attribute(coarse, "pads", {1, 1, 1, 1});
    vaiq::test::set_ints_attribute(coarse, "strides", {2, 2});
    vaiq::test::set_attribute(b.node("Resize", {"coarse", "", "scales"}, {"up"}, "up"), "mode", std::string("nearest"));
    b.node("Resize", {"coarse", "", "", "sizes"}, {"up_sized"}, "up_sized");  // nearest by default
    b.node("Add", {"fine", "up"}, {"merged"}, "merge");
    vaiq::test::set_attribute(b.node("Concat", {"merged", "up_sized"}, {"cat"}, "join"), "axis", int64_t{1});
    b.node("Conv", {"cat", "w_out"}, {"y"}, "out");
    const auto model = b.build();
    const Tensor x = vaiq::test::ramp({1, 3, 8, 10}, -1.5f, 0.0071f);
    for (int threads : {1, 2}) {
        auto calls = compare_rewrites(model, x, {"up", "up_sized", "merged", "cat"}, 0.0f, false, threads);
        EXPECT_EQ(calls["NhwcResize"], 2) << threads;
        EXPECT_EQ(calls["Resize"], 0) << threads;
    }
    auto optimized = model;
    ASSERT_TRUE(vaiq::runtime::optimize_layout(optimized.graph()));
    EXPECT_EQ(transposes_that_run(optimized.graph()), 3);  // x into each of the two convolutions that read it, y back
}

// The same join between integer convolutions: QLinearConcat, one input on the
// output's grid (a copy) and one requantized, and a QLinearAveragePool with
// partial windows after it run channels-last between them.
TEST(Layout, QLinearConcatRunsChannelsLastBetweenIntegerConvolutions) {
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 4, 7, 6}, DataType::UInt8).output("y", {1, 3, 4, 4}, DataType::UInt8);
    auto scalar = [&](const std::string& name, float v) {
        b.initializer(name, Tensor::from_values<float>({}, std::vector<float>{v}));
    };
    auto zero = [&](const std::string& name, uint8_t v) {
        b.initializer(name, Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{v}));
    };
    auto weights = [&](const std::string& name, std::vector<int64_t> shape, int seed) {
        std::vector<int8_t> w(static_cast<size_t>(vaiq::element_count(shape)));
        for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<int8_t>((static_cast<int>(i) * 37 + seed) % 201 - 100);
        b.initializer(name, Tensor::from_values<int8_t>(shape, w));
        b.initializer(name + "_s", Tensor::from_values<float>({}, std::vector<float>{0.004f}));
        b.initializer(name + "_z", Tensor::from_values<int8_t>({}, std::vector<int8_t>{0}));
    };
    scalar("sx", 0.02f), zero("zx", 128), scalar("sa", 0.05f), zero("za", 120), scalar("sb", 0.03f), zero("zb", 100);
    scalar("sy", 0.07f), zero("zy", 90);
    weights("w1", {6, 4, 3, 3}, 5), weights("w2", {5, 4, 1, 1}, 11), weights("w3", {3, 11, 1, 1}, 17);
    auto& c1 = b.node("QLinearConv", {"x", "sx", "zx", "w1", "w1_s", "w1_z", "sa", "za"}, {"a"}, "conv1");
    vaiq::test::set_ints_attribute(c1, "pads", {1, 1, 1, 1});
    b.node("QLinearConv", {"x", "sx", "zx", "w2", "w2_s", "w2_z", "sb", "zb"}, {"b"}, "conv2");
    auto& cat = b.node("QLinearConcat", {"sa", "za", "a", "sa", "za", "b", "sb", "zb"}, {"cat"}, "concat");
    cat.set_domain("com.microsoft");
    vaiq::test::set_attribute(cat, "axis", int64_t{1});
    auto& pool = b.node("QLinearAveragePool", {"cat", "sa", "za", "sb", "zb"}, {"pooled"}, "pool");
    pool.set_domain("com.microsoft");
    vaiq::test::set_ints_attribute(pool, "kernel_shape", {2, 2});
    vaiq::test::set_ints_attribute(pool, "strides", {2, 2});
    vaiq::test::set_ints_attribute(pool, "pads", {1, 0, 0, 1});
    b.node("QLinearConv", {"pooled", "sb", "zb", "w3", "w3_s", "w3_z", "sy", "zy"}, {"y"}, "conv3");
    auto model = b.build();
    auto* ms = model.proto().add_opset_import();
    ms->set_domain("com.microsoft");
    ms->set_version(1);
    std::vector<uint8_t> xs(4 * 7 * 6);
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<uint8_t>((i * 53) % 256);
    const Tensor x = Tensor::from_values<uint8_t>({1, 4, 7, 6}, xs);
    Executor plain(model, {.threads = 1, .optimize_layout = false, .fuse_patterns = false});
    Executor nhwc(model, {.threads = 1, .profile = true});
    std::map<std::string, Tensor> want, got;
    const std::vector<std::string> taps{"cat", "pooled"};
    want["y"] = plain.run({{"x", x}}, taps, [&](const std::string& n, const Tensor& t) { want[n] = t; })[0];
    got["y"] = nhwc.run({{"x", x}}, taps, [&](const std::string& n, const Tensor& t) { got[n] = t; })[0];
    for (const auto& [name, t] : want) {
        ASSERT_EQ(got[name].shape(), t.shape()) << name;
        const auto p = t.bytes(), q = got[name].bytes();
        size_t differ = 0, spread = 0;
        for (size_t i = 0; i < p.size(); ++i) differ += p[i] != q[i], spread += p[i] != p[0];
        EXPECT_EQ(differ, 0u) << name;
        EXPECT_GT(spread, p.size() / 2) << name << " is not all one value";
    }
    std::map<std::string, int64_t> calls;
    for (const auto& p : nhwc.profile()) calls[p.op_type] = p.calls;
    EXPECT_EQ(calls["Transpose"], 5)
        << "the input into channels-last for each convolution, the output and the taps back";
}

// Forks and rewrites at tensors the layout optimisation holds channels-last
// (the forking executors of mixed precision's ranking and screening) see and
// give them channels-first, and every value is the channels-first executor's,
// to the bit: each fork's value, each resumed run's output, the run's own.
TEST(Layout, ForksAndRewritesAtChannelsLastTensorsAgreeWithChannelsFirst) {
    const auto model = residual_block();
    const std::set<std::string> kept{"c1", "r1", "c2"};
    Executor first(model, {.threads = 1, .optimize_layout = false, .fuse_qdq = false, .taps = kept});
    auto options = vaiq::runtime::forking_options(1, kept);
    options.profile = true;
    Executor last(model, options);
    EXPECT_TRUE(last.can_fork("r1") && last.can_fork("c2"));
    const Tensor x = vaiq::test::ramp({1, 3, 8, 8}, -2.0f, 0.037f);
    auto values = [](const Tensor& t) { return std::vector<float>(t.data<float>().begin(), t.data<float>().end()); };
    const vaiq::runtime::Rewrite round = [](const std::string&, Tensor& value) {
        for (auto& v : value.mutable_data<float>()) v = std::round(v * 8) / 8;
    };
    auto run = [&](Executor& executor) {
        std::vector<std::vector<float>> seen;
        const auto y = executor.run_forking(
            {{"x", x}}, {"r1", "c2"},
            [&](const std::string& name, const Tensor& value, const vaiq::runtime::Resume& resume) {
                EXPECT_EQ(value.shape(), (std::vector<int64_t>{1, 3, 8, 8})) << name << " is given channels-first";
                seen.push_back(values(value));
                Tensor half = value;
                for (auto& v : half.mutable_data<float>()) v *= 0.5f;
                seen.push_back(values(resume(half)[0]));
            },
            {"c1"}, round);
        seen.push_back(values(y[0]));
        return seen;
    };
    const auto channels_first = run(first), channels_last = run(last);
    ASSERT_EQ(channels_first.size(), 5u);
    EXPECT_EQ(channels_last, channels_first);
    std::map<std::string, int64_t> calls;
    for (const auto& p : last.profile()) calls[p.op_type] = p.calls;
    EXPECT_GT(calls["Transpose"], 0) << "the forking executor ran channels-last";
}

// A tensor that convolutions read channels-last and a Flatten channels-first:
// a fork or rewrite reaches both (it works where the tensor is computed,
// channels-last). A transpose of the model's own that the layout optimisation
// cancels against its own is computed only for taps, from a value of the
// model's that others may read: no fork or rewrite there, rather than one that
// changes what those others read.
TEST(Layout, ForksAndRewritesReachEveryReaderOfATensorHeldChannelsLast) {
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 3, 8, 8}).output("y", {1, 3, 8, 8}).output("f", {1, 192}).output("z", {1, 2, 3, 8});
    b.initializer("w1", vaiq::test::ramp({3, 3, 3, 3}, -0.4f, 0.01f));
    b.initializer("w2", vaiq::test::ramp({3, 3, 1, 1}, 0.3f, -0.07f));
    b.initializer("w3", vaiq::test::ramp({2, 8, 1, 1}, -0.2f, 0.05f));
    vaiq::test::set_ints_attribute(b.node("Conv", {"x", "w1"}, {"c1"}, "conv1"), "pads", {1, 1, 1, 1});
    b.node("Conv", {"c1", "w2"}, {"y"}, "conv2");
    b.node("Flatten", {"c1"}, {"f"}, "flatten");
    b.node("Relu", {"c1"}, {"r"}, "relu");
    vaiq::test::set_ints_attribute(b.node("Transpose", {"r"}, {"t"}, "own_transpose"), "perm", {0, 3, 1, 2});
    b.node("Conv", {"t", "w3"}, {"z"}, "conv3");
    const auto model = b.build();
    const std::set<std::string> kept{"c1", "r", "t"};
    Executor first(model, {.threads = 1, .optimize_layout = false, .fuse_qdq = false, .taps = kept});
    Executor last(model, vaiq::runtime::forking_options(1, kept));
    EXPECT_TRUE(first.can_fork("t"));
    EXPECT_FALSE(last.can_fork("t"));
    const Tensor x = vaiq::test::ramp({1, 3, 8, 8}, -2.0f, 0.037f);
    auto values = [](const Tensor& t) { return std::vector<float>(t.data<float>().begin(), t.data<float>().end()); };
    // Not idempotent: a rewrite applied twice, or to another tensor's value, shows.
    const vaiq::runtime::Rewrite shift = [](const std::string& name, Tensor& value) {
        const float by = name == "c1" ? 0.25f : name == "r" ? 0.5f : 1.0f;
        for (auto& v : value.mutable_data<float>()) v = std::round(v * 4) / 4 + by;
    };
    auto run = [&](Executor& executor) {
        std::vector<std::vector<float>> seen;
        auto keep = [&](const std::vector<Tensor>& outputs) {
            for (const auto& t : outputs) seen.push_back(values(t));
        };
        keep(executor.run_forking({{"x", x}}, {"c1", "r"},
                                  [&](const std::string&, const Tensor& value, const vaiq::runtime::Resume& resume) {
                                      Tensor half = value;
                                      for (auto& v : half.mutable_data<float>()) v *= 0.5f;
                                      keep(resume(half));
                                  }));
        keep(executor.run_forking({{"x", x}}, {}, {}, {"c1", "r"}, shift));
        return seen;
    };
    const auto channels_first = run(first), channels_last = run(last);
    ASSERT_EQ(channels_first.size(), 12u);  // two forks' outputs, the run's, the rewritten run's
    for (size_t i = 0; i < channels_first.size(); ++i) EXPECT_EQ(channels_last[i], channels_first[i]) << i;
}
