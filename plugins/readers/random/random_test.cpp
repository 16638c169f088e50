// The random reader: the documented shape forms and ranges, and a decoder's inputs.
#include <gtest/gtest.h>

#include "data/data_reader.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/reader.hpp"

using vaiq::DataType;
using vaiq::test::GraphBuilder;
using vaiq::test::ramp;

using vaiq::test::all_batches;
using vaiq::test::error_of;

namespace {

// This test's plugin with the given options, opened for `model`.
std::unique_ptr<vaiq::DataReader> random_reader(const vaiq::Model& model, const nlohmann::json& shapes,
                                                const nlohmann::json& ranges, int batches, int seed = 0) {
    static const auto registry = vaiq::test::registry_with_test_plugin();
    const auto& info = registry.require(vaiq::PluginKind::Reader, "random");
    const nlohmann::json options = {{"random_data_reader_input_shape", shapes},
                                    {"RandomDataReaderInputDataRange", ranges},
                                    {"batches", batches},
                                    {"seed", seed}};
    const auto reader = registry.create<vaiq::Reader>("random", registry.resolve_options(info, options));
    EXPECT_EQ(reader->claim("."), 0) << "it reads no path";
    return reader->open({}, model, "random data");
}

TEST(Random, FeedsADecoderAsLanguageModelsAreCalibrated) {
    // input_ids [batch, sequence] into an embedding of 50 rows, an empty past, a mask and positions.
    GraphBuilder b;
    b.input("input_ids", {1, 1}, DataType::Int64)
        .input("attention_mask", {1, 1}, DataType::Int64)
        .input("position_ids", {1, 1}, DataType::Int64)
        .input("past_key_values.0.key", {1, 2, 1, 4})
        .output("y", {1, 1, 8});
    b.initializer("table", ramp({50, 8}));
    b.node("Gather", {"table", "input_ids"}, {"y"});
    auto model = b.build();
    for (auto& in : *model.graph().mutable_input())
        for (int d = 1; d < in.type().tensor_type().shape().dim_size(); ++d)
            if (in.name() != "past_key_values.0.key" || d == 2)
                in.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(d)->set_dim_param("dynamic");
    auto reader = random_reader(model, nlohmann::json::array(), nullptr, 1, 0);
    const auto batch = reader->next();
    ASSERT_TRUE(batch);
    const auto& ids = batch->feeds.at("input_ids");
    EXPECT_EQ(ids.shape(), (std::vector<int64_t>{1, 32}));
    int64_t top = 0;
    for (auto v : ids.data<int64_t>()) top = std::max(top, v);
    EXPECT_LT(top, 50);
    EXPECT_GT(top, 1) << "tokens over the vocabulary, not 0 or 1";
    EXPECT_EQ(batch->feeds.at("attention_mask").data<int64_t>()[31], 1);
    EXPECT_EQ(batch->feeds.at("position_ids").data<int64_t>()[31], 31);
    EXPECT_EQ(batch->feeds.at("past_key_values.0.key").shape(), (std::vector<int64_t>{1, 2, 0, 4})) << "an empty past";
}

TEST(Random, FollowsTheDocumentedShapeForms) {
    GraphBuilder b;
    b.input("x", {1, 3}).input("ids", {1, 4}, DataType::Int64).output("y", {1, 3});
    b.node("Relu", {"x"}, {"y"});
    auto model = b.build();
    model.graph()
        .mutable_input(0)
        ->mutable_type()
        ->mutable_tensor_type()
        ->mutable_shape()
        ->mutable_dim(0)
        ->set_dim_param("N");
    auto reader = random_reader(model, nlohmann::json::parse(R"({"x": [2, 3]})"), nullptr, 2);
    const auto batches = all_batches(*reader);
    ASSERT_EQ(batches.size(), 2u);
    EXPECT_EQ(batches[0].feeds.at("x").shape(), (std::vector<int64_t>{2, 3}));
    for (float v : batches[0].feeds.at("x").data<float>()) EXPECT_TRUE(v >= 0.0f && v < 1.0f);
    for (int64_t v : batches[0].feeds.at("ids").data<int64_t>()) EXPECT_TRUE(v == 0 || v == 1);

    // The model's own shapes, with the dynamic batch dimension as 1; a data range.
    reader = random_reader(model, nlohmann::json::array(), nlohmann::json::parse(R"({"ids": [5, 9]})"), 1);
    const auto one = all_batches(*reader);
    EXPECT_EQ(one[0].feeds.at("x").shape(), (std::vector<int64_t>{1, 3}));
    for (int64_t v : one[0].feeds.at("ids").data<int64_t>()) EXPECT_TRUE(v >= 5 && v <= 9);

    reader = random_reader(model, nlohmann::json::parse("[[4, 3], [1, 4]]"), nullptr, 1);
    EXPECT_EQ(all_batches(*reader)[0].feeds.at("x").shape()[0], 4);

    EXPECT_NE(error_of([&] {
                  random_reader(model, nlohmann::json::parse(R"({"xx": [1, 3]})"), nullptr, 1);
              }).find("'xx', which is not an input of the model (inputs: x, ids); did you mean 'x'?"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  random_reader(model, nlohmann::json::parse("[1, 3]"), nullptr, 1);
              }).find("gives one shape, but the model has 2 inputs"),
              std::string::npos);
}

// The same seed makes the same batches; another seed, others.
TEST(Random, ASeedDecidesTheBatches) {
    GraphBuilder b;
    b.input("x", {1, 8}).output("y", {1, 8});
    b.node("Relu", {"x"}, {"y"});
    const auto model = b.build();
    auto first = [&](int seed) {
        return random_reader(model, nlohmann::json::array(), nullptr, 1, seed)->next()->feeds.at("x");
    };
    const auto a = first(3), again = first(3), other = first(4);
    EXPECT_EQ(std::vector<float>(a.data<float>().begin(), a.data<float>().end()),
              std::vector<float>(again.data<float>().begin(), again.data<float>().end()));
    EXPECT_NE(a.data<float>()[0], other.data<float>()[0]);
    EXPECT_NE(
        error_of([&] { random_reader(model, nlohmann::json::array(), nullptr, 0); }).find("batches must be 1 or more"),
        std::string::npos);
}

}  // namespace
