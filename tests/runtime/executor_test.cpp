#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <limits>
#include <numeric>
#include <random>

#include "runtime/executor.hpp"
#include "runtime/kernels/ort_float.hpp"
#include "runtime/infer.hpp"
#include "runtime/layout.hpp"
#include "test_support.hpp"
#include "vaiq/quant.hpp"
#include "util/npy.hpp"
#include "vaiq/error.hpp"

namespace fs = std::filesystem;

namespace {

using vaiq::DataType;
using vaiq::Tensor;
using vaiq::runtime::Executor;

std::string error_of(const std::function<void()>& body) {
    try {
        body();
    } catch (const vaiq::InputError& e) {
        return e.what();
    }
    return "no error";
}

// Conv(pads 1) + bias + Relu computed directly, for conv_relu_model().
std::vector<float> reference_conv_relu(const Tensor& x, const Tensor& w, const Tensor& b) {
    std::vector<float> y(3 * 4 * 4);
    const auto xv = x.data<float>(), wv = w.data<float>(), bv = b.data<float>();
    for (int m = 0; m < 3; ++m)
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) {
                double acc = bv[m];
                for (int c = 0; c < 2; ++c)
                    for (int ki = 0; ki < 3; ++ki)
                        for (int kj = 0; kj < 3; ++kj) {
                            const int ii = i + ki - 1, jj = j + kj - 1;
                            if (ii < 0 || ii >= 4 || jj < 0 || jj >= 4) continue;
                            acc += xv[(c * 4 + ii) * 4 + jj] * wv[((m * 2 + c) * 3 + ki) * 3 + kj];
                        }
                y[(m * 4 + i) * 4 + j] = static_cast<float>(std::max(acc, 0.0));
            }
    return y;
}

TEST(Executor, ConvReluMatchesADirectComputation) {
    const auto model = vaiq::test::conv_relu_model();
    Executor executor(model, {.threads = 1});
    EXPECT_EQ(executor.input_names(), (std::vector<std::string>{"x"}));
    const Tensor x = vaiq::test::ramp({1, 2, 4, 4}, -1.0f, 0.0625f);
    const auto out = executor.run({{"x", x}});
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].shape(), (std::vector<int64_t>{1, 3, 4, 4}));
    const auto want = reference_conv_relu(x, Tensor::from_proto(model.graph().initializer(0)),
                                          Tensor::from_proto(model.graph().initializer(1)));
    const auto got = out[0].data<float>();
    int positives = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_NEAR(got[i], want[i], 1e-5) << i;
        positives += want[i] > 0;
    }
    EXPECT_GT(positives, 5) << "the test should exercise more than the Relu's zeros";
}

TEST(Executor, TapsStreamEachRequestedTensorOncePerRun) {
    const auto model = vaiq::test::conv_relu_model();
    Executor executor(model);
    std::vector<std::pair<std::string, std::vector<int64_t>>> seen;
    for (int batch = 0; batch < 3; ++batch)
        executor.run({{"x", vaiq::test::ramp({1, 2, 4, 4}, static_cast<float>(batch))}}, {"x", "conv_out"},
                     [&](const std::string& name, const Tensor& t) { seen.emplace_back(name, t.shape()); });
    ASSERT_EQ(seen.size(), 6u);
    EXPECT_EQ(seen[0].first, "x");
    EXPECT_EQ(seen[1].first, "conv_out");
    EXPECT_EQ(seen[1].second, (std::vector<int64_t>{1, 3, 4, 4}));
    EXPECT_NE(error_of([&] { executor.run({{"x", vaiq::test::ramp({1, 2, 4, 4})}}, {"nope"}, {}); }).find("no such tensor"),
              std::string::npos);
}

TEST(Executor, FeedsAreChecked) {
    const auto model = vaiq::test::conv_relu_model();
    Executor executor(model);
    EXPECT_EQ(error_of([&] { executor.run({{"x", vaiq::test::ramp({1, 2, 4, 5})}}); }),
              "input 'x' has shape [1, 2, 4, 5], but the model expects [1, 2, 4, 4]");
    EXPECT_EQ(error_of([&] { executor.run({{"x", Tensor(DataType::Int64, {1, 2, 4, 4})}}); }),
              "input 'x' is int64, but the model expects float");
    EXPECT_EQ(error_of([&] { executor.run({}); }), "input 'x' was not given");
    EXPECT_EQ(error_of([&] { executor.run({{"x", vaiq::test::ramp({1, 2, 4, 4})}, {"z", vaiq::test::ramp({1})}}); }),
              "the model has no input 'z' (inputs: x)");
}

TEST(Executor, UnsupportedOpsAreListedUpFront) {
    vaiq::test::GraphBuilder b;
    b.input("x", {2}).output("y", {2});
    b.node("FancyOp", {"x"}, {"t"}, "fancy").set_domain("com.example");
    b.node("Relu", {"t"}, {"y"}, "relu");
    const auto model = b.build();
    EXPECT_EQ(error_of([&] { Executor e(model); }),
              "vaiq's executor has no kernel for 1 node: fancy (com.example:FancyOp, opset 0)");
}

TEST(Executor, KernelErrorsNameTheNode) {
    vaiq::test::GraphBuilder b;
    b.input("a", {2, 3}).input("c", {4, 5}).output("y", {2, 5});
    b.node("MatMul", {"a", "c"}, {"y"}, "mm");
    const auto model = b.build();
    Executor e(model);
    EXPECT_EQ(error_of([&] { e.run({{"a", vaiq::test::ramp({2, 3})}, {"c", vaiq::test::ramp({4, 5})}}); }),
              "node 'mm' (MatMul, opset 13): inner dimensions differ: 3 and 4");
}

