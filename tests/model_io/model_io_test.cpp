#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "runtime/executor.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/model.hpp"

namespace fs = std::filesystem;

namespace {

using vaiq::InputError;
using vaiq::test::temp_dir;

// EXPECT that `body` throws InputError whose message contains `text`.
template <typename F>
void expect_input_error(F&& body, const std::string& text) {
    try {
        body();
        ADD_FAILURE() << "no error; expected one containing: " << text;
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
}

std::string read_bytes(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

// A model whose weight 'w' is stored externally in `data_name` with the given location.
fs::path external_model(const fs::path& dir, const std::string& location, int64_t declared_length = -1) {
    auto model = vaiq::test::conv_relu_model();
    for (auto& init : *model.graph().mutable_initializer()) {
        if (init.name() != "w") continue;
        const std::string raw = init.raw_data();
        init.clear_raw_data();
        init.set_data_location(onnx::TensorProto::EXTERNAL);
        auto add = [&](const char* k, const std::string& v) {
            auto* e = init.add_external_data();
            e->set_key(k);
            e->set_value(v);
        };
        add("location", location);
        add("offset", "0");
        if (declared_length >= 0) add("length", std::to_string(declared_length));
        if (location.find("..") == std::string::npos && location[0] != '/') write_bytes(dir / location, raw);
    }
    const auto path = dir / "model.onnx";
    write_bytes(path, model.proto().SerializeAsString());
    return path;
}

TEST(ModelIo, RoundTripKeepsTheModel) {
    const auto dir = temp_dir();
    const auto model = vaiq::test::conv_relu_model();
    vaiq::save_model(model, dir / "m.onnx");
    const auto loaded = vaiq::load_model(dir / "m.onnx");
    EXPECT_EQ(loaded.proto().SerializeAsString(), model.proto().SerializeAsString());
    EXPECT_EQ(loaded.opset(), 13);
    EXPECT_EQ(loaded.source(), dir / "m.onnx");
}

TEST(ModelIo, ExternalDataRoundTrip) {
    const auto dir = temp_dir();
    const auto model = vaiq::test::conv_relu_model();
    vaiq::SaveOptions options;
    options.use_external_data_format = true;
    options.external_data_size_threshold = 16;  // w (216 bytes) goes out, b (12 bytes) stays
    vaiq::save_model(model, dir / "big.onnx", options);
    ASSERT_TRUE(fs::exists(dir / "big.onnx.data"));
    EXPECT_EQ(fs::file_size(dir / "big.onnx.data"), 3u * 2 * 3 * 3 * 4);
    onnx::ModelProto on_disk;
    ASSERT_TRUE(on_disk.ParseFromString(read_bytes(dir / "big.onnx")));
    int external = 0;
    for (const auto& t : on_disk.graph().initializer()) external += t.data_location() == onnx::TensorProto::EXTERNAL;
    EXPECT_EQ(external, 1);
    const auto loaded = vaiq::load_model(dir / "big.onnx");
    EXPECT_EQ(loaded.proto().graph().SerializeAsString(), model.proto().graph().SerializeAsString());
}

TEST(ModelIo, ExternalDataBesideTheModelLoads) {
    const auto dir = temp_dir();
    const auto loaded = vaiq::load_model(external_model(dir, "weights.bin"));
    const auto* w = vaiq::GraphIndex(loaded.graph()).initializer("w");
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->data_location(), onnx::TensorProto::DEFAULT);
    EXPECT_EQ(vaiq::Tensor::from_proto(*w).size(), 54);
}

// Large external tensors stay in their file until read; what is saved from
// them is the same bytes, wherever they go.
TEST(ModelIo, LargeExternalTensorsAreReadWhenUsedAndSavedLikeAnyOther) {
    const auto dir = temp_dir();
    const auto source = external_model(dir, "weights.bin");
    vaiq::LoadOptions defer_all;
    defer_all.defer_external_bytes = 100;  // w holds 216 bytes
    const auto model = vaiq::load_model(source, defer_all);
    const auto* w = vaiq::GraphIndex(model.graph()).initializer("w");
    ASSERT_NE(w, nullptr);
    EXPECT_TRUE(vaiq::is_deferred(*w));
    EXPECT_EQ(vaiq::stored_data_bytes(*w), 216u);
    const auto inlined = vaiq::load_model(source);
    const auto* inline_w = vaiq::GraphIndex(inlined.graph()).initializer("w");
    EXPECT_FALSE(vaiq::is_deferred(*inline_w)) << "under the default 1 MiB: read at once";
    const auto expected = vaiq::Tensor::from_proto(*inline_w);
    const auto read = vaiq::Tensor::from_proto(*w);
    ASSERT_EQ(read.shape(), expected.shape());
    EXPECT_TRUE(std::equal(read.bytes().begin(), read.bytes().end(), expected.bytes().begin()));
    // Saved inline, and to external data of another name, the values are the same.
    vaiq::save_model(model, dir / "inline.onnx");
    vaiq::SaveOptions external;
    external.use_external_data_format = true;
    external.external_data_file = "out_data";
    external.external_data_size_threshold = 100;  // w goes out, b (12 bytes) stays
    vaiq::save_model(model, dir / "out.onnx", external);
    EXPECT_EQ(fs::file_size(dir / "out_data"), 216u);
    for (const auto* name : {"inline.onnx", "out.onnx"}) {
        const auto again = vaiq::load_model(dir / name);
        const auto t = vaiq::Tensor::from_proto(*vaiq::GraphIndex(again.graph()).initializer("w"));
        EXPECT_TRUE(std::equal(t.bytes().begin(), t.bytes().end(), expected.bytes().begin())) << name;
    }
    // A data file the model reads from is never replaced.
    const auto before = read_bytes(dir / "weights.bin");
    external.external_data_file = "weights.bin";
    expect_input_error([&] { vaiq::save_model(model, dir / "other.onnx", external); }, "weights are read from");
    EXPECT_EQ(read_bytes(dir / "weights.bin"), before);
    EXPECT_FALSE(fs::exists(dir / "other.onnx"));
    external.external_data_file = "sub/data";
    expect_input_error([&] { vaiq::save_model(model, dir / "other.onnx", external); }, "plain file name");
    // A file changed under a deferred tensor is an error when it is read, not garbage.
    write_bytes(dir / "weights.bin", "short");
    expect_input_error([&] { vaiq::Tensor::from_proto(*w); }, "cannot read its external data");
}

TEST(ModelIo, RejectsAbsoluteExternalDataLocation) {
    const auto dir = temp_dir();
    expect_input_error([&] { vaiq::load_model(external_model(dir, "/etc/passwd")); },
                       "absolute external data location");
}

TEST(ModelIo, RejectsExternalDataOutsideTheFolder) {
    const auto dir = temp_dir();
    expect_input_error([&] { vaiq::load_model(external_model(dir, "../secret.bin")); }, "leaves the model's folder");
}

TEST(ModelIo, RejectsASymlinkOutOfTheFolder) {
    const auto outside = temp_dir();
    write_bytes(outside / "secret.bin", std::string(216, 'x'));
    const auto dir = temp_dir();
    fs::create_directory_symlink(outside, dir / "link");
    expect_input_error([&] { vaiq::load_model(external_model(dir, "link/secret.bin")); }, "through a symbolic link");
}

TEST(ModelIo, RejectsExternalDataOfTheWrongLength) {
    const auto dir = temp_dir();
    expect_input_error([&] { vaiq::load_model(external_model(dir, "weights.bin", 100)); },
                       "declares 54 elements (216 bytes) but its external data length is 100");
}

TEST(ModelIo, RejectsAShortExternalDataFile) {
    const auto dir = temp_dir();
    const auto path = external_model(dir, "weights.bin");
    fs::resize_file(dir / "weights.bin", 50);
    expect_input_error([&] { vaiq::load_model(path); }, "holds only 50 bytes");
}

TEST(ModelIo, RejectsATensorWhoseDataDoesNotMatchItsShape) {
    const auto dir = temp_dir();
    auto model = vaiq::test::conv_relu_model();
    model.graph().mutable_initializer(0)->add_dims(2);  // w now claims twice its data
    write_bytes(dir / "bad.onnx", model.proto().SerializeAsString());
    expect_input_error([&] { vaiq::load_model(dir / "bad.onnx"); },
                       "declares 108 elements of float (432 bytes) but holds 216 bytes");
}

TEST(ModelIo, TruncatedAndCorruptFilesAreOneLineErrors) {
    const auto dir = temp_dir();
    vaiq::save_model(vaiq::test::conv_relu_model(), dir / "m.onnx");
    const std::string bytes = read_bytes(dir / "m.onnx");
    for (size_t keep : {bytes.size() / 2, size_t{7}, bytes.size() - 1}) {
        write_bytes(dir / "cut.onnx", bytes.substr(0, keep));
        try {
            vaiq::load_model(dir / "cut.onnx");
            ADD_FAILURE() << "a model cut to " << keep << " bytes loaded";
        } catch (const InputError& e) {
            EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
            EXPECT_NE(std::string(e.what()).find("cut.onnx"), std::string::npos) << e.what();
        }
    }
    write_bytes(dir / "junk.onnx", "this is not a protobuf at all \xff\xff\xff");
    expect_input_error([&] { vaiq::load_model(dir / "junk.onnx"); }, "not a valid ONNX model");
    write_bytes(dir / "empty.onnx", "");
    expect_input_error([&] { vaiq::load_model(dir / "empty.onnx"); }, "the file is empty");
    expect_input_error([&] { vaiq::load_model(dir / "missing.onnx"); }, "no such model file");
}

// Over protobuf's 2 GiB a file cannot be one model: said before any parsing
// (the file is sparse, so the test writes nothing).
TEST(ModelIo, AFileOverTwoGibibytesIsRefusedWithAdvice) {
    const auto dir = temp_dir();
    { std::ofstream(dir / "huge.onnx") << "x"; }
    fs::resize_file(dir / "huge.onnx", (uintmax_t{1} << 31) + 1);
    expect_input_error([&] { vaiq::load_model(dir / "huge.onnx"); }, "over the 2 GiB a protobuf can hold");
}

TEST(ModelIo, RefusesOldOpsetsWithAdvice) {
    const auto dir = temp_dir();
    vaiq::save_model(vaiq::test::conv_relu_model(9), dir / "old.onnx");
    expect_input_error([&] { vaiq::load_model(dir / "old.onnx"); }, "vaiq convert-opset");
    EXPECT_NO_THROW(vaiq::load_model(dir / "old.onnx", {.check_opset = false}));
}

TEST(ModelIo, ConvertsOpsets) {
    const auto old = vaiq::test::conv_relu_model(9);
    const auto converted = vaiq::convert_opset(old, 13);
    EXPECT_EQ(converted.opset(), 13);
    EXPECT_NO_THROW(vaiq::check_model(converted));
    EXPECT_THROW(vaiq::convert_opset(old, 0), InputError);
}

// Softmax changed meaning in opset 13: ONNX's adapter needs its input's rank,
// which exporters rarely declare (here a Relu's output has no value_info).
vaiq::Model undeclared_softmax_model() {
    vaiq::test::GraphBuilder b(9);
    b.input("x", {2, 3, 4}).output("y", {2, 3, 4});
    b.node("Relu", {"x"}, {"r"});
    vaiq::set_attribute(b.node("Softmax", {"r"}, {"y"}), "axis", 2);
    return b.build();
}

TEST(ModelIo, ConvertsSoftmaxOnceShapesAreDeclared) {
    const auto old = undeclared_softmax_model();
    EXPECT_THROW(vaiq::convert_opset(old, 13), InputError);
    int asked = 0;
    const auto converted = vaiq::convert_opset(old, 13, [&](vaiq::Model& m) {
        ++asked;
        vaiq::store_inferred_shapes(m);
    });
    EXPECT_EQ(asked, 1);
    EXPECT_EQ(converted.opset(), 13);
    EXPECT_EQ(converted.graph().value_info_size(), 0) << "the shapes declared for the adapters stay out";
    const auto x = vaiq::test::ramp({2, 3, 4}, -1.0f, 0.25f);
    const auto old_outputs = vaiq::evaluate(old, {{"x", x}});  // kept: data() views them
    const auto new_outputs = vaiq::evaluate(converted, {{"x", x}});
    const auto want = old_outputs[0].data<float>();
    const auto got = new_outputs[0].data<float>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6f) << i;
    // A hook that cannot help leaves the plain conversion's error.
    EXPECT_THROW(vaiq::convert_opset(old, 13, [](vaiq::Model&) {}), InputError);
}

// ONNX's converter knows the default domain alone: a com.microsoft Gelu (as
// preparation fuses one) stands aside while the rest converts and comes back in
// its place; ReduceMean's axes move from an attribute to an input (opset 18).
TEST(ModelIo, ConvertsAModelWithOpsOfAnotherDomain) {
    vaiq::test::GraphBuilder b(13);
    b.input("x", {2, 3, 4}).output("y", {2, 3, 1});
    b.node("Relu", {"x"}, {"r"});
    b.node("Gelu", {"r"}, {"g"}, "gelu").set_domain("com.microsoft");
    vaiq::set_attribute(b.node("ReduceMean", {"g"}, {"y"}, "mean"), "axes", std::vector<int64_t>{2});
    auto old = b.build();
    vaiq::import_opset(old.proto(), "com.microsoft", 1);
    const auto converted = vaiq::convert_opset(old, 19);
    EXPECT_EQ(converted.opset(), 19);
    std::vector<std::string> ops;
    for (const auto& n : converted.graph().node()) ops.push_back(n.domain() + ":" + n.op_type());
    EXPECT_EQ(ops, (std::vector<std::string>{":Relu", "com.microsoft:Gelu", ":ReduceMean"}));
    EXPECT_EQ(converted.graph().node(2).input_size(), 2) << "axes as an input";
    const auto x = vaiq::test::ramp({2, 3, 4}, -1.0f, 0.25f);
    const auto old_outputs = vaiq::evaluate(old, {{"x", x}});
    const auto new_outputs = vaiq::evaluate(converted, {{"x", x}});
    ASSERT_EQ(new_outputs[0].shape(), old_outputs[0].shape());
    for (int64_t i = 0; i < new_outputs[0].size(); ++i)
        EXPECT_EQ(new_outputs[0].data<float>()[i], old_outputs[0].data<float>()[i]) << i;
}

TEST(ModelIo, NeverWritesOverTheInput) {
    const auto dir = temp_dir();
    vaiq::save_model(vaiq::test::conv_relu_model(), dir / "in.onnx");
    const auto before = read_bytes(dir / "in.onnx");
    const auto model = vaiq::load_model(dir / "in.onnx");
    expect_input_error([&] { vaiq::save_model(model, dir / "in.onnx"); }, "refusing to write over the input model");
    expect_input_error([&] { vaiq::save_model(vaiq::Model(model.proto()), dir / "./in.onnx", {}, dir / "in.onnx"); },
                       "refusing to write over the input model");
    EXPECT_EQ(read_bytes(dir / "in.onnx"), before);
}

TEST(ModelIo, AFailedCheckWritesNothing) {
    const auto dir = temp_dir();
    auto model = vaiq::test::conv_relu_model();
    model.graph().mutable_node(0)->set_input(0, "nowhere");
    expect_input_error([&] { vaiq::save_model(model, dir / "out.onnx"); }, "fails the ONNX checker");
    EXPECT_TRUE(fs::is_empty(dir));
}

TEST(ModelIo, OutputFolderMustExist) {
    expect_input_error([&] { vaiq::save_model(vaiq::test::conv_relu_model(), temp_dir() / "no" / "such" / "m.onnx"); },
                       "does not exist");
}

}  // namespace

