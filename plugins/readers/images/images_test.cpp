// Image folders as calibration data: decoding and the preprocessing presets.
#include <gtest/gtest.h>
// jpeglib.h needs FILE and size_t declared first.
#include <cstdio>
#include <jpeglib.h>

#include <cmath>
#include <functional>

#include "data/data_reader.hpp"
#include "pixels.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/reader.hpp"

namespace fs = std::filesystem;

using vaiq::test::error_of;

namespace {

using vaiq::DataType;
using vaiq::Image;
using vaiq::ImagePipeline;
using vaiq::Tensor;
using vaiq::test::temp_dir;
using vaiq::test::write_text;

void write_png(const fs::path& path, const Image& image) {
    vaiq::test::write_png(path, image.height, image.width, image.channels, image.pixels.data());
}

// The images reader of this test's library, configured with `options` (a recipe's settings).
vaiq::DataReaders images_reader(const nlohmann::json& options = nullptr) {
    static const auto registry = vaiq::test::registry_with_test_plugin();
    const auto& info = registry.require(vaiq::PluginKind::Reader, "images");
    vaiq::DataReaders readers;
    readers.add("images", registry.create<vaiq::Reader>("images", registry.resolve_options(info, options)));
    return readers;
}

std::unique_ptr<vaiq::DataReader> open_images(const fs::path& dir, const vaiq::Model& model,
                                              const nlohmann::json& options = nullptr) {
    return images_reader(options).open(dir, model, "calibration data");
}

void write_jpeg(const fs::path& path, const Image& image) {
    FILE* file = std::fopen(path.c_str(), "wb");
    ASSERT_NE(file, nullptr);
    jpeg_compress_struct info{};
    jpeg_error_mgr error{};
    info.err = jpeg_std_error(&error);
    jpeg_create_compress(&info);
    jpeg_stdio_dest(&info, file);
    info.image_width = static_cast<JDIMENSION>(image.width);
    info.image_height = static_cast<JDIMENSION>(image.height);
    info.input_components = static_cast<int>(image.channels);
    info.in_color_space = image.channels == 3 ? JCS_RGB : JCS_GRAYSCALE;
    jpeg_set_defaults(&info);
    jpeg_set_quality(&info, 100, TRUE);
    jpeg_start_compress(&info, TRUE);
    while (info.next_scanline < info.image_height) {
        auto* row = const_cast<JSAMPROW>(image.pixels.data() + info.next_scanline * image.width * image.channels);
        jpeg_write_scanlines(&info, &row, 1);
    }
    jpeg_finish_compress(&info);
    jpeg_destroy_compress(&info);
    std::fclose(file);
}

// 4 x 6 RGB: R = 10 y + 2 x, G = R + 50, B = R + 100.
Image ramp_image() {
    Image image{4, 6, 3, {}};
    for (int64_t y = 0; y < 4; ++y)
        for (int64_t x = 0; x < 6; ++x)
            for (int k = 0; k < 3; ++k) image.pixels.push_back(static_cast<uint8_t>(10 * y + 2 * x + 50 * k));
    return image;
}

// The value at channel c, row y, column x of an NCHW [1, C, H, W] tensor.
float at(const vaiq::Tensor& t, int64_t c, int64_t y, int64_t x) {
    const auto& s = t.shape();
    return t.data<float>()[static_cast<size_t>((c * s[2] + y) * s[3] + x)];
}

TEST(Images, DecodesPngExactlyAndJpegClosely) {
    const auto dir = temp_dir();
    const auto image = ramp_image();
    write_png(dir / "a.png", image);
    const auto png = vaiq::decode_image(dir / "a.png");
    EXPECT_EQ(png.height, 4);
    EXPECT_EQ(png.width, 6);
    EXPECT_EQ(png.channels, 3);
    EXPECT_EQ(png.pixels, image.pixels);

    Image grey{8, 8, 1, std::vector<uint8_t>(64, 77)};
    write_jpeg(dir / "g.JPG", grey);
    const auto jpeg = vaiq::decode_image(dir / "g.JPG");
    EXPECT_EQ(jpeg.channels, 1);
    for (auto v : jpeg.pixels) EXPECT_NEAR(v, 77, 1);
    Image colour{8, 8, 3, {}};
    for (int i = 0; i < 64; ++i) colour.pixels.insert(colour.pixels.end(), {200, 40, 90});
    write_jpeg(dir / "c.jpeg", colour);
    const auto rgb = vaiq::decode_image(dir / "c.jpeg");
    ASSERT_EQ(rgb.channels, 3);
    EXPECT_NEAR(rgb.pixels[0], 200, 3);
    EXPECT_NEAR(rgb.pixels[1], 40, 3);
    EXPECT_NEAR(rgb.pixels[2], 90, 3);
}

TEST(Images, UndecodableFilesAreErrorsNamingThem) {
    const auto dir = temp_dir();
    for (const char* name : {"bad.png", "bad.jpg"}) {
        write_text(dir / name, "not an image at all");
        try {
            vaiq::decode_image(dir / name);
            FAIL() << name << " decoded";
        } catch (const vaiq::InputError& e) {
            EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
        }
    }
    // A JPEG cut short: libjpeg's error must come back as an exception, not an exit.
    Image grey{32, 32, 1, std::vector<uint8_t>(1024, 9)};
    write_jpeg(dir / "whole.jpg", grey);
    const auto bytes = vaiq::test::slurp(dir / "whole.jpg");
    write_text(dir / "cut.jpg", bytes.substr(0, 20));
    EXPECT_THROW(vaiq::decode_image(dir / "cut.jpg"), vaiq::InputError);
}

TEST(Images, PreprocessMethod2MatchesTheHandComputedReference) {
    // Size 2 / 0.875 = 2.29 -> 2; the 4 x 6 image keeps its aspect: 2 x 3, then the
    // centre 2 x 2 (left offset 0). Area resampling averages 2 x 2 blocks:
    // R = 10 (2y + 0.5) + 2 (2x + 0.5) = 20 y + 4 x + 6. Then the channel means go.
    const auto t = vaiq::image_to_input(ramp_image(), vaiq::preset_image_pipeline("preprocess_method2"), 3, 2, 2,
                                        DataType::Float, "test");
    EXPECT_EQ(t.shape(), (std::vector<int64_t>{1, 3, 2, 2}));
    const float means[3] = {123.68f, 116.78f, 103.94f};
    for (int64_t c = 0; c < 3; ++c)
        for (int64_t y = 0; y < 2; ++y)
            for (int64_t x = 0; x < 2; ++x)
                EXPECT_FLOAT_EQ(at(t, c, y, x), static_cast<float>(20 * y + 4 * x + 6 + 50 * c) - means[c])
                    << c << y << x;
}

TEST(Images, PreprocessMethod1MatchesTheHandComputedReference) {
    // Bilinear with half-pixel centres samples (2x + 0.5, 2y + 0.5): the same
    // block means here; then pixels to [-1, 1]: v / 127.5 - 1.
    const auto t = vaiq::image_to_input(ramp_image(), vaiq::preset_image_pipeline("preprocess_method1"), 3, 2, 2,
                                        DataType::Float, "test");
    for (int64_t c = 0; c < 3; ++c)
        for (int64_t y = 0; y < 2; ++y)
            for (int64_t x = 0; x < 2; ++x)
                EXPECT_NEAR(at(t, c, y, x), static_cast<float>(20 * y + 4 * x + 6 + 50 * c) / 127.5f - 1.0f, 1e-6f);
}

TEST(Images, AreaAveragesWhereBilinearSamples) {
    // One row 0 0 90 0 0 90 shrunk to two pixels: area means 30 and 30; bilinear
    // samples the centres of each third (pixels 1 and 4): 0 and 0.
    Image row{1, 6, 1, {0, 0, 90, 0, 0, 90}};
    ImagePipeline p;
    p.interpolation = ImagePipeline::Interpolation::Area;
    auto t = vaiq::image_to_input(row, p, 1, 1, 2, DataType::Float, "test");
    EXPECT_EQ(t.data<float>()[0], 30.0f);
    EXPECT_EQ(t.data<float>()[1], 30.0f);
    p.interpolation = ImagePipeline::Interpolation::Bilinear;
    t = vaiq::image_to_input(row, p, 1, 1, 2, DataType::Float, "test");
    EXPECT_EQ(t.data<float>()[0], 0.0f);
    EXPECT_EQ(t.data<float>()[1], 0.0f);
}

TEST(Images, ChannelsLayoutAndIntegerInputs) {
    Image pixel{1, 1, 3, {200, 40, 90}};
    ImagePipeline p;
    p.bgr = true;
    p.nhwc = true;
    auto t = vaiq::image_to_input(pixel, p, 3, 1, 1, DataType::Float, "test");
    EXPECT_EQ(t.shape(), (std::vector<int64_t>{1, 1, 1, 3}));
    EXPECT_EQ(t.data<float>()[0], 90.0f) << "BGR: blue first";
    EXPECT_EQ(t.data<float>()[2], 200.0f);
    // RGB to one channel: ITU-R 601 luma, 0.299 R + 0.587 G + 0.114 B = 93.54 -> 94.
    t = vaiq::image_to_input(pixel, ImagePipeline{}, 1, 1, 1, DataType::Float, "test");
    EXPECT_EQ(t.data<float>()[0], 94.0f);
    // Grey to three channels: replicated.
    t = vaiq::image_to_input(Image{1, 1, 1, {17}}, ImagePipeline{}, 3, 1, 1, DataType::Float, "test");
    EXPECT_EQ(t.data<float>()[1], 17.0f);
    EXPECT_EQ(t.data<float>()[2], 17.0f);
    // A uint8 input takes the normalised values rounded and saturated.
    p = ImagePipeline{};
    p.mean = {-100.0f};
    t = vaiq::image_to_input(pixel, p, 3, 1, 1, DataType::UInt8, "test");
    EXPECT_EQ(t.data<uint8_t>()[0], 255) << "300 saturates";
    EXPECT_EQ(t.data<uint8_t>()[1], 140);
    p.std = {1.0f, 2.0f};
    EXPECT_THROW(vaiq::image_to_input(pixel, p, 3, 1, 1, DataType::Float, "test"), vaiq::InputError)
        << "two stds for three channels";
    EXPECT_THROW(vaiq::preset_image_pipeline("preprocess_method3"), vaiq::InputError);
}

TEST(Images, AFolderOfImagesIsReadInTheModelsBatchSize) {
    const auto dir = temp_dir();
    for (int i : {10, 2, 1})
        write_png(dir / ("img_" + std::to_string(i) + ".png"),
                  Image{4, 4, 1, std::vector<uint8_t>(16, static_cast<uint8_t>(i))});
    const auto model = vaiq::test::conv_relu_model();  // x: [1, 2, 4, 4]: 2 channels, which images cannot feed
    EXPECT_THROW(open_images(dir, model)->next(), vaiq::InputError);
    vaiq::test::GraphBuilder b;
    b.input("x", {2, 1, 4, 4}).output("y", {2, 1, 4, 4});
    b.node("Relu", {"x"}, {"y"});
    const auto batched = b.build();
    auto reader = open_images(dir, batched);
    const auto first = reader->next();
    ASSERT_TRUE(first);
    const auto& x = first->feeds.at("x");
    EXPECT_EQ(x.shape(), (std::vector<int64_t>{2, 1, 4, 4}));
    EXPECT_EQ(x.data<float>()[0], 1.0f) << "natural order: img_1, img_2, then img_10";
    EXPECT_EQ(x.data<float>()[16], 2.0f);
    EXPECT_FALSE(reader->next()) << "img_10 alone does not fill a batch of 2";
    vaiq::write_npy(dir / "extra.npy", vaiq::test::ramp({1, 1, 4, 4}));
    EXPECT_THROW(open_images(dir, batched), vaiq::InputError) << "images mixed with tensor files";
}

// The recipe's data_preprocess and image_preprocess keys reach the reader as its
// options: a preset, a key set in its place, and values it refuses.
TEST(Images, TheRecipesPresetAndKeysSetHowPixelsBecomeInputs) {
    const auto dir = temp_dir();
    write_png(dir / "a.png", Image{2, 2, 1, {0, 255, 0, 255}});
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 1, 2, 2}).output("y", {1, 1, 2, 2});
    b.node("Relu", {"x"}, {"y"});
    const auto model = b.build();
    auto first = [&](const nlohmann::json& options) -> Tensor {
        return open_images(dir, model, options)->next()->feeds.at("x");
    };
    const auto none = first(nullptr);
    EXPECT_EQ(none.data<float>()[1], 255.0f) << "None: pixels as they are";
    const auto m1 = first({{"data_preprocess", "preprocess_method1"}});
    EXPECT_FLOAT_EQ(m1.data<float>()[0], -1.0f) << "method 1: pixels to [-1, 1]";
    const auto own_mean = first({{"data_preprocess", "preprocess_method1"}, {"image_preprocess.mean", 0}});
    EXPECT_FLOAT_EQ(own_mean.data<float>()[0], 0.0f) << "a key set replaces the preset's";
    const auto halved = first({{"image_preprocess.std", {2.0}}});
    EXPECT_FLOAT_EQ(halved.data<float>()[1], 127.5f);
    EXPECT_NE(error_of([&] {
                  images_reader({{"image_preprocess.size", {1.0e30, 2}}});
              }).find("image_preprocess.size must be [height, width], two integers from 1 to 65536"),
              std::string::npos)
        << "a side no image has, not an integer overflow";
    EXPECT_NE(error_of([&] {
                  images_reader({{"image_preprocess.resize", "squash"}});
              }).find("image_preprocess.resize 'squash' is not valid (valid: stretch, keep_aspect)"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  images_reader({{"image_preprocess.std", {1, 0, 1}}});
              }).find("must be positive"),
              std::string::npos);
}

}  // namespace
