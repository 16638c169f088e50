// The SDK's building blocks: tensors, quantization arithmetic, graph editing.
#include <gtest/gtest.h>
#include <omp.h>

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <thread>

#include "sdk/one_scale.hpp"
#include "test_support.hpp"
#include "vaiq/algorithm.hpp"
#include "vaiq/error.hpp"
#include "vaiq/gemm.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/histogram.hpp"
#include "vaiq/options.hpp"
#include "vaiq/quant.hpp"
#include "vaiq/tensor.hpp"

namespace {

using vaiq::DataType;
using vaiq::QuantType;

TEST(Tensor, DecodesTypedFieldsAndRawData) {
    onnx::TensorProto p;
    p.set_data_type(onnx::TensorProto::INT8);
    p.add_dims(3);
    for (int v : {-128, 0, 127}) p.add_int32_data(v);
    const auto t = vaiq::Tensor::from_proto(p);
    EXPECT_EQ(t.type(), DataType::Int8);
    EXPECT_EQ(std::vector<int8_t>(t.data<int8_t>().begin(), t.data<int8_t>().end()),
              (std::vector<int8_t>{-128, 0, 127}));
    const auto round_trip = vaiq::Tensor::from_proto(t.to_proto("x"));
    EXPECT_EQ(round_trip.data<int8_t>()[2], 127);
    EXPECT_THROW((void)t.data<float>(), vaiq::InternalError);
}

TEST(Tensor, RejectsDataThatDoesNotMatchTheShape) {
    onnx::TensorProto p;
    p.set_name("w");
    p.set_data_type(onnx::TensorProto::FLOAT);
    p.add_dims(2);
    p.add_dims(3);
    p.add_float_data(1.0f);
    EXPECT_THROW(vaiq::check_tensor_data(p), vaiq::InputError);
    p.clear_float_data();
    p.set_raw_data(std::string(23, '\0'));
    try {
        vaiq::check_tensor_data(p);
        FAIL();
    } catch (const vaiq::InputError& e) {
        EXPECT_EQ(std::string(e.what()), "tensor 'w' declares 6 elements of float (24 bytes) but holds 23 bytes");
    }
    p.set_raw_data(std::string(24, '\0'));
    EXPECT_NO_THROW(vaiq::check_tensor_data(p));
}

TEST(Tensor, ElementCountRefusesNegativeAndOverflowingShapes) {
    EXPECT_EQ(vaiq::element_count(std::vector<int64_t>{2, 3, 4}), 24);
    EXPECT_EQ(vaiq::element_count(std::vector<int64_t>{}), 1);
    EXPECT_THROW(vaiq::element_count(std::vector<int64_t>{2, -1}), vaiq::InputError);
    EXPECT_THROW(vaiq::element_count(std::vector<int64_t>{int64_t{1} << 40, int64_t{1} << 40}), vaiq::InputError);
}

// A copy holds its own values: the type, the shape and every byte, apart from
// the original's; assignment replaces what the target held, and a tensor
// assigned to itself keeps its values.
TEST(Tensor, ACopyHoldsItsOwnValues) {
    vaiq::Tensor original(vaiq::DataType::Float, {2, 3});
    auto values = original.mutable_data<float>();
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) + 0.5f;
    const vaiq::Tensor copy(original);
    vaiq::Tensor assigned(vaiq::DataType::Int8, {7});
    assigned = original;
    values[0] = -1.0f;
    for (const vaiq::Tensor* t : {&copy, static_cast<const vaiq::Tensor*>(&assigned)}) {
        EXPECT_EQ(t->type(), vaiq::DataType::Float);
        EXPECT_EQ(t->shape(), (std::vector<int64_t>{2, 3}));
        ASSERT_EQ(t->size(), 6);
        for (int64_t i = 0; i < 6; ++i)
            EXPECT_EQ(t->data<float>()[static_cast<size_t>(i)], static_cast<float>(i) + 0.5f);
    }
    auto& self = assigned;
    assigned = self;
    EXPECT_EQ(assigned.data<float>()[5], 5.5f);
    const vaiq::Tensor empty_copy{vaiq::Tensor()};
    EXPECT_EQ(empty_copy.size(), 0);
}