TEST(Executor, IfBranchesReadTheEnclosingScope) {
    // y = If(c) { Relu(t) } else { Neg(t) } where t = x * 2 lives in the outer graph.
    auto branch = [](const std::string& op, const std::string& out) {
        onnx::GraphProto g;
        g.set_name(op);
        auto* n = g.add_node();
        n->set_op_type(op);
        n->add_input("t");
        n->add_output(out);
        auto* o = g.add_output();
        o->set_name(out);
        o->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
        return g;
    };
    vaiq::test::GraphBuilder b;
    b.input("x", {3}).input("c", {}, DataType::Bool).output("y", {3});
    b.initializer("two", Tensor::from_values<float>({}, std::vector<float>{2.0f}));
    b.node("Mul", {"x", "two"}, {"t"}, "double");
    auto& node = b.node("If", {"c"}, {"y"}, "choose");
    for (auto [name, graph] : {std::pair{"then_branch", branch("Relu", "r")}, std::pair{"else_branch", branch("Neg", "n")}}) {
        auto* a = node.add_attribute();
        a->set_name(name);
        a->set_type(onnx::AttributeProto::GRAPH);
        *a->mutable_g() = graph;
    }
    const auto model = b.build();
    Executor executor(model);
    const Tensor x = Tensor::from_values<float>({3}, std::vector<float>{-1.0f, 0.5f, 2.0f});
    auto run = [&](bool c) {
        Tensor cond(DataType::Bool, {});
        cond.mutable_bytes()[0] = std::byte{c};
        return executor.run({{"x", x}, {"c", cond}})[0];
    };
    const auto then_out = run(true), else_out = run(false);
    EXPECT_EQ(std::vector<float>(then_out.data<float>().begin(), then_out.data<float>().end()),
              (std::vector<float>{0.0f, 1.0f, 4.0f}));
    EXPECT_EQ(std::vector<float>(else_out.data<float>().begin(), else_out.data<float>().end()),
              (std::vector<float>{2.0f, -1.0f, -4.0f}));
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

// What reads only constants runs once, when the model is compiled: a stored
// weight's DequantizeLinear never shows up in a run, and its value is still tappable.
TEST(Executor, StepsOfConstantsRunOnceAtCompileTime) {
    vaiq::test::GraphBuilder b;
    b.input("x", {4}).output("y", {4});
    b.initializer("wq", Tensor::from_values<int8_t>({4}, std::vector<int8_t>{-2, 0, 3, 100}));
    b.initializer("ws", Tensor::from_values<float>({}, std::vector<float>{0.5f}));
    b.node("DequantizeLinear", {"wq", "ws"}, {"w"});
    b.node("Mul", {"x", "w"}, {"y"});
    const auto model = b.build();
    Executor executor(model, {.threads = 1, .profile = true});
    std::map<std::string, Tensor> seen;
    const auto y = executor.run({{"x", Tensor::from_values<float>({4}, std::vector<float>{1, 2, 3, 4})}}, {"w"},
                                [&](const std::string& name, const Tensor& t) { seen[name] = t; })[0];
    EXPECT_EQ(std::vector<float>(y.data<float>().begin(), y.data<float>().end()),
              (std::vector<float>{-1.0f, 0.0f, 4.5f, 200.0f}));
    ASSERT_EQ(seen.count("w"), 1u);
    EXPECT_EQ(seen["w"].data<float>()[3], 50.0f);
    for (const auto& p : executor.profile()) EXPECT_NE(p.op_type, "DequantizeLinear") << "it ran per run";
}

// Requantized sums far outside the 8-bit range on both sides, and half-way
// cases, for uint8 and int8 outputs (the vector path and its tail).
TEST(Executor, RequantizationRoundsHalfToEvenAndSaturates) {
    const int64_t n = 53;
    std::vector<int8_t> bv(2 * n);
    for (int64_t j = 0; j < n; ++j) {
        bv[j] = static_cast<int8_t>(std::clamp<int64_t>(j * 5 - 127, -127, 127));
        bv[n + j] = static_cast<int8_t>(j % 3);
    }
    for (const auto out_type : {DataType::UInt8, DataType::Int8}) {
        vaiq::test::GraphBuilder g;
        g.input("a", {1, 2}, DataType::UInt8).output("y", {1, n}, out_type);
        g.initializer("b", Tensor::from_values<int8_t>({2, n}, bv));
        g.initializer("sa", Tensor::from_values<float>({}, std::vector<float>{1.0f}));
        g.initializer("za", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{0}));
        g.initializer("sb", Tensor::from_values<float>({}, std::vector<float>{1.0f}));
        g.initializer("zb", Tensor::from_values<int8_t>({}, std::vector<int8_t>{0}));
        g.initializer("sy", Tensor::from_values<float>({}, std::vector<float>{2.0f}));  // multiplier 0.5: halves
        if (out_type == DataType::UInt8) g.initializer("zy", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{100}));
        else g.initializer("zy", Tensor::from_values<int8_t>({}, std::vector<int8_t>{-3}));
        g.node("QLinearMatMul", {"a", "sa", "za", "b", "sb", "zb", "sy", "zy"}, {"y"});
        const auto model = g.build();
        const std::vector<uint8_t> av{9, 1};
        const auto y = Executor(model, {.threads = 1}).run({{"a", Tensor::from_values<uint8_t>({1, 2}, av)}})[0];
        const int zp = out_type == DataType::UInt8 ? 100 : -3;
        const float lo = out_type == DataType::UInt8 ? 0.0f : -128.0f, hi = out_type == DataType::UInt8 ? 255.0f : 127.0f;
        int low = 0, high = 0, halves = 0;
        for (int64_t j = 0; j < n; ++j) {
            const int32_t acc = av[0] * bv[j] + av[1] * bv[n + j];
            const float expected = std::clamp(std::nearbyint(static_cast<float>(acc) * 0.5f) + zp, lo, hi);
            const float got = out_type == DataType::UInt8 ? y.data<uint8_t>()[j] : y.data<int8_t>()[j];
            EXPECT_EQ(got, expected) << j;
            low += expected == lo;
            high += expected == hi;
            halves += acc % 2 != 0;
        }
        EXPECT_GT(low, 0);
        EXPECT_GT(high, 0);
        EXPECT_GT(halves, 0);
    }
}

