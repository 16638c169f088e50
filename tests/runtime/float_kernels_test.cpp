// Float kernels as ONNX Runtime computes them: fused LayerNorm/Gelu, MatMul, Gemm, Conv, Transpose, Softmax, MLAS
// arithmetic.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>

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

// y = Gelu(x) spelled out as PyTorch exports it (x / sqrt2, Erf, + one, x *, * half);
// the scalars sqrt2, one and half must exist. `product` names x * (erf + 1).
void spell_out_gelu(vaiq::test::GraphBuilder& b, const std::string& x, const std::string& y,
                    const std::string& product) {
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

    // The default domain spelt out ("ai.onnx") is the default domain: the same fusions.
    auto spelt = model;
    for (auto& node : *spelt.graph().mutable_node()) node.set_domain("ai.onnx");
    calls = compare_rewrites(spelt, x, {}, 1e-5f);
    EXPECT_EQ(calls["LayerNormalization"], 1);
    EXPECT_EQ(calls["Gelu"], 1);
}

// HardSwish as exported before opset 14 (x * Clip(x + 3, 0, 6) / 6, or * 1/6
// with the product's operands the other way round) between two convolutions:
// one kernel each, giving what the four nodes give bit for bit (with the
// constants they hold, here a float step off 3 and 6), channels-last between
// the convolutions.
TEST(Executor, SpelledOutHardSwishesRunAsOneKernelEachBitForBit) {
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 3, 6, 6}).output("y", {1, 3, 6, 6});
    b.initializer("w1", vaiq::test::ramp({3, 3, 1, 1}, -0.9f, 0.21f));
    b.initializer("w2", vaiq::test::ramp({3, 3, 1, 1}, 0.7f, -0.17f));
    b.initializer("three", Tensor::from_values<float>({}, std::vector<float>{std::nextafter(3.0f, 4.0f)}));
    b.initializer("six_off", Tensor::from_values<float>({}, std::vector<float>{std::nextafter(6.0f, 7.0f)}));
    b.initializer("zero", Tensor::from_values<float>({}, std::vector<float>{0.0f}));
    b.initializer("six", Tensor::from_values<float>({}, std::vector<float>{6.0f}));
    b.initializer("sixth", Tensor::from_values<float>({}, std::vector<float>{1.0f / 6.0f}));
    b.node("Conv", {"x", "w1"}, {"c1"});
    b.node("Add", {"c1", "three"}, {"a1"});
    b.node("Clip", {"a1", "zero", "six"}, {"k1"});
    b.node("Mul", {"c1", "k1"}, {"p1"});
    b.node("Div", {"p1", "six_off"}, {"h1"});
    b.node("Conv", {"h1", "w2"}, {"c2"});
    b.node("Add", {"three", "c2"}, {"a2"});
    b.node("Clip", {"a2", "zero", "six"}, {"k2"});
    b.node("Mul", {"k2", "c2"}, {"p2"});
    b.node("Mul", {"sixth", "p2"}, {"y"});
    const auto model = b.build();
    const Tensor x = vaiq::test::ramp({1, 3, 6, 6}, -9.0f, 0.173f);
    auto calls = compare_rewrites(model, x, {"h1"}, 0.0f);
    EXPECT_EQ(calls["HardSwish"], 2);
    EXPECT_EQ(calls.count("Clip") + calls.count("Div") + calls.count("Mul") + calls.count("Add"), 0u);
    EXPECT_EQ(calls["Transpose"], 3) << "channels-last from the input to the output (and back for the tap)";
    // A tap inside a pattern known beforehand keeps it spelled out.
    calls = compare_rewrites(model, x, {"k2"}, 0.0f, true);
    EXPECT_EQ(calls["HardSwish"], 1);
    EXPECT_EQ(calls["Clip"], 1);
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
            const Tensor bv =
                vaiq::test::ramp(tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, -1.0f, 0.003f);
            const Tensor cv = vaiq::test::ramp({n}, 0.5f, -0.05f);
            b.initializer("b", bv).initializer("c", cv);
            vaiq::test::set_attribute(b.node("Gemm", {"a", "b", "c"}, {"y"}), "transB", tb ? 1 : 0);
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

// A constant B whose rows are 4 KB apart is kept with padded rows (cache
// aliasing); the product is still the definition's.
TEST(Executor, AMatMulByAWeightOf1024ColumnsMatchesTheDefinition) {
    const int64_t m = 7, k = 37, n = 1024;
    vaiq::test::GraphBuilder b;
    b.input("a", {m, k}).output("y", {m, n});
    const Tensor bv = vaiq::test::ramp({k, n}, -1.0f, 0.00007f);
    b.initializer("b", bv);
    b.node("MatMul", {"a", "b"}, {"y"});
    const auto model = b.build();
    const Tensor av = vaiq::test::ramp({m, k}, 0.7f, -0.021f);
    Executor executor(model);
    for (int run = 0; run < 2; ++run) {  // the first run keeps B in its layout; the second reads it from there
        const auto y = executor.run({{"a", av}})[0];
        ASSERT_EQ(y.shape(), (std::vector<int64_t>{m, n}));
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
                double sum = 0;
                for (int64_t q = 0; q < k; ++q)
                    sum += double(av.data<float>()[i * k + q]) * bv.data<float>()[q * n + j];
                ASSERT_NEAR(y.data<float>()[i * n + j], sum, 1e-4) << run << " " << i << " " << j;
            }
    }
}