TEST(Tensor, HalfAndBfloat16RoundToNearestEven) {
    // Exactly halfway between two bfloat16 values: the even one wins.
    EXPECT_EQ(vaiq::float_to_bfloat16(std::bit_cast<float>(0x3f808000u)), 0x3f80);
    EXPECT_EQ(vaiq::float_to_bfloat16(std::bit_cast<float>(0x3f818000u)), 0x3f82);
    EXPECT_EQ(vaiq::float_to_bfloat16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
    EXPECT_TRUE(std::isnan(vaiq::bfloat16_to_float(vaiq::float_to_bfloat16(std::nanf("")))));
    EXPECT_EQ(vaiq::bfloat16_to_float(0x4049), 3.140625f);
    // Half: 65519 is the largest value that rounds down to 65504; 65520 overflows.
    EXPECT_EQ(vaiq::half_to_float(vaiq::float_to_half(65519.0f)), 65504.0f);
    EXPECT_TRUE(std::isinf(vaiq::half_to_float(vaiq::float_to_half(65520.0f))));
    EXPECT_EQ(vaiq::float_to_half(1.0f + 0x1p-11f), 0x3c00);                  // tie to even
    EXPECT_EQ(vaiq::float_to_half(1.0f + 3 * 0x1p-11f), 0x3c02);              // tie to even, upwards
    EXPECT_EQ(vaiq::half_to_float(vaiq::float_to_half(0x1p-24f)), 0x1p-24f);  // smallest subnormal
    EXPECT_EQ(vaiq::float_to_half(0x1p-26f), 0);                              // below half of it
    EXPECT_EQ(vaiq::float_to_half(-2.0f), 0xc000);
    for (uint32_t bits = 0; bits < 0x7c00; bits += 7)  // every finite half survives the round trip
        ASSERT_EQ(vaiq::float_to_half(vaiq::half_to_float(static_cast<uint16_t>(bits))), bits);
}

TEST(Tensor, ConvertsBetweenFloatTypes) {
    const std::vector<float> values{1.0f, -0.333333f, 1000.5f};
    const auto t = vaiq::Tensor::from_values<float>({3}, values);
    const auto half = t.convert_float(vaiq::DataType::Float16);
    EXPECT_EQ(half.type(), vaiq::DataType::Float16);
    const auto back = half.convert_float(vaiq::DataType::Float);
    EXPECT_EQ(back.data<float>()[0], 1.0f);
    EXPECT_NEAR(back.data<float>()[1], -0.333333f, 2e-4);
    EXPECT_EQ(back.data<float>()[2], 1000.5f);
    EXPECT_THROW(vaiq::Tensor::from_values<int64_t>({1}, std::vector<int64_t>{1}).convert_float(vaiq::DataType::Float),
                 vaiq::InputError);
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kBlocksKept = false;  // every block from the heap there
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kBlocksKept = false;
#else
constexpr bool kBlocksKept = true;
#endif
#else
constexpr bool kBlocksKept = true;
#endif

TEST(Tensor, FreedBlocksServeTheSameThreadsNextRequestsOfTheirSize) {
    if (!kBlocksKept) GTEST_SKIP() << "blocks are not kept under AddressSanitizer";
    constexpr size_t kMiB = size_t{1} << 20;
    // Most recently freed first; a size within the same page counts as the same.
    void* a = vaiq::allocate_tensor_bytes(100000);
    void* b = vaiq::allocate_tensor_bytes(100000);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
    vaiq::free_tensor_bytes(a, 100000);
    vaiq::free_tensor_bytes(b, 100000);
    EXPECT_EQ(vaiq::allocate_tensor_bytes(100001), b);
    EXPECT_EQ(vaiq::allocate_tensor_bytes(100000), a);
    vaiq::free_tensor_bytes(a, 100000);
    vaiq::free_tensor_bytes(b, 100001);
    // Another thread has its own blocks.
    void* elsewhere = nullptr;
    std::thread([&] {
        elsewhere = vaiq::allocate_tensor_bytes(100000);
        vaiq::free_tensor_bytes(elsewhere, 100000);
    }).join();
    EXPECT_NE(elsewhere, a);
    EXPECT_NE(elsewhere, b);
    EXPECT_EQ(vaiq::allocate_tensor_bytes(100000), b);
    vaiq::free_tensor_bytes(b, 100000);

    // Over 64 MiB kept, the oldest go back to the heap: of 65 blocks of 1 MiB
    // the last 64 stay (and a, b with them are gone).
    std::vector<void*> big;
    for (int i = 0; i < 65; ++i) big.push_back(vaiq::allocate_tensor_bytes(kMiB));
    for (void* p : big) vaiq::free_tensor_bytes(p, kMiB);
    for (int i = 64; i >= 1; --i) EXPECT_EQ(vaiq::allocate_tensor_bytes(kMiB), big[static_cast<size_t>(i)]);
    for (int i = 1; i <= 64; ++i) vaiq::free_tensor_bytes(big[static_cast<size_t>(i)], kMiB);
}

TEST(Tensor, FreedLargeBlocksServeLaterRequestsOfAnyThreadThatFitInThem) {
    if (!kBlocksKept) GTEST_SKIP() << "blocks are not kept under AddressSanitizer";
    const vaiq::KeptLargeBlocks as_in_a_run;
    // Sizes over anything the other tests of this process leave kept.
    constexpr size_t kMiB = size_t{1} << 20;
    auto fill = [](void* block, size_t bytes) {  // every byte usable
        std::memset(block, 0x5a, bytes);
        EXPECT_EQ(static_cast<unsigned char*>(block)[bytes - 1], 0x5a);
    };
    void* a = vaiq::allocate_tensor_bytes(130 * kMiB);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
    fill(a, 130 * kMiB);
    vaiq::free_tensor_bytes(a, 130 * kMiB);
    void* elsewhere = nullptr;  // another thread's request takes it
    std::thread([&] {
        elsewhere = vaiq::allocate_tensor_bytes(130 * kMiB - 100);
        vaiq::free_tensor_bytes(elsewhere, 130 * kMiB - 100);
    }).join();
    EXPECT_EQ(elsewhere, a);
    // A smaller request takes the smallest kept block that holds it, cut to its size.
    void* b = vaiq::allocate_tensor_bytes(190 * kMiB);
    vaiq::free_tensor_bytes(b, 190 * kMiB);
    void* c = vaiq::allocate_tensor_bytes(70 * kMiB);
    EXPECT_EQ(c, a);
    fill(c, 70 * kMiB);
    vaiq::free_tensor_bytes(c, 70 * kMiB);
    EXPECT_EQ(vaiq::allocate_tensor_bytes(150 * kMiB), b);
    vaiq::free_tensor_bytes(b, 150 * kMiB);
    // At most 512 MiB are kept: of three 200 MiB blocks (never touched: only
    // address space) freed after those, the first freed goes, the other two serve again.
    std::vector<void*> huge;
    for (int i = 0; i < 3; ++i) huge.push_back(vaiq::allocate_tensor_bytes(200 * kMiB));
    for (void* p : huge) vaiq::free_tensor_bytes(p, 200 * kMiB);
    const std::set<void*> kept{vaiq::allocate_tensor_bytes(200 * kMiB), vaiq::allocate_tensor_bytes(200 * kMiB)};
    EXPECT_EQ(kept, (std::set<void*>{huge[1], huge[2]}));
    for (void* p : kept) vaiq::free_tensor_bytes(p, 200 * kMiB);
}

TEST(Quant, ParsesEveryDocumentedSpelling) {
    EXPECT_EQ(vaiq::parse_quant_type("QUInt8"), QuantType::QUInt8);
    EXPECT_EQ(vaiq::parse_quant_type("QuantType.QInt8"), QuantType::QInt8);
    EXPECT_EQ(vaiq::parse_quant_type("vai_q_onnx.VitisQuantType.QBFloat16"), QuantType::QBFloat16);
    EXPECT_EQ(vaiq::parse_quant_type("Something.QInt8"), std::nullopt);
    EXPECT_EQ(vaiq::parse_quant_type("QInt7"), std::nullopt);
}

TEST(Quant, IntegerRangesMatchOnnxRuntime) {
    using R = std::pair<int64_t, int64_t>;
    EXPECT_EQ(vaiq::integer_range(QuantType::QInt8), (R{-128, 127}));
    EXPECT_EQ(vaiq::integer_range(QuantType::QInt8, true), (R{-127, 127}));
    EXPECT_EQ(vaiq::integer_range(QuantType::QUInt8, true), (R{0, 254}));
    EXPECT_EQ(vaiq::integer_range(QuantType::QInt8, false, true), (R{-64, 64}));
    EXPECT_EQ(vaiq::integer_range(QuantType::QUInt8, false, true), (R{0, 127}));
    EXPECT_EQ(vaiq::integer_range(QuantType::QInt16, true), (R{-32767, 32767}));
    EXPECT_EQ(vaiq::integer_range(QuantType::QUInt32), (R{0, 4294967295}));
    EXPECT_THROW(vaiq::integer_range(QuantType::QFloat16), vaiq::InternalError);
}

TEST(Quant, ScaleAndZeroPointAsOnnxRuntimeComputesThem) {
    vaiq::QuantSpec u8{QuantType::QUInt8, false};
    auto p = vaiq::compute_quant_params({-1.0f, 3.0f}, u8);
    EXPECT_FLOAT_EQ(p.scale[0], 4.0f / 255.0f);
    EXPECT_EQ(p.zero_point[0], 64);                    // round(0 - (-1) / (4/255)) = round(63.75)
    p = vaiq::compute_quant_params({0.5f, 2.0f}, u8);  // the range always includes 0
    EXPECT_FLOAT_EQ(p.scale[0], 2.0f / 255.0f);
    EXPECT_EQ(p.zero_point[0], 0);
    vaiq::QuantSpec s8{QuantType::QInt8, true};
    p = vaiq::compute_quant_params({-0.5f, 2.54f}, s8);
    EXPECT_FLOAT_EQ(p.scale[0], 2.54f * 2 / 254.0f);
    EXPECT_EQ(p.zero_point[0], 0);
    p = vaiq::compute_quant_params({0.0f, 0.0f}, u8);  // degenerate: scale 1
    EXPECT_FLOAT_EQ(p.scale[0], 1.0f);
    EXPECT_THROW(vaiq::compute_quant_params({1.0f, -1.0f}, u8), vaiq::InputError);
}

TEST(Quant, Int16ScaleIsTheNearestSixteenBitMultiplierAndShift) {
    // 0.1 = 26214 / 2^18 (M within int16, 15 significant bits).
    EXPECT_EQ(vaiq::nearest_int16_scale(0.1), 26214.0 / 262144.0);
    EXPECT_EQ(vaiq::nearest_int16_scale(0.25), 0.25);  // powers of two are exact
    for (double s : {3e-9, 1.7e-5, 0.0123, 0.9999, 7.5, 1234.5}) {
        const double q = vaiq::nearest_int16_scale(s);
        EXPECT_LE(std::abs(q - s) / s, 0x1p-15) << s;
        int n = 0;
        const double m = std::frexp(q, &n);  // q = m * 2^n: m has at most 15 significant bits
        EXPECT_EQ(std::ldexp(m, 15), std::nearbyint(std::ldexp(m, 15))) << s;
    }
    EXPECT_EQ(vaiq::nearest_int16_scale(1e6), 32767.0);  // M saturates at N = 0
    vaiq::QuantSpec spec{QuantType::QUInt8, false};
    spec.int16_scale = true;
    const auto p = vaiq::compute_quant_params({-1.0f, 3.0f}, spec);
    EXPECT_EQ(p.scale[0], static_cast<float>(vaiq::nearest_int16_scale(4.0 / 255.0)));
    EXPECT_EQ(p.zero_point[0], 64) << "the zero point follows the rounded scale";
}

TEST(Quant, FakeQuantizeIsWhatAQuantizeDequantizePairComputes) {
    // Per tensor: 2.6 steps round to 3, -30 saturates at -128 steps (int8, zero point 0).
    vaiq::QuantParams p{vaiq::QuantType::QInt8, {0.1f}, {0}, -1};
    const auto x = vaiq::Tensor::from_values<float>({3}, std::vector<float>{0.26f, -30.0f, 0.04f});
    const auto y = vaiq::fake_quantize(x, p, "x");
    EXPECT_FLOAT_EQ(y.data<float>()[0], 3 * 0.1f);
    EXPECT_FLOAT_EQ(y.data<float>()[1], -128 * 0.1f);
    EXPECT_FLOAT_EQ(y.data<float>()[2], 0.0f);
    // Per channel along axis 0, uint8 with zero points: each row its own scale.
    vaiq::QuantParams c{vaiq::QuantType::QUInt8, {1.0f, 0.5f}, {10, 0}, 0};
    const auto m = vaiq::Tensor::from_values<float>({2, 2}, std::vector<float>{-3.4f, 300.0f, 0.74f, -1.0f});
    const auto z = vaiq::fake_quantize(m, c, "m");
    EXPECT_EQ(std::vector<float>(z.data<float>().begin(), z.data<float>().end()),
              (std::vector<float>{-3.0f, 245.0f, 0.5f, 0.0f}));
}

// A tensor's one scale takes a one-pass path; it must give what the general
// path (quantize, then dequantize; here per channel with equal channels) gives,
// bit for bit, for every type, halves, saturation, NaN and large values.
TEST(Quant, FakeQuantizeWithOneScaleIsTheGeneralPathsBitForBit) {
    std::vector<float> x;
    for (int i = -300; i <= 300; ++i) x.push_back(static_cast<float>(i) * 0.05f);  // halves of 0.1 steps
    for (const float v :
         {1e9f, -1e9f, 3e38f, -3e38f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
          0.15f, -0.25f, -0.0f, -0.04f, 419430.45f, -419430.35f, 838860.75f, 6553.45f, -6553.55f, 3276.75f})
        x.push_back(v);
    const auto values = vaiq::Tensor::from_values<float>({static_cast<int64_t>(x.size()), 1}, x);
    for (const auto type : {QuantType::QInt8, QuantType::QUInt8, QuantType::QInt16, QuantType::QUInt16,
                            QuantType::QInt4, QuantType::QUInt4, QuantType::QInt32}) {
        const int64_t zp = type == QuantType::QUInt8    ? 128
                           : type == QuantType::QUInt16 ? 30000
                           : type == QuantType::QUInt4  ? 8
                                                        : 0;
        const vaiq::QuantParams one{type, {0.1f}, {zp}, -1};
        const vaiq::QuantParams channels{type, {0.1f}, {zp}, 1};  // one channel along axis 1: the general path
        const auto fast = vaiq::fake_quantize(values, one, "x");
        const auto general = vaiq::fake_quantize(values, channels, "x");
        // In the buffer of a tensor given up (a simulated run's): the same values, where they were.
        auto given = values;
        const float* buffer = given.data<float>().data();
        const auto in_place = vaiq::fake_quantize(std::move(given), one, "x");
        if (vaiq::quant_bits(type) <= 16) {
            EXPECT_EQ(in_place.data<float>().data(), buffer);
        }
        ASSERT_EQ(fast.size(), general.size());
        ASSERT_EQ(in_place.size(), general.size());
        for (size_t i = 0; i < x.size(); ++i) {
            ASSERT_EQ(std::bit_cast<uint32_t>(fast.data<float>()[i]), std::bit_cast<uint32_t>(general.data<float>()[i]))
                << vaiq::quant_type_name(type) << " at " << x[i];
            ASSERT_EQ(std::bit_cast<uint32_t>(in_place.data<float>()[i]),
                      std::bit_cast<uint32_t>(general.data<float>()[i]))
                << vaiq::quant_type_name(type) << " at " << x[i] << ", in place";
        }
    }
}

// Each instruction set's loop this CPU runs (the library uses the widest) gives
// the general path's bits, over a length that leaves each a tail.
TEST(Quant, EveryOneScaleKernelIsTheGeneralPathsBitForBit) {
    std::vector<float> x;
    for (int i = -700; i <= 700; ++i) x.push_back(static_cast<float>(i) * 0.05f);  // halves of 0.1 steps
    for (const float v : {1e9f, -1e9f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                          -0.0f, 419430.45f, -6553.55f})
        x.push_back(v);
    const auto values = vaiq::Tensor::from_values<float>({static_cast<int64_t>(x.size()), 1}, x);
    for (const auto type : {QuantType::QInt8, QuantType::QUInt8, QuantType::QInt16, QuantType::QUInt4}) {
        const int64_t zp = type == QuantType::QUInt8 ? 128 : type == QuantType::QUInt4 ? 8 : 0;
        const auto general = vaiq::fake_quantize(values, vaiq::QuantParams{type, {0.1f}, {zp}, 1}, "x");
        const auto [qmin, qmax] = vaiq::integer_range(type);
        const vaiq::detail::OneScale s{0.1f, static_cast<float>(qmin - zp), static_cast<float>(qmax - zp)};
        const auto kernels = vaiq::detail::one_scale_kernels();
        EXPECT_STREQ(kernels.front().first, "portable");
        for (const auto& [name, kernel] : kernels) {
            std::vector<float> out(x.size());
            kernel(x.data(), out.data(), static_cast<int64_t>(x.size()), s);
            for (size_t i = 0; i < x.size(); ++i)
                ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(general.data<float>()[i]))
                    << name << ", " << vaiq::quant_type_name(type) << " at " << x[i];
        }
    }
}

// A tensor large enough to be split across threads, of a length that leaves a
// tail for the vector loops: still the general path's bits, each value where it was.
TEST(Quant, FakeQuantizeWithOneScaleOnThreadsIsTheGeneralPathsBitForBit) {
    std::vector<float> x(100003);
    for (size_t i = 0; i < x.size(); ++i)
        x[i] = i % 997 == 0 ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(i % 6007) * 0.0125f - 37.5f;
    const auto values = vaiq::Tensor::from_values<float>({static_cast<int64_t>(x.size()), 1}, x);
    const vaiq::QuantParams one{QuantType::QUInt8, {0.1f}, {128}, -1};
    const vaiq::QuantParams channels{QuantType::QUInt8, {0.1f}, {128}, 1};
    const auto fast = vaiq::fake_quantize(values, one, "x");
    const auto general = vaiq::fake_quantize(values, channels, "x");
    ASSERT_EQ(fast.size(), general.size());
    for (size_t i = 0; i < x.size(); ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(fast.data<float>()[i]), std::bit_cast<uint32_t>(general.data<float>()[i]))
            << "at " << i;
}

TEST(Quant, FloatTypesRoundToTheirPrecisionAndSaturate) {
    const vaiq::QuantSpec half{QuantType::QFloat16, false};
    const auto p = vaiq::compute_quant_params({-5.0f, 7.0f}, half);
    EXPECT_EQ(p.scale, std::vector<float>{1.0f});
    EXPECT_EQ(p.zero_point, std::vector<int64_t>{0});
    const auto q = [](float v, QuantType t) { return vaiq::float_quant_value(vaiq::quantize_float_value(v, 0, t), t); };
    EXPECT_EQ(q(1.0f + 0x1p-12f, QuantType::QFloat16), 1.0f);  // below half a float16 step
    EXPECT_EQ(q(1.0f + 0x1p-10f, QuantType::QFloat16), 1.0f + 0x1p-10f);
    EXPECT_EQ(q(1.0f + 0x1p-9f, QuantType::QBFloat16), 1.0f);  // bfloat16 keeps 8 bits
    EXPECT_EQ(q(1e9f, QuantType::QFloat16), 65504.0f);
    EXPECT_EQ(q(-1e9f, QuantType::QFloat16), -65504.0f);
    EXPECT_TRUE(std::isnan(q(std::nanf(""), QuantType::QBFloat16)));
    const auto stored = vaiq::quantize_tensor(vaiq::Tensor::from_values<float>({2}, std::vector<float>{0.1f, 3e5f}),
                                              vaiq::QuantParams{QuantType::QFloat16, {1.0f}, {0}, -1}, "t");
    EXPECT_EQ(stored.type(), vaiq::DataType::Float16);
    const auto as_float = stored.convert_float(vaiq::DataType::Float);
    const auto back = as_float.data<float>();
    EXPECT_EQ(back[0], vaiq::half_to_float(vaiq::float_to_half(0.1f)));
    EXPECT_EQ(back[1], 65504.0f);
}

// Float8 E4M3FN (largest 448, no infinity) and E5M2 (largest 57344): every
// code decodes and encodes back to itself; halfway values go to the even code;
// beyond the largest value (infinities too) saturate, or without saturation
// become NaN (E4M3FN) or infinity (E5M2); below half the smallest subnormal
// round to a zero that keeps the sign.
TEST(Quant, Float8RoundsToNearestEvenAndSaturates) {
    using vaiq::DataType;
    for (const auto type : {DataType::Float8E4M3FN, DataType::Float8E5M2}) {
        int finite = 0;
        for (int bits = 0; bits < 256; ++bits) {
            const float v = vaiq::float8_to_float(static_cast<uint8_t>(bits), type);
            if (std::isnan(v)) {
                EXPECT_EQ(vaiq::float_to_float8(v, type) & 0x7f, 0x7f);
                continue;
            }
            if (std::isinf(v)) continue;
            ++finite;
            ASSERT_EQ(vaiq::float_to_float8(v, type), bits) << static_cast<int>(type) << " " << v;
        }
        EXPECT_EQ(finite, type == DataType::Float8E4M3FN ? 254 : 248);
        EXPECT_EQ(vaiq::float8_to_float(vaiq::float_to_float8(1e6f, type), type), vaiq::float8_max(type));
        EXPECT_EQ(vaiq::float8_to_float(vaiq::float_to_float8(-INFINITY, type), type), -vaiq::float8_max(type));
    }
    const auto e4m3 = [](float v, bool saturate = true) {
        return vaiq::float8_to_float(vaiq::float_to_float8(v, DataType::Float8E4M3FN, saturate),
                                     DataType::Float8E4M3FN);
    };
    EXPECT_EQ(vaiq::float8_max(DataType::Float8E4M3FN), 448.0f);
    EXPECT_EQ(e4m3(1.0625f), 1.0f);     // halfway between 1 and 1.125: the even mantissa
    EXPECT_EQ(e4m3(1.1875f), 1.25f);    // halfway between 1.125 and 1.25: the even one
    EXPECT_EQ(e4m3(1.07f), 1.125f);     // above halfway
    EXPECT_EQ(e4m3(15.5f), 16.0f);      // into the next binade
    EXPECT_EQ(e4m3(464.0f), 448.0f);    // halfway to 480, which E4M3FN does not have: even, 448
    EXPECT_EQ(e4m3(0x1p-9f), 0x1p-9f);  // the smallest subnormal
    EXPECT_EQ(e4m3(0x1.8p-9f), 0x1p-8f);
    EXPECT_EQ(e4m3(0x1p-10f), 0.0f);  // half the smallest subnormal: to the even zero
    EXPECT_EQ(vaiq::float_to_float8(-1e-6f, DataType::Float8E4M3FN), 0x80);
    EXPECT_TRUE(std::isnan(e4m3(500.0f, false)));
    EXPECT_TRUE(std::isnan(e4m3(INFINITY, false)));
    const auto e5m2 = [](float v, bool saturate = true) {
        return vaiq::float8_to_float(vaiq::float_to_float8(v, DataType::Float8E5M2, saturate), DataType::Float8E5M2);
    };
    EXPECT_EQ(e5m2(1.125f), 1.0f);  // two mantissa bits: halfway between 1 and 1.25
    EXPECT_EQ(e5m2(61440.0f), 57344.0f);
    EXPECT_TRUE(std::isinf(e5m2(61440.0f, false)));
    EXPECT_EQ(e5m2(0x1p-16f), 0x1p-16f);
    EXPECT_EQ(e5m2(0x1p-17f), 0.0f);

    // A tensor's parameters: its largest magnitude onto 448, zero point 0; the
    // stored values and their fake-quantized floats are what the pair computes.
    const vaiq::QuantSpec spec{QuantType::QFloat8E4M3FN, true};
    const auto p = vaiq::compute_quant_params({-3.5f, 2.0f}, spec);
    EXPECT_FLOAT_EQ(p.scale[0], 3.5f / 448.0f);
    EXPECT_EQ(p.zero_point, std::vector<int64_t>{0});
    const auto x = vaiq::Tensor::from_values<float>({4}, std::vector<float>{-3.5f, 0.1f, 1.0f, 5.0f});
    const auto q = vaiq::quantize_tensor(x, p, "t");
    EXPECT_EQ(q.type(), DataType::Float8E4M3FN);
    const auto fake = vaiq::fake_quantize(x, p, "t");
    const auto f = fake.data<float>();
    for (int i = 0; i < 4; ++i) {
        const auto bits = static_cast<uint8_t>(q.bytes()[i]);
        EXPECT_EQ(f[i], vaiq::float8_to_float(bits, DataType::Float8E4M3FN) * p.scale[0]) << i;
    }
    EXPECT_EQ(f[0], -3.5f);
    EXPECT_EQ(f[3], 3.5f) << "saturated";
    EXPECT_NEAR(f[1], 0.1f, 0.1f / 16);
    EXPECT_EQ(vaiq::parse_quant_type("QuantType.QFloat8E4M3FN"), QuantType::QFloat8E4M3FN);
}

TEST(Options, TypedAccess) {
    vaiq::Options o;
    o.set("flag", true);
    o.set("count", 3);
    o.set("names", {"a", "b"});
    EXPECT_TRUE(o.get_bool("flag"));
    EXPECT_EQ(o.get_int("count"), 3);
    EXPECT_DOUBLE_EQ(o.get_float("count"), 3.0);
    EXPECT_EQ(o.get_string_list("names"), (std::vector<std::string>{"a", "b"}));
    EXPECT_THROW(o.get_int("flag"), vaiq::InternalError);
    EXPECT_THROW(o.get_bool("missing"), vaiq::InternalError);
}

TEST(Graph, IndexKnowsProducersConsumersAndSubgraphReads) {
    auto model = vaiq::test::conv_relu_model();
    // An If whose branch reads "conv_out" from the outer graph.
    onnx::GraphProto branch;
    branch.set_name("then");
    auto* n = branch.add_node();
    n->set_op_type("Identity");
    n->add_input("conv_out");
    n->add_output("inner");
    branch.add_output()->set_name("inner");
    auto* if_node = model.graph().add_node();
    if_node->set_op_type("If");
    if_node->add_input("cond");
    if_node->add_output("if_out");
    auto* attr = if_node->add_attribute();
    attr->set_name("then_branch");
    attr->set_type(onnx::AttributeProto::GRAPH);
    *attr->mutable_g() = branch;

    const vaiq::GraphIndex index(model.graph());
    EXPECT_EQ(index.producer("conv_out"), 0);
    EXPECT_EQ(index.producer("x"), -1);
    ASSERT_EQ(index.consumers("conv_out").size(), 2u);
    EXPECT_EQ(index.consumers("conv_out")[1].slot, -1) << "a subgraph read";
    EXPECT_NE(index.initializer("w"), nullptr);
    EXPECT_TRUE(index.is_graph_input("x"));
    EXPECT_TRUE(index.is_graph_output("y"));

    // Renaming reaches into the subgraph.
    EXPECT_TRUE(vaiq::replace_all_uses(model.graph(), "conv_out", "renamed"));
    EXPECT_EQ(model.graph().node(2).attribute(0).g().node(0).input(0), "renamed");
    EXPECT_FALSE(vaiq::replace_all_uses(model.graph(), "y", "x")) << "graph outputs keep their names";
}

TEST(Graph, TopologicalOrderRepairsAndDetectsCycles) {
    vaiq::test::GraphBuilder b;
    b.input("x", {1}).output("y", {1});
    b.node("Relu", {"a"}, {"y"}, "second");
    b.node("Relu", {"x"}, {"a"}, "first");
    auto model = b.build();
    EXPECT_EQ(vaiq::topological_order(model.graph()), (std::vector<int>{1, 0}));
    model.graph().mutable_node(1)->set_input(0, "y");
    try {
        vaiq::topological_order(model.graph());
        FAIL();
    } catch (const vaiq::InputError& e) {
        EXPECT_NE(std::string(e.what()).find("cycle"), std::string::npos);
    }
}

TEST(Graph, UniqueNamesAndCleanup) {
    auto model = vaiq::test::conv_relu_model();
    EXPECT_EQ(vaiq::UniqueNames(model.graph()).fresh("fresh"), "fresh");
    EXPECT_EQ(vaiq::UniqueNames(model.graph()).fresh("conv_out"), "conv_out_1");
    vaiq::UniqueNames names(model.graph());
    EXPECT_EQ(names.fresh("conv_out"), "conv_out_1");
    EXPECT_EQ(names.fresh("conv_out"), "conv_out_2") << "a name handed out is taken";
    EXPECT_EQ(names.fresh("w"), "w_1");
    EXPECT_EQ(vaiq::remove_unused_initializers(model.graph()), 0);
    vaiq::remove_nodes(model.graph(), {0});
    EXPECT_EQ(vaiq::remove_unused_initializers(model.graph()), 2);  // w and b
}

}  // namespace