// QLinearMatMul with uint8 operands on both sides, non-zero zero points and a
// broadcast batch, against the definition computed here in plain integers.
TEST(Executor, QLinearMatMulSumsCentredIntegersExactly) {
    const int64_t batch = 3, m = 5, k = 37, n = 19;
    std::vector<uint8_t> av(batch * m * k), bv(k * n);
    for (size_t i = 0; i < av.size(); ++i) av[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
    for (size_t i = 0; i < bv.size(); ++i) bv[i] = static_cast<uint8_t>((i * 91 + 5) % 256);
    const uint8_t za = 131, zb = 7, zy = 100;
    const float sa = 0.02f, sb = 0.003f, sy = 0.5f;
    vaiq::test::GraphBuilder g;
    g.input("a", {batch, m, k}, DataType::UInt8).output("y", {batch, m, n}, DataType::UInt8);
    g.initializer("b", Tensor::from_values<uint8_t>({k, n}, bv));
    auto scalar = [&](const std::string& name, auto v) {
        using V = decltype(v);
        g.initializer(name, Tensor::from_values<V>({}, std::vector<V>{v}));
    };
    scalar("sa", sa);
    scalar("za", za);
    scalar("sb", sb);
    scalar("zb", zb);
    scalar("sy", sy);
    scalar("zy", zy);
    g.node("QLinearMatMul", {"a", "sa", "za", "b", "sb", "zb", "sy", "zy"}, {"y"});
    const auto model = g.build();
    Executor executor(model, {.threads = 1});
    const auto y = executor.run({{"a", Tensor::from_values<uint8_t>({batch, m, k}, av)}})[0];
    const auto out = y.data<uint8_t>();
    const float multiplier = sa * sb / sy;
    int checked = 0, saturated = 0;
    for (int64_t p = 0; p < batch; ++p)
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
                int32_t acc = 0;
                for (int64_t q = 0; q < k; ++q)
                    acc += (av[(p * m + i) * k + q] - za) * (bv[q * n + j] - zb);
                const float r = std::nearbyint(static_cast<float>(acc) * multiplier) + zy;
                const auto expected = static_cast<uint8_t>(std::clamp(r, 0.0f, 255.0f));
                EXPECT_EQ(out[(p * m + i) * n + j], expected) << p << " " << i << " " << j;
                saturated += expected == 0 || expected == 255;
                ++checked;
            }
    EXPECT_EQ(checked, batch * m * n);
    EXPECT_LT(saturated, checked / 2) << "the values should mostly be inside the range";
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

// Every listed tensor (and the output y) with and without the executor's
// rewrites, within `tolerance`; the run counts per op type with them.
std::map<std::string, int64_t> compare_rewrites(const vaiq::Model& model, const Tensor& x,
                                                const std::vector<std::string>& taps, float tolerance,
                                                bool taps_known = false, int threads = 1) {
    Executor plain(model, {.threads = 1, .optimize_layout = false, .fuse_patterns = false});
    vaiq::runtime::ExecutorOptions options{.threads = threads, .profile = true};
    if (taps_known) options.taps.insert(taps.begin(), taps.end());
    Executor rewritten(model, options);
    std::map<std::string, Tensor> a, b;
    a["y"] = plain.run({{"x", x}}, taps, [&](const std::string& n, const Tensor& t) { a[n] = t; })[0];
    b["y"] = rewritten.run({{"x", x}}, taps, [&](const std::string& n, const Tensor& t) { b[n] = t; })[0];
    EXPECT_EQ(b.size(), taps.size() + 1);
    for (const auto& [name, t] : a) {
        EXPECT_EQ(b[name].shape(), t.shape()) << name;
        const auto p = t.data<float>(), q = b[name].data<float>();
        for (size_t i = 0; i < p.size() && i < q.size(); ++i) EXPECT_NEAR(p[i], q[i], tolerance) << name << "[" << i << "]";
    }
    std::map<std::string, int64_t> calls;
    for (const auto& p : rewritten.profile()) calls[p.op_type] = p.calls;
    return calls;
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
    vaiq::test::set_int_attribute(dw, "group", expanded);
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
                    SCOPED_TRACE(fmt::format("{} channels, stride {}, {}x{}, {} threads", expanded, stride, size, size, threads));
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
                SCOPED_TRACE(fmt::format("skip {}, {} channels, {} threads", static_cast<int>(skip), expanded, threads));
                const auto model = inverted_residual(1, 1, 11, expanded, skip);
                const Tensor x = vaiq::test::ramp({1, 3, 11, 11}, -1.0f, 0.005f);
                const auto calls = compare_rewrites(model, x, {}, 1e-4f, false, threads);
                EXPECT_EQ(calls.at("NhwcConvDepthwise"), 1);
                EXPECT_EQ(calls.count("Add"), 0u);
                EXPECT_EQ(calls.at("NhwcConv"), skip == Skip::convolution ? 2 : 1) << "only the 1x1 convolutions before";
            }
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

// y = Gelu(x) spelled out as PyTorch exports it (x / sqrt2, Erf, + one, x *, * half);
// the scalars sqrt2, one and half must exist. `product` names x * (erf + 1).
void spell_out_gelu(vaiq::test::GraphBuilder& b, const std::string& x, const std::string& y, const std::string& product) {
    b.node("Div", {x, "sqrt2"}, {x + "_sqrt2"});
    b.node("Erf", {x + "_sqrt2"}, {"erf"});
    b.node("Add", {"erf", "one"}, {"erf1"});
    b.node("Mul", {x, "erf1"}, {product});
    b.node("Mul", {product, "half"}, {y});
}

// LayerNorm and Gelu as PyTorch exports them at opset 13, Constant nodes included.
vaiq::Model spelled_out_block() {
    vaiq::test::GraphBuilder b;
    b.input("x", {2, 3, 8}).output("y", {2, 3, 8});
    auto scalar = [&](const std::string& name, float v) {
        auto& c = b.node("Constant", {}, {name});
        auto* a = c.add_attribute();
        a->set_name("value");
        a->set_type(onnx::AttributeProto::TENSOR);
        *a->mutable_t() = Tensor::from_values<float>({}, std::vector<float>{v}).to_proto(name);
    };
    scalar("two", 2.0f);
    scalar("eps", 1e-5f);
    scalar("sqrt2", 1.4142135f);
    scalar("one", 1.0f);
    scalar("half", 0.5f);
    b.initializer("gamma", vaiq::test::ramp({8}, 0.5f, 0.1f));
    b.initializer("beta", vaiq::test::ramp({8}, -0.3f, 0.05f));
    vaiq::test::set_ints_attribute(b.node("ReduceMean", {"x"}, {"mean"}), "axes", {-1});
    b.node("Sub", {"x", "mean"}, {"centred"});
    b.node("Pow", {"centred", "two"}, {"squared"});
    vaiq::test::set_ints_attribute(b.node("ReduceMean", {"squared"}, {"variance"}), "axes", {-1});
    b.node("Add", {"variance", "eps"}, {"variance_eps"});
    b.node("Sqrt", {"variance_eps"}, {"deviation"});
    b.node("Div", {"centred", "deviation"}, {"normed"});
    b.node("Mul", {"normed", "gamma"}, {"scaled"});
    b.node("Add", {"scaled", "beta"}, {"ln"});
    spell_out_gelu(b, "ln", "y", "product");
    return b.build();
}

TEST(Executor, SpelledOutLayerNormAndGeluRunAsOneKernelEach) {
    const auto model = spelled_out_block();
    const Tensor x = vaiq::test::ramp({2, 3, 8}, -2.0f, 0.09f);
    auto calls = compare_rewrites(model, x, {}, 1e-5f);
    EXPECT_EQ(calls["LayerNormalization"], 1);
    EXPECT_EQ(calls["Gelu"], 1);
    EXPECT_EQ(calls.count("ReduceMean") + calls.count("Erf") + calls.count("Pow"), 0u);
    // Every intermediate stays tappable: its nodes then run too.
    calls = compare_rewrites(model, x, {"mean", "normed", "ln", "erf", "product"}, 1e-5f);
    EXPECT_EQ(calls["Erf"], 1);
    EXPECT_EQ(calls["ReduceMean"], 2);
    // Known beforehand, a tap inside a pattern keeps that pattern spelled out; the other still fuses.
    calls = compare_rewrites(model, x, {"erf"}, 1e-5f, true);
    EXPECT_EQ(calls["Erf"], 1);
    EXPECT_EQ(calls.count("Gelu"), 0u);
    EXPECT_EQ(calls["LayerNormalization"], 1);
}

// A linear layer as exported for 3-D inputs: MatMul by a weight, then Add of a
// bias. The bias goes into the product; a tap of the product still works.
TEST(Executor, ABiasAddedToAMatMulByAWeightRunsInsideIt) {
    vaiq::test::GraphBuilder b;
    b.input("x", {2, 3, 4}).output("y", {2, 3, 5});
    b.initializer("w", vaiq::test::ramp({4, 5}, -0.6f, 0.07f));
    b.initializer("bias", vaiq::test::ramp({5}, 0.25f, -0.2f));
    b.node("MatMul", {"x", "w"}, {"product"});
    b.node("Add", {"bias", "product"}, {"y"});
    const auto model = b.build();
    const Tensor x = vaiq::test::ramp({2, 3, 4}, -1.0f, 0.11f);
    auto calls = compare_rewrites(model, x, {}, 1e-6f);
    EXPECT_EQ(calls.count("Add"), 0u);
    EXPECT_EQ(calls.at("MatMul"), 1);
    calls = compare_rewrites(model, x, {"product"}, 1e-6f);
    EXPECT_EQ(calls.at("MatMul"), 2) << "the tap runs the plain product too";
    calls = compare_rewrites(model, x, {"product"}, 1e-6f, true);
    EXPECT_EQ(calls.at("Add"), 1) << "known beforehand, the tapped product is not fused away";
}

// MatMul by a weight, bias Add, spelled-out Gelu (a transformer's MLP), and
// with `quantized` a QuantizeLinear/DequantizeLinear pair after it.
vaiq::Model matmul_gelu(bool quantized) {
    vaiq::test::GraphBuilder b;
    b.input("x", {2, 5, 8}).output("y", {2, 5, 12});
    b.initializer("w", vaiq::test::ramp({8, 12}, -0.6f, 0.013f));
    b.initializer("bias", vaiq::test::ramp({12}, 0.25f, -0.05f));
    for (const auto& [name, v] : {std::pair{"sqrt2", 1.4142135f}, {"one", 1.0f}, {"half", 0.5f}, {"scale", 0.01f}})
        b.initializer(name, Tensor::from_values<float>({}, std::vector<float>{v}));
    b.initializer("zero", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{128}));
    b.node("MatMul", {"x", "w"}, {"product"});
    b.node("Add", {"product", "bias"}, {"h"});
    spell_out_gelu(b, "h", quantized ? "g" : "y", "doubled");
    if (quantized) {
        b.node("QuantizeLinear", {"g", "scale", "zero"}, {"q"});
        b.node("DequantizeLinear", {"q", "scale", "zero"}, {"y"});
    }
    return b.build();
}

