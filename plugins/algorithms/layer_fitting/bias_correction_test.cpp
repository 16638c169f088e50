// Bias correction: each corrected bias adds back the mean shift its quantized
// weight causes, and the plugin hands the corrections to the run.
#include <gtest/gtest.h>

#include <cmath>

#include "bias_correction.hpp"
#include "data/data_reader.hpp"
#include "plugin/registry.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/reader.hpp"

namespace fs = std::filesystem;
using vaiq::QuantType;
using vaiq::Tensor;
using vaiq::TensorRole;
using vaiq::test::GraphBuilder;
using vaiq::test::quant_entry;
using vaiq::test::temp_dir;

namespace {

// Gemm(x[2, 4], w[4, 3], b) and a depthwise 1x1 Conv(c[1, 2, 3, 3], k[2, 1, 1, 1], kb):
// on constant inputs the shift each quantized weight causes is known exactly.
TEST(BiasCorrection, AddsTheMeanShiftOfTheQuantizedWeight) {
    GraphBuilder b;
    b.input("x", {2, 4}).input("c", {1, 2, 3, 3}).output("y", {2, 3}).output("z", {1, 2, 3, 3});
    const std::vector<float> w = {0.0123f, 1.0f, 0.3f, -0.2f, 0.5f, 0.0123f, 0.7f, 0.05f, -0.9f, 0.25f, 0.0123f, 0.6f};
    b.initializer("w", Tensor::from_values<float>({4, 3}, w));
    b.initializer("b", Tensor::from_values<float>({3}, std::vector<float>{0.1f, 0.2f, 0.3f}));
    b.initializer("k", Tensor::from_values<float>({2, 1, 1, 1}, std::vector<float>{0.0123f, 1.0f}));
    b.initializer("kb", Tensor::from_values<float>({2}, std::vector<float>{0.0f, -1.0f}));
    b.node("Gemm", {"x", "w", "b"}, {"y"});
    auto& conv = b.node("Conv", {"c", "k", "kb"}, {"z"});
    vaiq::test::set_attribute(conv, "group", 2);
    const auto model = b.build();

    // x's columns are 1, 2, 3, 4 in every row; c's channels 2 and -1.
    const auto dir = temp_dir();
    std::vector<float> c(18);
    for (int i = 0; i < 18; ++i) c[i] = i < 9 ? 2.0f : -1.0f;
    fs::create_directories(dir / "data" / "s0");
    vaiq::write_npy(dir / "data" / "s0" / "x.npy",
                    Tensor::from_values<float>({2, 4}, std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4}));
    vaiq::write_npy(dir / "data" / "s0" / "c.npy", Tensor::from_values<float>({1, 2, 3, 3}, c));
    auto data = vaiq::open_data_reader(dir / "data", model);

    vaiq::QuantPlan plan;
    plan.tensors.push_back(quant_entry("w", TensorRole::Weight, QuantType::QInt8, {1.0f / 127}, {0}));
    plan.tensors.push_back(quant_entry("k", TensorRole::Weight, QuantType::QInt8, {1.0f / 127}, {0}));
    // The model itself as the "quantized" one: its inputs are exactly the constants above.
    vaiq::test::TestAlgorithmContext context(model, *data, plan);
    const auto biases = vaiq::corrected_biases(context.context, model, {}).biases;
    ASSERT_EQ(biases.size(), 2u);
    auto rounded = [](float v) { return std::nearbyint(v * 127.0f) / 127.0f; };
    for (int n = 0; n < 3; ++n) {
        double delta = 0;
        for (int k = 0; k < 4; ++k) delta += (w[k * 3 + n] - rounded(w[k * 3 + n])) * (k + 1);
        EXPECT_NEAR(biases.at("b").data<float>()[n], 0.1f * (n + 1) + delta, 1e-6) << n;
    }
    EXPECT_NEAR(biases.at("kb").data<float>()[0], (0.0123f - rounded(0.0123f)) * 2.0, 1e-6);
    EXPECT_NEAR(biases.at("kb").data<float>()[1], -1.0f, 1e-6) << "1.0 quantizes exactly: nothing to correct";