TEST(Histogram, GrowsAtTheSameStrideThenMergesToStayBounded) {
    vaiq::Histogram h(8, false);  // 4 bins each side of 0
    const std::vector<float> first{-1.0f, -0.1f, 0.1f, 0.9f};
    h.add(first);
    EXPECT_DOUBLE_EQ(h.stride(), 0.25);
    EXPECT_EQ(h.counts().size(), 8u);
    EXPECT_DOUBLE_EQ(h.edge(0), -1.0);
    h.add(std::vector<float>{1.6f});  // 3 more bins each side, same stride
    EXPECT_DOUBLE_EQ(h.stride(), 0.25);
    EXPECT_EQ(h.counts().size(), 14u);
    EXPECT_EQ(h.counts()[13], 1.0);
    h.add(std::vector<float>{-100.0f});  // would need 400 bins a side: pairs merge until <= 16
    EXPECT_LE(h.counts().size(), 32u);
    EXPECT_DOUBLE_EQ(h.edge(h.counts().size() / 2), 0.0) << "0 stays on an edge";
    EXPECT_DOUBLE_EQ(h.total(), 6.0);
    double sum = 0;
    for (double c : h.counts()) sum += c;
    EXPECT_DOUBLE_EQ(sum, 6.0) << "merging keeps every count";
    EXPECT_EQ(h.counts().front(), 1.0);
    EXPECT_FLOAT_EQ(h.min(), -100.0f);
    EXPECT_THROW(h.add(std::vector<float>{std::nanf("")}), vaiq::InputError);
}

