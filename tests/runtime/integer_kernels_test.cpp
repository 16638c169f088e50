// Integer kernels and QDQ fusion: requantization, QLinear* and QGemm as ONNX Runtime computes them.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>

#include "executor_test_support.hpp"
#include "runtime/cpu_features.hpp"
#include "runtime/executor.hpp"
#include "runtime/infer.hpp"
#include "runtime/kernels/int8_conv.hpp"
#include "runtime/kernels/int8_pointwise.hpp"
#include "runtime/kernels/ort_float.hpp"
#include "runtime/layout.hpp"
#include "runtime/qdq_fusion.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/quant.hpp"
#include "vaiq/reader.hpp"

namespace fs = std::filesystem;

namespace {

using vaiq::DataType;
using vaiq::Tensor;
using vaiq::runtime::Executor;
using vaiq::runtime::test::error_of;
using vaiq::runtime::test::reference_conv_relu;

// Adds one-value initializers to `b`: scalar(name, value), of the value's type.
auto scalar_initializers(vaiq::test::GraphBuilder& b) {
    return [&b](const std::string& name, auto v) {
        using V = decltype(v);
        b.initializer(name, Tensor::from_values<V>({}, std::vector<V>{v}));
    };
}

// Runs `model` on x with the QDQ fusion and without it; expects the two to agree
// on every value and returns the fused run's calls per op type.
std::map<std::string, int64_t> fused_calls_agreeing_with_plain(const vaiq::Model& model, const Tensor& x) {
    Executor fused(model, {.profile = true}), plain(model, {.fuse_qdq = false});
    const auto a = fused.run({{"x", x}})[0], c = plain.run({{"x", x}})[0];
    int differing = 0;
    for (int64_t i = 0; i < a.size(); ++i) differing += a.data<float>()[i] != c.data<float>()[i];
    EXPECT_EQ(differing, 0);
    std::map<std::string, int64_t> calls;
    for (const auto& p : fused.profile()) calls[p.op_type] = p.calls;
    return calls;
}

// A one-value 8-bit tensor of type `t` (int8 or uint8) holding `v`.
Tensor byte_of(DataType t, int v) {
    return t == DataType::Int8 ? Tensor::from_values<int8_t>({}, std::vector<int8_t>{static_cast<int8_t>(v)})
                               : Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{static_cast<uint8_t>(v)});
}

// A tensor of `type` (8-bit) and `shape` of random bytes.
Tensor random_bytes(DataType type, const std::vector<int64_t>& shape, std::mt19937& rng) {
    std::uniform_int_distribution<int> byte(0, 255);
    Tensor t = Tensor::uninitialized(type, shape);
    for (auto& v : t.mutable_bytes()) v = static_cast<std::byte>(byte(rng));
    return t;
}

// A QLinearConv's weight initializers in `b`: "w" (random int8 of `shape`), "sw"
// and "zw" (one scale and a zero point of 0, or one of each per output channel,
// the scales from `base` up in steps of 0.0001 that repeat every `period`
// channels) and "bias" (random int32, one per output channel).
void conv_weights(vaiq::test::GraphBuilder& b, const std::vector<int64_t>& shape, bool per_channel, float base,
                  int period, std::mt19937& rng) {
    std::uniform_int_distribution<int> weight(-127, 127);
    const int64_t m = shape[0];
    std::vector<int8_t> wt(static_cast<size_t>(vaiq::element_count(shape)));
    for (auto& v : wt) v = static_cast<int8_t>(weight(rng));
    std::vector<float> sw(per_channel ? static_cast<size_t>(m) : 1);
    for (size_t i = 0; i < sw.size(); ++i) sw[i] = base + 0.0001f * static_cast<float>(i % static_cast<size_t>(period));
    std::vector<int32_t> bias(static_cast<size_t>(m));
    for (auto& v : bias) v = weight(rng) * 40;
    b.initializer("w", Tensor::from_values<int8_t>(shape, wt));
    b.initializer("sw", per_channel ? Tensor::from_values<float>({m}, sw) : Tensor::from_values<float>({}, sw));
    b.initializer("zw", per_channel ? Tensor::from_values<int8_t>({m}, std::vector<int8_t>(sw.size(), 0))
                                    : Tensor::from_values<int8_t>({}, std::vector<int8_t>{0}));
    b.initializer("bias", Tensor::from_values<int32_t>({m}, bias));
}

// The model `b` describes, with the com.microsoft opset its QLinear ops need.
vaiq::Model contrib_model(vaiq::test::GraphBuilder& b) {
    auto model = b.build();
    auto* ms = model.proto().add_opset_import();
    ms->set_domain("com.microsoft");
    ms->set_version(1);
    return model;
}

// Fuzzing found both: a zero point with fewer values than the scale was read
// out of bounds, one of another type than DequantizeLinear's input failed an
// internal type check. Both are the model's fault: InputError naming them.
TEST(Executor, QuantizeLinearZeroPointsMustMatchTheirScales) {
    auto run = [](const std::string& op, DataType x_type, const Tensor& zero_point) {
        vaiq::test::GraphBuilder b(13);
        b.input("x", {1, 2}, x_type).output("y", {1, 2});
        b.initializer("scale", Tensor::from_values<float>({2}, std::vector<float>{0.5f, 0.25f}));
        b.initializer("zp", zero_point);
        auto& node = b.node(op, {"x", "scale", "zp"}, {"y"}, "q");
        auto* axis = node.add_attribute();
        axis->set_name("axis");
        axis->set_type(onnx::AttributeProto::INT);
        axis->set_i(1);
        const auto model = b.build();
        Executor executor(model);
        return error_of([&] { executor.run({{"x", Tensor(x_type, {1, 2})}}); });
    };
    const auto one_int8 = Tensor::from_values<int8_t>({1}, std::vector<int8_t>{0});
    EXPECT_NE(run("QuantizeLinear", DataType::Float, one_int8).find("the zero point has 1 values and the scale 2"),
              std::string::npos);
    EXPECT_NE(run("DequantizeLinear", DataType::Int8, one_int8).find("the zero point has 1 values and the scale 2"),
              std::string::npos);
    const auto two_int16 = Tensor::from_values<int16_t>({2}, std::vector<int16_t>{0, 0});
    // The executor checks the schema's shared type parameter before the kernel does.
    EXPECT_NE(run("DequantizeLinear", DataType::Int8, two_int16).find("inputs 0 and 2 must have one element type, not "
                                                                      "int8 and int16"),
              std::string::npos);
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
        if (out_type == DataType::UInt8)
            g.initializer("zy", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{100}));
        else
            g.initializer("zy", Tensor::from_values<int8_t>({}, std::vector<int8_t>{-3}));
        g.node("QLinearMatMul", {"a", "sa", "za", "b", "sb", "zb", "sy", "zy"}, {"y"});
        const auto model = g.build();
        const std::vector<uint8_t> av{9, 1};
        const auto y = Executor(model, {.threads = 1}).run({{"a", Tensor::from_values<uint8_t>({1, 2}, av)}})[0];
        const int zp = out_type == DataType::UInt8 ? 100 : -3;
        const float lo = out_type == DataType::UInt8 ? 0.0f : -128.0f,
                    hi = out_type == DataType::UInt8 ? 255.0f : 127.0f;
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
    const auto scalar = scalar_initializers(g);
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
                for (int64_t q = 0; q < k; ++q) acc += (av[(p * m + i) * k + q] - za) * (bv[q * n + j] - zb);
                const float r = std::nearbyint(static_cast<float>(acc) * multiplier) + zy;
                const auto expected = static_cast<uint8_t>(std::clamp(r, 0.0f, 255.0f));
                EXPECT_EQ(out[(p * m + i) * n + j], expected) << p << " " << i << " " << j;
                saturated += expected == 0 || expected == 255;
                ++checked;
            }
    EXPECT_EQ(checked, batch * m * n);
    EXPECT_LT(saturated, checked / 2) << "the values should mostly be inside the range";
}

// A 4-D stack of A matrices times one symmetric int8 B (a weight): one taller
// product without sums of A; each value as the centred sum gives it.
TEST(Executor, QLinearMatMulOfAStackByASymmetricWeightIsExact) {
    const int64_t outer = 2, batch = 3, m = 4, k = 33, n = 9;
    std::vector<uint8_t> av(outer * batch * m * k);
    std::vector<int8_t> bv(k * n);
    for (size_t i = 0; i < av.size(); ++i) av[i] = static_cast<uint8_t>((i * 53 + 3) % 256);
    for (size_t i = 0; i < bv.size(); ++i) bv[i] = static_cast<int8_t>(static_cast<int>((i * 29 + 1) % 255) - 127);
    vaiq::test::GraphBuilder g;
    g.input("a", {outer, batch, m, k}, DataType::UInt8).output("y", {outer, batch, m, n}, DataType::UInt8);
    g.initializer("b", Tensor::from_values<int8_t>({k, n}, bv));
    g.initializer("sa", Tensor::from_values<float>({}, std::vector<float>{0.03f}));
    g.initializer("za", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{120}));
    g.initializer("sb", Tensor::from_values<float>({}, std::vector<float>{0.002f}));
    g.initializer("zb", Tensor::from_values<int8_t>({}, std::vector<int8_t>{0}));
    g.initializer("sy", Tensor::from_values<float>({}, std::vector<float>{0.4f}));
    g.initializer("zy", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{128}));
    g.node("QLinearMatMul", {"a", "sa", "za", "b", "sb", "zb", "sy", "zy"}, {"y"});
    const auto model = g.build();
    Executor executor(model, {.threads = 1});
    const auto y = executor.run({{"a", Tensor::from_values<uint8_t>({outer, batch, m, k}, av)}})[0];
    ASSERT_EQ(y.shape(), (std::vector<int64_t>{outer, batch, m, n}));
    const auto out = y.data<uint8_t>();
    int mismatches = 0;
    for (int64_t r = 0; r < outer * batch * m; ++r)
        for (int64_t j = 0; j < n; ++j) {
            int32_t acc = 0;
            for (int64_t q = 0; q < k; ++q) acc += (av[r * k + q] - 120) * bv[q * n + j];
            const float v = std::nearbyint(static_cast<float>(acc) * (0.03f * 0.002f / 0.4f)) + 128;
            mismatches += out[r * n + j] != static_cast<uint8_t>(std::clamp(v, 0.0f, 255.0f));
        }
    EXPECT_EQ(mismatches, 0);
}

TEST(Executor, QLinearAddRequantizesLikeOnnxRuntime) {
    // a = (q - 128) * 0.5, b = (q - 0) * 0.25, c = round((a + b) / 1.0) + 10, saturated to uint8.
    vaiq::test::GraphBuilder b;
    b.input("a", {4}, DataType::UInt8).input("b", {4}, DataType::UInt8).output("c", {4}, DataType::UInt8);
    const auto scalar = scalar_initializers(b);
    scalar("sa", 0.5f);
    scalar("za", uint8_t{128});
    scalar("sb", 0.25f);
    scalar("zb", uint8_t{0});
    scalar("sc", 1.0f);
    scalar("zc", uint8_t{10});
    b.node("QLinearAdd", {"a", "sa", "za", "b", "sb", "zb", "sc", "zc"}, {"c"}, "add").set_domain("com.microsoft");
    const auto model = contrib_model(b);
    Executor e(model);
    const auto out = e.run({{"a", Tensor::from_values<uint8_t>({4}, std::vector<uint8_t>{128, 130, 0, 255})},
                            {"b", Tensor::from_values<uint8_t>({4}, std::vector<uint8_t>{0, 2, 4, 255})}})[0];
    // 0 + 0 -> 10; 1 + 0.5 = 1.5 -> 2 (half to even) -> 12; -64 + 1 -> -63 -> 0 (saturated); 63.5 + 63.75 = 127.25 ->
    // 137
    EXPECT_EQ(std::vector<uint8_t>(out.data<uint8_t>().begin(), out.data<uint8_t>().end()),
              (std::vector<uint8_t>{10, 12, 0, 137}));
}

// Ties within a float rounding step, from a quantized ViT's LayerNorm, where
// ONNX Runtime's order of operations decides the result.
// A single value added to a tensor (HardSwish's x + 3, a bias of one value) runs as
// one pass whose constant holds the single value's share: each output as the
// element-by-element formula gives it, on either side, over several chunks.
TEST(Executor, QLinearAddOfASingleValueIsTheElementwiseFormula) {
    const float sa = 0x1.e7a4fep-6f, sb = 0x1.d5c55cp-4f, sc = 0x1.e8b12p-5f;
    const uint8_t za = 133, zb = 7, zc = 121;
    const int64_t n = 40000;  // three chunks of 2^14
    std::vector<uint8_t> big(static_cast<size_t>(n));
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7919 % 256);
    for (const bool single_first : {false, true}) {
        vaiq::test::GraphBuilder b;
        const std::vector<int64_t> a_shape = single_first ? std::vector<int64_t>{1} : std::vector<int64_t>{4, n / 4};
        const std::vector<int64_t> b_shape = single_first ? std::vector<int64_t>{4, n / 4} : std::vector<int64_t>{1};
        b.input("a", a_shape, DataType::UInt8).input("b", b_shape, DataType::UInt8).output("c", {4, n / 4}, DataType::UInt8);
        const auto scalar = scalar_initializers(b);
        scalar("sa", sa), scalar("za", za), scalar("sb", sb), scalar("zb", zb), scalar("sc", sc), scalar("zc", zc);
        b.node("QLinearAdd", {"a", "sa", "za", "b", "sb", "zb", "sc", "zc"}, {"c"}, "add").set_domain("com.microsoft");
        const auto model = contrib_model(b);
        const uint8_t lone = 201;
        const auto single = Tensor::from_values<uint8_t>({1}, std::vector<uint8_t>{lone});
        const auto whole = Tensor::from_values<uint8_t>({4, n / 4}, big);
        const auto c = Executor(model, {.threads = 2})
                           .run({{"a", single_first ? single : whole}, {"b", single_first ? whole : single}})[0];
        const float ra = sa / sc, rb = sb / sc;
        const bool fused = vaiq::runtime::cpu_features().avx2 && vaiq::runtime::cpu_features().fma;
        const float fixed = static_cast<float>(zc) - (fused ? std::fma(ra, static_cast<float>(za), rb * zb)
                                                            : ra * static_cast<float>(za) + rb * zb);
        int differing = 0;
        for (int64_t i = 0; i < n; ++i) {
            const float x = big[static_cast<size_t>(i)];
            const float v = single_first ? std::fma(x, rb, fixed + static_cast<float>(lone) * ra)
                                         : std::fma(x, ra, fixed + static_cast<float>(lone) * rb);
            differing += c.data<uint8_t>()[i] != static_cast<uint8_t>(std::clamp(std::nearbyint(v), 0.0f, 255.0f));
        }
        EXPECT_EQ(differing, 0) << (single_first ? "the single value first" : "the single value second");
    }
}

