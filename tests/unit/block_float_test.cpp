// Block floating point and MX types: the values each keeps (worked by hand from
// the definitions in vaiq/block_float.hpp), the blocks' layout, and their two
// written forms (vaiq's op and the simulation in standard ops) value for value.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <random>

#include "runtime/executor.hpp"
#include "test_support.hpp"
#include "vaiq/block_float.hpp"
#include "vaiq/error.hpp"
#include "vaiq/vaiq_ops.hpp"

namespace vaiq {
namespace {

std::vector<float> quantized(QuantType type, const std::vector<float>& values, int64_t block = 8) {
    const auto t = Tensor::from_values<float>({1, static_cast<int64_t>(values.size())}, values);
    const auto out = block_float_fake_quantize(t, type, {1, block});
    return {out.data<float>().begin(), out.data<float>().end()};
}

TEST(BlockFloat, FloorPowerOfTwoIsExactDownToSubnormals) {
    EXPECT_EQ(floor_power_of_two(3.0f), 2.0f);
    EXPECT_EQ(floor_power_of_two(-0.75f), 0.5f);
    EXPECT_EQ(floor_power_of_two(4.0f), 4.0f);
    EXPECT_EQ(floor_power_of_two(std::nextafter(4.0f, 0.0f)), 2.0f);
    EXPECT_EQ(floor_power_of_two(std::ldexp(1.5f, -140)), std::ldexp(1.0f, -140));
    EXPECT_EQ(floor_power_of_two(0.0f), 0.0f);
}

// BFP16: P = 2 (the block's largest magnitude is 3.99), a step of P / 64 = 1/32,
// 127 steps at most either way.
TEST(BlockFloat, Bfp16KeepsSevenBitsBelowTheBlocksPowerOfTwo) {
    const auto q = quantized(QuantType::QBFP16, {3.0f, 0.3f, -0.01f, 2.99f, 1.55f, 0.0f, 3.99f, -3.99f});
    const std::vector<float> expected = {3.0f, 0.3125f, -0.0f, 3.0f, 1.5625f, 0.0f, 3.96875f, -3.96875f};
    EXPECT_EQ(q, expected);
    EXPECT_TRUE(std::signbit(q[2]));  // rounding keeps the sign of a small negative value
}

// MXINT8 is the same grid with -128 allowed: -3.99 keeps -4.
TEST(BlockFloat, MxInt8ReachesMinus128Steps) {
    const auto q = quantized(QuantType::QMXInt8, {3.99f, -3.99f, 0.3f}, 32);
    EXPECT_EQ(q, (std::vector<float>{3.96875f, -4.0f, 0.3125f}));
}

// MXFP8 E4M3: S = P * 2^-8 = 2^-7, so the elements are x * 128 on E4M3's grid
// (a step of 32 between 256 and 512), saturated to 448.
TEST(BlockFloat, MxFp8E4M3RoundsToTheFloat8GridAndSaturates) {
    const auto q = quantized(QuantType::QMXFP8E4M3, {3.0f, 3.9f, 0.01f, -2.2f}, 32);
    EXPECT_EQ(q, (std::vector<float>{3.0f, 3.5f, 0.009765625f, -2.25f}));
}

// MXFP4 E2M1: S = P * 2^-2 = 0.5, elements 2x on {0, 0.5, 1, 1.5, 2, 3, 4, 6},
// ties to even (1.25 -> 1, 2.5 -> 2), saturated to 6.
TEST(BlockFloat, MxFp4RoundsToE2M1) {
    const auto q = quantized(QuantType::QMXFP4E2M1, {3.0f, 2.6f, 1.3f, 0.2f, 0.125f, 0.625f, 1.25f, -3.9f}, 32);
    EXPECT_EQ(q, (std::vector<float>{3.0f, 3.0f, 1.5f, 0.25f, 0.0f, 0.5f, 1.0f, -3.0f}));
}

// The step formula MXFP6/FP4 use gives what the float8 conversion gives for the
// FP8 elements, on every value between float8 codes and beyond the largest.
TEST(BlockFloat, TheElementStepFormulaIsTheFloat8Conversion) {
    for (const auto type : {QuantType::QMXFP8E4M3, QuantType::QMXFP8E5M2}) {
        const auto f = block_float_format(type);
        const float min_normal = std::ldexp(1.0f, 2 - (1 << (f.exponent_bits - 1)));
        for (int bits = 0; bits < 256; ++bits) {
            const float v = float8_to_float(static_cast<uint8_t>(bits), f.float8);
            if (!std::isfinite(v)) continue;
            for (const float x : {v, std::nextafter(v, 1e9f), v * 1.0625f, v * 1.125f + 1e-3f, v * 3.0f}) {
                const float step = std::ldexp(std::max(floor_power_of_two(x), min_normal), -f.mantissa_bits);
                const float by_step = std::clamp(std::nearbyint(x / step) * step, -f.max_norm, f.max_norm);
                EXPECT_EQ(by_step, float8_to_float(float_to_float8(x, f.float8), f.float8)) << x;
            }
        }
    }
}

// Blocks run along the axis within each position of the others; a last,
// short block (10 channels in blocks of 4: 4, 4, 2) is padded with zeros.
TEST(BlockFloat, BlocksRunAlongTheAxisAtEachPositionOfTheOthers) {
    Tensor x(DataType::Float, {2, 10, 3});
    auto v = x.mutable_data<float>();
    for (auto& e : v) e = 0.3f;
    v[(1 * 10 + 9) * 3 + 2] = 100.0f;  // batch 1, channel 9, position 2: the short block's
    const auto q = block_float_fake_quantize(x, QuantType::QBFP16, {1, 4});
    const auto out = q.data<float>();
    EXPECT_EQ(out[(1 * 10 + 8) * 3 + 2], 0.0f);  // 0.3 on 100's grid (a step of 1)
    EXPECT_EQ(out[(1 * 10 + 9) * 3 + 2], 100.0f);
    // Elsewhere 0.3 keeps its own grid: P = 0.25, 77 steps of 2^-8.
    EXPECT_EQ(out[(1 * 10 + 7) * 3 + 2], 0.30078125f);  // the block before
    EXPECT_EQ(out[(1 * 10 + 9) * 3 + 1], 0.30078125f);  // the next position
    EXPECT_EQ(out[(0 * 10 + 9) * 3 + 2], 0.30078125f);  // the other batch
}

TEST(BlockFloat, ZerosSubnormalsAndSingleValuesStay) {
    const std::vector<float> zeros(8, 0.0f);
    EXPECT_EQ(quantized(QuantType::QBFP16, zeros), zeros);
    // A block of subnormals takes 2^-127: its step 2^-133 keeps them to 6 bits.
    const float tiny = std::ldexp(1.0f, -130) * 1.3f;
    EXPECT_EQ(quantized(QuantType::QBFP16, {tiny, 0, 0, 0, 0, 0, 0, 0})[0], std::ldexp(10.0f, -133));
    const auto one = Tensor::from_values<float>({1}, std::vector<float>{0.123456f});
    const auto kept = block_float_fake_quantize(one, QuantType::QMXFP4E2M1, {1, 32});
    EXPECT_EQ(kept.data<float>()[0], 0.123456f);
}

TEST(BlockFloat, AnAxisOutsideTheRankIsRefusedByName) {
    const Tensor x(DataType::Float, {4, 4});
    try {
        block_float_fake_quantize(x, QuantType::QBFP16, {3, 8}, "act");
        FAIL() << "axis 3 of a rank-2 tensor was accepted";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("'act'"), std::string::npos) << e.what();
    }
}

// Values that test the roundings: ties at every grid, values just beside
// them, subnormals, zeros of both signs and a wide spread of magnitudes.
Tensor awkward_values(std::vector<int64_t> shape, unsigned seed) {
    Tensor x(DataType::Float, shape);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-20, 12), pick(0, 9);
    for (auto& v : x.mutable_data<float>()) {
        const float m = unit(rng);
        switch (pick(rng)) {
            case 0: v = 0.0f; break;
            case 1: v = -0.0f; break;
            case 2: v = std::ldexp(std::round(m * 64.0f) + 0.5f, exponent(rng) - 6); break;  // a tie
            case 3: v = std::ldexp(m, -135); break;                                          // subnormal
            case 4: v = std::nextafter(std::ldexp(std::round(m * 16.0f) + 0.5f, -4), 0.0f); break;
            default: v = std::ldexp(m, exponent(rng)); break;
        }
    }
    return x;
}

