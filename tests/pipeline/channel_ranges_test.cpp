// Channel ranges measured on the calibration data, and the data-aware passes
// that ask for them (activation-aware CLE) inside a run.
#include <gtest/gtest.h>

#include <cmath>

#include "data/data_reader.hpp"
#include "pipeline/channel_ranges.hpp"
#include "pipeline/pipeline.hpp"
#include "test_support.hpp"
#include "vaiq/reader.hpp"

namespace fs = std::filesystem;
using vaiq::Tensor;
using vaiq::test::GraphBuilder;
using vaiq::test::temp_dir;
using vaiq::test::write_text;

namespace {

TEST(ChannelRanges, TakeTheLargestMagnitudePerChannelOverEveryBatchOnTheGivenAxis) {
    GraphBuilder b;
    b.input("x", {1, 2, 3}).output("y", {1, 2, 3});
    b.node("Neg", {"x"}, {"y"});
    const auto model = b.build();
    const auto dir = temp_dir();
    // Two samples of [1, 2, 3]: channel (axis 1) maxima 6 and 7; last-axis maxima 4, 7, 6.
    vaiq::write_npy(dir / "x.npy", Tensor::from_values<float>({2, 2, 3}, std::vector<float>{1, -2, 3, 4, 5, -6,  //
                                                                                            -1, 0, 6, 2, -7, 1}));
    auto data = vaiq::open_data_reader(dir / "x.npy", model);
    const auto ranges = vaiq::measure_channel_ranges(model, *data, {{"y", 1}, {"x", -1}}, 1);
    EXPECT_EQ(ranges.at("y"), (std::vector<float>{6, 7}));
    EXPECT_EQ(ranges.at("x"), (std::vector<float>{4, 7, 6}));
    // An axis the tensor does not have is left out, not guessed.
    EXPECT_TRUE(vaiq::measure_channel_ranges(model, *data, {{"y", 5}}, 1).empty());
}

// Conv -> Relu -> Conv whose weights are balanced, but whose first layer's
// channel 0 reads only input channel 0, which the data makes 50x the other:
// channel 0 of the tensor between the layers is 50x the others, which the
// weights do not show, and the second layer reads it with 1/50 of the weight
// (so all channels matter for the output). Per-tensor quantization of that
// tensor loses the small channels.
vaiq::Model unbalanced_activation_model() {
    GraphBuilder b;
    b.input("x", {1, 2, 6, 6}).output("y", {1, 3, 6, 6});
    auto noise = [](int64_t i) { return static_cast<float>(std::sin(double(i) * 1.7)); };
    std::vector<float> w1(72), w2(12);
    for (int64_t i = 0; i < 72; ++i) {
        const int64_t out = i / 18, in = (i / 9) % 2;
        w1[i] = (out == 0) == (in == 0) ? 0.3f * noise(i) : 0.0f;
    }
    for (int64_t i = 0; i < 12; ++i) w2[i] = i % 4 == 0 ? 0.01f : 0.5f + 0.3f * noise(i + 100);
    b.initializer("w1", Tensor::from_values<float>({4, 2, 3, 3}, w1));
    b.initializer("b1", Tensor::from_values<float>({4}, std::vector<float>{0.1f, 0.1f, 0.1f, 0.1f}));
    b.initializer("w2", Tensor::from_values<float>({3, 4, 1, 1}, w2));
    vaiq::test::set_ints_attribute(b.node("Conv", {"x", "w1", "b1"}, {"c1"}), "pads", {1, 1, 1, 1});
    b.node("Relu", {"c1"}, {"r"});
    b.node("Conv", {"r", "w2"}, {"y"});
    return b.build();
}

double output_sqnr(const nlohmann::json& report) {
    const auto& v = report["evaluation"]["outputs"][0]["sqnr_db"];
    return v.is_number() ? v.get<double>() : 1e9;
}

TEST(ActivationAwareCle, MeasuresTheTensorBetweenTheLayersAndQuantizesItBetter) {
    const auto dir = temp_dir();
    vaiq::save_model(unbalanced_activation_model(), dir / "in.onnx");
    std::vector<float> x(8 * 72);
    for (size_t i = 0; i < x.size(); ++i)
        x[i] = static_cast<float>(std::cos(double(i) * 0.37)) * ((i / 36) % 2 == 0 ? 50.0f : 1.0f);
    vaiq::write_npy(dir / "x.npy", Tensor::from_values<float>({8, 2, 6, 6}, x));
    vaiq::PluginRegistry registry;
    registry.load_default_paths();
    auto run = [&](const std::string& cle) {
        return output_sqnr(
            vaiq::test::run_recipe_in(dir, registry, "calibration_data_reader: x.npy\ncle_guard: false\n" + cle));
    };
    const double none = run(""), plain = run("include_cle: true\n");
    const double aware = run("include_cle: true\nextra_options: {CLEActivationAware: true}\n");
    EXPECT_GT(aware, plain + 1) << "no CLE " << none << " dB, plain CLE " << plain << " dB, activation-aware " << aware;
}

}  // namespace