// An LSTM whose rows are longer than the gate sums' vector steps and not a
// multiple of them (input 19, hidden 13), against the spec's equations here.
TEST(Executor, AnLstmMatchesTheDefinition) {
    const int64_t seq = 3, batch = 2, in = 19, hidden = 13;
    vaiq::test::GraphBuilder b;
    b.input("x", {seq, batch, in}).output("y", {seq, 1, batch, hidden});
    const Tensor w = vaiq::test::ramp({1, 4 * hidden, in}, -0.4f, 0.0011f);
    const Tensor r = vaiq::test::ramp({1, 4 * hidden, hidden}, 0.3f, -0.0013f);
    const Tensor bias = vaiq::test::ramp({1, 8 * hidden}, -0.2f, 0.004f);
    b.initializer("w", w).initializer("r", r).initializer("b", bias);
    vaiq::test::set_attribute(b.node("LSTM", {"x", "w", "r", "b"}, {"y"}), "hidden_size", hidden);
    const Tensor x = vaiq::test::ramp({seq, batch, in}, 0.9f, -0.017f);
    const auto model = b.build();
    const auto y = Executor(model).run({{"x", x}})[0];
    ASSERT_EQ(y.shape(), (std::vector<int64_t>{seq, 1, batch, hidden}));
    const auto yv = y.data<float>();
    auto sigmoid = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
    for (int64_t n = 0; n < batch; ++n) {
        std::vector<double> h(hidden, 0.0), c(hidden, 0.0);
        for (int64_t t = 0; t < seq; ++t) {
            std::vector<double> gate(4 * hidden);  // i, o, f, c
            for (int64_t g = 0; g < 4 * hidden; ++g) {
                double sum = bias.data<float>()[g] + bias.data<float>()[4 * hidden + g];
                for (int64_t k = 0; k < in; ++k)
                    sum += double(x.data<float>()[(t * batch + n) * in + k]) * w.data<float>()[g * in + k];
                for (int64_t k = 0; k < hidden; ++k) sum += h[k] * r.data<float>()[g * hidden + k];
                gate[g] = sum;
            }
            for (int64_t k = 0; k < hidden; ++k) {
                c[k] = sigmoid(gate[2 * hidden + k]) * c[k] + sigmoid(gate[k]) * std::tanh(gate[3 * hidden + k]);
                h[k] = sigmoid(gate[hidden + k]) * std::tanh(c[k]);
                EXPECT_NEAR(yv[(t * batch + n) * hidden + k], h[k], 1e-5) << t << " " << n << " " << k;
            }
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

// Pad with a constant: uneven pads on every axis (none on some sides), a
// non-zero fill for float and the default zero for uint8; each output element
// is x's where it maps inside x, else the fill.
TEST(Executor, ConstantPadPlacesEveryRowAndFillsTheRest) {
    const std::vector<int64_t> shape{2, 3, 4}, begin{1, 0, 2}, end{0, 2, 1};
    for (const auto type : {DataType::Float, DataType::UInt8}) {
        const float fill = type == DataType::Float ? 7.5f : 0.0f;
        vaiq::test::GraphBuilder b;
        b.input("x", shape, type).output("y", {3, 5, 7}, type);
        std::vector<int64_t> pads(begin);
        pads.insert(pads.end(), end.begin(), end.end());
        b.initializer("pads", Tensor::from_values<int64_t>({6}, pads));
        if (type == DataType::Float) {
            b.initializer("value", Tensor::from_values<float>({}, std::vector<float>{fill}));
            b.node("Pad", {"x", "pads", "value"}, {"y"});
        } else {
            b.node("Pad", {"x", "pads"}, {"y"});
        }
        const auto model = b.build();
        std::vector<float> values(24);
        std::iota(values.begin(), values.end(), 1.0f);
        const Tensor x = type == DataType::Float
                             ? Tensor::from_values<float>(shape, values)
                             : Tensor::from_values<uint8_t>(shape, std::vector<uint8_t>(values.begin(), values.end()));
        const auto y = Executor(model, {.threads = 1}).run({{"x", x}})[0];
        ASSERT_EQ(y.shape(), (std::vector<int64_t>{3, 5, 7}));
        int inside = 0;
        for (int64_t i = 0; i < 3; ++i)
            for (int64_t j = 0; j < 5; ++j)
                for (int64_t k = 0; k < 7; ++k) {
                    const int64_t a = i - 1, c = k - 2;
                    const bool in = a >= 0 && a < 2 && j < 3 && c >= 0 && c < 4;
                    inside += in;
                    const float want = in ? values[(a * 3 + j) * 4 + c] : fill;
                    const int64_t at = (i * 5 + j) * 7 + k;
                    const float got = type == DataType::Float ? y.data<float>()[at] : y.data<uint8_t>()[at];
                    ASSERT_EQ(got, want) << i << " " << j << " " << k;
                }
        EXPECT_EQ(inside, 24);
    }
}

TEST(Executor, TransposesThatSwapBlocksOfAxesOrKeepTheOrder) {
    // [2, 3, 1, 5] -> NHWC [2, 1, 5, 3] (a block swap: three rows interleaved, as four in [2, 4, 3, 5]),
    // [3, 1, 4] -> [1, 3, 4] (no move), a matrix and a scalar, float and uint8. Three rows of
    // bytes go 16 columns at a time by shuffles, with a remainder ([1, 3, 7, 9]), and in
    // pieces over the threads ([1, 3, 130, 131]: more than one piece of 2^14 columns).
    struct Case {
        std::vector<int64_t> shape, perm;
    };
    // Then matrices of whole 16x16 blocks and remainders on both sides (both types move as blocks in registers).
    for (const auto& c :
         {Case{{2, 3, 1, 5}, {0, 2, 3, 1}}, Case{{2, 4, 3, 5}, {0, 2, 3, 1}}, Case{{3, 1, 4}, {1, 0, 2}},
          Case{{4, 6}, {1, 0}}, Case{{}, {}}, Case{{3, 40, 35}, {0, 2, 1}}, Case{{33, 64}, {1, 0}},
          Case{{1, 3, 7, 9}, {0, 2, 3, 1}}, Case{{1, 3, 130, 131}, {0, 2, 3, 1}}}) {
        for (const auto type : {DataType::Float, DataType::UInt8})
            for (const int threads : {1, 2}) {
                vaiq::test::GraphBuilder b;
                std::vector<int64_t> out_shape;
                for (auto p : c.perm) out_shape.push_back(c.shape[p]);
                b.input("x", c.shape, type).output("y", out_shape, type);
                vaiq::test::set_ints_attribute(b.node("Transpose", {"x"}, {"y"}), "perm", c.perm);
                const auto model = b.build();
                const int64_t count = vaiq::element_count(c.shape);
                std::vector<float> values(count);
                std::iota(values.begin(), values.end(), 1.0f);  // each element is its input index + 1
                // uint8 holds the index + 1 modulo 251 (a prime: no power-of-two stride maps onto itself).
                std::vector<uint8_t> bytes(count);
                for (int64_t i = 0; i < count; ++i) bytes[i] = static_cast<uint8_t>((i + 1) % 251);
                const Tensor x = type == DataType::Float ? Tensor::from_values<float>(c.shape, values)
                                                         : Tensor::from_values<uint8_t>(c.shape, bytes);
                const auto y = Executor(model, {.threads = threads}).run({{"x", x}})[0];
                ASSERT_EQ(y.shape(), out_shape);
                std::vector<int64_t> in_strides(c.shape.size(), 1);
                for (int d = static_cast<int>(c.shape.size()) - 2; d >= 0; --d)
                    in_strides[d] = in_strides[d + 1] * c.shape[d + 1];
                for (int64_t i = 0; i < y.size(); ++i) {
                    int64_t rest = i, at = 0;
                    for (int d = static_cast<int>(out_shape.size()) - 1; d >= 0; --d) {
                        at += (rest % out_shape[d]) * in_strides[c.perm[d]];
                        rest /= out_shape[d];
                    }
                    if (type == DataType::Float)
                        ASSERT_EQ(y.data<float>()[i], static_cast<float>(at + 1)) << i;
                    else
                        ASSERT_EQ(y.data<uint8_t>()[i], (at + 1) % 251) << i;
                }
            }
    }
}

// The fast exp path (AVX-512 where the CPU has it) against a plain transcription
// of the same MLAS steps with std::ldexp for the final scaling, over the whole
// reduced range, and its sum against MLAS's lane order.
// The row maximum Softmax shifts by, wherever it sits: in a whole block of 16 or in the tail.
// HardSigmoid rounds alpha * x before adding beta, as ONNX Runtime does: for
// x = 0.053 (float) that gives 0.5106, where one rounding in double gives 0.51060003.
TEST(Executor, HardSigmoidRoundsTheProductThenTheSum) {
    vaiq::test::GraphBuilder b;
    b.input("x", {3}).output("y", {3});
    auto& n = b.node("HardSigmoid", {"x"}, {"y"});
    vaiq::set_attribute(n, "alpha", 0.2f);
    const auto model = b.build();
    const auto y = Executor(model).run(
        {{"x", Tensor::from_values<float>({3}, std::vector<float>{0x1.b22d1p-5f, -9.0f, 9.0f})}})[0];
    EXPECT_EQ(y.data<float>()[0], 0.2f * 0x1.b22d1p-5f + 0.5f);
    EXPECT_EQ(y.data<float>()[0], 0.5106f);
    EXPECT_EQ(y.data<float>()[1], 0.0f);
    EXPECT_EQ(y.data<float>()[2], 1.0f);
}

// LeakyRelu on float multiplies in float: the product of two floats is exact in
// double, so it is the double product rounded once. Both its ways: into the
// donated input (x read last) and into a new tensor (x also an output).
TEST(Executor, LeakyReluOnFloatIsTheDoubleProductRounded) {
    std::vector<float> x;
    for (float v = -3.0f; v < 3.0f; v += 0.0173f) x.push_back(v);
    x.insert(x.end(), {-0.0f, 0x1.fffffep127f, -0x1.fffffep127f, -1e-40f, std::nanf("")});
    const auto n = static_cast<int64_t>(x.size());
    for (const float alpha : {0.01f, 0.1015625f, 0.3f})
        for (const bool donated : {true, false}) {
            vaiq::test::GraphBuilder b;
            b.input("x", {n}).output("y", {n});
            if (!donated) b.output("x", {n});
            vaiq::set_attribute(b.node("LeakyRelu", {"x"}, {"y"}), "alpha", alpha);
            const auto model = b.build();
            const auto outputs = Executor(model).run({{"x", Tensor::from_values<float>({n}, x)}});
            const auto y = outputs[0].data<float>();
            for (size_t i = 0; i < x.size(); ++i) {
                const double v = x[i];
                const float expected = static_cast<float>(v < 0 ? v * static_cast<double>(alpha) : v);
                EXPECT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(expected))
                    << x[i] << " alpha " << alpha << (donated ? " donated" : "");
            }
        }
}

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
        for (float c : {0x1.125edcp-7f, 0x1.555b5ap-5f, 0x1.555450p-3f, 0x1.fffff6p-2f, 1.0f, 1.0f})
            p = std::fma(p, x, c);
        differ += std::ldexp(p, static_cast<int>(m)) != out[i];
    }
    EXPECT_EQ(differ, 0u) << "of " << in.size();
    EXPECT_NEAR(out.back(), std::exp(in.back()), 1e-6f);
}