TEST(Histogram, AConstantZeroFirstBatchThenAWideOneStaysSmall) {
    // A Relu that is zero everywhere on the first sample sets a tiny stride;
    // the next sample's range must merge bins, not allocate 10^11 of them.
    vaiq::Histogram h(2048, false);
    h.add(std::vector<float>(64, 0.0f));
    h.add(std::vector<float>{-3.0f, 0.5f, 120.0f});
    EXPECT_LE(h.counts().size(), 4u * 2048u);
    EXPECT_GE(h.stride() * static_cast<double>(h.counts().size() / 2), 120.0);
    EXPECT_DOUBLE_EQ(h.edge(h.counts().size() / 2), 0.0) << "0 stays on an edge";
    double sum = 0;
    for (double c : h.counts()) sum += c;
    EXPECT_DOUBLE_EQ(sum, 67.0);
    // The 64 zeros and 0.5 are in the bins just above 0, -3 just below 0's neighbours.
    const auto zero_bin = static_cast<size_t>(h.counts().size() / 2);
    EXPECT_GE(h.counts()[zero_bin], 64.0);

    vaiq::Histogram a(16, true);  // over |x|
    a.add(std::vector<float>(4, 0.0f));
    a.add(std::vector<float>{-50.0f, 2.0f});
    EXPECT_LE(a.counts().size(), 64u);
    EXPECT_EQ(a.counts().front(), 4.0 + (2.0 < a.stride() ? 1.0 : 0.0));
    EXPECT_EQ(a.counts().back(), 1.0);
}