TEST(Executor, AGeluAfterAMatMulRunsInsideIt) {
    const Tensor x = vaiq::test::ramp({2, 5, 8}, -2.0f, 0.05f);
    auto calls = compare_rewrites(matmul_gelu(false), x, {}, 1e-5f);
    EXPECT_EQ(calls.at("MatMul"), 1);
    EXPECT_EQ(calls.count("Gelu") + calls.count("Erf") + calls.count("Add"), 0u) << "oneDNN's Gelu as it writes";
    calls = compare_rewrites(matmul_gelu(false), x, {"h"}, 1e-5f, true);
    EXPECT_EQ(calls.at("Gelu"), 1) << "the product tapped: it stays, and so does the Gelu kernel";
    // In a model that quantizes, the fused Gelu is MLAS's, to the bit: what the Gelu kernel computes.
    const auto model = matmul_gelu(true);
    vaiq::runtime::ExecutorOptions options{.threads = 1, .profile = true};
    Executor fused(model, options);
    options.taps = {"h"};
    Executor separate(model, options);
    Tensor a, b;
    fused.run({{"x", x}}, {"g"}, [&](const std::string&, const Tensor& t) { a = t; });
    separate.run({{"x", x}}, {"g"}, [&](const std::string&, const Tensor& t) { b = t; });
    std::map<std::string, int64_t> fused_calls;
    for (const auto& p : fused.profile()) fused_calls[p.op_type] = p.calls;
    EXPECT_EQ(fused_calls.count("Gelu"), 0u);
    ASSERT_EQ(a.size(), b.size());
    for (int64_t i = 0; i < a.size(); ++i) ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]) << i;
}

// Gemm with one or two rows of A (a classifier at batch 1 or 2), B plain and
// transposed, with C, against the sums computed here.
TEST(Executor, GemmOfAFewRowsMatchesTheDefinition) {
    const int64_t k = 37, n = 19;
    for (const int64_t m : {1, 2})
        for (const bool tb : {false, true}) {
            vaiq::test::GraphBuilder b;
            b.input("a", {m, k}).output("y", {m, n});
            const Tensor bv = vaiq::test::ramp(tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, -1.0f, 0.003f);
            const Tensor cv = vaiq::test::ramp({n}, 0.5f, -0.05f);
            b.initializer("b", bv).initializer("c", cv);
            vaiq::test::set_int_attribute(b.node("Gemm", {"a", "b", "c"}, {"y"}), "transB", tb ? 1 : 0);
            const auto model = b.build();
            const Tensor av = vaiq::test::ramp({m, k}, 0.7f, -0.021f);
            const auto y = Executor(model, {.threads = 2}).run({{"a", av}})[0];
            ASSERT_EQ(y.shape(), (std::vector<int64_t>{m, n}));
            for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j) {
                    double sum = cv.data<float>()[j];
                    for (int64_t q = 0; q < k; ++q)
                        sum += double(av.data<float>()[i * k + q]) * bv.data<float>()[tb ? j * k + q : q * n + j];
                    EXPECT_NEAR(y.data<float>()[i * n + j], sum, 1e-5) << m << " " << tb << " " << i << " " << j;
                }
        }
}

// Dense 3x3 convolutions of stride 1 (Winograd's, from 16 channels in and out;
// direct below), plain and NHWC with a fused Relu, Relu6 (which keeps them
// direct) or nothing, against the sums computed here.
TEST(Executor, DenseThreeByThreeConvolutionsMatchTheDefinition) {
    struct Case {
        int64_t c, m;
        std::string activation;  // "", "Relu" or "Clip" (0..6)
    };
    for (const auto& k : {Case{16, 32, ""}, Case{16, 32, "Relu"}, Case{32, 16, "Clip"}, Case{8, 8, "Relu"}})
        for (const bool layout : {false, true}) {
            SCOPED_TRACE(fmt::format("{} -> {} channels, '{}', layout {}", k.c, k.m, k.activation, layout));
            const int64_t n = 2, h = 9, w = 11;
            vaiq::test::GraphBuilder b;
            b.input("x", {n, k.c, h, w}).output("y", {n, k.m, h, w});
            std::mt19937 rng(7);
            std::uniform_real_distribution<float> u(-1.0f, 1.0f);
            auto random = [&](std::vector<int64_t> shape) {
                std::vector<float> v(vaiq::element_count(shape));
                for (float& e : v) e = u(rng);
                return Tensor::from_values<float>(shape, v);
            };
            const Tensor wv = random({k.m, k.c, 3, 3}), bv = random({k.m}), xv = random({n, k.c, h, w});
            b.initializer("w", wv).initializer("b", bv);
            b.initializer("lo", Tensor::from_values<float>({}, std::vector<float>{0.0f}));
            b.initializer("hi", Tensor::from_values<float>({}, std::vector<float>{6.0f}));
            auto& conv = b.node("Conv", {"x", "w", "b"}, {k.activation.empty() ? "y" : "c"});
            vaiq::test::set_ints_attribute(conv, "pads", {1, 1, 1, 1});
            if (k.activation == "Relu") b.node("Relu", {"c"}, {"y"});
            if (k.activation == "Clip") b.node("Clip", {"c", "lo", "hi"}, {"y"});
            const auto model = b.build();
            const auto y = Executor(model, {.threads = 2, .optimize_layout = layout}).run({{"x", xv}})[0];
            ASSERT_EQ(y.shape(), (std::vector<int64_t>{n, k.m, h, w}));
            const auto x = xv.data<float>(), wt = wv.data<float>();
            for (int64_t i = 0; i < n; ++i)
                for (int64_t o = 0; o < k.m; ++o)
                    for (int64_t r = 0; r < h; ++r)
                        for (int64_t q = 0; q < w; ++q) {
                            double sum = bv.data<float>()[o];
                            for (int64_t ci = 0; ci < k.c; ++ci)
                                for (int64_t dr = 0; dr < 3; ++dr)
                                    for (int64_t dq = 0; dq < 3; ++dq) {
                                        const int64_t rr = r + dr - 1, qq = q + dq - 1;
                                        if (rr < 0 || rr >= h || qq < 0 || qq >= w) continue;
                                        sum += double(x[((i * k.c + ci) * h + rr) * w + qq]) *
                                               wt[((o * k.c + ci) * 3 + dr) * 3 + dq];
                                    }
                            if (k.activation == "Relu") sum = std::max(sum, 0.0);
                            if (k.activation == "Clip") sum = std::clamp(sum, 0.0, 6.0);
                            const int64_t at = ((i * k.m + o) * h + r) * w + q;
                            ASSERT_NEAR(y.data<float>()[at], sum, 1e-4) << at;
                        }
        }
}