TEST(OrtFloat, SgemmSumsInThePanelsMlasPicks) {
    // K = 300 in panels of 128 ([0, 128), [128, 256), [256, 300)) while N >= K; for a
    // narrower B, MLAS widens the panel: 256 for N up to 64, 512 up to 32, 1024 up
    // to 16. Each panel is a chain of fused multiply-adds, the panels added in order.
    // M = 27: tiles of six rows and a part one; N = 37: two whole vectors and a part one.
    // One or two rows (a recurrent step) run in wider tiles: N = 301 is a tile of
    // sixteen vectors and one of three, N = 200 one of thirteen.
    const int64_t k = 300;
    for (const int64_t m : {27, 2, 1})
        for (const auto& [n, panel] :
             {std::pair<int64_t, int64_t>{301, 128}, {200, 128}, {37, 256}, {20, 512}, {12, 1024}}) {
            std::mt19937 rng(5);
            std::uniform_real_distribution<float> u(-1.0f, 1.0f);
            std::vector<float> a(m * k), b(k * n), c(m * n);
            for (auto& v : a) v = u(rng);
            for (auto& v : b) v = u(rng);
            vaiq::runtime::ort_sgemm(a.data(), b.data(), c.data(), m, k, n);
            int differ = 0;
            for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j) {
                    float total = 0.0f;
                    for (int64_t k0 = 0; k0 < k; k0 += panel) {
                        float acc = 0.0f;
                        for (int64_t p = k0; p < std::min<int64_t>(k, k0 + panel); ++p)
                            acc = std::fma(a[i * k + p], b[p * n + j], acc);
                        total = k0 == 0 ? acc : total + acc;
                    }
                    differ += c[i * n + j] != total;
                }
            EXPECT_EQ(differ, 0) << "M = " << m << ", N = " << n << ", panels of " << panel;
        }
}