namespace {

// The rewrite toolkit: typed attributes replace in place, fresh initializer
// names, one QLinear table, and a context whose index follows the edits.
TEST(RewriteToolkit, AttributesInitializersQLinearFormsAndAContextThatFollowsEdits) {
    onnx::NodeProto node;
    node.set_op_type("AveragePool");
    vaiq::set_attribute(node, "kernel_shape", std::vector<int64_t>{3, 3});
    vaiq::set_attribute(node, "count_include_pad", 0);
    vaiq::set_attribute(node, "kernel_shape", std::vector<int64_t>{2, 2});
    ASSERT_EQ(node.attribute_size(), 2) << "replaced, not appended";
    EXPECT_EQ(node.attribute(0).name(), "kernel_shape") << "in place";
    EXPECT_EQ(*vaiq::ints_attribute(node, "kernel_shape"), (std::vector<int64_t>{2, 2}));
    vaiq::set_attribute(node, "alpha", 0.5f);
    vaiq::set_attribute(node, "mode", std::string("constant"));
    EXPECT_EQ(vaiq::float_attribute(node, "alpha", 0.0f), 0.5f);
    EXPECT_EQ(vaiq::find_attribute(node, "mode")->s(), "constant");
    EXPECT_TRUE(vaiq::remove_attribute(node, "alpha"));
    EXPECT_FALSE(vaiq::remove_attribute(node, "alpha"));

    EXPECT_EQ(vaiq::qlinear_form("Conv")->op, "QLinearConv");
    EXPECT_EQ(vaiq::qlinear_form("Gemm")->domain, "com.microsoft");
    EXPECT_FALSE(vaiq::qlinear_form("Relu"));

    auto model = vaiq::test::conv_relu_model();
    vaiq::RewriteContext context(model);
    EXPECT_EQ(context.index().producer("y"), 1);
    EXPECT_EQ(context.shapes().at("y"), (std::vector<int64_t>{1, 3, 4, 4}));
    vaiq::UniqueNames names(context.graph());
    const auto k = vaiq::add_initializer(context.graph(), names, "w", vaiq::test::ramp({}, 2.0f));
    EXPECT_NE(k, "w") << "w is taken";
    vaiq::make_node(context.graph(), names, "Mul", {"y", k}, {"z"}, "scale");
    EXPECT_EQ(context.index().producer("z"), -1) << "a snapshot until told";
    context.changed();
    EXPECT_EQ(context.index().producer("z"), 2);
    EXPECT_NE(context.index().initializer(k), nullptr);

    // Relu -> Mul fused into one node in the Mul's place.
    onnx::NodeProto fused;
    fused.set_op_type("Fused");
    fused.add_input("conv_out");
    fused.add_output("z");
    vaiq::fuse_nodes(context.graph(), {1, 2}, 2, fused);
    context.changed();
    ASSERT_EQ(context.graph().node_size(), 2);
    EXPECT_EQ(context.graph().node(1).op_type(), "Fused");
    EXPECT_EQ(context.index().producer("z"), 1);
}

}  // namespace