struct Form {
    Model custom, simulated;
};

// One tensor through `type` both ways: vaiq's op and its simulation, for a
// tensor of `shape` declared as `declared` (-1: a size known only at run time;
// empty: not even the rank is known when the simulation is written).
Form both_forms(QuantType type, const std::vector<int64_t>& shape, const std::vector<int64_t>& declared,
                SharedExponentBlocks blocks) {
    TensorQuant t;
    t.tensor = "x";
    t.params = compute_quant_params({}, QuantSpec{.type = type, .shared_exponent = blocks});
    Form out;
    for (bool simulate : {false, true}) {
        test::GraphBuilder b(block_float_simulation_opset(type));
        b.input("x", shape).output("y", shape);
        auto model = b.build();
        for (auto* value : {model.graph().mutable_input(0), model.graph().mutable_output(0)}) {
            auto& dims = *value->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim();
            for (int d = 0; d < dims.size(); ++d)
                if (declared.empty() || declared[d] < 0) dims[d].set_dim_param(fmt::format("n{}", d));
        }
        UniqueNames names(model.graph());
        if (simulate)
            add_block_float_simulation(model, names, t, declared.empty() ? std::nullopt : std::optional(declared), "x",
                                       "y");
        else
            add_block_float_op(model, names, t, "x", "y");
        check_model(model);
        (simulate ? out.simulated : out.custom) = std::move(model);
    }
    return out;
}

int bits_that_differ(const Tensor& a, const Tensor& b) {
    int differ = 0;
    for (int64_t i = 0; i < a.size(); ++i)
        differ += std::bit_cast<uint32_t>(a.data<float>()[i]) != std::bit_cast<uint32_t>(b.data<float>()[i]);
    return differ;
}