    // A fit that moved one of w's values a grid step keeps its bias; k, which a
    // fit left at nearest rounding, is corrected as before.
    auto fitted_w = w;
    fitted_w[0] = rounded(w[0]) + 1.0f / 127;
    const std::map<std::string, Tensor> fitted = {
        {"w", Tensor::from_values<float>({4, 3}, fitted_w)},
        {"k", Tensor::from_values<float>({2, 1, 1, 1}, std::vector<float>{0.0123f, 1.0f})}};
    const auto after_fit = vaiq::corrected_biases(context.context, model, fitted);
    EXPECT_EQ(after_fit.fitted_left, 1);
    EXPECT_FALSE(after_fit.biases.contains("b"));
    ASSERT_TRUE(after_fit.biases.contains("kb"));
    EXPECT_EQ(after_fit.biases.at("kb").data<float>()[0], biases.at("kb").data<float>()[0]);
}

}  // namespace

// The documented switches run both plugins, the nested FastFinetune options
// reach fast finetune, and bias correction runs after every other algorithm
// whatever order a recipe names them in.
TEST(LayerFittingPlugins, TheDocumentedSwitchesRunThemAndBiasCorrectionComesLast) {
    const auto dir = temp_dir();
    GraphBuilder b;
    b.input("x", {4, 16}).output("y", {4, 8});
    b.initializer("w", vaiq::test::ramp({16, 8}, -0.3f, 0.0047f));
    b.initializer("b", Tensor::from_values<float>({8}, std::vector<float>(8, 0.1f)));
    b.node("Gemm", {"x", "w", "b"}, {"y"});
    vaiq::save_model(b.build(), dir / "in.onnx");
    auto registry = vaiq::test::registry_with_installed_plugins();
    auto recipe = [](const std::string& bias_correction, const std::string& fast_finetune) {
        return "target: cpu\ncalibrate_method: MinMax\nextra_options:\n  RandomDataReaderInputDataRange: {x: [0.5, 1.5]}\n"
               "  BiasCorrection: " +
               bias_correction + "\n  FastFinetune: {" + fast_finetune + "}\n";
    };
    const std::string options = "NumIterations: 20, Trials: 2, TrialMetric: sqnr";
    const auto implied = vaiq::test::run_recipe_in(dir, registry, recipe("true", options) + "include_fast_ft: true\n");
    ASSERT_TRUE(implied.contains("fast_finetune")) << implied.dump();
    EXPECT_EQ(implied["fast_finetune"]["iterations"], 20) << "a nested extra option reaches the plugin";
    EXPECT_EQ(implied["fast_finetune"]["trials"]["runs"].size(), 2u);
    ASSERT_TRUE(implied.contains("bias_correction"));
    EXPECT_EQ(implied["bias_correction"]["layers"], 0);
    EXPECT_EQ(implied["bias_correction"]["left_as_fitted"], 1) << "the Gemm fast finetune fitted keeps its bias";
    const auto first = vaiq::test::slurp(dir / "out.onnx");

    const auto named = vaiq::test::run_recipe_in(
        dir, registry, recipe("false", options) + "algorithms: [bias_correction, fast_finetune]\n", "n.yaml");
    EXPECT_EQ(named["bias_correction"]["left_as_fitted"], 1);
    EXPECT_EQ(vaiq::test::slurp(dir / "out.onnx"), first) << "the same model whatever order names them";

    try {
        vaiq::test::run_recipe_in(dir, registry, recipe("false", "NumIteration: 5") + "include_fast_ft: true\n",
                                  "t.yaml");
        ADD_FAILURE() << "a misspelt FastFinetune key runs";
    } catch (const vaiq::InputError& e) {
        EXPECT_NE(std::string(e.what()).find("FastFinetune.NumIterations"), std::string::npos) << e.what();
    }
}