TEST(Histogram, ShardsOfOneStrideMergeExactly) {
    // Both shards start from the same extent, so their grids are one grid.
    vaiq::Histogram whole(8, false), a(8, false), b(8, false);
    const std::vector<float> first{-1.0f, 0.3f}, second{1.0f, -0.6f, 0.1f}, later{2.2f, -0.2f};
    for (auto* h : {&whole, &a}) h->add(first);
    for (auto* h : {&whole, &b}) h->add(second);
    for (auto* h : {&whole, &b}) h->add(later);  // b grows at its stride
    a.merge(b);
    EXPECT_EQ(a.counts(), whole.counts());
    EXPECT_DOUBLE_EQ(a.stride(), whole.stride());
    EXPECT_DOUBLE_EQ(a.total(), 7.0);
    EXPECT_FLOAT_EQ(a.min(), -1.0f);
    EXPECT_FLOAT_EQ(a.max(), 2.2f);
}

TEST(Histogram, ShardsOfDifferentStridesMergeOntoTheCoarserGrid) {
    vaiq::Histogram fine(8, false), coarse(8, false);
    fine.add(std::vector<float>{-1.0f, 0.1f, 0.3f, 0.9f});  // stride 0.25
    coarse.add(std::vector<float>{-3.0f, 2.9f});            // stride 0.75
    fine.merge(coarse);
    EXPECT_DOUBLE_EQ(fine.stride(), 0.75);
    EXPECT_DOUBLE_EQ(fine.total(), 6.0);
    double sum = 0;
    for (double c : fine.counts()) sum += c;
    EXPECT_DOUBLE_EQ(sum, 6.0) << "every count kept, split bins included";
    // 0.1 and 0.3 lay in [0, 0.25) and [0.25, 0.5): both inside [0, 0.75).
    EXPECT_GE(fine.counts()[4], 2.0);
    EXPECT_FLOAT_EQ(fine.min(), -3.0f);
}

TEST(Histogram, SavedStateRestoresExactlyAndBadStateIsRefused) {
    vaiq::Histogram h(16, true);
    h.add(std::vector<float>{-0.5f, 0.25f, 3.0f, 0.0f});
    vaiq::Statistics saved;
    h.save(saved);
    const auto back = vaiq::Histogram::restore(saved, 16, true, "t");
    EXPECT_EQ(back.counts(), h.counts());
    EXPECT_EQ(back.stride(), h.stride());
    EXPECT_EQ(back.total(), h.total());
    EXPECT_EQ(back.min(), h.min());
    EXPECT_THROW(vaiq::Histogram::restore(saved, 16, false, "t"), vaiq::InputError) << "kept over |x|, not x";
    auto negative = saved;
    negative["hist_counts"][0] = -1;
    EXPECT_THROW(vaiq::Histogram::restore(negative, 16, true, "t"), vaiq::InputError);
    auto huge = saved;
    huge["hist_counts"].assign(1000, 1.0);
    EXPECT_THROW(vaiq::Histogram::restore(huge, 16, true, "t"), vaiq::InputError) << "more bins than it ever keeps";
    auto no_stride = saved;
    no_stride.erase("hist_stride");
    EXPECT_THROW(vaiq::Histogram::restore(no_stride, 16, true, "t"), vaiq::InputError);
    vaiq::Histogram wrong(32, true);
    EXPECT_THROW(wrong.merge(h), vaiq::InputError);
}

TEST(Extremes, FindTheExtremesAndAnyValueThatIsNotFinite) {
    // Lengths around the vector widths, and one big enough to be shared by threads.
    for (const size_t n : {size_t{2}, size_t{15}, size_t{16}, size_t{17}, size_t{100}, size_t{300001}}) {
        std::vector<float> v(n);
        for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7919) % 1000) * 0.01f - 3.0f;
        v[n / 3] = -7.5f;
        v[n - 1] = 9.25f;
        const auto e = vaiq::extremes(v);
        EXPECT_TRUE(e.finite) << n;
        EXPECT_EQ(e.lo, -7.5f) << n;
        EXPECT_EQ(e.hi, 9.25f) << n;
        for (const float bad :
             {std::nanf(""), std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
            auto w = v;
            w[n / 2] = bad;
            const auto e_bad = vaiq::extremes(w);
            EXPECT_FALSE(e_bad.finite) << n << " " << bad;
            EXPECT_TRUE(std::isnan(bad) ? std::isnan(e_bad.not_finite) : e_bad.not_finite == bad) << "named";
        }
    }
}

// Each value's bin is floor(x / stride) from the zero bin (of |x| for an
// absolute histogram), clamped: whichever vector width the CPU counts with, for
// values on edges, between them and below zero, in batches of every remainder.
TEST(Histogram, EachValueLandsInTheBinItsDefinitionGives) {
    for (const size_t n : {size_t{3}, size_t{4}, size_t{7}, size_t{8}, size_t{161}, size_t{5000}}) {
        std::vector<float> values(n);
        for (size_t i = 0; i < n; ++i) values[i] = static_cast<float>(i % 161) * 0.1f - 8.0f + (i % 7 == 0 ? 0.05f : 0);
        values[0] = -8.0f;
        values[n - 1] = 8.0f;  // the top edge: clamped into the last bin
        vaiq::Histogram signed_h(16, false), absolute_h(8, true);
        signed_h.add(values);  // extent 8: stride 1
        absolute_h.add(values);
        std::vector<double> want_signed(16, 0.0), want_absolute(8, 0.0);
        for (float v : values) {
            want_signed[std::clamp(static_cast<int>(std::floor(static_cast<double>(v))) + 8, 0, 15)] += 1;
            want_absolute[std::clamp(static_cast<int>(std::floor(std::abs(static_cast<double>(v)))), 0, 7)] += 1;
        }
        ASSERT_EQ(signed_h.stride(), 1.0);
        EXPECT_EQ(signed_h.counts(), want_signed) << n;
        EXPECT_EQ(absolute_h.counts(), want_absolute) << n;
    }
}

TEST(Histogram, ABigBatchCountsAsItsPiecesDo) {
    // A big batch is counted in shards over the threads (one on one thread), its
    // zeros by mask where the CPU has AVX-512 and 0 is an end of the range (a
    // Relu's); small ones (under a value a bin) straight in. Values of both
    // signs, then clamped at 0 from below and from above.
    std::vector<float> mixed(1 << 20);
    for (size_t i = 0; i < mixed.size(); ++i)
        mixed[i] = i % 5 == 0   ? (i % 10 == 0 ? 0.0f : -0.0f)
                   : i % 7 == 0 ? 1e-30f  // not zero, yet in the bin of 0
                                : static_cast<float>((i * 2654435761u) % 20011) * 1e-3f - 10.0f;
    // The extremes in the first piece, so that the pieces' bins grow once, as
    // the whole batch's do (a value on the reach of bins grown in between is
    // clamped into the last bin then, and so can land one bin lower).
    mixed[1] = 10.5f;
    mixed[2] = -10.5f;
    auto clamped = [&](bool below) {
        auto out = mixed;
        for (auto& v : out)
            if (below ? v < 0 : v > 0) v = 0.0f;
        return out;
    };
    // After a first batch of extent 12 the bins hold every value; after one of
    // extent 1 the big batch reaches past them, so they grow and it is counted again.
    for (const int threads : {1, 3}) {
        omp_set_num_threads(threads);
        for (const auto& values : {mixed, clamped(true), clamped(false)})
            for (const float extent : {12.0f, 1.0f}) {
                vaiq::Histogram whole(64, false), pieces(64, false), whole_abs(64, true), pieces_abs(64, true);
                const std::vector<float> first{-extent, extent};  // the same stride for both
                for (auto* h : {&whole, &pieces, &whole_abs, &pieces_abs}) h->add(first);
                whole.add(values);
                whole_abs.add(values);
                for (size_t start = 0; start < values.size(); start += 50) {
                    const auto piece =
                        std::span<const float>(values).subspan(start, std::min<size_t>(50, values.size() - start));
                    pieces.add(piece);
                    pieces_abs.add(piece);
                }
                EXPECT_EQ(whole.counts(), pieces.counts()) << extent;
                EXPECT_EQ(whole_abs.counts(), pieces_abs.counts()) << extent;
                EXPECT_EQ(whole.stride(), extent == 1.0f ? 0.125 : 0.375)
                    << "grown and merged to a power-of-two multiple";
                EXPECT_DOUBLE_EQ(whole.total(), 2.0 + static_cast<double>(values.size()));
                const auto zeros = std::count(values.begin(), values.end(), 0.0f);
                const size_t zero_bin = whole.counts().size() / 2;
                EXPECT_GE(whole.counts()[zero_bin], static_cast<double>(zeros)) << "0 lies in the bin just above 0";
                EXPECT_LT(whole.counts()[zero_bin - 1], static_cast<double>(zeros));
            }
    }
    omp_set_num_threads(0 < omp_get_num_procs() ? omp_get_num_procs() : 1);
}