// A residual (the same shape) or a repeated row (a bias) added, uint8 or int8
// out, over several chunks and a remainder shorter than a vector: each output as
// the element-by-element formula gives it (on AVX-512 one pass without the float
// sums in memory, elsewhere two).
TEST(Executor, QLinearAddOfSameShapesAndRepeatedRowsIsTheElementwiseFormula) {
    const float sa = 0x1.e7a4fep-6f, sb = 0x1.d5c55cp-4f, sc = 0x1.e8b12p-5f;
    const int64_t rows = 1667, row = 24;  // 40008 values: two whole chunks of 2^14 and a part
    std::vector<uint8_t> a_values(static_cast<size_t>(rows * row)), b_values(a_values.size());
    for (size_t i = 0; i < a_values.size(); ++i) {
        a_values[i] = static_cast<uint8_t>(i * 7919 % 256);
        b_values[i] = static_cast<uint8_t>(i * 104729 % 253);
    }
    for (const DataType out_type : {DataType::UInt8, DataType::Int8})
        for (const bool repeated : {false, true}) {
            const uint8_t za = 133, zb = 7;
            const int zc = out_type == DataType::UInt8 ? 121 : -9;
            vaiq::test::GraphBuilder b;
            const std::vector<int64_t> b_shape = repeated ? std::vector<int64_t>{row} : std::vector<int64_t>{rows, row};
            b.input("a", {rows, row}, DataType::UInt8).input("b", b_shape, DataType::UInt8);
            b.output("c", {rows, row}, out_type);
            b.initializer("sa", Tensor::from_values<float>({}, std::vector<float>{sa}));
            b.initializer("za", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{za}));
            b.initializer("sb", Tensor::from_values<float>({}, std::vector<float>{sb}));
            b.initializer("zb", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{zb}));
            b.initializer("sc", Tensor::from_values<float>({}, std::vector<float>{sc}));
            if (out_type == DataType::UInt8)
                b.initializer("zc", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{static_cast<uint8_t>(zc)}));
            else
                b.initializer("zc", Tensor::from_values<int8_t>({}, std::vector<int8_t>{static_cast<int8_t>(zc)}));
            b.node("QLinearAdd", {"a", "sa", "za", "b", "sb", "zb", "sc", "zc"}, {"c"}, "add")
                .set_domain("com.microsoft");
            const auto model = contrib_model(b);
            const std::vector<uint8_t> b_fed(b_values.begin(), b_values.begin() + (repeated ? row : rows * row));
            const auto c = Executor(model, {.threads = 2})
                               .run({{"a", Tensor::from_values<uint8_t>({rows, row}, a_values)},
                                     {"b", Tensor::from_values<uint8_t>(b_shape, b_fed)}})[0];
            ASSERT_EQ(c.type(), out_type);
            const float ra = sa / sc, rb = sb / sc;
            const bool fused = vaiq::runtime::cpu_features().avx2 && vaiq::runtime::cpu_features().fma;
            const float fixed = static_cast<float>(zc) - (fused ? std::fma(ra, static_cast<float>(za), rb * zb)
                                                                : ra * static_cast<float>(za) + rb * zb);
            const float lo = out_type == DataType::UInt8 ? 0.0f : -128.0f, hi = lo + 255.0f;
            int differing = 0, saturated = 0;
            for (int64_t i = 0; i < rows * row; ++i) {
                const float x = a_values[static_cast<size_t>(i)];
                const float y = b_fed[static_cast<size_t>(repeated ? i % row : i)];
                const float want = std::clamp(std::nearbyint(std::fma(x, ra, std::fma(y, rb, fixed))), lo, hi);
                const float got = out_type == DataType::UInt8 ? c.data<uint8_t>()[i] : c.data<int8_t>()[i];
                differing += got != want;
                saturated += want == lo || want == hi;
            }
            EXPECT_EQ(differing, 0) << (repeated ? "a repeated row" : "the same shape");
            EXPECT_GT(saturated, 0) << "some sums leave the output's range";
        }
}

// QLinearMul of 8-bit inputs over each way one input meets the other: the same
// shape, a single value on either side, one value per channel (NCHW) and per
// channel repeated (channels last), and a broadcast of both ([4, 1] x [1, 5000]),
// every output float((a - za)(b - zb)) * ((sa sb) / sc) + zc rounded half to even.
TEST(Executor, QLinearMulIsTheElementwiseFormulaHoweverItBroadcasts) {
    const float sa = 0x1.e7a4fep-6f, sb = 0x1.d5c55cp-4f, sc = 0x1.e8b12p-5f;
    const uint8_t za = 133, zc = 121;
    const int8_t zb = -3;
    struct Case {
        std::vector<int64_t> a, b;
    };
    const std::vector<Case> cases = {
        {{2, 20000}, {2, 20000}},       {{1}, {2, 3, 7000}}, {{2, 3, 7000}, {}}, {{1, 6, 40, 90}, {1, 6, 1, 1}},
        {{1, 1, 1, 6}, {1, 40, 90, 6}}, {{4, 1}, {1, 5000}}};
    for (const auto& [as, bs] : cases) {
        const auto count = [](const std::vector<int64_t>& s) {
            return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>());
        };
        std::vector<uint8_t> av(static_cast<size_t>(count(as)));
        std::vector<int8_t> bv(static_cast<size_t>(count(bs)));
        for (size_t i = 0; i < av.size(); ++i) av[i] = static_cast<uint8_t>(i * 7919 % 256);
        for (size_t i = 0; i < bv.size(); ++i) bv[i] = static_cast<int8_t>(i * 104729 % 256 - 128);
        const size_t rank = std::max(as.size(), bs.size());
        auto padded = [&](std::vector<int64_t> s) {
            s.insert(s.begin(), rank - s.size(), 1);
            return s;
        };
        const auto pa = padded(as), pb = padded(bs);
        std::vector<int64_t> cs(rank);
        for (size_t d = 0; d < rank; ++d) cs[d] = std::max(pa[d], pb[d]);
        vaiq::test::GraphBuilder b;
        b.input("a", as, DataType::UInt8).input("b", bs, DataType::Int8).output("c", cs, DataType::UInt8);
        const auto scalar = scalar_initializers(b);
        scalar("sa", sa), scalar("za", za), scalar("sb", sb), scalar("zb", zb), scalar("sc", sc), scalar("zc", zc);
        b.node("QLinearMul", {"a", "sa", "za", "b", "sb", "zb", "sc", "zc"}, {"c"}, "mul").set_domain("com.microsoft");
        const auto model = contrib_model(b);
        const auto c =
            Executor(model, {.threads = 2})
                .run({{"a", Tensor::from_values<uint8_t>(as, av)}, {"b", Tensor::from_values<int8_t>(bs, bv)}})[0];
        ASSERT_EQ(c.shape(), cs);
        const float ratio = sa * sb / sc;
        int differing = 0;
        for (int64_t i = 0; i < c.size(); ++i) {
            int64_t ia = 0, ib = 0, rest = i;  // the inputs' indices of output element i
            int64_t stride_a = 1, stride_b = 1;
            for (size_t d = rank; d-- > 0;) {
                const int64_t at = rest % cs[d];
                rest /= cs[d];
                ia += (pa[d] == 1 ? 0 : at) * stride_a, ib += (pb[d] == 1 ? 0 : at) * stride_b;
                stride_a *= pa[d], stride_b *= pb[d];
            }
            const float product =
                static_cast<float>((av[static_cast<size_t>(ia)] - za) * (bv[static_cast<size_t>(ib)] - zb));
            const float v = product * ratio + static_cast<float>(zc);
            differing += c.data<uint8_t>()[i] != static_cast<uint8_t>(std::clamp(std::nearbyint(v), 0.0f, 255.0f));
        }
        EXPECT_EQ(differing, 0) << "shapes " << as.size() << "-d and " << bs.size() << "-d, " << c.size() << " outputs";
    }
}

// QLinearSigmoid and QLinearLeakyRelu look an 8-bit input's 256 values up in
// a table: every value, of both types, in a tensor larger than one thread's
// chunk, is the elementwise formula (dequantize, the function, round half to
// even and saturate).
TEST(Executor, QLinearSigmoidAndLeakyReluAreTheFormulaOnEveryValue) {
    constexpr int64_t kCount = 3 * 65536 + 17;
    for (const auto type : {DataType::UInt8, DataType::Int8})
        for (const std::string op : {"QLinearSigmoid", "QLinearLeakyRelu"}) {
            SCOPED_TRACE(op + (type == DataType::UInt8 ? " uint8" : " int8"));
            const bool u8 = type == DataType::UInt8;
            const float sx = 0.07f, sy = op == "QLinearSigmoid" ? 1.0f / 255 : 0.05f;
            const int32_t zx = u8 ? 131 : -3, zy = u8 ? (op == "QLinearSigmoid" ? 0 : 120) : -7;
            vaiq::test::GraphBuilder b;
            b.input("x", {kCount}, type).output("y", {kCount}, type);
            b.initializer("sx", Tensor::from_values<float>({}, std::vector<float>{sx}));
            b.initializer("sy", Tensor::from_values<float>({}, std::vector<float>{sy}));
            if (u8) {
                b.initializer("zx", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{static_cast<uint8_t>(zx)}));
                b.initializer("zy", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{static_cast<uint8_t>(zy)}));
            } else {
                b.initializer("zx", Tensor::from_values<int8_t>({}, std::vector<int8_t>{static_cast<int8_t>(zx)}));
                b.initializer("zy", Tensor::from_values<int8_t>({}, std::vector<int8_t>{static_cast<int8_t>(zy)}));
            }
            auto& node = b.node(op, {"x", "sx", "zx", "sy", "zy"}, {"y"}, "unary");
            node.set_domain("com.microsoft");
            vaiq::set_attribute(node, "alpha", 0.1f);
            const auto model = contrib_model(b);
            Tensor x = Tensor::uninitialized(type, {kCount});
            auto in = x.mutable_bytes();
            for (int64_t i = 0; i < kCount; ++i) in[static_cast<size_t>(i)] = static_cast<std::byte>((i * 7) % 256);
            // The kernel's own table, and the LookupTable the QDQ fusion makes of it.
            for (const bool fuse : {false, true}) {
                const auto y = Executor(model, {.fuse_qdq = fuse}).run({{"x", x}})[0];
                ASSERT_EQ(y.type(), type);
                const auto out = y.bytes();
                const double lo = u8 ? 0 : -128, hi = u8 ? 255 : 127;
                for (int64_t i = 0; i < kCount; ++i) {
                    const auto bits = static_cast<uint8_t>(in[static_cast<size_t>(i)]);
                    const int32_t q = u8 ? bits : static_cast<int8_t>(bits);
                    const float f = static_cast<float>(q - zx) * sx;
                    const float r = op == "QLinearSigmoid" ? 1.0f / (1.0f + std::exp(-f)) : (f < 0 ? f * 0.1f : f);
                    const double expected = std::clamp(std::nearbyint(static_cast<double>(r / sy)) + zy, lo, hi);
                    const auto got = static_cast<uint8_t>(out[static_cast<size_t>(i)]);
                    ASSERT_EQ(u8 ? got : static_cast<int8_t>(got), static_cast<int32_t>(expected))
                        << "input " << q << (fuse ? ", fused" : "");
                }
            }
        }
}

// ConvInteger of uint8 x (one zero point) and int8 weights runs on the int8
// convolution: its sums are the definition's, padding counted as the zero point.
TEST(Executor, ConvIntegerOfInt8WeightsIsTheDefinition) {
    constexpr int64_t kC = 5, kM = 6, kH = 7, kW = 9;
    std::vector<uint8_t> xv(kC * kH * kW);
    std::vector<int8_t> wv(kM * kC * 3 * 3);
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
    for (size_t i = 0; i < wv.size(); ++i) wv[i] = static_cast<int8_t>(static_cast<int>((i * 53 + 7) % 255) - 127);
    constexpr int32_t kZero = 3;
    vaiq::test::GraphBuilder b;
    b.input("x", {1, kC, kH, kW}, DataType::UInt8).output("y", {1, kM, kH, kW}, DataType::Int32);
    b.initializer("w", Tensor::from_values<int8_t>({kM, kC, 3, 3}, wv));
    b.initializer("zx", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{kZero}));
    vaiq::test::set_ints_attribute(b.node("ConvInteger", {"x", "w", "zx"}, {"y"}, "conv"), "pads", {1, 1, 1, 1});
    const auto model = b.build();
    const auto y = Executor(model).run({{"x", Tensor::from_values<uint8_t>({1, kC, kH, kW}, xv)}})[0];
    ASSERT_EQ(y.shape(), (std::vector<int64_t>{1, kM, kH, kW}));
    const auto got = y.data<int32_t>();
    for (int64_t m = 0; m < kM; ++m)
        for (int64_t i = 0; i < kH; ++i)
            for (int64_t j = 0; j < kW; ++j) {
                int32_t sum = 0;
                for (int64_t c = 0; c < kC; ++c)
                    for (int64_t u = 0; u < 3; ++u)
                        for (int64_t v = 0; v < 3; ++v) {
                            const int64_t r = i + u - 1, q = j + v - 1;
                            const int32_t xq = r < 0 || r >= kH || q < 0 || q >= kW
                                                   ? kZero
                                                   : xv[static_cast<size_t>((c * kH + r) * kW + q)];
                            sum += (xq - kZero) * wv[static_cast<size_t>(((m * kC + c) * 3 + u) * 3 + v)];
                        }
                ASSERT_EQ(got[static_cast<size_t>((m * kH + i) * kW + j)], sum) << m << " " << i << " " << j;
            }
}