TEST(OrtFloat, SgemmOfNothingIsZero) {
    std::vector<float> c(6, 7.0f);  // K = 0: every output is an empty sum
    vaiq::runtime::ort_sgemm(nullptr, nullptr, c.data(), 2, 0, 3);
    EXPECT_EQ(c, std::vector<float>(6, 0.0f));
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

// The vector paths (eight lanes on AVX2, sixteen on AVX-512) compute what
// their one-lane tails compute, to the bit: a sweep over [-20, 20], erf's split
// and clamp boundaries and the logistic's clamp and their neighbours, zeros,
// tiny values and infinities.
TEST(OrtFloat, ErfLogisticAndTanhAreTheSameWhetherVectorsOrOneLaneAtATimeComputeThem) {
    std::vector<float> in;
    for (int i = -20000; i <= 20000; ++i) in.push_back(static_cast<float>(i) * 1e-3f + 3e-5f);
    for (float b : {0.921875f, 3.725f, 3.925f, 1.0f, 9.0f, 18.0f}) {
        for (float v : {b, std::nextafter(b, 0.0f), std::nextafter(b, 100.0f)}) {
            in.push_back(v);
            in.push_back(-v);
        }
    }
    for (float v : {0.0f, -0.0f, 1e-30f, -1e-38f, 1e-45f, 100.0f, std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()})
        in.push_back(v);
    for (const auto& [f, name] :
         {std::pair{&vaiq::runtime::ort_erf, "erf"}, std::pair{&vaiq::runtime::ort_logistic, "logistic"},
          std::pair{&vaiq::runtime::ort_tanh, "tanh"}}) {
        std::vector<float> whole(in.size()), single(in.size());
        f(in.data(), whole.data(), static_cast<int64_t>(in.size()));
        for (size_t i = 0; i < in.size(); ++i) f(&in[i], &single[i], 1);
        size_t differ = 0;
        for (size_t i = 0; i < in.size(); ++i)
            differ += std::bit_cast<uint32_t>(whole[i]) != std::bit_cast<uint32_t>(single[i]);
        EXPECT_EQ(differ, 0u) << "of " << in.size() << " (" << name << ")";
    }
    // MLAS's tanh: within 3e-7 of tanh over the sweep, clamped at |x| = 9, odd, a NaN kept.
    std::vector<float> tanh(in.size());
    vaiq::runtime::ort_tanh(in.data(), tanh.data(), static_cast<int64_t>(in.size()));
    for (size_t i = 0; i < 40001; ++i) EXPECT_NEAR(tanh[i], std::tanh(in[i]), 3e-7f) << in[i];
    float at_nine = 0, beyond = 0, negative = 0, nan = std::numeric_limits<float>::quiet_NaN();
    const float nine = 9.0f, hundred = 100.0f, minus = -0.7f, plus = 0.7f;
    vaiq::runtime::ort_tanh(&nine, &at_nine, 1);
    vaiq::runtime::ort_tanh(&hundred, &beyond, 1);
    EXPECT_EQ(beyond, at_nine);
    vaiq::runtime::ort_tanh(&minus, &negative, 1);
    float positive = 0;
    vaiq::runtime::ort_tanh(&plus, &positive, 1);
    EXPECT_EQ(negative, -positive);
    vaiq::runtime::ort_tanh(&nan, &nan, 1);
    EXPECT_TRUE(std::isnan(nan));
    float erf = 0, logistic = 0;
    vaiq::runtime::ort_erf(&in[20000], &erf, 1);
    vaiq::runtime::ort_logistic(&in[20000], &logistic, 1);
    EXPECT_NEAR(erf, std::erf(in[20000]), 2e-7f);
    EXPECT_NEAR(logistic, 1.0f / (1.0f + std::exp(-in[20000])), 2e-7f);
}

}  // namespace