// A big batch after the first is counted in the pass that finds its extremes;
// one holding NaN or infinity is refused by name and leaves the histogram as it was.
TEST(Histogram, ABigBatchThatIsNotFiniteIsRefusedAndCountsNothing) {
    std::vector<float> values(200000);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 1000) * 0.01f - 5.0f;
    for (const float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
        vaiq::Histogram h(64, false);
        h.add(std::vector<float>{-2.0f, 2.0f});
        auto with_bad = values;
        with_bad[123457] = bad;
        try {
            h.add(with_bad, "conv_out");
            ADD_FAILURE() << "a batch holding " << bad << " was taken";
        } catch (const vaiq::InputError& e) {
            EXPECT_NE(std::string(e.what()).find("'conv_out' holds " + fmt::format("{}", bad)), std::string::npos)
                << e.what();
        }
        EXPECT_DOUBLE_EQ(h.total(), 2.0);
        EXPECT_EQ(h.counts().size(), 64u) << "not grown";
        EXPECT_EQ(std::accumulate(h.counts().begin(), h.counts().end(), 0.0), 2.0);
    }
}

// Subnormal values give a stride whose inverse a float cannot hold: such
// batches are binned in double, by the same definition.
TEST(Histogram, SubnormalValuesLandInTheBinsTheirDefinitionGives) {
    std::vector<float> values(100000);
    for (size_t i = 0; i < values.size(); ++i)
        values[i] = static_cast<float>(static_cast<double>(i % 2001) * 1e-42 - 1e-39);
    vaiq::Histogram h(64, false);
    h.add(values);  // the first batch sets the stride; the second is counted in one pass
    h.add(values);
    ASSERT_GT(1.0 / h.stride(), 0x1p100);
    std::vector<double> want(h.counts().size(), 0.0);
    const auto last = static_cast<int64_t>(want.size()) - 1;
    for (float v : values) {
        const auto bin = static_cast<int64_t>(std::floor(static_cast<double>(v) * (1.0 / h.stride()))) + 32;
        want[static_cast<size_t>(std::clamp<int64_t>(bin, 0, last))] += 2;
    }
    EXPECT_EQ(h.counts(), want);
}

// The power-of-two search sums each position's error in chunks shared by the
// threads; it must pick what the plain definition (nearbyint, clamp, a
// sequential sum over the channel's values) picks, on any thread count.
TEST(Quant, PowerOfTwoSearchPicksThePlainDefinitionsPositionOnAnyThreadCount) {
    // [3, 70001] (a channel along axis 0 spans several chunks) and [4001, 3] (a
    // channel along the last axis, one value a row).
    auto heavy_tailed = [](std::vector<int64_t> shape, int64_t period) {
        vaiq::Tensor w(DataType::Float, shape);
        auto values = w.mutable_data<float>();
        for (size_t i = 0; i < values.size(); ++i) {
            // Most values small, a few far out, so that clipping pays for some channels.
            const float u = static_cast<float>((i * 2654435761u) % 100003) / 100003.0f - 0.5f;
            values[i] = u * u * u * static_cast<float>(i / period + 1) * 8.0f;
        }
        values[5] = 3.9f;  // one outlier
        return w;
    };
    // The definition: from the position where nothing overflows (counted from the
    // zero point), it and four finer ones, the least summed squared error.
    auto plain = [](const vaiq::Tensor& w, int axis, size_t channel, vaiq::TensorRange range,
                    const vaiq::QuantSpec& spec) {
        const auto values = w.data<float>();
        const int64_t channels = axis >= 0 ? w.shape()[axis] : 1;
        const int64_t inner = axis == 0 ? w.shape()[1] : 1;
        const auto [qmin, qmax] = vaiq::integer_range(spec.type, spec.symmetric, spec.reduce_range);
        const double zp = static_cast<double>(vaiq::power_of_two_params(range, 0, spec).zero_point[0]);
        const double over = std::max(range.min / (qmin - zp - 0.5), range.max / (qmax - zp + 0.5));
        const int start = static_cast<int>(std::floor(-std::log2(over)));
        int best = start;
        double best_error = INFINITY;
        for (int p = start; p <= start + 4; ++p) {
            const auto params = vaiq::power_of_two_params(range, p, spec);
            double error = 0;
            for (size_t i = 0; i < values.size(); ++i)
                if (axis < 0 || static_cast<size_t>((static_cast<int64_t>(i) / inner) % channels) == channel)
                    error += vaiq::round_trip_error(values[i], params.scale[0], params.zero_point[0], qmin, qmax);
            if (error < best_error) best_error = error, best = p;
        }
        return std::pair{best, start};
    };
    const auto rows = heavy_tailed({3, 70001}, 70001), columns = heavy_tailed({4001, 3}, 1);
    int finer = 0;  // searches that clip: the test must see the search move
    for (const bool symmetric : {true, false})
        for (const auto& [w, axis] : {std::pair{&rows, -1}, std::pair{&rows, 0}, std::pair{&columns, 1}}) {
            vaiq::QuantSpec spec;
            spec.power_of_two = true;
            spec.symmetric = symmetric;
            spec.per_channel = axis >= 0;
            const auto ranges = vaiq::channel_ranges(*w, axis);
            for (size_t c = 0; c < ranges.size(); ++c) {
                omp_set_num_threads(1);
                const int one = vaiq::best_power_of_two_position(*w, axis, c, ranges[c], spec);
                omp_set_num_threads(3);
                const int three = vaiq::best_power_of_two_position(*w, axis, c, ranges[c], spec);
                EXPECT_EQ(one, three) << "axis " << axis << " channel " << c;
                const auto [best, start] = plain(*w, axis, c, ranges[c], spec);
                EXPECT_EQ(one, best) << "axis " << axis << " channel " << c;
                finer += best > start;
            }
        }
    EXPECT_GT(finer, 0);
    omp_set_num_threads(0 < omp_get_num_procs() ? omp_get_num_procs() : 1);
}