// ConvInteger of uint8 weights with a zero point per output channel (the
// QUInt8 weights of QLinearOps models) runs as column blocks times weight rows:
// two groups, a stride, padding, and more output positions (40 x 34) than one
// block of 1,024 holds. Its sums are the definition's.
TEST(Executor, ConvIntegerOfUint8WeightsWithZeroPointsIsTheDefinition) {
    constexpr int64_t kC = 4, kM = 6, kH = 80, kW = 67, kGroups = 2, kStride = 2, kOh = 40, kOw = 34;
    constexpr int64_t kCg = kC / kGroups, kMg = kM / kGroups;
    std::vector<uint8_t> xv(kC * kH * kW), wv(kM * kCg * 3 * 3), wz(kM);
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
    for (size_t i = 0; i < wv.size(); ++i) wv[i] = static_cast<uint8_t>((i * 53 + 7) % 256);
    for (size_t i = 0; i < wz.size(); ++i) wz[i] = static_cast<uint8_t>(100 + 10 * i);
    constexpr int32_t kZero = 3;
    vaiq::test::GraphBuilder b;
    b.input("x", {1, kC, kH, kW}, DataType::UInt8).output("y", {1, kM, kOh, kOw}, DataType::Int32);
    b.initializer("w", Tensor::from_values<uint8_t>({kM, kCg, 3, 3}, wv));
    b.initializer("zx", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{kZero}));
    b.initializer("zw", Tensor::from_values<uint8_t>({kM}, wz));
    auto& conv = b.node("ConvInteger", {"x", "w", "zx", "zw"}, {"y"}, "conv");
    vaiq::test::set_ints_attribute(conv, "pads", {1, 1, 1, 1});
    vaiq::test::set_ints_attribute(conv, "strides", {kStride, kStride});
    vaiq::set_attribute(conv, "group", kGroups);
    const auto model = b.build();
    const auto y = Executor(model).run({{"x", Tensor::from_values<uint8_t>({1, kC, kH, kW}, xv)}})[0];
    ASSERT_EQ(y.shape(), (std::vector<int64_t>{1, kM, kOh, kOw}));
    const auto got = y.data<int32_t>();
    for (int64_t m = 0; m < kM; ++m)
        for (int64_t i = 0; i < kOh; ++i)
            for (int64_t j = 0; j < kOw; ++j) {
                int32_t sum = 0;
                for (int64_t c = 0; c < kCg; ++c)
                    for (int64_t u = 0; u < 3; ++u)
                        for (int64_t v = 0; v < 3; ++v) {
                            const int64_t r = i * kStride + u - 1, q = j * kStride + v - 1;
                            const int64_t channel = m / kMg * kCg + c;
                            const int32_t xq = r < 0 || r >= kH || q < 0 || q >= kW
                                                   ? kZero
                                                   : xv[static_cast<size_t>((channel * kH + r) * kW + q)];
                            const int32_t wq = wv[static_cast<size_t>(((m * kCg + c) * 3 + u) * 3 + v)];
                            sum += (xq - kZero) * (wq - wz[static_cast<size_t>(m)]);
                        }
                ASSERT_EQ(got[static_cast<size_t>((m * kOh + i) * kOw + j)], sum) << m << " " << i << " " << j;
            }
}

// QLinearConcat requantizes each 8-bit input through its own table (a copy
// where it has the output's parameters): every value as the formula gives it.
TEST(Executor, QLinearConcatRequantizesEachInputAsTheFormula) {
    constexpr int64_t kRows = 2, kA = 3, kB = 4, kInner = 50;
    std::vector<uint8_t> av(kRows * kA * kInner), bv(kRows * kB * kInner);
    for (size_t i = 0; i < av.size(); ++i) av[i] = static_cast<uint8_t>(i * 7 % 256);
    for (size_t i = 0; i < bv.size(); ++i) bv[i] = static_cast<uint8_t>(i * 11 % 256);
    vaiq::test::GraphBuilder b;
    b.input("a", {kRows, kA, kInner}, DataType::UInt8).input("b", {kRows, kB, kInner}, DataType::UInt8);
    b.output("y", {kRows, kA + kB, kInner}, DataType::UInt8);
    const auto scalar = scalar_initializers(b);
    scalar("sa", 0.031f), scalar("za", uint8_t{10}), scalar("sy", 0.02f), scalar("zy", uint8_t{128});
    auto& node = b.node("QLinearConcat", {"sy", "zy", "a", "sa", "za", "b", "sy", "zy"}, {"y"}, "concat");
    node.set_domain("com.microsoft");
    vaiq::set_attribute(node, "axis", 1);
    const auto model = contrib_model(b);
    const auto y = Executor(model).run({{"a", Tensor::from_values<uint8_t>({kRows, kA, kInner}, av)},
                                        {"b", Tensor::from_values<uint8_t>({kRows, kB, kInner}, bv)}})[0];
    ASSERT_EQ(y.shape(), (std::vector<int64_t>{kRows, kA + kB, kInner}));
    const auto out = y.data<uint8_t>();
    for (int64_t r = 0; r < kRows; ++r)
        for (int64_t c = 0; c < kA + kB; ++c)
            for (int64_t i = 0; i < kInner; ++i) {
                const size_t at = static_cast<size_t>((r * (kA + kB) + c) * kInner + i);
                if (c >= kA) {  // the output's own parameters: copied
                    ASSERT_EQ(out[at], bv[static_cast<size_t>((r * kB + c - kA) * kInner + i)]);
                    continue;
                }
                const float f = static_cast<float>(av[static_cast<size_t>((r * kA + c) * kInner + i)] - 10) * 0.031f;
                const double expected = std::clamp(std::nearbyint(static_cast<double>(f / 0.02f)) + 128, 0.0, 255.0);
                ASSERT_EQ(out[at], static_cast<uint8_t>(expected)) << r << " " << c << " " << i;
            }
}

TEST(Executor, QLinearAddAndMulRoundNearTiesAsOnnxRuntime) {
    auto run = [](const std::string& op, uint8_t a, float sa, uint8_t za, uint8_t bv, float sb, uint8_t zb, float sc,
                  uint8_t zc) {
        vaiq::test::GraphBuilder b;
        b.input("a", {1}, DataType::UInt8).input("b", {1}, DataType::UInt8).output("c", {1}, DataType::UInt8);
        b.initializer("sa", Tensor::from_values<float>({}, std::vector<float>{sa}));
        b.initializer("za", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{za}));
        b.initializer("sb", Tensor::from_values<float>({}, std::vector<float>{sb}));
        b.initializer("zb", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{zb}));
        b.initializer("sc", Tensor::from_values<float>({}, std::vector<float>{sc}));
        b.initializer("zc", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{zc}));
        b.node(op, {"a", "sa", "za", "b", "sb", "zb", "sc", "zc"}, {"c"}, "op").set_domain("com.microsoft");
        const auto model = contrib_model(b);
        Executor e(model);
        return e
            .run({{"a", Tensor::from_values<uint8_t>({1}, std::vector<uint8_t>{a})},
                  {"b", Tensor::from_values<uint8_t>({1}, std::vector<uint8_t>{bv})}})[0]
            .data<uint8_t>()[0];
    };
    const float sa = 0x1.e7a4fep-6f, sb = 0x1.d5c55cp-12f, sc = 0x1.e8b12p-6f;
    // (114 - 133) sa + (82 - 118) sb is 113.4999911 steps above zc - 133: the fixed part's
    // fused multiply-add (ONNX Runtime's AVX2 kernel) lifts it to 113.50001, which rounds to 114.
    const bool fused = vaiq::runtime::cpu_features().avx2 && vaiq::runtime::cpu_features().fma;
    EXPECT_EQ(run("QLinearAdd", 114, sa, 133, 82, sb, 118, sc, 133), fused ? 114 : 113);
    // QLinearMul: float((a - za)(b - zb)) * ((sa sb) / sc) + zc. With every scale 0.1 and
    // a = b = 5, 25 * 0.10000001 = 2.5000002 rounds to 3; the dequantized values'
    // product, 0.5 * 0.5 / 0.1 = 2.5, would round to 2.
    EXPECT_EQ(run("QLinearMul", 5, 0.1f, 0, 5, 0.1f, 0, 0.1f, 0), 3);
}

// QLinearGlobalAveragePool as MLAS computes it: the integer sum (753) times
// 0.1 / (0.1 * 6) in float is 125.49999, so 125; averaging the dequantized values
// would give 125.5 and round to 126.
TEST(Executor, QLinearGlobalAveragePoolScalesTheIntegerSum) {
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 1, 2, 3}, DataType::UInt8).output("y", {1, 1, 1, 1}, DataType::UInt8);
    b.initializer("s", Tensor::from_values<float>({}, std::vector<float>{0.1f}));
    b.initializer("z", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{0}));
    b.node("QLinearGlobalAveragePool", {"x", "s", "z", "s", "z"}, {"y"}, "gap").set_domain("com.microsoft");
    const auto model = contrib_model(b);
    Executor e(model);
    const auto y =
        e.run({{"x", Tensor::from_values<uint8_t>({1, 1, 2, 3}, std::vector<uint8_t>{69, 211, 65, 104, 164, 140})}})[0];
    EXPECT_EQ(y.data<uint8_t>()[0], 125);
}

// Channels-last (the layout pass's form), two images of 7 x 7 x 400, at one and
// two threads (each thread summing its share of the pixels): every channel's
// value equals the NCHW form's on the same data.
TEST(Executor, QLinearGlobalAveragePoolChannelsLastEqualsChannelsFirst) {
    const int64_t n = 2, h = 7, w = 7, c = 400;
    std::vector<uint8_t> nhwc(static_cast<size_t>(n * h * w * c)), nchw(nhwc.size());
    std::mt19937 rng(3);
    std::uniform_int_distribution<int> byte(0, 255);
    for (int64_t b = 0; b < n; ++b)
        for (int64_t p = 0; p < h * w; ++p)
            for (int64_t ch = 0; ch < c; ++ch) {
                const auto v = static_cast<uint8_t>(byte(rng));
                nhwc[static_cast<size_t>((b * h * w + p) * c + ch)] = v;
                nchw[static_cast<size_t>((b * c + ch) * h * w + p)] = v;
            }
    auto pool = [&](bool channels_last, int threads) {
        vaiq::test::GraphBuilder b;
        const std::vector<int64_t> shape =
            channels_last ? std::vector<int64_t>{n, h, w, c} : std::vector<int64_t>{n, c, h, w};
        b.input("x", shape, DataType::UInt8).output("y", {}, DataType::UInt8);
        b.initializer("s", Tensor::from_values<float>({}, std::vector<float>{0.1f}));
        b.initializer("z", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{7}));
        b.initializer("sy", Tensor::from_values<float>({}, std::vector<float>{0.07f}));
        auto& gap = b.node("QLinearGlobalAveragePool", {"x", "s", "z", "sy", "z"}, {"y"}, "gap");
        gap.set_domain("com.microsoft");
        vaiq::test::set_attribute(gap, "channels_last", channels_last ? 1 : 0);
        const auto model = contrib_model(b);
        return Executor(model, {.threads = threads})
            .run({{"x", Tensor::from_values<uint8_t>(shape, channels_last ? nhwc : nchw)}})[0];
    };
    const auto first = pool(false, 1);
    const auto values = first.data<uint8_t>();
    EXPECT_GT(std::set<uint8_t>(values.begin(), values.end()).size(), 10u);  // not one clamped value
    for (int threads : {1, 2}) {
        const auto last = pool(true, threads);
        ASSERT_EQ(last.size(), first.size());
        for (int64_t k = 0; k < first.size(); ++k)
            ASSERT_EQ(last.data<uint8_t>()[k], values[k]) << k << " at " << threads << " threads";
    }
}

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
    vaiq::test::set_attribute(conv, "group", group);
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
                    const X want =
                        vaiq::quantize_value<X>(static_cast<float>(acc) * multiplier, static_cast<double>(zy));
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

// An 8-bit output `y` of executor `e` equal byte for byte to `whole` (the NCHW
// path's) and not all one value, with `convolutions` channels-last integer
// convolutions run where the CPU's oneDNN int8 kernels are exact.
void expect_as_whole(Executor& e, const Tensor& y, const Tensor& whole, int64_t convolutions, int threads) {
    ASSERT_EQ(y.shape(), whole.shape());
    size_t differ = 0, spread = 0;
    const auto* a = reinterpret_cast<const uint8_t*>(y.bytes().data());
    const auto* b = reinterpret_cast<const uint8_t*>(whole.bytes().data());
    for (int64_t i = 0; i < y.size(); ++i) differ += a[i] != b[i], spread += a[i] != a[0];
    EXPECT_EQ(differ, 0u) << threads << " threads";
    EXPECT_GT(spread, static_cast<size_t>(y.size() / 2)) << "the outputs are not all one value";
    std::map<std::string, int64_t> calls;
    for (const auto& p : e.profile()) calls[p.op_type] = p.calls;
    if (calls.count("NhwcQLinearConv")) {
        EXPECT_EQ(calls["NhwcQLinearConv"], convolutions);
    }
}