namespace nbits {

// A MatMulNBits case: A [rows, k] times random packed B [n, blocks, blob].
struct Case {
    int64_t rows, k, n, block;
    int bits;
    enum { kDefault, kPacked, kFloat } zero_points;
    bool bias, constant;
};

// Weight (k, col) as the contrib op's spec defines it, in double.
double weight(const Case& c, const std::vector<uint8_t>& b, const std::vector<float>& scales,
              const std::vector<uint8_t>& packed_zp, const std::vector<float>& float_zp, int64_t k, int64_t col) {
    const int64_t blocks = (c.k + c.block - 1) / c.block, blob = c.block * c.bits / 8, blk = k / c.block,
                  r = k % c.block;
    const int per_byte = 8 / c.bits, mask = (1 << c.bits) - 1;
    const int q = (b[static_cast<size_t>((col * blocks + blk) * blob + r / per_byte)] >> (c.bits * (r % per_byte))) & mask;
    double zp = 1 << (c.bits - 1);
    if (c.zero_points == Case::kFloat) zp = float_zp[static_cast<size_t>(col * blocks + blk)];
    if (c.zero_points == Case::kPacked) {
        const int64_t row_bytes = (blocks + per_byte - 1) / per_byte;
        zp = (packed_zp[static_cast<size_t>(col * row_bytes + blk / per_byte)] >> (c.bits * (blk % per_byte))) & mask;
    }
    return (q - zp) * scales[static_cast<size_t>(col * blocks + blk)];
}

void check(const Case& c) {
    const std::string label = fmt::format("rows {} K {} N {} block {} bits {} zero points {} bias {} constant {}",
                                          c.rows, c.k, c.n, c.block, c.bits, static_cast<int>(c.zero_points), c.bias,
                                          c.constant);
    std::mt19937 rng(static_cast<unsigned>(c.rows * 131 + c.k * 7 + c.n + c.bits));
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    const int64_t blocks = (c.k + c.block - 1) / c.block, blob = c.block * c.bits / 8;
    std::vector<uint8_t> b(static_cast<size_t>(c.n * blocks * blob));
    for (auto& v : b) v = static_cast<uint8_t>(byte(rng));
    std::vector<float> scales(static_cast<size_t>(c.n * blocks)), float_zp(scales.size()), a(static_cast<size_t>(c.rows * c.k)),
        bias(static_cast<size_t>(c.n));
    for (auto& v : scales) v = 0.01f + 0.02f * std::abs(unit(rng));
    for (auto& v : float_zp) v = 8.0f + 4.0f * unit(rng);
    for (auto& v : a) v = unit(rng);
    for (auto& v : bias) v = unit(rng);
    const int per_byte = 8 / c.bits;
    std::vector<uint8_t> packed_zp(static_cast<size_t>(c.n * ((blocks + per_byte - 1) / per_byte)));
    for (auto& v : packed_zp) v = static_cast<uint8_t>(byte(rng));

    vaiq::test::GraphBuilder g(13);
    g.input("a", {c.rows, c.k}).output("y", {c.rows, c.n});
    const Tensor b_tensor = Tensor::from_values<uint8_t>({c.n, blocks, blob}, b);
    std::map<std::string, Tensor> feeds{{"a", Tensor::from_values<float>({c.rows, c.k}, a)}};
    if (c.constant) {
        g.initializer("b", b_tensor);
    } else {
        g.input("b", {c.n, blocks, blob}, DataType::UInt8);
        feeds["b"] = b_tensor;
    }
    g.initializer("scales", Tensor::from_values<float>({c.n, blocks}, scales));
    std::vector<std::string> inputs{"a", "b", "scales"};
    if (c.zero_points == Case::kPacked) {
        g.initializer("zp", Tensor::from_values<uint8_t>({static_cast<int64_t>(packed_zp.size())}, packed_zp));
        inputs.push_back("zp");
    } else if (c.zero_points == Case::kFloat) {
        g.initializer("zp", Tensor::from_values<float>({c.n, blocks}, float_zp));
        inputs.push_back("zp");
    }
    if (c.bias) {
        if (c.zero_points == Case::kDefault) inputs.push_back("");
        inputs.insert(inputs.end(), {"", "bias"});
        g.initializer("bias", Tensor::from_values<float>({c.n}, bias));
    }
    auto& node = g.node("MatMulNBits", inputs, {"y"}, "mm");
    node.set_domain("com.microsoft");
    vaiq::test::set_attribute(node, "K", c.k);
    vaiq::test::set_attribute(node, "N", c.n);
    vaiq::test::set_attribute(node, "bits", c.bits);
    vaiq::test::set_attribute(node, "block_size", c.block);
    auto model = g.build();
    auto* domain = model.proto().add_opset_import();
    domain->set_domain("com.microsoft");
    domain->set_version(1);
    Executor executor(model);
    for (int run = 0; run < 2; ++run) {  // the second run reuses what the first one kept
        const auto y = executor.run(feeds)[0];
        ASSERT_EQ(y.shape(), (std::vector<int64_t>{c.rows, c.n})) << label;
        for (int64_t r = 0; r < c.rows; ++r)
            for (int64_t col = 0; col < c.n; ++col) {
                double expected = c.bias ? bias[static_cast<size_t>(col)] : 0.0;
                for (int64_t k = 0; k < c.k; ++k)
                    expected += a[static_cast<size_t>(r * c.k + k)] * weight(c, b, scales, packed_zp, float_zp, k, col);
                ASSERT_NEAR(y.data<float>()[static_cast<size_t>(r * c.n + col)], expected, 2e-4 * std::sqrt(c.k))
                    << label << " row " << r << " column " << col;
            }
    }
}

}  // namespace nbits