namespace {

TEST(ModelIo, FourBitTensorsPackTwoValuesToAByteLowNibbleFirst) {
    // ONNX's rule: pack(x, y) = y << 4 | (x & 0xF), the first element in the low nibble.
    const auto t = vaiq::Tensor::from_values<int8_t>({5}, std::vector<int8_t>{-8, 7, 1, -1, 5});
    vaiq::Tensor int4(vaiq::DataType::Int4, {5});
    std::copy(t.bytes().begin(), t.bytes().end(), int4.mutable_bytes().begin());
    const auto proto = int4.to_proto("w");
    EXPECT_EQ(proto.data_type(), 22);
    ASSERT_EQ(proto.raw_data().size(), 3u);
    EXPECT_EQ(static_cast<uint8_t>(proto.raw_data()[0]), 0x78);
    EXPECT_EQ(static_cast<uint8_t>(proto.raw_data()[1]), 0xF1);
    EXPECT_EQ(static_cast<uint8_t>(proto.raw_data()[2]), 0x05);
    const auto back = vaiq::Tensor::from_proto(proto);
    EXPECT_EQ(back.type(), vaiq::DataType::Int4);
    EXPECT_EQ(std::vector<int8_t>(back.data<int8_t>().begin(), back.data<int8_t>().end()),
              (std::vector<int8_t>{-8, 7, 1, -1, 5}));
    // uint4 from int32_data (one packed byte each), and a size that lies.
    onnx::TensorProto u;
    u.set_data_type(21);
    u.add_dims(3);
    u.add_int32_data(0xA3);
    u.add_int32_data(0x0F);
    const auto uv = vaiq::Tensor::from_proto(u);
    EXPECT_EQ(std::vector<uint8_t>(uv.data<uint8_t>().begin(), uv.data<uint8_t>().end()),
              (std::vector<uint8_t>{3, 10, 15}));
    u.add_int32_data(0);
    EXPECT_THROW(vaiq::Tensor::from_proto(u), InputError);
}

TEST(ModelIo, ConvertsPastTheOpsetsOnnxKnowsAdaptingTheOpsThatChanged) {
    vaiq::test::GraphBuilder b(13);
    b.input("x", {2, 3, 4}).output("y", {2, 1, 4});
    vaiq::test::set_ints_attribute(b.node("ReduceMean", {"x"}, {"m"}, "mean"), "axes", {1});
    b.node("Relu", {"m"}, {"y"}, "relu");
    const auto model = b.build();
    const auto converted = vaiq::convert_opset(model, 21);
    EXPECT_EQ(converted.opset(), 21);
    const auto& mean = converted.graph().node(0);
    ASSERT_EQ(mean.input_size(), 2) << "opset 18 takes the axes as an input";
    EXPECT_EQ(mean.attribute_size(), 0);
    const vaiq::GraphIndex index(converted.graph());
    const auto axes = vaiq::Tensor::from_proto(*index.initializer(mean.input(1)));
    EXPECT_EQ(axes.data<int64_t>()[0], 1);
    EXPECT_NO_THROW(vaiq::check_model(converted)) << "checked structurally past ONNX's own opsets";
    const auto x = vaiq::test::ramp({2, 3, 4}, -1.0f, 0.1f);
    const auto before = vaiq::runtime::Executor(model).run({{"x", x}})[0];
    const auto after = vaiq::runtime::Executor(converted).run({{"x", x}})[0];
    for (int64_t i = 0; i < before.size(); ++i) EXPECT_EQ(before.data<float>()[i], after.data<float>()[i]);
    EXPECT_THROW(vaiq::convert_opset(model, 22), InputError);
    // A model reading a value nothing defines fails the structural check.
    auto broken = converted;
    broken.graph().mutable_node(1)->set_input(0, "nowhere");
    EXPECT_THROW(vaiq::check_model(broken), InputError);
}

}  // namespace