// A chain of integer convolutions runs channels-last, each computed a band of
// output rows (or of whole images) at a time. Outputs of up to 576K values an
// image make bands of rows, with the image's top and bottom padding in the first
// and last band: a padded copy (zero point 37), oneDNN's own padding (zero point
// 0) at stride 2 with uneven pads, a 1x1 whose two images share a band (on one
// thread; on two each has its own), a dilated 3x3. Every value equals the NCHW
// path's, which computes each convolution whole.
TEST(Executor, ChannelsLastConvolutionBandsAgreeWithTheWholeConvolution) {
    struct Layer {
        int64_t m, group, k, stride, dilation;
        std::vector<int64_t> pads;
        uint8_t zy;
    };
    const Layer layers[] = {{64, 1, 3, 1, 1, {1, 1, 1, 1}, 0},
                            {64, 64, 3, 2, 1, {0, 1, 1, 0}, 128},
                            {8, 1, 1, 1, 1, {0, 0, 0, 0}, 0},
                            {40, 1, 3, 1, 2, {2, 2, 2, 2}, 9}};
    const int64_t n = 2, c = 4, h = 100, w = 90;
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> byte(0, 255), weight(-127, 127);
    vaiq::test::GraphBuilder b;
    b.input("x", {n, c, h, w}, DataType::UInt8).output("y", {}, DataType::UInt8);
    const auto scalar = scalar_initializers(b);
    scalar("z_in", uint8_t{37});
    scalar("s_in", 0.02f);
    scalar("zw", int8_t{0});
    std::string input = "x", zero_point = "z_in", scale = "s_in";
    int64_t channels = c;
    for (size_t i = 0; i < std::size(layers); ++i) {
        const auto& l = layers[i];
        const auto id = std::to_string(i);
        std::vector<int8_t> wt(static_cast<size_t>(l.m * (channels / l.group) * l.k * l.k));
        for (auto& v : wt) v = static_cast<int8_t>(weight(rng));
        std::vector<int32_t> bias(static_cast<size_t>(l.m));
        for (auto& v : bias) v = weight(rng) * 50;
        b.initializer("w" + id, Tensor::from_values<int8_t>({l.m, channels / l.group, l.k, l.k}, wt));
        b.initializer("b" + id, Tensor::from_values<int32_t>({l.m}, bias));
        scalar("sw" + id, 0.004f);
        scalar("sy" + id, 0.6f);
        scalar("zy" + id, l.zy);
        auto& conv = b.node("QLinearConv",
                            {input, scale, zero_point, "w" + id, "sw" + id, "zw", "sy" + id, "zy" + id, "b" + id},
                            {i + 1 == std::size(layers) ? "y" : "c" + id}, "conv" + id);
        vaiq::test::set_ints_attribute(conv, "pads", l.pads);
        vaiq::test::set_ints_attribute(conv, "strides", {l.stride, l.stride});
        vaiq::test::set_ints_attribute(conv, "dilations", {l.dilation, l.dilation});
        vaiq::test::set_attribute(conv, "group", l.group);
        input = "c" + id, zero_point = "zy" + id, scale = "sy" + id, channels = l.m;
    }
    const auto model = b.build();
    std::vector<uint8_t> x(static_cast<size_t>(n * c * h * w));
    for (auto& v : x) v = static_cast<uint8_t>(byte(rng));
    const auto feed = Tensor::from_values<uint8_t>({n, c, h, w}, x);
    for (const int threads : {1, 2}) {
        Executor banded(model, {.threads = threads, .profile = true});
        const auto y = banded.run({{"x", feed}})[0];
        const auto whole = Executor(model, {.threads = threads, .optimize_layout = false}).run({{"x", feed}})[0];
        EXPECT_EQ(y.shape(), (std::vector<int64_t>{n, 40, 50, 45}));
        expect_as_whole(banded, y, whole, 4, threads);
    }
}

// The bands of resnet50's 56 x 56 1x1 convolutions (64 -> 256 channels) split
// their 56 rows evenly: in bands of 5 the last held one row, which in the first
// band's weight layout oneDNN's brgconv kernels (AVX-512 CPUs with bf16) refused,
// leaving its reference loops: 40 ms for that band, 0.04 ms for the others.
// oneDNN's verbose log names the kernel each execution ran. (66 input channels:
// the pointwise kernel, which runs resnet50's 64 now, leaves them to oneDNN.)
TEST(Executor, ChannelsLastConvolutionBandsNeverRunOnReferenceLoops) {
    const int64_t c = 66, m = 256, h = 56, w = 56;
    std::mt19937 rng(11);
    std::uniform_int_distribution<int> byte(0, 255), weight(-127, 127);
    vaiq::test::GraphBuilder b;
    b.input("x", {1, c, h, w}, DataType::UInt8).output("y", {}, DataType::UInt8);
    const auto scalar = scalar_initializers(b);
    scalar("zx", uint8_t{0});
    scalar("sx", 0.02f);
    scalar("zw", int8_t{0});
    scalar("sw", 0.004f);
    scalar("sy", 0.3f);
    scalar("zy", uint8_t{128});  // centred: few outputs clamp, so they are far from one value
    std::vector<int8_t> wt(static_cast<size_t>(m * c));
    for (auto& v : wt) v = static_cast<int8_t>(weight(rng));
    b.initializer("w", Tensor::from_values<int8_t>({m, c, 1, 1}, wt));
    b.node("QLinearConv", {"x", "sx", "zx", "w", "sw", "zw", "sy", "zy"}, {"y"}, "conv");
    const auto model = b.build();
    std::vector<uint8_t> x(static_cast<size_t>(c * h * w));
    for (auto& v : x) v = static_cast<uint8_t>(byte(rng));
    const auto feed = Tensor::from_values<uint8_t>({1, c, h, w}, x);
    for (const int threads : {1, 2}) {
        Executor banded(model, {.threads = threads, .profile = true});
        testing::internal::CaptureStdout();
        dnnl::set_verbose(1);
        const auto y = banded.run({{"x", feed}})[0];
        dnnl::set_verbose(0);
        const std::string log = testing::internal::GetCapturedStdout();
        EXPECT_NE(log.find("exec,cpu,convolution,"), std::string::npos) << "oneDNN's log is not there to read";
        EXPECT_EQ(log.find("exec,cpu,convolution,ref"), std::string::npos) << threads << " threads:\n" << log;
        const auto whole = Executor(model, {.threads = threads, .optimize_layout = false}).run({{"x", feed}})[0];
        expect_as_whole(banded, y, whole, 1, threads);
    }
}

