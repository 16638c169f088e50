#include <gtest/gtest.h>

#include "runtime/executor.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/format.hpp"
#include "vaiq/graph.hpp"

namespace {

using vaiq::QuantType;
using vaiq::Tensor;

// x [2, 40] -> MatMul(w [40, 3]) -> y: K = 40 spans three blocks of 16, the last padded.
vaiq::Model matmul_model(const Tensor& w) {
    vaiq::test::GraphBuilder b(13);
    b.input("x", {2, 40}).output("y", {2, 3});
    b.initializer("w", w);
    b.node("MatMul", {"x", "w"}, {"y"}, "mm");
    return b.build();
}

Tensor weights() {
    std::vector<float> v(120);
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i) * 1.7f) * (i % 3 == 0 ? 2.0f : 0.5f);
    return Tensor::from_values<float>({40, 3}, v);
}

vaiq::TensorQuant blocked(QuantType type, bool symmetric) {
    const auto spec = vaiq::test::blocked_spec(type, symmetric, 16);
    return {std::string("w"), vaiq::TensorRole::Weight, spec, vaiq::constant_params(weights(), spec)};
}

void emit(vaiq::Model& model, const vaiq::QuantPlan& plan) {
    vaiq::test::emit_with_format("matmul_nbits", model, plan);
}

TEST(MatMulNBits, WritesPackedColumnsThatComputeTheBlockwiseWeights) {
    for (const auto& [type, symmetric] : {std::pair{QuantType::QInt4, true}, std::pair{QuantType::QUInt4, false}}) {
        auto model = matmul_model(weights());
        const auto t = blocked(type, symmetric);
        emit(model, {{t}});
        ASSERT_EQ(model.graph().node_size(), 1);
        const auto& node = model.graph().node(0);
        EXPECT_EQ(node.op_type(), "MatMulNBits");
        EXPECT_EQ(node.domain(), "com.microsoft");
        const vaiq::GraphIndex index(model.graph());
        const auto b = Tensor::from_proto(*index.initializer(node.input(1)));
        EXPECT_EQ(b.shape(), (std::vector<int64_t>{3, 3, 8})) << "[N, blocks, 16 x 4 bits / 8]";
        EXPECT_EQ(node.input_size(), symmetric ? 3 : 4) << "symmetric int4 takes the default zero point 8";
        // Column 0, block 0, rows 0 and 1 share the first byte, row 0 in the low nibble.
        const auto q = vaiq::quantize_tensor(weights(), t.params, "w");
        const int offset = symmetric ? 8 : 0;
        auto stored = [&](int64_t row) {
            return (symmetric ? q.data<int8_t>()[static_cast<size_t>(row * 3)] : q.data<uint8_t>()[static_cast<size_t>(row * 3)]) + offset;
        };
        EXPECT_EQ(b.data<uint8_t>()[0], static_cast<uint8_t>(stored(0) | (stored(1) << 4)));
        // vaiq runs it as the block-wise weights dequantized.
        const auto x = vaiq::test::ramp({2, 40}, -1.0f, 0.05f);
        const auto y = vaiq::runtime::Executor(model).run({{"x", x}})[0];
        const auto fake = matmul_model(vaiq::fake_quantize(weights(), t.params, "w"));
        const auto reference = vaiq::runtime::Executor(fake).run({{"x", x}})[0];
        for (int64_t i = 0; i < y.size(); ++i)
            EXPECT_NEAR(y.data<float>()[i], reference.data<float>()[i], 1e-4f) << i;
    }
}

TEST(MatMulNBits, OneBlockPerColumnIsWrittenWithThePowerOfTwoCoveringK) {
    // block_size -1 plans one block spanning K = 40: a scale per column, written as block_size 64.
    auto model = matmul_model(weights());
    const auto spec = vaiq::test::blocked_spec(QuantType::QInt4, true, 40);
    const vaiq::TensorQuant t{std::string("w"), vaiq::TensorRole::Weight, spec, vaiq::constant_params(weights(), spec)};
    ASSERT_EQ(t.params.scale.size(), 3u) << "one scale per column";
    emit(model, {{t}});
    const auto& node = model.graph().node(0);
    int64_t block = 0;
    for (const auto& a : node.attribute())
        if (a.name() == "block_size") block = a.i();
    EXPECT_EQ(block, 64);
    const auto x = vaiq::test::ramp({2, 40}, -1.0f, 0.05f);
    const auto y = vaiq::runtime::Executor(model).run({{"x", x}})[0];
    const auto fake = matmul_model(vaiq::fake_quantize(weights(), t.params, "w"));
    const auto reference = vaiq::runtime::Executor(fake).run({{"x", x}})[0];
    for (int64_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y.data<float>()[i], reference.data<float>()[i], 1e-4f) << i;
    // K = 300 would need blocks of 512, which ONNX Runtime's MatMulNBits refuses.
    std::vector<float> tall(900, 0.5f);
    const auto w300 = Tensor::from_values<float>({300, 3}, tall);
    vaiq::test::GraphBuilder b(13);
    b.input("x", {1, 300}).output("y", {1, 3});
    b.initializer("w", w300);
    b.node("MatMul", {"x", "w"}, {"y"}, "mm");
    auto wide = b.build();
    const auto spec300 = vaiq::test::blocked_spec(QuantType::QInt4, true, 300);
    const vaiq::TensorQuant t300{std::string("w"), vaiq::TensorRole::Weight, spec300,
                                 vaiq::constant_params(w300, spec300)};
    try {
        emit(wide, {{t300}});
        ADD_FAILURE() << "no error";
    } catch (const vaiq::InputError& e) {
        EXPECT_NE(std::string(e.what()).find("quant_format: QDQ"), std::string::npos) << e.what();
    }
}