TEST(Executor, TransposesThatSwapBlocksOfAxesOrKeepTheOrder) {
    // [2, 3, 1, 5] -> NHWC [2, 1, 5, 3] (a block swap), [3, 1, 4] -> [1, 3, 4] (no move), a matrix and a
    // scalar, float and uint8.
    struct Case {
        std::vector<int64_t> shape, perm;
    };
    // Then matrices of whole 16x16 blocks and remainders on both sides (floats move as blocks in registers).
    for (const auto& c : {Case{{2, 3, 1, 5}, {0, 2, 3, 1}}, Case{{3, 1, 4}, {1, 0, 2}}, Case{{4, 6}, {1, 0}},
                          Case{{}, {}}, Case{{3, 40, 35}, {0, 2, 1}}, Case{{33, 64}, {1, 0}}}) {
        for (const auto type : {DataType::Float, DataType::UInt8}) {
            if (type == DataType::UInt8 && vaiq::element_count(c.shape) > 255) continue;  // values are the indices
            vaiq::test::GraphBuilder b;
            std::vector<int64_t> out_shape;
            for (auto p : c.perm) out_shape.push_back(c.shape[p]);
            b.input("x", c.shape, type).output("y", out_shape, type);
            vaiq::test::set_ints_attribute(b.node("Transpose", {"x"}, {"y"}), "perm", c.perm);
            const auto model = b.build();
            const int64_t count = vaiq::element_count(c.shape);
            std::vector<float> values(count);
            std::iota(values.begin(), values.end(), 1.0f);  // each element is its input index + 1
            const Tensor x = type == DataType::Float
                                 ? Tensor::from_values<float>(c.shape, values)
                                 : Tensor::from_values<uint8_t>(c.shape, std::vector<uint8_t>(values.begin(), values.end()));
            const auto y = Executor(model, {.threads = 1}).run({{"x", x}})[0];
            ASSERT_EQ(y.shape(), out_shape);
            std::vector<int64_t> in_strides(c.shape.size(), 1);
            for (int d = static_cast<int>(c.shape.size()) - 2; d >= 0; --d) in_strides[d] = in_strides[d + 1] * c.shape[d + 1];
            for (int64_t i = 0; i < y.size(); ++i) {
                int64_t rest = i, at = 0;
                for (int d = static_cast<int>(out_shape.size()) - 1; d >= 0; --d) {
                    at += (rest % out_shape[d]) * in_strides[c.perm[d]];
                    rest /= out_shape[d];
                }
                const float got = type == DataType::Float ? y.data<float>()[i] : y.data<uint8_t>()[i];
                ASSERT_EQ(got, static_cast<float>(at + 1)) << i;
            }
        }
    }
}

TEST(Executor, QLinearAddRequantizesLikeOnnxRuntime) {
    // a = (q - 128) * 0.5, b = (q - 0) * 0.25, c = round((a + b) / 1.0) + 10, saturated to uint8.
    vaiq::test::GraphBuilder b;
    b.input("a", {4}, DataType::UInt8).input("b", {4}, DataType::UInt8).output("c", {4}, DataType::UInt8);
    auto scalar = [&](const std::string& name, auto v) {
        using V = decltype(v);
        b.initializer(name, Tensor::from_values<V>({}, std::vector<V>{v}));
    };
    scalar("sa", 0.5f);
    scalar("za", uint8_t{128});
    scalar("sb", 0.25f);
    scalar("zb", uint8_t{0});
    scalar("sc", 1.0f);
    scalar("zc", uint8_t{10});
    b.node("QLinearAdd", {"a", "sa", "za", "b", "sb", "zb", "sc", "zc"}, {"c"}, "add").set_domain("com.microsoft");
    auto model = b.build();
    auto* ms = model.proto().add_opset_import();
    ms->set_domain("com.microsoft");
    ms->set_version(1);
    Executor e(model);
    const auto out = e.run({{"a", Tensor::from_values<uint8_t>({4}, std::vector<uint8_t>{128, 130, 0, 255})},
                            {"b", Tensor::from_values<uint8_t>({4}, std::vector<uint8_t>{0, 2, 4, 255})}})[0];
    // 0 + 0 -> 10; 1 + 0.5 = 1.5 -> 2 (half to even) -> 12; -64 + 1 -> -63 -> 0 (saturated); 63.5 + 63.75 = 127.25 -> 137
    EXPECT_EQ(std::vector<uint8_t>(out.data<uint8_t>().begin(), out.data<uint8_t>().end()),
              (std::vector<uint8_t>{10, 12, 0, 137}));
}

TEST(Npy, ReadsTheFormatAsSpecified) {
    // A (2, 3) int16 array as numpy writes it: magic, version 1.0, header, data.
    std::string header = "{'descr': '<i2', 'fortran_order': False, 'shape': (2, 3), }";
    header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');  // data starts 64-byte aligned
    header += '\n';
    std::string bytes = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size()) + '\0' + header;
    for (int16_t v : {1, -2, 3, -4, 5, 300}) bytes.append(reinterpret_cast<const char*>(&v), 2);
    const auto file = vaiq::test::temp_dir() / "a.npy";
    std::ofstream(file, std::ios::binary) << bytes;
    const Tensor t = vaiq::read_npy(file);
    EXPECT_EQ(t.type(), DataType::Int16);
    EXPECT_EQ(t.shape(), (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(t.data<int16_t>()[5], 300);
    // And writes what it reads.
    vaiq::write_npy(file.parent_path() / "b.npy", t);
    const Tensor back = vaiq::read_npy(file.parent_path() / "b.npy");
    EXPECT_EQ(back.shape(), t.shape());
    EXPECT_TRUE(std::equal(back.bytes().begin(), back.bytes().end(), t.bytes().begin()));
}

TEST(Npy, RejectsBadFiles) {
    const auto dir = vaiq::test::temp_dir();
    std::ofstream(dir / "junk.npy") << "not numpy";
    EXPECT_NE(error_of([&] { vaiq::read_npy(dir / "junk.npy"); }).find("not a .npy file"), std::string::npos);
    vaiq::write_npy(dir / "f.npy", vaiq::test::ramp({4, 4}));
    fs::resize_file(dir / "f.npy", fs::file_size(dir / "f.npy") - 8);
    EXPECT_NE(error_of([&] { vaiq::read_npy(dir / "f.npy"); }).find("holds fewer values"), std::string::npos);
}

TEST(Infer, BindsInputsRunsAndWritesOutputs) {
    const auto dir = vaiq::test::temp_dir();
    vaiq::save_model(vaiq::test::conv_relu_model(), dir / "m.onnx");
    vaiq::write_npy(dir / "x.npy", vaiq::test::ramp({1, 2, 4, 4}, -1.0f, 0.0625f));
    const auto r = vaiq::runtime::infer(dir / "m.onnx", {{(dir / "x.npy").string()}, dir / "out", 3, 1});
    EXPECT_LE(r.min_ms, r.median_ms);
    const Tensor written = vaiq::read_npy(dir / "out" / "output_0.npy");
    EXPECT_TRUE(std::equal(written.bytes().begin(), written.bytes().end(), r.outputs[0].bytes().begin()));
    const auto named = vaiq::runtime::infer(dir / "m.onnx", {{"x=" + (dir / "x.npy").string()}, {}, 1, 1});
    EXPECT_TRUE(std::equal(named.outputs[0].bytes().begin(), named.outputs[0].bytes().end(), r.outputs[0].bytes().begin()));
    EXPECT_NE(error_of([&] {
                  vaiq::runtime::infer(dir / "m.onnx", {{(dir / "x.npy").string(), (dir / "x.npy").string()}, {}, 1, 1});
              }).find("one input too many"),
              std::string::npos);
}

}  // namespace