// Shape inference runs on a copy without the large weights' values: it still
// knows their shapes, still reads the small constants (a Reshape's shape), and
// the model keeps every value.
TEST(ModelIo, ShapeInferenceKnowsLargeWeightsShapesAndReadsSmallConstants) {
    vaiq::test::GraphBuilder b(13);
    b.input("x", {1, 32, 8, 8}).output("y", {4, 1024});
    b.initializer("w", vaiq::test::ramp({64, 32, 3, 3}, -1.0f, 1e-4f));  // 18432 values
    vaiq::Tensor shape(vaiq::DataType::Int64, {2});
    shape.mutable_data<int64_t>()[0] = 4;
    shape.mutable_data<int64_t>()[1] = -1;
    b.initializer("shape", shape);
    auto& conv = b.node("Conv", {"x", "w"}, {"c"}, "conv");
    vaiq::test::set_ints_attribute(conv, "pads", {1, 1, 1, 1});
    b.node("Reshape", {"c", "shape"}, {"r"}, "reshape");
    b.node("Relu", {"r"}, {"y"}, "relu");
    vaiq::Model model = b.build();
    const auto weights_before = model.graph().initializer(0).SerializeAsString();
    const auto shapes = vaiq::infer_shapes(model);
    EXPECT_EQ(shapes.at("w"), (std::vector<int64_t>{64, 32, 3, 3}));
    EXPECT_EQ(shapes.at("c"), (std::vector<int64_t>{1, 64, 8, 8}));
    EXPECT_EQ(shapes.at("r"), (std::vector<int64_t>{4, 1024}));  // from the shape's values
    EXPECT_EQ(vaiq::infer_types(model).at("r"), vaiq::DataType::Float);
    EXPECT_GT(vaiq::store_inferred_shapes(model, {}), 0);
    EXPECT_EQ(model.graph().initializer(0).SerializeAsString(), weights_before);
}