// ids [2, 3] -> Gather(table [5, 40]) -> y [2, 3, 40]: rows of 40 values in blocks of 16, the last one short.
vaiq::Model gather_model(const Tensor& table) {
    vaiq::test::GraphBuilder b(13);
    b.input("ids", {2, 3}, vaiq::DataType::Int64).output("y", {2, 3, 40});
    b.initializer("table", table);
    b.node("Gather", {"table", "ids"}, {"y"}, "embed");
    return b.build();
}

TEST(MatMulNBits, WritesEmbeddingTablesAsGatherBlockQuantized) {
    std::vector<float> v(200);
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::cos(static_cast<float>(i) * 0.9f) * (i % 7 == 0 ? 3.0f : 1.0f);
    const auto table = Tensor::from_values<float>({5, 40}, v);
    for (const auto& [type, symmetric] : {std::pair{QuantType::QInt4, true}, std::pair{QuantType::QUInt4, false}}) {
        auto spec = vaiq::test::blocked_spec(type, symmetric, 16);
        spec.axis = 1;  // along each row
        const vaiq::TensorQuant t{std::string("table"), vaiq::TensorRole::Weight, spec,
                                  vaiq::constant_params(table, spec)};
        auto model = gather_model(table);
        emit(model, {{t}});
        ASSERT_EQ(model.graph().node_size(), 1);
        const auto& node = model.graph().node(0);
        EXPECT_EQ(node.op_type(), "GatherBlockQuantized");
        EXPECT_EQ(node.input(1), "ids");
        EXPECT_EQ(node.input_size(), symmetric ? 3 : 4) << "symmetric int4 takes the default zero point 8";
        const vaiq::GraphIndex index(model.graph());
        const auto data = Tensor::from_proto(*index.initializer(node.input(0)));
        EXPECT_EQ(data.type(), vaiq::DataType::UInt8);
        EXPECT_EQ(data.shape(), (std::vector<int64_t>{5, 20})) << "two values a byte along each row";
        EXPECT_EQ(Tensor::from_proto(*index.initializer(node.input(2))).shape(), (std::vector<int64_t>{5, 3}));
        // Row 1's values 0 and 1 share its first byte, value 0 in the low nibble.
        const auto q = vaiq::quantize_tensor(table, t.params, "table");
        const int offset = symmetric ? 8 : 0;
        auto stored = [&](size_t i) { return (symmetric ? q.data<int8_t>()[i] : q.data<uint8_t>()[i]) + offset; };
        EXPECT_EQ(data.data<uint8_t>()[20], static_cast<uint8_t>(stored(40) | (stored(41) << 4)));
        // vaiq gathers the block-wise values dequantized, negative indices counting from the end.
        const auto ids = Tensor::from_values<int64_t>({2, 3}, std::vector<int64_t>{4, 0, 2, -1, 1, 1});
        const auto y = vaiq::runtime::Executor(model).run({{"ids", ids}})[0];
        const auto fake = vaiq::fake_quantize(table, t.params, "table");
        ASSERT_EQ(y.shape(), (std::vector<int64_t>{2, 3, 40}));
        const int64_t rows[] = {4, 0, 2, 4, 1, 1};
        for (int64_t i = 0; i < y.size(); ++i)
            EXPECT_FLOAT_EQ(y.data<float>()[i], fake.data<float>()[rows[i / 40] * 40 + i % 40]) << i;
    }
}

TEST(MatMulNBits, RefusesWhatItCannotWrite) {
    auto model = matmul_model(weights());
    auto t = blocked(QuantType::QInt4, true);
    t.params.block_size = 24;  // not a power of two
    EXPECT_THROW(emit(model, {{t}}), vaiq::InputError);
    model = matmul_model(weights());
    const vaiq::TensorQuant activation{std::string("x"), vaiq::TensorRole::Activation, {},
                                       {QuantType::QUInt8, {0.1f}, {128}}};
    EXPECT_THROW(emit(model, {{blocked(QuantType::QInt4, true), activation}}), vaiq::InputError)
        << "activations stay float in this form";
}

}  // namespace