// Depthwise 3x3 convolutions run channels-last, summed and requantized in
// registers where the CPU has AVX-512 VNNI: int8 and uint8 in and out, channel
// counts that fill and that leave part of a 64-channel block or that put
// several pixels in one (32, 16: at stride 1, not at the edges), strides 1 and 2,
// even, uneven and no pads, per-tensor and per-channel weight scales. Every value
// equals the NCHW path's (oneDNN's whole convolution, checked by hand above).
TEST(Executor, DepthwiseConvolutionsAgreeWithTheWholeConvolution) {
    struct Case {
        DataType x_type, y_type;
        int64_t c, stride;
        std::vector<int64_t> pads;
        bool per_channel;
    };
    const Case cases[] = {{DataType::UInt8, DataType::UInt8, 64, 1, {1, 1, 1, 1}, false},
                          {DataType::Int8, DataType::Int8, 100, 2, {0, 1, 1, 0}, true},
                          {DataType::UInt8, DataType::Int8, 24, 2, {1, 1, 1, 1}, true},
                          {DataType::Int8, DataType::UInt8, 144, 1, {0, 0, 0, 0}, false},
                          // a vector holds several pixels' channels (all but the edges)
                          {DataType::UInt8, DataType::UInt8, 32, 1, {1, 1, 1, 1}, true},
                          {DataType::Int8, DataType::Int8, 16, 1, {1, 0, 1, 2}, false},
                          {DataType::UInt8, DataType::UInt8, 32, 2, {1, 1, 1, 1}, false}};
    std::mt19937 rng(9);
    for (const auto& k : cases) {
        SCOPED_TRACE(k.c);
        const int64_t n = 2, h = 13, w = 11;
        vaiq::test::GraphBuilder b;
        b.input("x", {n, k.c, h, w}, k.x_type).output("y", {}, k.y_type);
        b.initializer("sx", Tensor::from_values<float>({}, std::vector<float>{0.03f}));
        b.initializer("zx", byte_of(k.x_type, k.x_type == DataType::Int8 ? -7 : 131));
        conv_weights(b, {k.c, 1, 3, 3}, k.per_channel, 0.002f, 17, rng);
        b.initializer("sy", Tensor::from_values<float>({}, std::vector<float>{0.05f}));
        b.initializer("zy", byte_of(k.y_type, k.y_type == DataType::Int8 ? 5 : 90));
        auto& conv = b.node("QLinearConv", {"x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "bias"}, {"y"}, "dw");
        vaiq::test::set_ints_attribute(conv, "pads", k.pads);
        vaiq::test::set_ints_attribute(conv, "strides", {k.stride, k.stride});
        vaiq::test::set_attribute(conv, "group", k.c);
        const auto model = b.build();
        const Tensor feed = random_bytes(k.x_type, {n, k.c, h, w}, rng);
        for (const int threads : {1, 2}) {
            Executor nhwc(model, {.threads = threads, .profile = true});
            const auto y = nhwc.run({{"x", feed}})[0];
            const auto whole = Executor(model, {.threads = threads, .optimize_layout = false}).run({{"x", feed}})[0];
            expect_as_whole(nhwc, y, whole, 1, threads);
        }
    }
}

// 1x1 convolutions run channels-last, summed and requantized in registers
// where the CPU has AVX-512 VNNI: int8 and uint8 in and out; output channels
// that fill 64-channel groups and that leave one, two, three or four vectors
// of 16 in a last group (or only part of one); strides 1 and 2; per-tensor and
// per-channel weight scales; output bounds (a fused activation's). 286 and 84
// output pixels: the last six-pixel tile of a thread's share is partial. Every
// value equals the NCHW path's (oneDNN's whole convolution, checked by hand
// above). oneDNN's verbose log shows that no oneDNN convolution ran, except
// for input channels that are not a multiple of 4, which the kernel leaves to it.
TEST(Executor, PointwiseConvolutionsAgreeWithTheWholeConvolution) {
    struct Case {
        DataType x_type, y_type;
        int64_t c, m, stride;
        bool per_channel;
        std::optional<std::pair<int64_t, int64_t>> bounds;
    };
    const Case cases[] = {{DataType::UInt8, DataType::UInt8, 16, 96, 1, false, {}},
                          {DataType::Int8, DataType::Int8, 24, 144, 1, true, {}},
                          {DataType::UInt8, DataType::Int8, 32, 64, 2, false, {}},
                          {DataType::Int8, DataType::UInt8, 8, 100, 1, false, std::pair<int64_t, int64_t>{3, 200}},
                          {DataType::UInt8, DataType::UInt8, 64, 200, 2, true, std::pair<int64_t, int64_t>{90, 255}},
                          {DataType::Int8, DataType::Int8, 4, 7, 1, true, std::pair<int64_t, int64_t>{-20, 50}},
                          {DataType::UInt8, DataType::Int8, 12, 60, 1, true, {}},
                          {DataType::UInt8, DataType::UInt8, 6, 40, 1, false, {}}};  // left to oneDNN
    std::mt19937 rng(13);
    for (const auto& k : cases) {
        SCOPED_TRACE(fmt::format("{} -> {} channels, stride {}", k.c, k.m, k.stride));
        const int64_t n = 2, h = 13, w = 11;
        vaiq::test::GraphBuilder b;
        b.input("x", {n, k.c, h, w}, k.x_type).output("y", {}, k.y_type);
        b.initializer("sx", Tensor::from_values<float>({}, std::vector<float>{0.03f}));
        b.initializer("zx", byte_of(k.x_type, k.x_type == DataType::Int8 ? -7 : 131));
        conv_weights(b, {k.m, k.c, 1, 1}, k.per_channel, 0.001f, 13, rng);
        b.initializer("sy", Tensor::from_values<float>({}, std::vector<float>{0.01f}));
        b.initializer("zy", byte_of(k.y_type, k.y_type == DataType::Int8 ? 5 : 110));
        auto& conv = b.node("QLinearConv", {"x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "bias"}, {"y"}, "pw");
        vaiq::test::set_ints_attribute(conv, "strides", {k.stride, k.stride});
        if (k.bounds) {
            vaiq::test::set_attribute(conv, vaiq::runtime::kOutputMinAttribute, k.bounds->first);
            vaiq::test::set_attribute(conv, vaiq::runtime::kOutputMaxAttribute, k.bounds->second);
        }
        const auto model = b.build();
        const Tensor feed = random_bytes(k.x_type, {n, k.c, h, w}, rng);
        for (const int threads : {1, 2}) {
            Executor nhwc(model, {.threads = threads, .profile = true});
            testing::internal::CaptureStdout();
            dnnl::set_verbose(1);
            const auto y = nhwc.run({{"x", feed}})[0];
            dnnl::set_verbose(0);
            const bool onednn =
                testing::internal::GetCapturedStdout().find("exec,cpu,convolution,") != std::string::npos;
            if (vaiq::runtime::int8_pointwise_available()) {
                EXPECT_EQ(onednn, k.c % 4 != 0) << threads << " threads";
            }
            const auto whole = Executor(model, {.threads = threads, .optimize_layout = false}).run({{"x", feed}})[0];
            expect_as_whole(nhwc, y, whole, 1, threads);
            if (k.bounds) {
                const auto* v = reinterpret_cast<const uint8_t*>(y.bytes().data());
                auto value = [&](int64_t i) {
                    return k.y_type == DataType::Int8 ? int64_t{static_cast<int8_t>(v[i])} : int64_t{v[i]};
                };
                int64_t lo = 255, hi = -128;
                for (int64_t i = 0; i < y.size(); ++i) lo = std::min(lo, value(i)), hi = std::max(hi, value(i));
                EXPECT_EQ(lo, k.bounds->first);  // reached, not passed
                EXPECT_EQ(hi, k.bounds->second);
            }
        }
    }
}

// x -> QLinearConv 1x1 (c -> m channels) -> "e" -> QLinearConv depthwise 3x3 -> y,
// both with a bias; bounds on either output when given (a fused activation's).
struct DepthwisePair {
    DataType x_type, e_type, y_type;
    int64_t c, m, stride;
    std::vector<int64_t> pads;
    std::optional<std::pair<int64_t, int64_t>> e_bounds, y_bounds;
};

vaiq::Model depthwise_pair_model(const DepthwisePair& k, int64_t n, int64_t h, int64_t w, bool e_is_output,
                                 std::mt19937& rng) {
    std::uniform_int_distribution<int> weight(-127, 127);
    auto weights = [&](std::vector<int64_t> shape) {
        std::vector<int8_t> v(static_cast<size_t>(vaiq::element_count(shape)));
        for (auto& x : v) x = static_cast<int8_t>(weight(rng));
        return Tensor::from_values<int8_t>(shape, v);
    };
    auto bias = [&](int64_t scale) {
        std::vector<int32_t> v(static_cast<size_t>(k.m));
        for (auto& x : v) x = weight(rng) * static_cast<int32_t>(scale);
        return Tensor::from_values<int32_t>({k.m}, v);
    };
    vaiq::test::GraphBuilder b;
    b.input("x", {n, k.c, h, w}, k.x_type).output("y", {}, k.y_type);
    if (e_is_output) b.output("e", {}, k.e_type);
    const auto scalar = scalar_initializers(b);
    scalar("sx", 0.03f);
    b.initializer("zx", byte_of(k.x_type, k.x_type == DataType::Int8 ? -7 : 131));
    scalar("se", 0.02f);
    b.initializer("ze", byte_of(k.e_type, k.e_type == DataType::Int8 ? 3 : 100));
    scalar("sy", 0.03f);
    b.initializer("zy", byte_of(k.y_type, k.y_type == DataType::Int8 ? -4 : 120));
    scalar("zw", int8_t{0});
    std::vector<float> sw(static_cast<size_t>(k.m));
    for (size_t i = 0; i < sw.size(); ++i) sw[i] = 0.005f + 0.0005f * static_cast<float>(i % 11);
    b.initializer("sp", Tensor::from_values<float>({}, std::vector<float>{0.004f}));
    b.initializer("sd", Tensor::from_values<float>({k.m}, sw));
    b.initializer("zd", Tensor::from_values<int8_t>({k.m}, std::vector<int8_t>(sw.size(), 0)));
    b.initializer("wp", weights({k.m, k.c, 1, 1}));
    b.initializer("wd", weights({k.m, 1, 3, 3}));
    b.initializer("bp", bias(40));
    b.initializer("bd", bias(20));
    auto& pointwise = b.node("QLinearConv", {"x", "sx", "zx", "wp", "sp", "zw", "se", "ze", "bp"}, {"e"}, "pw");
    auto& depthwise = b.node("QLinearConv", {"e", "se", "ze", "wd", "sd", "zd", "sy", "zy", "bd"}, {"y"}, "dw");
    vaiq::test::set_attribute(depthwise, "group", k.m);
    vaiq::test::set_ints_attribute(depthwise, "pads", k.pads);
    vaiq::test::set_ints_attribute(depthwise, "strides", {k.stride, k.stride});
    for (auto [node, bounds] : {std::pair{&pointwise, k.e_bounds}, std::pair{&depthwise, k.y_bounds}})
        if (bounds) {
            vaiq::test::set_attribute(*node, vaiq::runtime::kOutputMinAttribute, bounds->first);
            vaiq::test::set_attribute(*node, vaiq::runtime::kOutputMaxAttribute, bounds->second);
        }
    return b.build();
}

// A 1x1 integer convolution read only by a depthwise 3x3 one runs with it as one
// step, an image at a time (three images here): every output equals the NCHW
// path's, which runs each convolution whole, at one and two threads, with int8
// and uint8 tensors, strides 1 and 2, even and uneven pads, and bounds on either
// output. Input channels that are not a multiple of 4 leave the 1x1 to oneDNN:
// the step then runs the two as they run alone. The expanded tensor as a graph
// output, or tapped, keeps them apart.
TEST(Executor, IntegerDepthwisePairsRunAsOneStepAndAgreeWithTheWholeConvolutions) {
    using Bounds = std::pair<int64_t, int64_t>;
    const DepthwisePair cases[] = {
        {DataType::UInt8, DataType::UInt8, DataType::UInt8, 16, 96, 1, {1, 1, 1, 1}, {}, {}},
        {DataType::Int8, DataType::Int8, DataType::Int8, 24, 40, 2, {1, 1, 1, 1}, Bounds{-60, 90}, {}},
        {DataType::UInt8, DataType::Int8, DataType::UInt8, 8, 64, 2, {0, 1, 1, 0}, {}, Bounds{100, 250}},
        {DataType::Int8, DataType::UInt8, DataType::Int8, 32, 144, 1, {1, 0, 1, 2}, Bounds{80, 160}, Bounds{-100, 60}},
        {DataType::UInt8, DataType::UInt8, DataType::UInt8, 6, 32, 1, {1, 1, 1, 1}, {}, {}}};  // 1x1 on oneDNN
    std::mt19937 rng(17);
    const int64_t n = 3, h = 13, w = 11;
    for (const auto& k : cases) {
        SCOPED_TRACE(fmt::format("{} -> {} channels, stride {}", k.c, k.m, k.stride));
        const auto model = depthwise_pair_model(k, n, h, w, false, rng);
        const Tensor feed = random_bytes(k.x_type, {n, k.c, h, w}, rng);
        for (const int threads : {1, 2}) {
            Executor fused(model, {.threads = threads, .profile = true});
            const auto y = fused.run({{"x", feed}})[0];
            const auto whole = Executor(model, {.threads = threads, .optimize_layout = false}).run({{"x", feed}})[0];
            expect_as_whole(fused, y, whole, 0, threads);
            std::map<std::string, int64_t> calls;
            for (const auto& p : fused.profile()) calls[p.op_type] = p.calls;
            EXPECT_EQ(calls["NhwcQLinearConvPair"], 1) << threads;  // the layout pass pairs them on any CPU
            if (k.y_bounds) {
                const auto* v = reinterpret_cast<const uint8_t*>(y.bytes().data());
                int64_t lo = 255, hi = -128;
                for (int64_t i = 0; i < y.size(); ++i) {
                    const int64_t value = k.y_type == DataType::Int8 ? int64_t{static_cast<int8_t>(v[i])} : v[i];
                    lo = std::min(lo, value), hi = std::max(hi, value);
                }
                EXPECT_EQ(lo, k.y_bounds->first);  // reached, not passed
                EXPECT_EQ(hi, k.y_bounds->second);
            }
        }
    }
    // Apart: the expanded tensor is an output, or tapped.
    const auto& k = cases[0];
    const Tensor feed = random_bytes(k.x_type, {n, k.c, h, w}, rng);
    auto pairs = [](Executor& e) {
        for (const auto& p : e.profile())
            if (p.op_type == "NhwcQLinearConvPair") return p.calls;
        return int64_t{0};
    };
    const auto two_outputs = depthwise_pair_model(k, n, h, w, true, rng);
    Executor with_output(two_outputs, {.profile = true});
    EXPECT_EQ(with_output.run({{"x", feed}}).size(), 2u);
    EXPECT_EQ(pairs(with_output), 0);
    const auto model = depthwise_pair_model(k, n, h, w, false, rng);
    Executor tapped(model, {.profile = true, .taps = {"e"}});
    size_t taps = 0;
    tapped.run({{"x", feed}}, {"e"}, [&](const std::string&, const Tensor&) { ++taps; });
    EXPECT_EQ(taps, 1u);
    EXPECT_EQ(pairs(tapped), 0);
}

// x -> Q -> DQ -> Conv(DQ(w), DQ(b)) -> Clip(0, clip_max) -> Q -> DQ -> y, as the qdq format writes it.
vaiq::Model qdq_conv(float clip_max) {
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 2, 5, 5}).output("y", {1, 3, 5, 5});
    const auto scalar = scalar_initializers(b);
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

// x -> Q/DQ (scale s) -> op -> t -> Q/DQ (scale s_out), one zero point; `configure` sets the op's attributes.
vaiq::Model pair_around(const std::string& op, const std::vector<int64_t>& in, const std::vector<int64_t>& out, float s,
                        float s_out, const std::function<void(onnx::NodeProto&)>& configure = {}) {
    vaiq::test::GraphBuilder b;
    b.input("x", in).output("y", out);
    b.initializer("s", Tensor::from_values<float>({}, std::vector<float>{s}));
    b.initializer("so", Tensor::from_values<float>({}, std::vector<float>{s_out}));
    b.initializer("z", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{100}));
    b.node("QuantizeLinear", {"x", "s", "z"}, {"xq"});
    b.node("DequantizeLinear", {"xq", "s", "z"}, {"xd"});
    auto& n = b.node(op, {"xd"}, {"t"}, "op");
    if (configure) configure(n);
    b.node("QuantizeLinear", {"t", "so", "z"}, {"tq"});
    b.node("DequantizeLinear", {"tq", "so", "z"}, {"y"});
    return b.build();
}

// `t` lies inside an integer operator, and the output equals the unfused graph's exactly.
void expect_on_integers_and_exact(const vaiq::Model& model, const Tensor& x, const std::vector<int64_t>& shape) {
    Executor fused(model), plain(model, {.fuse_qdq = false});
    EXPECT_NE(tap_error(fused, x, "t").find("inside an integer operator"), std::string::npos);
    const auto a = fused.run({{"x", x}})[0], c = plain.run({{"x", x}})[0];
    ASSERT_EQ(a.shape(), shape);
    for (int64_t i = 0; i < a.size(); ++i) EXPECT_EQ(a.data<float>()[i], c.data<float>()[i]) << i;
}

// DQ -> Transpose -> Q with one scale and zero point: the Transpose moves the
// uint8 values themselves (ONNX Runtime drops the pair); with another scale on
// the Q the pair stays, and so does the float Transpose.
TEST(QdqFusion, DropsTheQdqPairAroundAnOpThatOnlyMovesValues) {
    const auto perm = [](onnx::NodeProto& n) { vaiq::test::set_ints_attribute(n, "perm", {0, 2, 1}); };
    const auto x = vaiq::test::ramp({1, 2, 3}, -1.0f, 0.37f);
    expect_on_integers_and_exact(pair_around("Transpose", {1, 2, 3}, {1, 3, 2}, 0.04f, 0.04f, perm), x, {1, 3, 2});
    const auto rescaled_model = pair_around("Transpose", {1, 2, 3}, {1, 3, 2}, 0.04f, 0.05f, perm);
    Executor rescaled(rescaled_model);
    EXPECT_EQ(tap_error(rescaled, x, "t"), "");
    // An op that computes (Relu) is not a move: its pair is not dropped (the
    // integers' own Relu, around zero point 100, would keep the negative values);
    // it becomes a lookup table of what the float op computes.
    expect_on_integers_and_exact(pair_around("Relu", {1, 2, 3}, {1, 2, 3}, 0.04f, 0.04f), x, {1, 2, 3});
}

// A HardSwish spelled out between a pair, x * HardSigmoid(x) + 0.5 (a constant of
// rank 1): one lookup table of the input's integers, equal to the float ops on
// every one of them (uint8 and int8; 300 elements: the 64-byte permutes and the rest).
TEST(QdqFusion, FloatOpsBetweenAPairRunAsALookupTableOfTheIntegers) {
    for (const auto type : {DataType::UInt8, DataType::Int8}) {
        vaiq::test::GraphBuilder b;
        b.input("x", {3, 100}).output("y", {3, 100});
        b.initializer("s", Tensor::from_values<float>({}, std::vector<float>{0.037f}));
        b.initializer("so", Tensor::from_values<float>({}, std::vector<float>{0.029f}));
        b.initializer("half", Tensor::from_values<float>({1}, std::vector<float>{0.5f}));
        if (type == DataType::UInt8)
            b.initializer("z", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{131}));
        else
            b.initializer("z", Tensor::from_values<int8_t>({}, std::vector<int8_t>{-7}));
        b.node("QuantizeLinear", {"x", "s", "z"}, {"xq"});
        b.node("DequantizeLinear", {"xq", "s", "z"}, {"xd"});
        b.node("HardSigmoid", {"xd"}, {"h"}, "hard_sigmoid");
        b.node("Mul", {"xd", "h"}, {"m"}, "mul");
        b.node("Add", {"m", "half"}, {"t"}, "add");
        b.node("QuantizeLinear", {"t", "so", "z"}, {"tq"});
        b.node("DequantizeLinear", {"tq", "so", "z"}, {"y"});
        const auto model = b.build();
        // Every integer of the type once (x from -5.3 by 0.037), then 44 more.
        const auto x = vaiq::test::ramp({3, 100}, -5.3f, 0.037f);
        Executor fused(model), plain(model, {.fuse_qdq = false});
        for (const auto* inside : {"h", "m", "t"})
            EXPECT_NE(tap_error(fused, x, inside).find("inside an integer operator"), std::string::npos) << inside;
        const auto a = fused.run({{"x", x}})[0], c = plain.run({{"x", x}})[0];
        ASSERT_EQ(a.shape(), (std::vector<int64_t>{3, 100}));
        int differing = 0;
        for (int64_t i = 0; i < a.size(); ++i) differing += a.data<float>()[i] != c.data<float>()[i];
        EXPECT_EQ(differing, 0);
    }
}

// HardSwish as a QDQ model writes it, x * q(HardSigmoid(x)), then a product by a
// constant: a table for the HardSigmoid, a QLinearMul of x by it and one by the
// constant, which fold into one table of x, equal to the unfused graph on every
// integer (x on either side of the product). With int8 activations the products
// stay float (x86 fuses no int8 QLinearMul), still equal.
TEST(QdqFusion, ProductsOfATensorByItsTablesAndConstantsFoldIntoOneTable) {
    for (const auto type : {DataType::UInt8, DataType::Int8}) {
        for (const bool x_first : {true, false}) {
            vaiq::test::GraphBuilder b;
            b.input("x", {3, 100}).output("y", {3, 100});
            const auto scalar = scalar_initializers(b);
            scalar("s", 0.037f), scalar("sh", 1.0f / 255.0f), scalar("sm", 0.021f), scalar("so", 0.013f);
            if (type == DataType::UInt8)
                scalar("z", uint8_t{131}), scalar("zh", uint8_t{0}), scalar("c", uint8_t{200});
            else
                scalar("z", int8_t{-7}), scalar("zh", int8_t{-128}), scalar("c", int8_t{70});
            b.node("QuantizeLinear", {"x", "s", "z"}, {"xq"});
            b.node("DequantizeLinear", {"xq", "s", "z"}, {"xd"});
            b.node("HardSigmoid", {"xd"}, {"h"}, "hard_sigmoid");
            b.node("QuantizeLinear", {"h", "sh", "zh"}, {"hq"});
            b.node("DequantizeLinear", {"hq", "sh", "zh"}, {"hd"});
            b.node("Mul", x_first ? std::vector<std::string>{"xd", "hd"} : std::vector<std::string>{"hd", "xd"}, {"m"},
                   "hard_swish");
            b.node("QuantizeLinear", {"m", "sm", "z"}, {"mq"});
            b.node("DequantizeLinear", {"mq", "sm", "z"}, {"md"});
            b.node("DequantizeLinear", {"c", "s", "z"}, {"cd"});
            b.node("Mul", {"md", "cd"}, {"t"}, "by_constant");
            b.node("QuantizeLinear", {"t", "so", "z"}, {"tq"});
            b.node("DequantizeLinear", {"tq", "so", "z"}, {"y"});
            const auto model = b.build();
            const auto x = vaiq::test::ramp({3, 100}, -5.3f, 0.037f);  // every integer, then some again
            auto calls = fused_calls_agreeing_with_plain(model, x);
            if (type == DataType::UInt8) {
                EXPECT_EQ(calls["LookupTable"], 1);
                EXPECT_EQ(calls.count("QLinearMul") + calls.count("Mul"), 0u);
            } else {  // int8 activations read twice stay int8 and their products float, as on x86 there
                EXPECT_EQ(calls["LookupTable"], 1) << "the HardSigmoid";
                EXPECT_EQ(calls["Mul"], 2);
            }
        }
    }
}

// A swish as a QDQ model writes it, x * q(Sigmoid(x)): ONNX Runtime's fusion gives
// a QLinearSigmoid and a QLinearMul of x by it; both fold into one table of x,
// equal to the unfused graph on every integer.
TEST(QdqFusion, ASwishFoldsIntoOneTable) {
    vaiq::test::GraphBuilder b;
    b.input("x", {3, 100}).output("y", {3, 100});
    const auto scalar = scalar_initializers(b);
    scalar("s", 0.037f), scalar("ss", 1.0f / 255.0f), scalar("sm", 0.021f);
    scalar("z", uint8_t{131}), scalar("zs", uint8_t{0}), scalar("zm", uint8_t{40});
    b.node("QuantizeLinear", {"x", "s", "z"}, {"xq"});
    b.node("DequantizeLinear", {"xq", "s", "z"}, {"xd"});
    b.node("Sigmoid", {"xd"}, {"sig"}, "sigmoid");
    b.node("QuantizeLinear", {"sig", "ss", "zs"}, {"sq"});
    b.node("DequantizeLinear", {"sq", "ss", "zs"}, {"sd"});
    b.node("Mul", {"xd", "sd"}, {"m"}, "swish");
    b.node("QuantizeLinear", {"m", "sm", "zm"}, {"mq"});
    b.node("DequantizeLinear", {"mq", "sm", "zm"}, {"y"});
    const auto model = b.build();
    // Every integer, then some again.
    auto calls = fused_calls_agreeing_with_plain(model, vaiq::test::ramp({3, 100}, -5.3f, 0.037f));
    EXPECT_EQ(calls["LookupTable"], 1);
    EXPECT_EQ(calls.count("QLinearSigmoid") + calls.count("QLinearMul") + calls.count("Sigmoid"), 0u);
}

// Not a lookup: an op whose result something else reads too (a graph output), and
// a group fed by two DequantizeLinears.
TEST(QdqFusion, AGroupWithAnotherReaderOrTwoSourcesIsNotALookupTable) {
    vaiq::test::GraphBuilder b;
    b.input("x", {4}).input("w", {4}).output("y", {4}).output("h", {4}).output("v", {4});
    b.initializer("s", Tensor::from_values<float>({}, std::vector<float>{0.05f}));
    b.initializer("z", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{128}));
    b.node("QuantizeLinear", {"x", "s", "z"}, {"xq"});
    b.node("DequantizeLinear", {"xq", "s", "z"}, {"xd"});
    b.node("HardSigmoid", {"xd"}, {"h"}, "hard_sigmoid");  // also a graph output
    b.node("QuantizeLinear", {"h", "s", "z"}, {"hq"});
    b.node("DequantizeLinear", {"hq", "s", "z"}, {"y"});
    b.node("QuantizeLinear", {"w", "s", "z"}, {"wq"});
    b.node("DequantizeLinear", {"wq", "s", "z"}, {"wd"});
    b.node("Max", {"xd", "wd"}, {"t"}, "max");  // two sources
    b.node("QuantizeLinear", {"t", "s", "z"}, {"tq"});
    b.node("DequantizeLinear", {"tq", "s", "z"}, {"v"});
    const auto model = b.build();
    Executor e(model);
    const auto x = vaiq::test::ramp({4}, -1.0f, 0.3f), w = vaiq::test::ramp({4}, 0.5f, -0.4f);
    EXPECT_NO_THROW(e.run({{"x", x}, {"w", w}}, {"h", "t"}, [](const std::string&, const Tensor&) {}));
}