// Fuzzing found it: ONNX's ConvTranspose shape inference crashes (reads past
// the kernel shape) when the weight has fewer dimensions than the input.
TEST(ModelIo, AConvTransposeWhoseWeightRankDiffersFromItsInputIsRefusedNotInferred) {
    vaiq::test::GraphBuilder b(13);
    b.input("X", {1, 1, 3}).input("W", {1, 2}).output("Y", {});
    b.node("ConvTranspose", {"X", "W"}, {"Y"}, "deconv");
    vaiq::Model model = b.build();
    const auto shapes = vaiq::infer_shapes(model);  // never throws: what it knows
    EXPECT_EQ(shapes.at("X").size(), 3u);
    EXPECT_EQ(shapes.at("W").size(), 2u);
    try {
        vaiq::store_inferred_shapes(model, {});
        FAIL() << "expected InputError";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("node 'deconv' (ConvTranspose): the input has 3 dimensions and the "
                                             "weight 2"),
                  std::string::npos)
            << e.what();
    }
}

// And the same for ConvInteger with a weight of more dimensions than its input.
TEST(ModelIo, AConvIntegerWhoseWeightRankDiffersFromItsInputIsRefusedNotInferred) {
    vaiq::test::GraphBuilder b(10);
    b.input("x", {1, 3, 3}, vaiq::DataType::UInt8).input("w", {1, 1, 2, 2}, vaiq::DataType::UInt8).output("y", {});
    b.node("ConvInteger", {"x", "w"}, {"y"}, "conv");
    vaiq::Model model = b.build();
    EXPECT_EQ(vaiq::infer_shapes(model).at("w").size(), 4u);
    try {
        vaiq::store_inferred_shapes(model, {});
        FAIL() << "expected InputError";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("node 'conv' (ConvInteger): the input has 3 dimensions and the weight 4"),
                  std::string::npos)
            << e.what();
    }
}