// The op and its simulation in standard ops give the same bits for every type,
// with and without padding, along a middle and the last axis, on a vector, and
// where the size along the axis, or even the rank, is known only at run time,
// and on empty tensors whose emptiness only the run knows.
TEST(BlockFloat, TheSimulationInStandardOpsIsTheOpBitForBit) {
    const struct {
        std::vector<int64_t> shape, declared;
        SharedExponentBlocks blocks;
    } cases[] = {{{2, 10, 3}, {2, 10, 3}, {1, 4}},
                 {{1, 16, 4, 4}, {1, 16, 4, 4}, {1, 8}},
                 {{3, 40}, {3, 40}, {-1, 32}},
                 {{37}, {37}, {1, 8}},
                 {{2, 10, 3}, {-1, -1, 3}, {1, 4}},
                 {{3, 40}, {3, -1}, {-1, 16}},
                 {{2, 16, 3}, {2, -1, 3}, {1, 8}},  // a size along the axis known only at run time
                 {{2, 10, 3}, {}, {1, 4}},
                 {{2, 10, 3}, {}, {-2, 4}},
                 {{3, 40}, {}, {-1, 16}},                   // nor the rank
                 {{1, 4, 0, 24}, {1, 4, -1, 24}, {-1, 8}},  // empty along a size known only at run time
                 {{0, 16, 3}, {-1, 16, 3}, {1, 8}}};        // (a decoder's empty key/value cache)
    for (const auto type : {QuantType::QBFP16, QuantType::QMXInt8, QuantType::QMXFP8E4M3, QuantType::QMXFP8E5M2,
                            QuantType::QMXFP6E3M2, QuantType::QMXFP6E2M3, QuantType::QMXFP4E2M1})
        for (const int mode : {2, 0, 1})  // ties to even, away from zero, upward
            for (auto c : cases) {
                c.blocks.rounding_mode = mode;
                const auto forms = both_forms(type, c.shape, c.declared, c.blocks);
                const auto x = awkward_values(c.shape, 7);
                const auto op = runtime::Executor(forms.custom).run({{"x", x}})[0];
                const auto simulated = runtime::Executor(forms.simulated).run({{"x", x}})[0];
                ASSERT_EQ(op.shape(), c.shape);
                EXPECT_EQ(bits_that_differ(op, simulated), 0)
                    << quant_type_name(type) << " " << c.declared.size() << " " << c.blocks.axis << " mode " << mode;
                // and the op is the SDK's function
                EXPECT_EQ(bits_that_differ(op, block_float_fake_quantize(x, type, c.blocks)), 0);
            }
}

// Ties round as Quark's rounding_mode says. In a BFP16 block whose largest
// value is 1 (P = 1), x * 64 is 2.5, -2.5, 1.5 and -1.5 for these values.
TEST(BlockFloat, TiesRoundAsTheRoundingModeSays) {
    const std::vector<float> x = {1.0f, 5.0f / 128, -5.0f / 128, 3.0f / 128, -3.0f / 128, 0.0f, 0.0f, 0.0f};
    const auto t = Tensor::from_values<float>({1, 8}, x);
    const std::map<int, std::vector<float>> expected = {{2, {2, -2, 2, -2}}, {0, {3, -3, 2, -2}}, {1, {3, -2, 2, -1}}};
    for (const auto& [mode, steps] : expected) {
        const auto y = block_float_fake_quantize(t, QuantType::QBFP16, {1, 8, mode});
        for (size_t i = 0; i < steps.size(); ++i)
            EXPECT_EQ(y.data<float>()[i + 1] * 64, steps[i]) << "mode " << mode << ", value " << i;
    }
    EXPECT_THROW(block_float_fake_quantize(t, QuantType::QBFP16, {1, 8, 3}), InputError);
}

TEST(BlockFloat, TheOpReadsQuarksAttributesAndRefusesWhatItDoesNotCompute) {
    onnx::NodeProto node;
    node.set_op_type(std::string(kMXOp));
    node.set_domain(std::string(kVaiqDomain));
    set_attribute(node, "element_dtype", std::string("fp4_e2m1"));
    set_attribute(node, "block_size", int64_t{16});
    auto read = block_float_node(node);
    ASSERT_TRUE(read);
    EXPECT_EQ(read->type, QuantType::QMXFP4E2M1);
    EXPECT_EQ(read->blocks, (SharedExponentBlocks{1, 16}));
    set_attribute(node, "rounding_mode", int64_t{0});
    EXPECT_EQ(block_float_node(node)->blocks.rounding_mode, 0);
    set_attribute(node, "rounding_mode", int64_t{3});
    EXPECT_THROW(block_float_node(node), InputError);
    node.set_op_type(std::string(kBFPOp));
    set_attribute(node, "rounding_mode", int64_t{2});
    set_attribute(node, "bfp_method", std::string("to_bfp_prime"));
    EXPECT_THROW(block_float_node(node), InputError);
    node.set_domain("com.other");
    EXPECT_FALSE(block_float_node(node));
}

}  // namespace
}  // namespace vaiq