// With a constant of rank 1 the output of a scalar's group has rank 1, as
// broadcasting makes it.
TEST(QdqFusion, ALookupTableKeepsTheRankItsConstantsGive) {
    vaiq::test::GraphBuilder b;
    b.input("x", {}).output("y", {1});
    b.initializer("s", Tensor::from_values<float>({}, std::vector<float>{0.1f}));
    b.initializer("z", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{0}));
    b.initializer("two", Tensor::from_values<float>({1}, std::vector<float>{2.0f}));
    b.node("QuantizeLinear", {"x", "s", "z"}, {"xq"});
    b.node("DequantizeLinear", {"xq", "s", "z"}, {"xd"});
    b.node("Mul", {"xd", "two"}, {"t"}, "mul");
    b.node("QuantizeLinear", {"t", "s", "z"}, {"tq"});
    b.node("DequantizeLinear", {"tq", "s", "z"}, {"y"});
    const auto model = b.build();
    Executor fused(model);
    const auto x = Tensor::from_values<float>({}, std::vector<float>{1.2f});
    EXPECT_NE(tap_error(fused, x, "t").find("inside an integer operator"), std::string::npos);
    const auto y = fused.run({{"x", x}})[0];
    ASSERT_EQ(y.shape(), (std::vector<int64_t>{1}));
    EXPECT_FLOAT_EQ(y.data<float>()[0], 2.4f);
}

// A TensorFlow export's maximum(x, -0.4) reads a constant of rank 4 holding one
// value: between convolutions it is one table, looked up channels-last with no
// transpose around it; on a tensor of rank 2 its output has rank 4, as
// broadcasting makes it. Every value equal to the unfused group's.
TEST(QdqFusion, AMaxByOneValueOfRankFourIsATable) {
    for (const bool between_convolutions : {true, false}) {
        vaiq::test::GraphBuilder b;
        const std::vector<int64_t> in =
            between_convolutions ? std::vector<int64_t>{2, 3, 6, 7} : std::vector<int64_t>{5, 7};
        const std::vector<int64_t> out =
            between_convolutions ? std::vector<int64_t>{2, 8, 6, 7} : std::vector<int64_t>{1, 1, 5, 7};
        b.input("x", in).output("y", out);
        const auto scalar = scalar_initializers(b);
        scalar("s", 0.043f), scalar("so", 0.031f), scalar("z", uint8_t{121}), scalar("zo", uint8_t{30});
        b.initializer("floor", Tensor::from_values<float>({1, 1, 1, 1}, std::vector<float>{-0.4f}));
        std::string from = "x";
        if (between_convolutions) {
            b.initializer("w1", vaiq::test::ramp({8, 3, 1, 1}, -0.5f, 0.037f));
            b.node("Conv", {"x", "w1"}, {"c1"}, "conv1");
            from = "c1";
        }
        b.node("QuantizeLinear", {from, "s", "z"}, {"xq"});
        b.node("DequantizeLinear", {"xq", "s", "z"}, {"xd"});
        b.node("Max", {"xd", "floor"}, {"m"}, "maximum");
        b.node("QuantizeLinear", {"m", "so", "zo"}, {"mq"});
        b.node("DequantizeLinear", {"mq", "so", "zo"}, {between_convolutions ? "md" : "y"});
        if (between_convolutions) {
            b.initializer("w2", vaiq::test::ramp({8, 8, 1, 1}, 0.2f, -0.003f));
            b.node("Conv", {"md", "w2"}, {"y"}, "conv2");
        }
        const auto model = b.build();
        const auto x = vaiq::test::ramp(in, -2.0f, 0.011f);
        Executor fused(model, {.profile = true}), plain(model, {.fuse_qdq = false});
        const auto a = fused.run({{"x", x}})[0], want = plain.run({{"x", x}})[0];
        ASSERT_EQ(a.shape(), want.shape());
        EXPECT_EQ(a.shape(), out);
        int differing = 0, floored = 0;
        for (int64_t i = 0; i < a.size(); ++i) {
            differing += a.data<float>()[i] != want.data<float>()[i];
            floored += std::abs(want.data<float>()[i] + 0.4f) < 0.02f;
        }
        EXPECT_EQ(differing, 0) << between_convolutions;
        if (!between_convolutions) {
            EXPECT_GT(floored, 0) << "the maximum cuts";
        }
        std::map<std::string, int64_t> calls;
        for (const auto& p : fused.profile()) calls[p.op_type] = p.calls;
        EXPECT_EQ(calls["LookupTable"], 1) << between_convolutions;
        EXPECT_EQ(calls.count("Max"), 0u) << between_convolutions;
        if (between_convolutions) {
            EXPECT_EQ(calls["Transpose"], 2) << "the table looks up channels-last";
        }
    }
}

// DenseNet's DQ -> BatchNormalization -> Relu -> Q after a Concat, the
// normalization's scale a quantized weight: one table per channel of what the
// group computes on each integer, looked up channels-first (a graph input) and
// channels-last (between convolutions), every value equal to the group's: 20
// channels go through the vector lookups sixteen at a time and the scalar rest.
TEST(QdqFusion, ABatchNormalizationBetweenAPairRunsAsATableAChannel) {
    for (const bool between_convolutions : {false, true}) {
        vaiq::test::GraphBuilder b;
        const int64_t c = 20;
        b.input("x", {2, between_convolutions ? 3 : c, 6, 7}).output("y", {2, c, 6, 7});
        b.initializer("s", Tensor::from_values<float>({}, std::vector<float>{0.043f}));
        b.initializer("z", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{121}));
        b.initializer("so", Tensor::from_values<float>({}, std::vector<float>{0.031f}));
        b.initializer("zo", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{0}));
        std::vector<int8_t> gamma(c);
        for (int64_t i = 0; i < c; ++i) gamma[i] = static_cast<int8_t>(40 + 7 * i - (i % 3) * 90);
        b.initializer("gamma_q", Tensor::from_values<int8_t>({c}, gamma));
        b.initializer("gamma_s", Tensor::from_values<float>({}, std::vector<float>{0.011f}));
        b.initializer("gamma_z", Tensor::from_values<int8_t>({}, std::vector<int8_t>{0}));
        b.initializer("beta", vaiq::test::ramp({c}, -0.4f, 0.05f));
        b.initializer("mean", vaiq::test::ramp({c}, 0.3f, -0.07f));
        b.initializer("var", vaiq::test::ramp({c}, 0.5f, 0.21f));
        std::string in = "x";
        if (between_convolutions) {
            b.initializer("w1", vaiq::test::ramp({c, 3, 1, 1}, -0.5f, 0.017f));
            b.node("Conv", {"x", "w1"}, {"c1"}, "conv1");
            in = "c1";
        }
        b.node("QuantizeLinear", {in, "s", "z"}, {"xq"});
        b.node("DequantizeLinear", {"xq", "s", "z"}, {"xd"});
        b.node("DequantizeLinear", {"gamma_q", "gamma_s", "gamma_z"}, {"gamma"});
        b.node("BatchNormalization", {"xd", "gamma", "beta", "mean", "var"}, {"bn"}, "bn");
        b.node("Relu", {"bn"}, {"r"}, "relu");
        b.node("QuantizeLinear", {"r", "so", "zo"}, {"rq"});
        b.node("DequantizeLinear", {"rq", "so", "zo"}, {between_convolutions ? "rd" : "y"});
        if (between_convolutions) {
            b.initializer("w2", vaiq::test::ramp({c, c, 1, 1}, 0.2f, -0.001f));
            b.node("Conv", {"rd", "w2"}, {"y"}, "conv2");
        }
        const auto model = b.build();
        const auto x = vaiq::test::ramp({2, between_convolutions ? 3 : c, 6, 7}, -6.0f, 0.0043f);
        // The unfused group in the same layout (float convolutions sum alike in both).
        Executor fused(model, {.profile = true}), plain(model, {.fuse_qdq = false});
        EXPECT_NE(tap_error(fused, x, "bn").find("inside an integer operator"), std::string::npos);
        const auto a = fused.run({{"x", x}})[0], want = plain.run({{"x", x}})[0];
        ASSERT_EQ(a.shape(), want.shape());
        int differing = 0, zero = 0;
        for (int64_t i = 0; i < a.size(); ++i) {
            differing += a.data<float>()[i] != want.data<float>()[i];
            zero += a.data<float>()[i] == 0.0f;
        }
        EXPECT_EQ(differing, 0) << between_convolutions;
        if (!between_convolutions) {
            EXPECT_GT(zero, 0) << "the Relu cuts";
            EXPECT_LT(zero, a.size() / 2);
        }
        std::map<std::string, int64_t> calls;
        for (const auto& p : fused.profile()) calls[p.op_type] = p.calls;
        EXPECT_EQ(calls["ChannelLookupTable"], 1) << between_convolutions;
        EXPECT_EQ(calls["Transpose"], between_convolutions ? 2 : 0) << "the table looks up channels-last";
    }
}