namespace {

// QLinearConv on the int8 path against a brute-force loop, for uint8 and int8
// inputs with a non-zero zero point, padding (filled with that zero point),
// strides and groups: the integer sums must be exact.
struct ConvGeometry {
    int64_t n, c, h, w, m, group, k, stride, pad;
};

template <typename X>
void check_qlinear_conv(const ConvGeometry& geometry) {
    const auto [n, c, h, w, m, group, k, stride, pad] = geometry;
    const int64_t oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
    std::mt19937 rng(11);
    std::uniform_int_distribution<int> any(std::numeric_limits<X>::min(), std::numeric_limits<X>::max());
    std::uniform_int_distribution<int> weight(-127, 127);
    std::vector<X> x(n * c * h * w);
    std::vector<int8_t> wt(m * (c / group) * k * k);
    std::vector<int32_t> bias(m);
    for (auto& v : x) v = static_cast<X>(any(rng));
    for (auto& v : wt) v = static_cast<int8_t>(weight(rng));
    for (auto& v : bias) v = weight(rng) * 100;
    const X zx = static_cast<X>(std::is_signed_v<X> ? -5 : 37);
    const float sx = 0.02f, sw = 0.003f, sy = 0.05f;
    const X zy = static_cast<X>(std::is_signed_v<X> ? 3 : 120);

    vaiq::test::GraphBuilder b;
    constexpr DataType xt = vaiq::data_type_of<X>();
    b.input("x", {n, c, h, w}, xt).output("y", {n, m, oh, ow}, xt);
    b.initializer("sx", Tensor::from_values<float>({}, std::vector<float>{sx}));
    b.initializer("zx", Tensor::from_values<X>({}, std::vector<X>{zx}));
    b.initializer("w", Tensor::from_values<int8_t>({m, c / group, k, k}, wt));
    b.initializer("sw", Tensor::from_values<float>({}, std::vector<float>{sw}));
    b.initializer("zw", Tensor::from_values<int8_t>({}, std::vector<int8_t>{0}));
    b.initializer("sy", Tensor::from_values<float>({}, std::vector<float>{sy}));
    b.initializer("zy", Tensor::from_values<X>({}, std::vector<X>{zy}));
    b.initializer("bias", Tensor::from_values<int32_t>({m}, bias));
    auto& conv = b.node("QLinearConv", {"x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "bias"}, {"y"}, "conv");
    vaiq::test::set_ints_attribute(conv, "pads", {pad, pad, pad, pad});
    vaiq::test::set_ints_attribute(conv, "strides", {stride, stride});
    vaiq::test::set_int_attribute(conv, "group", group);
    const auto model = b.build();
    Executor e(model);
    const Tensor y = e.run({{"x", Tensor::from_values<X>({n, c, h, w}, x)}})[0];
    const auto got = y.template data<X>();

    const float multiplier = sx * sw / sy;
    const int64_t cg = c / group, mg = m / group;
    size_t mismatches = 0;
    for (int64_t bn = 0; bn < n; ++bn)
        for (int64_t oc = 0; oc < m; ++oc)
            for (int64_t i = 0; i < oh; ++i)
                for (int64_t j = 0; j < ow; ++j) {
                    int32_t acc = bias[oc];
                    for (int64_t ic = 0; ic < cg; ++ic)
                        for (int64_t ki = 0; ki < k; ++ki)
                            for (int64_t kj = 0; kj < k; ++kj) {
                                const int64_t r = i * stride - pad + ki, s = j * stride - pad + kj;
                                if (r < 0 || r >= h || s < 0 || s >= w) continue;
                                const int64_t channel = (oc / mg) * cg + ic;
                                acc += (static_cast<int32_t>(x[((bn * c + channel) * h + r) * w + s]) - zx) *
                                       wt[((oc * cg + ic) * k + ki) * k + kj];
                            }
                    const X want = vaiq::quantize_value<X>(static_cast<float>(acc) * multiplier, static_cast<double>(zy));
                    mismatches += got[((bn * m + oc) * oh + i) * ow + j] != want;
                }
    EXPECT_EQ(mismatches, 0u) << "of " << got.size();
}

TEST(Executor, QLinearConvIsExactForUint8AndInt8Inputs) {
    // Small and grouped; then 18x19 outputs of 20 channels, whose sums come out
    // channels-last in 16x16 blocks and remainders on both sides.
    for (const auto& geometry : {ConvGeometry{2, 4, 7, 6, 6, 2, 3, 2, 1}, ConvGeometry{2, 8, 18, 19, 20, 1, 3, 1, 1}}) {
        check_qlinear_conv<uint8_t>(geometry);
        check_qlinear_conv<int8_t>(geometry);
    }
}

}  // namespace

namespace {

// x -> Q -> DQ -> Conv(DQ(w), DQ(b)) -> Clip(0, clip_max) -> Q -> DQ -> y, as the qdq format writes it.
vaiq::Model qdq_conv(float clip_max) {
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 2, 5, 5}).output("y", {1, 3, 5, 5});
    auto scalar = [&](const std::string& name, auto v) {
        using V = decltype(v);
        b.initializer(name, Tensor::from_values<V>({}, std::vector<V>{v}));
    };
    scalar("sx", 0.02f);
    scalar("zx", uint8_t{128});
    scalar("sw", 0.01f);
    scalar("zw", int8_t{0});
    scalar("sb", 0.0002f);
    scalar("zb", int32_t{0});
    scalar("sy", 6.0f / 255.0f);
    scalar("zy", uint8_t{0});
    scalar("lo", 0.0f);
    scalar("hi", clip_max);
    std::vector<int8_t> w(3 * 2 * 3 * 3);
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<int8_t>(static_cast<int>(i * 7 % 61) - 30);
    b.initializer("wq", Tensor::from_values<int8_t>({3, 2, 3, 3}, w));
    b.initializer("bq", Tensor::from_values<int32_t>({3}, std::vector<int32_t>{500, -300, 1000}));
    b.node("QuantizeLinear", {"x", "sx", "zx"}, {"xq"});
    b.node("DequantizeLinear", {"xq", "sx", "zx"}, {"xd"});
    b.node("DequantizeLinear", {"wq", "sw", "zw"}, {"wd"});
    b.node("DequantizeLinear", {"bq", "sb", "zb"}, {"bd"});
    vaiq::test::set_ints_attribute(b.node("Conv", {"xd", "wd", "bd"}, {"c"}, "conv"), "pads", {1, 1, 1, 1});
    b.node("Clip", {"c", "lo", "hi"}, {"r"}, "clip");
    b.node("QuantizeLinear", {"r", "sy", "zy"}, {"rq"});
    b.node("DequantizeLinear", {"rq", "sy", "zy"}, {"y"});
    return b.build();
}

std::string tap_error(Executor& e, const Tensor& x, const std::string& tensor) {
    try {
        e.run({{"x", x}}, {tensor}, [](const std::string&, const Tensor&) {});
    } catch (const vaiq::InputError& err) {
        return err.what();
    }
    return "";
}

TEST(QdqFusion, RunsDqConvClipQAsQLinearConvWhenQMakesTheClipRedundant) {
    const auto x = vaiq::test::ramp({1, 2, 5, 5}, -2.0f, 0.07f);
    const auto model = qdq_conv(6.0f);
    Executor fused(model), plain(model, {.fuse_qdq = false});
    EXPECT_NE(tap_error(fused, x, "c").find("inside an integer operator"), std::string::npos);
    EXPECT_EQ(tap_error(plain, x, "c"), "");
    // Same values as the integer kernel computes them: every element within one step.
    const auto a = fused.run({{"x", x}})[0], b = plain.run({{"x", x}})[0];
    for (int64_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a.data<float>()[i], b.data<float>()[i], 6.0f / 255.0f * 1.01f);
    // A Clip that cuts inside Q's range is not redundant: nothing is fused.
    const auto tight = qdq_conv(3.0f);
    Executor kept(tight);
    EXPECT_EQ(tap_error(kept, x, "c"), "");
}

}  // namespace