// Every path of the kernel against the spec's arithmetic: up to 16 rows
// (weights expanded in registers, four rows at a time, 4-bit rows
// de-interleaved), more rows in groups of 6 with tails (expanded panels, K in
// chunks), column counts off the groups of 4 and panels of 64, K ending inside
// a block, 8 bits, zero points default/packed/float, bias, B as an input.
TEST(MatMulNBitsKernel, AgreesWithTheSpecsArithmeticOnEveryPath) {
    using nbits::Case;
    for (int64_t rows : {1, 2, 3, 4, 5, 8, 13, 16, 17, 23})
        for (int64_t n : {3, 37, 70})
            nbits::check({rows, 40, n, 16, 4, Case::kDefault, false, true});
    for (int64_t rows : {2, 19})
        nbits::check({rows, 200, 70, 32, 4, Case::kPacked, true, true});
    nbits::check({3, 72, 33, 16, 8, Case::kFloat, false, true});
    nbits::check({19, 72, 33, 64, 8, Case::kPacked, true, true});
    for (int64_t rows : {12, 20})
        nbits::check({rows, 130, 64, 128, 4, Case::kFloat, true, false});
    nbits::check({1, 130, 5, 128, 4, Case::kDefault, false, false});
    nbits::check({18, 1100, 35, 16, 4, Case::kPacked, true, true});  // K in three chunks of the panel
    nbits::check({3, 1100, 35, 64, 4, Case::kPacked, true, true});
}

namespace gbq {

vaiq::Model gather_model(const Tensor& data, const Tensor& scales, const Tensor* zero_points, int64_t gather_axis,
                         int64_t quantize_axis, int64_t bits, std::vector<int64_t> indices_shape) {
    vaiq::test::GraphBuilder g(13);
    g.input("ids", indices_shape, DataType::Int64).output("y", {});
    g.initializer("data", data).initializer("scales", scales);
    std::vector<std::string> inputs{"data", "ids", "scales"};
    if (zero_points) {
        g.initializer("zp", *zero_points);
        inputs.push_back("zp");
    }
    auto& node = g.node("GatherBlockQuantized", inputs, {"y"}, "gather");
    node.set_domain("com.microsoft");
    vaiq::test::set_attribute(node, "gather_axis", gather_axis);
    vaiq::test::set_attribute(node, "quantize_axis", quantize_axis);
    vaiq::test::set_attribute(node, "block_size", 16);
    vaiq::test::set_attribute(node, "bits", bits);
    auto model = g.build();
    auto* domain = model.proto().add_opset_import();
    domain->set_domain("com.microsoft");
    domain->set_version(1);
    return model;
}

}  // namespace gbq

