// The tensor_files reader: the layouts it binds to a model's inputs, and those it refuses.
#include <gtest/gtest.h>

#include <fstream>

#include "data/data_reader.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/reader.hpp"

namespace fs = std::filesystem;
using vaiq::Tensor;
using vaiq::test::GraphBuilder;
using vaiq::test::ramp;
using vaiq::test::temp_dir;

using vaiq::test::all_batches;
using vaiq::test::error_of;

namespace {

// Opens `path` with this test's plugin, as a run does.
std::unique_ptr<vaiq::DataReader> open_files(const fs::path& path, const vaiq::Model& model) {
    static const auto registry = vaiq::test::registry_with_test_plugin();
    static const auto readers = vaiq::DataReaders::all_of(registry);
    return readers.open(path, model, "calibration data");
}

void write_pb(const fs::path& file, const Tensor& t, const std::string& name) {
    std::ofstream out(file, std::ios::binary);
    t.to_proto(name).SerializeToOstream(&out);
}

vaiq::Model two_input_model() {
    GraphBuilder b;
    b.input("a", {1, 3}).input("b", {1, 3}).output("y", {1, 3});
    b.node("Add", {"a", "b"}, {"y"}, "add");
    return b.build();
}

TEST(TensorFiles, ReadsTheOnnxTestDataLayoutByTensorName) {
    const auto dir = temp_dir();
    for (int s = 0; s < 2; ++s) {
        const auto set = dir / ("test_data_set_" + std::to_string(s));
        fs::create_directories(set);
        // Named after the inputs but stored in the opposite order.
        write_pb(set / "input_0.pb", Tensor::from_values<float>({1, 3}, std::vector<float>{1, 1, 1}), "b");
        write_pb(set / "input_1.pb", Tensor::from_values<float>({1, 3}, std::vector<float>{2, 2, float(s)}), "a");
    }
    auto reader = open_files(dir, two_input_model());
    const auto batches = all_batches(*reader);
    ASSERT_EQ(batches.size(), 2u);
    EXPECT_EQ(batches[1].feeds.at("a").data<float>()[2], 1.0f);
    EXPECT_EQ(batches[1].feeds.at("b").data<float>()[0], 1.0f);
    reader->rewind();
    EXPECT_EQ(all_batches(*reader).size(), 2u) << "rewind starts again";
}

TEST(TensorFiles, BindsSampleFolderFilesByNameThenInOrder) {
    const auto dir = temp_dir();
    fs::create_directories(dir / "s1");
    vaiq::write_npy(dir / "s1" / "b.npy", Tensor::from_values<float>({1, 3}, std::vector<float>{7, 7, 7}));
    vaiq::write_npy(dir / "s1" / "z.npy", Tensor::from_values<float>({1, 3}, std::vector<float>{5, 5, 5}));
    auto reader = open_files(dir, two_input_model());
    const auto batches = all_batches(*reader);
    ASSERT_EQ(batches.size(), 1u);
    EXPECT_EQ(batches[0].feeds.at("b").data<float>()[0], 7.0f);
    EXPECT_EQ(batches[0].feeds.at("a").data<float>()[0], 5.0f) << "the unnamed file goes to the unbound input";
}

TEST(TensorFiles, SplitsFilesIntoTheModelsBatchAndAddsAMissingBatchDimension) {
    const auto dir = temp_dir();
    const auto model = vaiq::test::conv_relu_model();  // x: [1, 2, 4, 4]
    vaiq::write_npy(dir / "s10.npy", ramp({3, 2, 4, 4}));
    vaiq::write_npy(dir / "s2.npy", ramp({2, 4, 4}, 100.0f));
    auto reader = open_files(dir, model);
    const auto batches = all_batches(*reader);
    ASSERT_EQ(batches.size(), 4u);
    EXPECT_EQ(batches[0].feeds.at("x").data<float>()[0], 100.0f) << "s2 sorts before s10";
    EXPECT_EQ(batches[0].feeds.at("x").shape(), (std::vector<int64_t>{1, 2, 4, 4}));
    EXPECT_EQ(batches[2].feeds.at("x").data<float>()[0], 32.0f) << "the second sample of s10";
    EXPECT_NE(batches[3].source.find("batch 3 of 3"), std::string::npos) << batches[3].source;
}

TEST(TensorFiles, ATensorProtoStackOfBatchesIsReadBatchByBatch) {
    // The original tool's calibration .pb: (dataset size, N, C, H, W) for an NCHW input.
    const auto dir = temp_dir();
    write_pb(dir / "stack.pb", ramp({3, 1, 2, 4, 4}), "images");
    auto reader = open_files(dir / "stack.pb", vaiq::test::conv_relu_model());
    const auto batches = all_batches(*reader);
    ASSERT_EQ(batches.size(), 3u);
    EXPECT_EQ(batches[2].feeds.at("x").shape(), (std::vector<int64_t>{1, 2, 4, 4}));
    EXPECT_EQ(batches[2].feeds.at("x").data<float>()[0], 64.0f);
}

TEST(TensorFiles, ACorruptTensorProtoIsAnErrorNamingTheFile) {
    const auto dir = temp_dir();
    std::ofstream(dir / "junk.pb", std::ios::binary) << "\xff\xff\xff not a tensor";
    const auto error = error_of([&] { all_batches(*open_files(dir / "junk.pb", vaiq::test::conv_relu_model())); });
    EXPECT_NE(error.find("junk.pb: not an ONNX TensorProto file"), std::string::npos) << error;
}

TEST(TensorFiles, RefusesLayoutsItCannotBind) {
    const auto dir = temp_dir();
    vaiq::write_npy(dir / "a.npy", ramp({1, 3}));
    EXPECT_NE(error_of([&] { open_files(dir, two_input_model()); }).find("one folder per sample"), std::string::npos);
    fs::create_directories(dir / "s1");
    EXPECT_NE(error_of([&] { open_files(dir, two_input_model()); }).find("mixes tensor files and folders"),
              std::string::npos);
}

}  // namespace