TEST(Quant, ChannelRangesAreEachChannelsExtremes) {
    vaiq::Tensor t(DataType::Float, {2, 3, 2});
    const std::vector<float> v{1, -2, 3, 4, -5, 6, 7, 8, -9, 10, 11, -12};
    std::copy(v.begin(), v.end(), t.mutable_data<float>().begin());
    const auto along1 = vaiq::channel_ranges(t, 1);  // channel c: elements 2c, 2c+1, 6+2c, 6+2c+1
    ASSERT_EQ(along1.size(), 3u);
    EXPECT_EQ(along1[0].min, -2.0f);
    EXPECT_EQ(along1[0].max, 8.0f);
    EXPECT_EQ(along1[1].min, -9.0f);
    EXPECT_EQ(along1[1].max, 10.0f);
    EXPECT_EQ(along1[2].min, -12.0f);
    EXPECT_EQ(along1[2].max, 11.0f);
    const auto whole = vaiq::channel_ranges(t, -1);
    ASSERT_EQ(whole.size(), 1u);
    EXPECT_EQ(whole[0].min, -12.0f);
    EXPECT_EQ(whole[0].max, 11.0f);
    const auto last = vaiq::channel_ranges(t, 2);
    ASSERT_EQ(last.size(), 2u);
    EXPECT_EQ(last[0].min, -9.0f);
    EXPECT_EQ(last[1].max, 10.0f);
}

TEST(BlockwiseQuantization, RoundToNearestBlocksMatchHandComputedParameters) {
    // W [4, 2] in blocks of 2 along K (axis 0): blocks rows {0, 1} and {2, 3} of each column.
    const auto w = vaiq::Tensor::from_values<float>({4, 2}, std::vector<float>{0.7f, -0.2f,   //
                                                                              -1.4f, 0.1f,  //
                                                                              0.3f, 3.5f,   //
                                                                              0.15f, -0.5f});
    auto spec = vaiq::test::blocked_spec(vaiq::QuantType::QInt4, true, 2);
    const auto p = vaiq::constant_params(w, spec);
    EXPECT_EQ(p.block_shape, (std::vector<int64_t>{2, 2}));
    // Symmetric int4 spans [-7, 7]: scale = max|w| / 7 per block, zero point 0.
    const std::vector<float> expected{1.4f / 7, 0.2f / 7, 0.3f / 7, 3.5f / 7};
    ASSERT_EQ(p.scale.size(), 4u);
    for (size_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(p.scale[i], expected[i]) << i;
    EXPECT_EQ(p.zero_point, (std::vector<int64_t>{0, 0, 0, 0}));
    const auto q = vaiq::quantize_tensor(w, p, "w");
    // 0.7 / 0.2 = 3.5 -> 4 (half to even), -1.4 / 0.2 = -7, -0.2 / (0.2 / 7) = -7, 0.1 -> 3.5 -> 4, ...
    EXPECT_EQ(std::vector<int8_t>(q.data<int8_t>().begin(), q.data<int8_t>().end()),
              (std::vector<int8_t>{4, -7, -7, 4, 7, 7, 4, -1}));
    // Asymmetric uint4: [min, max] widened to 0, 15 steps.
    spec.type = vaiq::QuantType::QUInt4;
    spec.symmetric = false;
    const auto u = vaiq::constant_params(w, spec);
    EXPECT_FLOAT_EQ(u.scale[0], 2.1f / 15);
    EXPECT_EQ(u.zero_point[0], 10);  // round(1.4 / (2.1 / 15)) = round(10)
    const auto uq = vaiq::quantize_tensor(w, u, "w");
    for (auto v : uq.data<uint8_t>()) EXPECT_LE(v, 15);
}

TEST(BlockwiseQuantization, ALastShortBlockAndBadLayoutsAreHandled) {
    const auto w = vaiq::test::ramp({5, 3}, -1.0f, 0.1f);
    const auto spec = vaiq::test::blocked_spec(vaiq::QuantType::QInt8, true, 2);
    const auto p = vaiq::constant_params(w, spec);
    EXPECT_EQ(p.block_shape, (std::vector<int64_t>{3, 3})) << "ceil(5 / 2) blocks along K";
    const vaiq::ParamLayout layout(w.shape(), p, "w");
    EXPECT_EQ(layout.index(0), 0u);
    EXPECT_EQ(layout.index(4), 1u) << "row 1, column 1: block 0";
    EXPECT_EQ(layout.index(14), 8u) << "row 4, column 2: block 2";
    const auto back = vaiq::fake_quantize(w, p, "w");
    for (int64_t i = 0; i < w.size(); ++i) EXPECT_NEAR(back.data<float>()[i], w.data<float>()[i], 0.01f) << i;
    auto wrong = p;
    wrong.scale.pop_back();
    wrong.zero_point.pop_back();
    EXPECT_THROW(vaiq::quantize_tensor(w, wrong, "w"), vaiq::InputError);
    vaiq::TensorQuant t{std::string("w"), vaiq::TensorRole::Weight, spec, p};
    EXPECT_THROW(vaiq::check_quant_params(t, 17), vaiq::InputError) << "DequantizeLinear takes blocks from opset 21";
    t.params.type = vaiq::QuantType::QInt4;
    EXPECT_THROW(vaiq::check_quant_params(t, 21), vaiq::InputError) << "4 bits: MatMulNBits only, for now";
}

// Each way vaiq::gemm computes (a matrix-vector product on Eigen, small products
// on one thread, large ones threaded) against a plain loop, with transposes,
// padded strides, alpha and beta; the thread count is restored after a small one.
TEST(Gemm, EveryPathComputesAlphaOpAOpBPlusBetaC) {
    struct Shape {
        int64_t m, n, k;
    };
    for (const Shape s : {Shape{37, 1, 9}, Shape{5, 7, 3}, Shape{160, 96, 300}})
        for (const bool ta : {false, true})
            for (const bool tb : {false, true}) {
                const int64_t lda = (ta ? s.m : s.k) + 2, ldb = (tb ? s.k : s.n) + 1, ldc = s.n + 3;
                std::vector<float> a(static_cast<size_t>((ta ? s.k : s.m) * lda)),
                    b(static_cast<size_t>((tb ? s.n : s.k) * ldb)), c(static_cast<size_t>(s.m * ldc));
                for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 7) % 13) - 6.0f;
                for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 5) % 11) * 0.25f - 1.0f;
                for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<float>(i % 3);
                std::vector<float> expected = c;
                for (int64_t i = 0; i < s.m; ++i)
                    for (int64_t j = 0; j < s.n; ++j) {
                        double sum = 0;
                        for (int64_t p = 0; p < s.k; ++p)
                            sum += static_cast<double>(ta ? a[p * lda + i] : a[i * lda + p]) *
                                   (tb ? b[j * ldb + p] : b[p * ldb + j]);
                        expected[i * ldc + j] = static_cast<float>(0.5 * sum + 2.0 * expected[i * ldc + j]);
                    }
                const int threads = omp_get_max_threads();
                vaiq::gemm(ta, tb, s.m, s.n, s.k, 0.5f, a.data(), lda, b.data(), ldb, 2.0f, c.data(), ldc);
                EXPECT_EQ(omp_get_max_threads(), threads);
                for (int64_t i = 0; i < s.m; ++i)
                    for (int64_t j = 0; j < ldc; ++j) {
                        const float want = expected[i * ldc + j];
                        ASSERT_NEAR(c[i * ldc + j], want, 1e-4f * (1.0f + std::abs(want)))
                            << s.m << "x" << s.n << "x" << s.k << " ta=" << ta << " tb=" << tb << " at " << i << ","
                            << j;
                    }
            }
}

// The held-out rows algorithms judge their fits on: about a quarter, and in
// sequences of 64 tokens every position is held out in some and fitted in others.
TEST(HeldOutRow, AQuarterOfTheRowsWithNoPatternOfPositions) {
    int held = 0;
    std::vector<int> by_position(64, 0);
    for (uint64_t row = 0; row < 64 * 64; ++row)
        if (vaiq::held_out_row(row)) ++held, ++by_position[row % 64];
    EXPECT_NEAR(held / 4096.0, 0.25, 0.02);
    for (int p = 0; p < 64; ++p) {
        EXPECT_GT(by_position[static_cast<size_t>(p)], 4) << "position " << p;
        EXPECT_LT(by_position[static_cast<size_t>(p)], 30) << "position " << p;
    }
    EXPECT_EQ(vaiq::held_out_row(12345), vaiq::held_out_row(12345)) << "deterministic";
}