namespace {

// DQ -> Pad(zeros) -> AveragePool -> Q: ONNX Runtime folds the Pad into the pool
// (count_include_pad) and runs QLinearAveragePool; so does vaiq.
TEST(QdqFusion, FoldsAZeroPadIntoQLinearAveragePool) {
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 2, 4, 4}).output("y", {1, 2, 3, 3});
    b.initializer("s", Tensor::from_values<float>({}, std::vector<float>{0.05f}));
    b.initializer("z", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{10}));
    b.initializer("pads", Tensor::from_values<int64_t>({8}, std::vector<int64_t>{0, 0, 1, 1, 0, 0, 1, 1}));
    b.node("QuantizeLinear", {"x", "s", "z"}, {"xq"});
    b.node("DequantizeLinear", {"xq", "s", "z"}, {"xd"});
    b.node("Pad", {"xd", "pads"}, {"p"}, "pad");
    auto& pool = b.node("AveragePool", {"p"}, {"a"}, "pool");
    vaiq::test::set_ints_attribute(pool, "kernel_shape", {2, 2});
    vaiq::test::set_ints_attribute(pool, "strides", {2, 2});
    b.node("QuantizeLinear", {"a", "s", "z"}, {"aq"});
    b.node("DequantizeLinear", {"aq", "s", "z"}, {"y"});
    const auto model = b.build();
    const auto x = vaiq::test::ramp({1, 2, 4, 4}, -0.3f, 0.05f);
    Executor fused(model), plain(model, {.fuse_qdq = false});
    EXPECT_NE(tap_error(fused, x, "p").find("inside an integer operator"), std::string::npos);
    const auto a = fused.run({{"x", x}})[0], c = plain.run({{"x", x}})[0];
    ASSERT_EQ(a.shape(), (std::vector<int64_t>{1, 2, 3, 3}));
    for (int64_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a.data<float>()[i], c.data<float>()[i], 0.0501f) << i;
}

}  // namespace

namespace {

vaiq::Model contrib_model(vaiq::test::GraphBuilder& b) {
    auto model = b.build();
    auto* ms = model.proto().add_opset_import();
    ms->set_domain("com.microsoft");
    ms->set_version(1);
    return model;
}

TEST(Executor, QGemmAddsTheInt32BiasAndRequantizesPerColumn) {
    // A = [[130, 126]] (zp 128 -> [2, -2]), B^T = [[1, 2], [3, -4]] int8, C = [10, -10].
    // Sums: [2*1 - 2*2 + 10, 2*3 + 2*4 - 10] = [8, 4]; scales 0.5 * [0.25, 0.5] / 0.125 -> [1, 2].
    vaiq::test::GraphBuilder b;
    b.input("a", {1, 2}, DataType::UInt8).output("y", {1, 2}, DataType::UInt8);
    b.initializer("sa", Tensor::from_values<float>({}, std::vector<float>{0.5f}));
    b.initializer("za", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{128}));
    b.initializer("w", Tensor::from_values<int8_t>({2, 2}, std::vector<int8_t>{1, 2, 3, -4}));
    b.initializer("sw", Tensor::from_values<float>({2}, std::vector<float>{0.25f, 0.5f}));
    b.initializer("zw", Tensor::from_values<int8_t>({2}, std::vector<int8_t>{0, 0}));
    b.initializer("c", Tensor::from_values<int32_t>({2}, std::vector<int32_t>{10, -10}));
    b.initializer("sy", Tensor::from_values<float>({}, std::vector<float>{0.125f}));
    b.initializer("zy", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{100}));
    auto& g = b.node("QGemm", {"a", "sa", "za", "w", "sw", "zw", "c", "sy", "zy"}, {"y"}, "qgemm");
    g.set_domain("com.microsoft");
    vaiq::test::set_int_attribute(g, "transB", 1);
    const auto model = contrib_model(b);
    Executor e(model);
    const auto y = e.run({{"a", Tensor::from_values<uint8_t>({1, 2}, std::vector<uint8_t>{130, 126})}})[0];
    EXPECT_EQ(y.data<uint8_t>()[0], 108);  // 8 * 1 + 100
    EXPECT_EQ(y.data<uint8_t>()[1], 108);  // 4 * 2 + 100
}

TEST(Executor, QLinearSoftmaxRowsSumToOneStep) {
    vaiq::test::GraphBuilder b;
    b.input("x", {2, 4}, DataType::UInt8).output("y", {2, 4}, DataType::UInt8);
    b.initializer("sx", Tensor::from_values<float>({}, std::vector<float>{0.1f}));
    b.initializer("zx", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{0}));
    b.initializer("sy", Tensor::from_values<float>({}, std::vector<float>{1.0f / 256.0f}));
    b.initializer("zy", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{0}));
    auto& s = b.node("QLinearSoftmax", {"x", "sx", "zx", "sy", "zy"}, {"y"}, "softmax");
    s.set_domain("com.microsoft");
    vaiq::test::set_int_attribute(s, "opset", 13);
    const auto model = contrib_model(b);
    Executor e(model);
    const auto y = e.run({{"x", Tensor::from_values<uint8_t>({2, 4}, std::vector<uint8_t>{0, 10, 20, 30, 5, 5, 5, 5})}})[0];
    const auto v = y.data<uint8_t>();
    // Row 2 is uniform: 256 / 4 = 64 each. Row 1: softmax([0, 1, 2, 3]) * 256, rounded.
    for (int j = 4; j < 8; ++j) EXPECT_EQ(v[j], 64);
    const double denom = 1 + std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
    for (int j = 0; j < 4; ++j) EXPECT_NEAR(v[j], std::exp(double(j)) / denom * 256, 0.51) << j;
}

}  // namespace