// DQ -> MaxPool -> Q (padded, strided) with one scale: the pool takes the max of
// the uint8 values themselves, exactly the float pool's quantized result.
TEST(QdqFusion, MaxPoolBetweenAnEqualPairRunsOnTheIntegers) {
    const auto model = pair_around("MaxPool", {1, 3, 5, 5}, {1, 3, 3, 3}, 0.03f, 0.03f, [](onnx::NodeProto& pool) {
        vaiq::test::set_ints_attribute(pool, "kernel_shape", {3, 3});
        vaiq::test::set_ints_attribute(pool, "strides", {2, 2});
        vaiq::test::set_ints_attribute(pool, "pads", {1, 1, 1, 1});
    });
    expect_on_integers_and_exact(model, vaiq::test::ramp({1, 3, 5, 5}, -2.0f, 0.057f), {1, 3, 3, 3});
}

// DQ -> Resize -> Q with one scale: a nearest Resize copies the uint8 values
// themselves (ONNX Runtime drops the pair around any Resize), exactly the float
// Resize's quantized result; a linear one computes new values, and its pair stays.
TEST(QdqFusion, ANearestResizeBetweenAnEqualPairRunsOnTheIntegers) {
    for (const std::string mode : {"nearest", "linear"}) {
        vaiq::test::GraphBuilder b;
        b.input("x", {1, 2, 3, 4}).output("y", {1, 2, 6, 6});
        b.initializer("s", Tensor::from_values<float>({}, std::vector<float>{0.03f}));
        b.initializer("z", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{90}));
        b.initializer("scales", Tensor::from_values<float>({4}, std::vector<float>{1.0f, 1.0f, 2.0f, 1.5f}));
        b.node("QuantizeLinear", {"x", "s", "z"}, {"xq"});
        b.node("DequantizeLinear", {"xq", "s", "z"}, {"xd"});
        auto& resize = b.node("Resize", {"xd", "", "scales"}, {"t"}, "resize");
        vaiq::set_attribute(resize, "mode", mode);
        b.node("QuantizeLinear", {"t", "s", "z"}, {"tq"});
        b.node("DequantizeLinear", {"tq", "s", "z"}, {"y"});
        const auto model = b.build();
        const auto x = vaiq::test::ramp({1, 2, 3, 4}, -2.0f, 0.17f);
        if (mode == "nearest") {
            expect_on_integers_and_exact(model, x, {1, 2, 6, 6});
        } else {
            Executor e(model);
            EXPECT_EQ(tap_error(e, x, "t"), "");
        }
    }
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
    vaiq::test::set_attribute(g, "transB", 1);
    const auto model = contrib_model(b);
    Executor e(model);
    const auto y = e.run({{"a", Tensor::from_values<uint8_t>({1, 2}, std::vector<uint8_t>{130, 126})}})[0];
    EXPECT_EQ(y.data<uint8_t>()[0], 108);  // 8 * 1 + 100
    EXPECT_EQ(y.data<uint8_t>()[1], 108);  // 4 * 2 + 100
}

// Sums beyond 2^24, which float32 cannot hold exactly: on a CPU whose int8
// products saturate, the executor sums 8-bit products in float32 and must cut
// the reduction where a partial sum could pass 2^24. Here every partial sum of
// one sign climbs past it (567 or 1031 products of 255 x 127; odd totals), and
// the bias or a final small product brings the result back into the output's
// range, so that a sum off by one moves the output by one.
TEST(Executor, QLinearConvSumsBeyondFloatPrecisionExactly) {
    const int64_t c = 63, taps = c * 9;
    vaiq::test::GraphBuilder b;
    b.input("x", {1, c, 4, 4}, DataType::UInt8).output("y", {1, 3, 2, 2}, DataType::UInt8);
    // Output channel 0 all +127, 1 all -127, 2 half and half.
    std::vector<int8_t> w(3 * taps);
    for (int64_t i = 0; i < taps; ++i) {
        w[i] = 127;
        w[taps + i] = -127;
        w[2 * taps + i] = i < taps / 2 ? 127 : -127;
    }
    const int32_t full = static_cast<int32_t>(taps) * 127 * 255;  // 18,362,295
    b.initializer("w", Tensor::from_values<int8_t>({3, c, 3, 3}, w));
    b.initializer("bias", Tensor::from_values<int32_t>({3}, std::vector<int32_t>{-full + 7, full - 9, 127 * 255 + 11}));
    const auto scalar = scalar_initializers(b);
    scalar("one", 1.0f);
    scalar("zx", uint8_t{0});
    scalar("zw", int8_t{0});
    scalar("zy", uint8_t{128});
    b.node("QLinearConv", {"x", "one", "zx", "w", "one", "zw", "one", "zy", "bias"}, {"y"}, "conv");
    const auto model = b.build();
    for (int threads : {1, 2}) {
        Executor e(model, {.threads = threads});
        const auto y = e.run({{"x", Tensor::from_values<uint8_t>({1, c, 4, 4}, std::vector<uint8_t>(c * 16, 255))}})[0];
        const std::vector<uint8_t> want{135, 135, 135, 135, 119, 119, 119, 119, 139, 139, 139, 139};
        EXPECT_EQ(std::vector<uint8_t>(y.data<uint8_t>().begin(), y.data<uint8_t>().end()), want) << threads;
    }
}

TEST(Executor, QGemmSumsBeyondFloatPrecisionExactly) {
    const int64_t k = 1031;
    const int32_t full = static_cast<int32_t>(k) * 127 * 255;  // 33,388,935
    std::vector<int8_t> w(2 * k, 127);
    std::fill(w.begin() + k, w.end(), -127);
    vaiq::test::GraphBuilder b;
    b.input("a", {1, k}, DataType::UInt8).output("y", {1, 2}, DataType::UInt8);
    b.initializer("w", Tensor::from_values<int8_t>({2, k}, w));
    b.initializer("c", Tensor::from_values<int32_t>({2}, std::vector<int32_t>{-full + 5, full - 5}));
    const auto scalar = scalar_initializers(b);
    scalar("one", 1.0f);
    scalar("za", uint8_t{0});
    scalar("zw", int8_t{0});
    scalar("zy", uint8_t{128});
    auto& g = b.node("QGemm", {"a", "one", "za", "w", "one", "zw", "c", "one", "zy"}, {"y"}, "qgemm");
    g.set_domain("com.microsoft");
    vaiq::test::set_attribute(g, "transB", 1);
    const auto model = contrib_model(b);
    Executor e(model);
    const auto y = e.run({{"a", Tensor::from_values<uint8_t>({1, k}, std::vector<uint8_t>(k, 255))}})[0];
    EXPECT_EQ(y.data<uint8_t>()[0], 133);
    EXPECT_EQ(y.data<uint8_t>()[1], 123);
}

// Both operands vary, so the reduction is cut by their types alone.
TEST(Executor, QLinearMatMulOfTwoActivationsSumsBeyondFloatPrecisionExactly) {
    const int64_t k = 1101;
    // a: 255 but the last, 40. b (zero point 128): column 0 climbs +127 x 550 and
    // falls -127 x 550, column 1 the other way; their last values +1 and -1.
    std::vector<uint8_t> a(k, 255), bv(k * 2);
    a[k - 1] = 40;
    for (int64_t q = 0; q + 1 < k; ++q) {
        bv[q * 2] = q < 550 ? 255 : 1;
        bv[q * 2 + 1] = q < 550 ? 1 : 255;
    }
    bv[(k - 1) * 2] = 129;
    bv[(k - 1) * 2 + 1] = 127;
    vaiq::test::GraphBuilder g;
    g.input("a", {1, k}, DataType::UInt8).input("b", {k, 2}, DataType::UInt8).output("y", {1, 2}, DataType::UInt8);
    const auto scalar = scalar_initializers(g);
    scalar("one", 1.0f);
    scalar("za", uint8_t{0});
    scalar("zb", uint8_t{128});
    scalar("zy", uint8_t{100});
    g.node("QLinearMatMul", {"a", "one", "za", "b", "one", "zb", "one", "zy"}, {"y"});
    const auto model = g.build();
    Executor e(model);
    const auto y =
        e.run({{"a", Tensor::from_values<uint8_t>({1, k}, a)}, {"b", Tensor::from_values<uint8_t>({k, 2}, bv)}})[0];
    EXPECT_EQ(y.data<uint8_t>()[0], 140);  // 40 + 100
    EXPECT_EQ(y.data<uint8_t>()[1], 60);   // -40 + 100
}

// Before VNNI, the int8 kernels add pairs of u8 x s8 products in int16, which
// saturates beyond 32767. Weights of magnitude 64 or less keep every pair
// within 2 x 255 x 64 and may take those kernels; 65 may not (two products of
// 255 x 65 are 33150). Each case sums products of x = 255 and weights of one
// magnitude and sign, and a bias brings the total back into the output's range,
// so that any saturated pair moves the output.
TEST(Executor, EightBitProductsAreExactAtTheMagnitudeWherePairsCouldSaturate) {
    for (int32_t magnitude : {64, 65}) {
        const auto scalar_model = [&](vaiq::test::GraphBuilder& b) {
            const auto scalar = scalar_initializers(b);
            scalar("one", 1.0f);
            scalar("zx", uint8_t{0});
            scalar("zw", int8_t{0});
            scalar("zy", uint8_t{128});
        };
        const auto full = [&](int64_t products) { return static_cast<int32_t>(products) * 255 * magnitude; };
        const auto w_value = static_cast<int8_t>(magnitude);
        {  // QLinearConv: 8 channels x 3 x 3 taps, output channel 0 all +magnitude, 1 all -magnitude
            const int64_t c = 8, taps = c * 9;
            std::vector<int8_t> w(2 * taps, w_value);
            std::fill(w.begin() + taps, w.end(), static_cast<int8_t>(-magnitude));
            vaiq::test::GraphBuilder b;
            b.input("x", {1, c, 3, 3}, DataType::UInt8).output("y", {1, 2, 1, 1}, DataType::UInt8);
            b.initializer("w", Tensor::from_values<int8_t>({2, c, 3, 3}, w));
            b.initializer("bias",
                          Tensor::from_values<int32_t>({2}, std::vector<int32_t>{-full(taps) + 7, full(taps) - 9}));
            scalar_model(b);
            b.node("QLinearConv", {"x", "one", "zx", "w", "one", "zw", "one", "zy", "bias"}, {"y"}, "conv");
            const auto model = b.build();
            Executor e(model);
            const auto y =
                e.run({{"x", Tensor::from_values<uint8_t>({1, c, 3, 3}, std::vector<uint8_t>(c * 9, 255))}})[0];
            EXPECT_EQ(std::vector<uint8_t>(y.data<uint8_t>().begin(), y.data<uint8_t>().end()),
                      (std::vector<uint8_t>{135, 119}))
                << magnitude;
        }
        {  // QGemm with int8 B^T and QLinearMatMul with uint8 B (zero point 128): 129 products a column
            const int64_t k = 129;
            std::vector<int8_t> w(2 * k, w_value);
            std::fill(w.begin() + k, w.end(), static_cast<int8_t>(-magnitude));
            std::vector<uint8_t> bu(2 * k);  // [k, 2]: column 0 128 + magnitude, column 1 128 - magnitude
            for (int64_t q = 0; q < k; ++q) {
                bu[q * 2] = static_cast<uint8_t>(128 + magnitude);
                bu[q * 2 + 1] = static_cast<uint8_t>(128 - magnitude);
            }
            vaiq::test::GraphBuilder b;
            b.input("a", {1, k}, DataType::UInt8)
                .output("y", {1, 2}, DataType::UInt8)
                .output("z", {1, 2}, DataType::UInt8);
            b.initializer("w", Tensor::from_values<int8_t>({2, k}, w));
            b.initializer("bu", Tensor::from_values<uint8_t>({k, 2}, bu));
            b.initializer("c", Tensor::from_values<int32_t>({2}, std::vector<int32_t>{-full(k) + 5, full(k) - 5}));
            b.initializer("zb", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{128}));
            b.initializer("big", Tensor::from_values<float>({}, std::vector<float>{static_cast<float>(full(k)) / 100}));
            scalar_model(b);
            auto& g = b.node("QGemm", {"a", "one", "zx", "w", "one", "zw", "c", "one", "zy"}, {"y"}, "qgemm");
            g.set_domain("com.microsoft");
            vaiq::test::set_attribute(g, "transB", 1);
            // Without a bias to cancel it, the product is scaled to 100 steps: a saturated pair still moves it.
            b.node("QLinearMatMul", {"a", "one", "zx", "bu", "one", "zb", "big", "zy"}, {"z"});
            const auto model = contrib_model(b);
            Executor e(model);
            const auto out = e.run({{"a", Tensor::from_values<uint8_t>({1, k}, std::vector<uint8_t>(k, 255))}});
            EXPECT_EQ(out[0].data<uint8_t>()[0], 133) << magnitude;
            EXPECT_EQ(out[0].data<uint8_t>()[1], 123) << magnitude;
            EXPECT_EQ(out[1].data<uint8_t>()[0], 228) << magnitude;  // 100 + 128
            EXPECT_EQ(out[1].data<uint8_t>()[1], 28) << magnitude;   // -100 + 128
        }
    }
}