// The int4 form with any axes: data [20, 3] (int4, one value a byte in memory)
// blocked along axis 0 (two blocks of 16, the second short), gathered along
// axis 1, zero points of the data's type; against the formula by hand.
TEST(GatherBlockQuantizedKernel, Int4DataWithOtherAxesAndZeroPoints) {
    std::vector<int8_t> values(60);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int8_t>(static_cast<int>(i * 5 % 16) - 8);
    Tensor data(DataType::Int4, {20, 3});
    std::memcpy(data.mutable_bytes().data(), values.data(), values.size());
    const auto scales = Tensor::from_values<float>({2, 3}, std::vector<float>{0.5f, 0.25f, 2.0f, 1.0f, 0.125f, 4.0f});
    Tensor zp(DataType::Int4, {2, 3});
    const int8_t zp_values[] = {0, 1, -2, 3, -4, 5};
    std::memcpy(zp.mutable_bytes().data(), zp_values, 6);
    const auto model = gbq::gather_model(data, scales, &zp, 1, 0, 4, {2});
    const auto y = Executor(model).run({{"ids", Tensor::from_values<int64_t>({2}, std::vector<int64_t>{2, -3})}})[0];
    ASSERT_EQ(y.shape(), (std::vector<int64_t>{20, 2}));
    for (int64_t row = 0; row < 20; ++row)
        for (int64_t j = 0; j < 2; ++j) {
            const int64_t col = j == 0 ? 2 : 0, s = (row / 16) * 3 + col;
            const float expected = static_cast<float>(values[row * 3 + col] - zp_values[s]) * scales.data<float>()[s];
            EXPECT_FLOAT_EQ(y.data<float>()[row * 2 + j], expected) << row << " " << j;
        }
}

// The uint8 form with 8-bit values: one a byte, packed zero points one a byte;
// 2-D indices; an index out of range is an error naming it.
TEST(GatherBlockQuantizedKernel, Uint8DataOfEightBitsAndBadIndices) {
    std::vector<uint8_t> values(4 * 20);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint8_t>(i * 37 % 256);
    const auto data = Tensor::from_values<uint8_t>({4, 20}, values);
    std::vector<float> scale_values(8);
    for (size_t i = 0; i < scale_values.size(); ++i) scale_values[i] = 0.01f * static_cast<float>(i + 1);
    const auto scales = Tensor::from_values<float>({4, 2}, scale_values);
    std::vector<uint8_t> zp_values(8);
    for (size_t i = 0; i < zp_values.size(); ++i) zp_values[i] = static_cast<uint8_t>(100 + 10 * i);
    const auto zp = Tensor::from_values<uint8_t>({4, 2}, zp_values);
    const auto model = gbq::gather_model(data, scales, &zp, 0, 1, 8, {2, 2});
    Executor executor(model);
    const auto y = executor.run({{"ids", Tensor::from_values<int64_t>({2, 2}, std::vector<int64_t>{3, 0, 1, 3})}})[0];
    ASSERT_EQ(y.shape(), (std::vector<int64_t>{2, 2, 20}));
    const int64_t rows[] = {3, 0, 1, 3};
    for (int64_t i = 0; i < y.size(); ++i) {
        const int64_t row = rows[i / 20], col = i % 20, s = row * 2 + col / 16;
        EXPECT_FLOAT_EQ(y.data<float>()[i], static_cast<float>(values[row * 20 + col] - zp_values[s]) * scale_values[s]);
    }
    const auto message = error_of([&] { executor.run({{"ids", Tensor::from_values<int64_t>({2, 2}, std::vector<int64_t>{0, 4, 1, 1})}}); });
    EXPECT_NE(message.find("index 4 is out of range"), std::string::npos) << message;
    const auto bad_scales = gbq::gather_model(data, Tensor::from_values<float>({4, 1}, std::vector<float>{1, 1, 1, 1}), nullptr, 0, 1, 8, {1});
    EXPECT_NE(error_of([&] { Executor(bad_scales).run({{"ids", Tensor::from_values<int64_t>({1}, std::vector<int64_t>{0})}}); })
                  .find("scales must have the data's shape"),
              std::string::npos);
}