namespace {

// The fast exp path (AVX-512 where the CPU has it) against a plain transcription
// of the same MLAS steps with std::ldexp for the final scaling, over the whole
// reduced range, and its sum against MLAS's lane order.
// The row maximum Softmax shifts by, wherever it sits: in a whole block of 16 or in the tail.
TEST(OrtSoftmax, RowMaximumFindsEveryPosition) {
    for (int64_t n = 1; n <= 40; ++n)
        for (int64_t at = 0; at < n; ++at) {
            std::vector<float> row(n);
            for (int64_t j = 0; j < n; ++j) row[j] = -100.0f - static_cast<float>(j);
            row[at] = -1.5f;
            ASSERT_EQ(vaiq::runtime::ort_row_max(row.data(), n), -1.5f) << n << " " << at;
        }
}

TEST(OrtSoftmax, FastScalingEqualsLdexpEverywhere) {
    std::vector<float> in;
    for (float v = -110.0f; v <= 0.0f; v += 0.0137f) in.push_back(v);
    ASSERT_NE(in.size() % 16, 0u) << "the last block should be partial";
    std::vector<float> out(in.size());
    const float sum = vaiq::runtime::ort_sum_exp(in.data(), out.data(), static_cast<int64_t>(in.size()), 0.0f);
    // The sum: element j into lane j % 16 in order, then MLAS's fold of the lanes.
    float lanes[16] = {};
    for (size_t i = 0; i < out.size(); ++i) lanes[i % 16] += out[i];
    float a[8];
    for (int i = 0; i < 8; ++i) a[i] = lanes[i + 8] + lanes[i];
    EXPECT_EQ(sum, ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])));
    size_t differ = 0;
    for (size_t i = 0; i < in.size(); ++i) {
        float x = std::max(-103.9720840454f, in[i]);
        const float m = std::fma(x, 1.44269504088896341f, 12582912.0f) - 12582912.0f;
        x = std::fma(m, -6.93145752e-1f, x);
        x = std::fma(m, -1.42860677e-6f, x);
        float p = 0x1.694000p-10f;
        for (float c : {0x1.125edcp-7f, 0x1.555b5ap-5f, 0x1.555450p-3f, 0x1.fffff6p-2f, 1.0f, 1.0f}) p = std::fma(p, x, c);
        differ += std::ldexp(p, static_cast<int>(m)) != out[i];
    }
    EXPECT_EQ(differ, 0u) << "of " << in.size();
    EXPECT_NEAR(out.back(), std::exp(in.back()), 1e-6f);
}

}  // namespace

namespace {

// int8 activations: ONNX Runtime on x86 turns int8 Q/DQ pairs into uint8 ones
// (zero point + 128, same values) and then fuses as for uint8. A pair whose
// DequantizeLinear has several readers is left alone.
TEST(QdqFusion, Int8PairsBecomeUint8AndFuse) {
    auto build = [](bool shared) {
        vaiq::test::GraphBuilder b;
        b.input("x", {1, 2, 4, 4}).output("y", {1, 3, 4, 4});
        if (shared) b.output("xd_out", {1, 2, 4, 4});
        auto scalar = [&](const std::string& name, auto v) {
            using V = decltype(v);
            b.initializer(name, Tensor::from_values<V>({}, std::vector<V>{v}));
        };
        scalar("sx", 0.02f);
        scalar("zx", int8_t{3});
        scalar("sw", 0.01f);
        scalar("zw", int8_t{0});
        scalar("sy", 0.05f);
        scalar("zy", int8_t{-5});
        std::vector<int8_t> w(3 * 2 * 3 * 3);
        for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<int8_t>(static_cast<int>(i * 11 % 51) - 25);
        b.initializer("wq", Tensor::from_values<int8_t>({3, 2, 3, 3}, w));
        b.node("QuantizeLinear", {"x", "sx", "zx"}, {"xq"});
        b.node("DequantizeLinear", {"xq", "sx", "zx"}, {"xd"});
        if (shared) b.node("Identity", {"xd"}, {"xd_out"});
        b.node("DequantizeLinear", {"wq", "sw", "zw"}, {"wd"});
        vaiq::test::set_ints_attribute(b.node("Conv", {"xd", "wd"}, {"c"}, "conv"), "pads", {1, 1, 1, 1});
        b.node("QuantizeLinear", {"c", "sy", "zy"}, {"cq"});
        b.node("DequantizeLinear", {"cq", "sy", "zy"}, {"y"});
        return b.build();
    };
    const auto x = vaiq::test::ramp({1, 2, 4, 4}, -1.0f, 0.06f);
    const auto single = build(false);
    Executor fused(single), plain(single, {.fuse_qdq = false});
    EXPECT_NE(tap_error(fused, x, "c").find("inside an integer operator"), std::string::npos);
    const auto a = fused.run({{"x", x}})[0], c = plain.run({{"x", x}})[0];
    for (int64_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a.data<float>()[i], c.data<float>()[i], 0.0501f) << i;
    const auto shared = build(true);
    Executor kept(shared);
    EXPECT_EQ(tap_error(kept, x, "c"), "") << "the input pair stays int8, so the Conv stays float";
}

}  // namespace

namespace {

TEST(OrtFloat, SgemmSumsInPanelsOf128) {
    // K = 300: panels [0, 128), [128, 256), [256, 300), each a chain of fused multiply-adds.
    const int64_t m = 3, k = 300, n = 5;
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> a(m * k), b(k * n), c(m * n);
    for (auto& v : a) v = u(rng);
    for (auto& v : b) v = u(rng);
    vaiq::runtime::ort_sgemm(a.data(), b.data(), c.data(), m, k, n);
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
            float total = 0.0f;
            for (int64_t k0 = 0; k0 < k; k0 += 128) {
                float acc = 0.0f;
                for (int64_t p = k0; p < std::min<int64_t>(k, k0 + 128); ++p) acc = std::fma(a[i * k + p], b[p * n + j], acc);
                total = k0 == 0 ? acc : total + acc;
            }
            EXPECT_EQ(c[i * n + j], total) << i << "," << j;
        }
}

TEST(OrtFloat, RowSumAndErf) {
    std::vector<float> x(21);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 1.0f / static_cast<float>(i + 3);
    // 21 values: packets over [0, 16), one more packet [16, 20), then x[20].
    float p0[4], p1[4];
    for (int l = 0; l < 4; ++l) {
        p0[l] = x[l] + x[8 + l];
        p1[l] = x[4 + l] + x[12 + l];
        p0[l] = p0[l] + p1[l];
        p0[l] = p0[l] + x[16 + l];
    }
    const float want = ((p0[0] + p0[2]) + (p0[1] + p0[3])) + x[20];
    EXPECT_EQ(vaiq::runtime::ort_row_sum(x.data(), 21), want);
    std::vector<float> in{-4.0f, -1.0f, -0.5f, 0.0f, 0.3f, 0.921875f, 2.0f, 10.0f}, out(in.size());
    vaiq::runtime::ort_erf(in.data(), out.data(), static_cast<int64_t>(in.size()));
    for (size_t i = 0; i < in.size(); ++i) EXPECT_NEAR(out[i], std::erf(in[i]), 2e-7f) << in[i];
    EXPECT_EQ(out[3], 0.0f);
    EXPECT_NEAR(out[7], 1.0f, 2e-7f) << "clamped at |x| = 3.725 as MLAS does";
}

}  // namespace