// A row of the PP-OCRv4 recognizer's attention (cpu.yaml) where the table's
// shift decides a tie: ONNX Runtime computes log(FLT_MAX / 40) in float, and
// its element 14 reads 10; with the shift in double it read 9.
TEST(Executor, QLinearSoftmaxBuildsItsTableAsOnnxRuntimeDoes) {
    const std::vector<uint8_t> x = {165, 154, 157, 166, 163, 174, 159, 147, 153, 142, 149, 167, 157, 163,
                                    171, 174, 152, 130, 130, 151, 148, 134, 138, 156, 168, 178, 174, 158,
                                    150, 143, 138, 162, 169, 146, 140, 141, 166, 188, 166, 141};
    const std::vector<uint8_t> expected = {8, 5, 6, 8, 7, 10, 6,  4, 5, 4, 5, 8, 6, 7, 10, 10, 5, 2,  2, 5,
                                           4, 3, 3, 6, 9, 12, 10, 6, 5, 4, 3, 7, 9, 4, 3,  4,  8, 17, 8, 4};
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 40}, DataType::UInt8).output("y", {1, 40}, DataType::UInt8);
    const auto scalar = scalar_initializers(b);
    scalar("xs", 0x1.0f4a4cp-5f), scalar("xz", uint8_t{150}), scalar("ys", 0x1.010102p-8f), scalar("yz", uint8_t{0});
    auto& softmax = b.node("QLinearSoftmax", {"x", "xs", "xz", "ys", "yz"}, {"y"}, "softmax");
    softmax.set_domain("com.microsoft");
    vaiq::test::set_attribute(softmax, "opset", 11);
    vaiq::test::set_attribute(softmax, "axis", 1);
    const auto model = contrib_model(b);
    const auto y = Executor(model).run({{"x", Tensor::from_values<uint8_t>({1, 40}, x)}})[0];
    EXPECT_EQ(std::vector<uint8_t>(y.data<uint8_t>().begin(), y.data<uint8_t>().end()), expected);
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
    vaiq::test::set_attribute(s, "opset", 13);
    const auto model = contrib_model(b);
    Executor e(model);
    const auto y =
        e.run({{"x", Tensor::from_values<uint8_t>({2, 4}, std::vector<uint8_t>{0, 10, 20, 30, 5, 5, 5, 5})}})[0];
    const auto v = y.data<uint8_t>();
    // Row 2 is uniform: 256 / 4 = 64 each. Row 1: softmax([0, 1, 2, 3]) * 256, rounded.
    for (int j = 4; j < 8; ++j) EXPECT_EQ(v[j], 64);
    const double denom = 1 + std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
    for (int j = 0; j < 4; ++j) EXPECT_NEAR(v[j], std::exp(double(j)) / denom * 256, 0.51) << j;
}

// int8 activations: ONNX Runtime on x86 turns int8 Q/DQ pairs into uint8 ones
// (zero point + 128, same values) and then fuses as for uint8. A pair whose
// DequantizeLinear has several readers is left alone.
TEST(QdqFusion, Int8PairsBecomeUint8AndFuse) {
    auto build = [](bool shared) {
        vaiq::test::GraphBuilder b;
        b.input("x", {1, 2, 4, 4}).output("y", {1, 3, 4, 4});
        if (shared) b.output("xd_out", {1, 2, 4, 4});
        const auto scalar = scalar_initializers(b);
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

// The NPU recipes' Conv: every scale a power of two, an int8 bias with a step of
// its own, uint8 activations with zero point 128, and a Relu (or Clip) that the
// output's QuantizeLinear does not make redundant: ONNX Runtime runs it in float.
struct NpuConv {
    int64_t channels = 4, outputs = 6, group = 1;
    bool extreme_weights = false;  ///< all +-127 (else they cycle through -60..60)
    float bias_scale = 1.0f / 64;  ///< the accumulator's step is 1/16 * 1/128
    float x_scale = 1.0f / 16;
    bool per_channel = false;
    std::string activation = "Relu";  ///< or "Clip" (0, 1.5), or "" for none
};

vaiq::Model npu_conv(const NpuConv& p) {
    vaiq::test::GraphBuilder b;
    b.input("x", {1, p.channels, 7, 7}).output("y", {1, p.outputs, 7, 7});
    const auto scalar = scalar_initializers(b);
    scalar("sx", p.x_scale);
    scalar("zx", uint8_t{128});
    scalar("sb", p.bias_scale);
    scalar("zb", int8_t{0});
    scalar("sy", 1.0f / 8);
    scalar("zy", uint8_t{128});
    scalar("lo", 0.0f);
    scalar("hi", 1.5f);
    if (p.per_channel) {
        std::vector<float> scales(static_cast<size_t>(p.outputs));
        for (size_t c = 0; c < scales.size(); ++c) scales[c] = std::ldexp(1.0f, -6 - static_cast<int>(c % 3));
        b.initializer("sw", Tensor::from_values<float>({p.outputs}, scales));
        b.initializer("zw", Tensor::from_values<int8_t>({p.outputs}, std::vector<int8_t>(scales.size(), 0)));
    } else {
        scalar("sw", 1.0f / 128);
        scalar("zw", int8_t{0});
    }
    const int64_t per_output = p.channels / p.group * 9;
    std::vector<int8_t> w(static_cast<size_t>(p.outputs * per_output));
    for (size_t i = 0; i < w.size(); ++i)
        w[i] = static_cast<int8_t>(p.extreme_weights ? (i % 2 ? 127 : -127) : static_cast<int>(i * 37 % 121) - 60);
    b.initializer("wq", Tensor::from_values<int8_t>({p.outputs, p.channels / p.group, 3, 3}, w));
    std::vector<int8_t> bias(static_cast<size_t>(p.outputs));
    for (size_t c = 0; c < bias.size(); ++c) bias[c] = static_cast<int8_t>(static_cast<int>(c * 29 % 101) - 50);
    b.initializer("bq", Tensor::from_values<int8_t>({p.outputs}, bias));
    b.node("QuantizeLinear", {"x", "sx", "zx"}, {"xq"});
    b.node("DequantizeLinear", {"xq", "sx", "zx"}, {"xd"});
    auto& wd = b.node("DequantizeLinear", {"wq", "sw", "zw"}, {"wd"});
    if (p.per_channel) vaiq::set_attribute(wd, "axis", 0);
    b.node("DequantizeLinear", {"bq", "sb", "zb"}, {"bd"});
    auto& conv = b.node("Conv", {"xd", "wd", "bd"}, {"c"}, "conv");
    vaiq::test::set_ints_attribute(conv, "pads", {1, 1, 1, 1});
    vaiq::set_attribute(conv, "group", p.group);
    std::string out = "c";
    if (p.activation == "Relu") b.node("Relu", {"c"}, {out = "r"}, "relu");
    if (p.activation == "Clip") b.node("Clip", {"c", "lo", "hi"}, {out = "r"}, "clip");
    b.node("QuantizeLinear", {out, "sy", "zy"}, {"yq"});
    b.node("DequantizeLinear", {"yq", "sy", "zy"}, {"y"});
    return b.build();
}

// Where every partial sum is exact, the integer convolution is the float one:
// equal to the last bit, through the channels-last bands, the depthwise kernel
// and the NCHW path, with the activation applied to the integers.
TEST(QdqFusion, APowerOfTwoConvRunsOnIntegersAndComputesWhatFloatDoes) {
    if (!vaiq::runtime::exact_int8_available()) GTEST_SKIP() << "no exact int8 products on this CPU";
    std::vector<NpuConv> cases(6);
    cases[1].activation = "Clip";
    cases[2].activation = "";
    cases[3].per_channel = true;
    cases[4].group = cases[4].channels = cases[4].outputs = 16;  // depthwise
    cases[5].bias_scale = 1.0f / 2048;                           // the accumulator's own step
    for (size_t k = 0; k < cases.size(); ++k) {
        const auto model = npu_conv(cases[k]);
        const auto x = vaiq::test::ramp({1, cases[k].channels, 7, 7}, -9.0f, 0.0371f);
        const auto reference = Executor(model, {.fuse_qdq = false}).run({{"x", x}})[0];
        for (const bool layout : {true, false}) {
            Executor fused(model, {.threads = 2, .optimize_layout = layout});
            EXPECT_NE(tap_error(fused, x, "c").find("inside an integer operator"), std::string::npos) << k;
            const auto y = fused.run({{"x", x}})[0];
            ASSERT_EQ(y.shape(), reference.shape());
            int differing = 0;
            for (int64_t i = 0; i < y.size(); ++i) differing += y.data<float>()[i] != reference.data<float>()[i];
            EXPECT_EQ(differing, 0) << "case " << k << (layout ? ", channels-last" : ", NCHW");
        }
        if (cases[k].activation == "Relu") {  // the clamp matters: without it negative values would pass
            float lowest = 0;
            for (float v : reference.data<float>()) lowest = std::min(lowest, v);
            EXPECT_EQ(lowest, 0.0f);
        }
    }
}

// Where a float sum could round (a channel's products may reach 2^24 steps), a
// bias is finer than the accumulator's step, or a scale is no power of two, the
// Conv stays in float.
TEST(QdqFusion, APowerOfTwoConvThatFloatCouldRoundStaysFloat) {
    if (!vaiq::runtime::exact_int8_available()) GTEST_SKIP() << "no exact int8 products on this CPU";
    std::vector<NpuConv> cases(3);
    cases[0].channels = 115, cases[0].extreme_weights = true;  // 1035 x 127 x 128 >= 2^24
    cases[1].bias_scale = 1.0f / 4096;
    cases[2].x_scale = 0.06f;
    for (size_t k = 0; k < cases.size(); ++k) {
        const auto model = npu_conv(cases[k]);
        Executor executor(model);
        EXPECT_EQ(tap_error(executor, vaiq::test::ramp({1, cases[k].channels, 7, 7}, -9.0f, 0.0371f), "c"), "") << k;
    }
    NpuConv near;  // 1026 x 127 x 128 and the bias: just within the bound
    near.channels = 114, near.extreme_weights = true;
    const auto model = npu_conv(near);
    const auto x = vaiq::test::ramp({1, 114, 7, 7}, -9.0f, 0.0371f);
    Executor executor(model);
    EXPECT_NE(tap_error(executor, x, "c"), "");
    const auto y = executor.run({{"x", x}})[0];
    const auto reference = Executor(model, {.fuse_qdq = false}).run({{"x", x}})[0];
    for (int64_t i = 0; i < y.size(); ++i) ASSERT_EQ(y.data<float>()[i], reference.data<float>()[i]) << i;
}

// ResNet's residual Add in the NPU recipes' form: DQ(a) + DQ(b) -> Relu/Clip -> Q,
// scales powers of two, the Relu not made redundant by the Q.
struct NpuAdd {
    float a_scale = 1.0f / 16, b_scale = 1.0f / 64, y_scale = 1.0f / 8;
    std::vector<int64_t> b_shape{1, 3, 5, 5};
    std::string activation = "Relu";
};

vaiq::Model npu_add(const NpuAdd& p) {
    vaiq::test::GraphBuilder b;
    b.input("a", {1, 3, 5, 5}).input("b", p.b_shape).output("y", {1, 3, 5, 5});
    const auto scalar = scalar_initializers(b);
    scalar("sa", p.a_scale);
    scalar("za", uint8_t{128});
    scalar("sb", p.b_scale);
    scalar("zb", uint8_t{120});
    scalar("sy", p.y_scale);
    scalar("zy", uint8_t{128});
    scalar("lo", -0.5f);
    scalar("hi", 2.0f);
    b.node("QuantizeLinear", {"a", "sa", "za"}, {"aq"});
    b.node("DequantizeLinear", {"aq", "sa", "za"}, {"ad"});
    b.node("QuantizeLinear", {"b", "sb", "zb"}, {"bq"});
    b.node("DequantizeLinear", {"bq", "sb", "zb"}, {"bd"});
    b.node("Add", {"ad", "bd"}, {"s"}, "add");
    std::string out = "s";
    if (p.activation == "Relu") b.node("Relu", {"s"}, {out = "r"}, "relu");
    if (p.activation == "Clip") b.node("Clip", {"s", "lo", "hi"}, {out = "r"}, "clip");
    b.node("QuantizeLinear", {out, "sy", "zy"}, {"yq"});
    b.node("DequantizeLinear", {"yq", "sy", "zy"}, {"y"});
    return b.build();
}

// Exact in integers where the float sum is exact: equal to the last bit, rounding
// half to even on the way to a coarser output step, shifting to a finer one,
// broadcasting, in NCHW and channels-last.
TEST(QdqFusion, APowerOfTwoAddRunsOnIntegersAndComputesWhatFloatDoes) {
    std::vector<NpuAdd> cases(5);
    cases[1].activation = "Clip";
    cases[2].y_scale = 1.0f / 256;  // a finer output step: a left shift, most values saturating
    cases[3].b_shape = {1, 3, 1, 1};
    cases[4].a_scale = 1.0f / 4, cases[4].b_scale = 1.0f / 8;  // the output step: no shift
    for (size_t k = 0; k < cases.size(); ++k) {
        const auto model = npu_add(cases[k]);
        std::map<std::string, Tensor> feeds{
            {"a", vaiq::test::ramp({1, 3, 5, 5}, -7.0f, 0.2031f)},
            {"b", vaiq::test::ramp(cases[k].b_shape, 1.3f, -0.0429f)}};
        const auto reference = Executor(model, {.fuse_qdq = false}).run(feeds)[0];
        for (const bool layout : {true, false}) {
            Executor fused(model, {.threads = 1, .optimize_layout = layout});
            std::string error;
            try {
                fused.run(feeds, {"s"}, [](const std::string&, const Tensor&) {});
            } catch (const vaiq::InputError& e) {
                error = e.what();
            }
            EXPECT_NE(error.find("inside an integer operator"), std::string::npos) << k;
            const auto y = fused.run(feeds)[0];
            ASSERT_EQ(y.shape(), reference.shape());
            int differing = 0;
            for (int64_t i = 0; i < y.size(); ++i) differing += y.data<float>()[i] != reference.data<float>()[i];
            EXPECT_EQ(differing, 0) << "case " << k;
        }
    }
    // Steps 2^26 apart: the float sum could round, so the Add stays float.
    NpuAdd apart;
    apart.b_scale = std::ldexp(1.0f, -30);
    const auto apart_model = npu_add(apart);
    Executor kept(apart_model);
    EXPECT_NO_THROW(kept.run({{"a", vaiq::test::ramp({1, 3, 5, 5})}, {"b", vaiq::test::ramp({1, 3, 5, 5})}}, {"s"},
                             [](const std::string&, const Tensor&) {}));
}

}  // namespace