// Relu, Abs, Clip, Sub and Add write into an input the executor donated (this
// step reads it last): the results, taps, graph outputs and the caller's feeds
// must be as if each step had written a new tensor.
// Broadcasting binary ops take trailing dimensions that are contiguous or
// broadcast in each operand as one run: every pattern must still pair the
// elements numpy does (Sub: the operands' order shows), on one thread and two.
TEST(Executor, BroadcastSubPairsTheElementsNumpyPairs) {
    using Shape = std::vector<int64_t>;
    const std::vector<std::pair<Shape, Shape>> cases = {{{2, 3, 4, 5}, {2, 3, 1, 1}},
                                                        {{2, 3, 1, 1}, {2, 3, 4, 5}},
                                                        {{2, 3, 4, 5}, {1, 3, 1, 5}},
                                                        {{2, 1, 4, 5}, {3, 1, 1}},
                                                        {{4, 1}, {1, 5}},
                                                        {{2, 3, 4, 5}, {5}},
                                                        {{3, 1, 5}, {3, 4, 1}},
                                                        {{1, 64, 40, 40}, {1, 64, 1, 1}},
                                                        {{1, 1, 40, 40}, {1, 64, 40, 1}}};
    for (const auto& [sa, sb] : cases) {
        const size_t rank = std::max(sa.size(), sb.size());
        auto padded = [&](Shape s) {
            s.insert(s.begin(), rank - s.size(), 1);
            return s;
        };
        const Shape pa = padded(sa), pb = padded(sb);
        Shape out(rank);
        for (size_t d = 0; d < rank; ++d) out[d] = std::max(pa[d], pb[d]);
        vaiq::test::GraphBuilder b;
        b.input("a", sa).input("b", sb).output("d", out);
        b.node("Sub", {"a", "b"}, {"d"});
        const auto model = b.build();
        const Tensor a = vaiq::test::ramp(sa, -1.0f, 0.37f), bt = vaiq::test::ramp(sb, 2.0f, -0.11f);
        // Each output index's element of an operand: its own index, 0 where it is broadcast.
        auto element = [&](const Shape& s, const Tensor& t, int64_t flat) {
            int64_t at = 0, stride = 1;
            for (size_t d = rank; d-- > 0;) {
                const int64_t c = flat % out[d];
                flat /= out[d];
                at += (s[d] == 1 ? 0 : c) * stride;
                stride *= s[d];
            }
            return t.data<float>()[static_cast<size_t>(at)];
        };
        for (int threads : {1, 2}) {
            vaiq::runtime::ExecutorOptions options;
            options.threads = threads;
            Executor executor(model, options);
            const auto d = executor.run({{"a", a}, {"b", bt}});
            ASSERT_EQ(d[0].shape(), out);
            for (int64_t i = 0; i < static_cast<int64_t>(d[0].size()); ++i)
                ASSERT_EQ(d[0].data<float>()[static_cast<size_t>(i)], element(pa, a, i) - element(pb, bt, i))
                    << fmt::format("[{}] - [{}] at {}, {} threads", fmt::join(sa, ","), fmt::join(sb, ","), i, threads);
        }
    }
}

TEST(Executor, ElementwiseStepsWritingIntoDonatedInputsGiveTheSameValues) {
    constexpr int64_t kRows = 4, kColumns = 5000;  // above the parallel grain
    vaiq::test::GraphBuilder b;
    b.input("x", {kRows, kColumns}).input("y", {kRows, kColumns});
    b.output("r", {kRows, kColumns}).output("w", {kRows, kColumns});
    b.initializer("lo", Tensor::from_values<float>({}, std::vector<float>{-0.5f}));
    b.initializer("hi", Tensor::from_values<float>({}, std::vector<float>{0.5f}));
    b.node("Neg", {"x"}, {"a"});            // x is read again below: not donated
    b.node("Relu", {"a"}, {"r"});           // into a's buffer; r is a graph output
    b.node("Sub", {"y", "r"}, {"s"});       // into y's (a feed's copy), r kept
    b.node("Abs", {"s"}, {"u"});            // into s's
    b.node("Sub", {"r", "u"}, {"v"});       // into u's, the second operand
    b.node("Add", {"v", "x"}, {"vx"});      // into v's or x's
    b.node("Clip", {"vx", "lo", "hi"}, {"w"});
    const auto model = b.build();
    const Tensor x = vaiq::test::ramp({kRows, kColumns}, -3.0f, 0.0003f);
    const Tensor y = vaiq::test::ramp({kRows, kColumns}, 2.0f, -0.00025f);
    const auto xs = x.data<float>(), ys = y.data<float>();
    for (int threads : {1, 2}) {
        vaiq::runtime::ExecutorOptions options;
        options.threads = threads;
        Executor executor(model, options);
        std::map<std::string, std::vector<float>> tapped;
        const auto outs = executor.run({{"x", x}, {"y", y}}, {"a", "u"}, [&](const std::string& name, const Tensor& t) {
            tapped[name].assign(t.data<float>().begin(), t.data<float>().end());
        });
        ASSERT_EQ(outs.size(), 2u);
        const auto r = outs[0].data<float>(), w = outs[1].data<float>();
        ASSERT_EQ(r.size(), xs.size());
        size_t clipped = 0;
        for (size_t i = 0; i < xs.size(); ++i) {
            const float a = -xs[i], relu = std::max(a, 0.0f), u = std::abs(ys[i] - relu);
            const float vx = (relu - u) + xs[i];
            ASSERT_EQ(tapped["a"][i], a) << i;
            ASSERT_EQ(tapped["u"][i], u) << i;
            ASSERT_EQ(r[i], relu) << i;
            ASSERT_EQ(w[i], std::clamp(vx, -0.5f, 0.5f)) << i;
            clipped += vx < -0.5f || vx > 0.5f;
        }
        EXPECT_GT(clipped, 0u);
        EXPECT_LT(clipped, xs.size());
        EXPECT_EQ(x.data<float>()[0], -3.0f);  // the caller's feeds are untouched
        EXPECT_EQ(y.data<float>()[0], 2.0f);
    }
}
