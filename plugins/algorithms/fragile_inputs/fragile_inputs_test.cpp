// The fragile_inputs algorithm: what comparisons, rankings and singular ops
// read, and the scores a model outputs, stay float.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <set>

#include "field_run.hpp"
#include "pipeline/pipeline.hpp"
#include "recipe/recipe.hpp"

namespace fs = std::filesystem;
using vaiq::Tensor;
using vaiq::test::FieldRun;
using vaiq::test::GraphBuilder;
using vaiq::test::output_sqnr;
using vaiq::test::temp_dir;

namespace {

// x -> Conv -> head (channel 0: score logits of a few units, channel 1: offsets
// of hundreds); the score is cut out, squashed and tested for peaks.
vaiq::Model peak_model() {
    GraphBuilder b;
    b.input("x", {1, 1, 16, 16}).output("peaks", {1, 1, 16, 16}).output("offsets", {1, 1, 16, 16});
    std::vector<float> w(2 * 9, 0.0f);
    for (int k = 0; k < 9; ++k) w[k] = k == 4 ? 4.0f : 0.5f;      // the score: a blurred blob map
    for (int k = 0; k < 9; ++k) w[9 + k] = (k % 3 - 1) * 150.0f;  // the offsets: a wide gradient
    b.initializer("w", Tensor::from_values<float>({2, 1, 3, 3}, w));
    b.initializer("bias", Tensor::from_values<float>({2}, std::vector<float>{-4.0f, 0.0f}));
    for (const auto& [name, v] : {std::pair{"zero", 0}, std::pair{"one", 1}, std::pair{"two", 2}})
        b.initializer(name, Tensor::from_values<int64_t>({1}, std::vector<int64_t>{v}));
    vaiq::test::set_ints_attribute(b.node("Conv", {"x", "w", "bias"}, {"head"}, "head_conv"), "pads", {1, 1, 1, 1});
    b.node("Slice", {"head", "zero", "one", "one"}, {"score"}, "score_slice");
    b.node("Slice", {"head", "one", "two", "one"}, {"offsets"}, "offset_slice");
    b.node("Sigmoid", {"score"}, {"prob"}, "sigmoid");
    auto& pool = b.node("MaxPool", {"prob"}, {"pooled"}, "pool");
    vaiq::test::set_ints_attribute(pool, "kernel_shape", {3, 3});
    vaiq::test::set_ints_attribute(pool, "pads", {1, 1, 1, 1});
    b.node("Equal", {"pooled", "prob"}, {"is_peak"}, "peak_test");
    vaiq::set_attribute(b.node("Cast", {"is_peak"}, {"peak_mask"}, "mask"), "to", 1);
    b.node("Mul", {"peak_mask", "prob"}, {"peaks"}, "keep_peaks");
    return b.build();
}

int count_peaks(const Tensor& peaks, float threshold) {
    int n = 0;
    for (float v : peaks.data<float>()) n += v > threshold;
    return n;
}

// The peak test on a shared 8-bit grid: a plateau of equal values is a "peak" at
// every pixel. Left float, the quantized model finds the float model's peaks.
TEST_F(FieldRun, APeakTestComparesTheValuesItComparedInFloat) {
    const auto report = run(peak_model());
    std::set<std::string> kept;
    for (const auto& k : report["plan"]["kept_float"]) kept.insert(k["tensor"].get<std::string>());
    for (const char* t : {"prob", "pooled", "score", "head"}) EXPECT_TRUE(kept.count(t)) << t << report["plan"].dump();
    int float_peaks = 0, quantized_peaks = 0, old_peaks = 0;
    const auto quantized_path = dir_ / "out.onnx";
    run(peak_model(), "float_fragile_inputs: false\nmixed_scale_ratio: 0\n");  // as the plan was before
    for (int i = 10; i < 14; ++i) {
        const auto x = image({1, 1, 16, 16}, i);
        float_peaks += count_peaks(outputs(dir_ / "in.onnx", x)[0], 0.2f);
        old_peaks += count_peaks(outputs(dir_ / "out.onnx", x)[0], 0.2f);
    }
    run(peak_model());
    for (int i = 10; i < 14; ++i)
        quantized_peaks += count_peaks(outputs(dir_ / "out.onnx", image({1, 1, 16, 16}, i))[0], 0.2f);
    EXPECT_GT(float_peaks, 4);
    EXPECT_NEAR(quantized_peaks, float_peaks, 1 + float_peaks / 10);
    EXPECT_GT(old_peaks, 2 * float_peaks) << "quantized comparisons found peaks on the grid's plateaus";
}

TEST_F(FieldRun, ExplainNamesTheTensorsAComparisonKeepsFloat) {
    const auto dir = temp_dir();
    const auto recipe = vaiq::load_recipe(vaiq::test::write_text(dir / "r.yaml", "recipe_version: 1\ntarget: cpu\n"));
    const auto plugins = vaiq::resolve_plugins(recipe, registry_);
    const auto model = peak_model();
    const auto text = vaiq::explain(recipe, plugins, registry_, &model);
    EXPECT_NE(text.find("tensors left float by the plan:"), std::string::npos) << text;
    EXPECT_NE(text.find("Equal 'peak_test' compares it"), std::string::npos) << text;
}

// A log-mel front end: energies spanning eight decades, clamped to 1e-10 and
// logged. On an 8-bit grid the small energies round to 0, and 0 clamps to
// 1e-10 or, where the clamp's output is the quantized one, logs to -inf.
vaiq::Model log_energy_model() {
    GraphBuilder b;
    b.input("x", {1, 1, 16, 16}).output("db", {1, 1, 16, 8});
    std::vector<float> filters(16 * 8, 0.0f);
    for (int i = 0; i < 16; ++i) filters[i * 8 + i / 2] = 1.0f;
    b.initializer("filters", Tensor::from_values<float>({16, 8}, filters));
    b.initializer("eps", Tensor::from_values<float>({}, std::vector<float>{1e-10f}));
    b.initializer("ten", Tensor::from_values<float>({}, std::vector<float>{10.0f}));
    b.node("Exp", {"x"}, {"power"}, "power");  // the calibration images' 0..2 -> 1..7: a few decades
    b.node("Mul", {"power", "power"}, {"p2"}, "square");
    b.node("Mul", {"p2", "p2"}, {"p4"}, "fourth");
    b.node("MatMul", {"p4", "filters"}, {"energy"}, "mel");
    b.node("Clip", {"energy", "eps"}, {"clamped"}, "floor");
    b.node("Log", {"clamped"}, {"log"}, "log");
    b.node("Mul", {"log", "ten"}, {"db"}, "to_db");
    return b.build();
}

TEST_F(FieldRun, ALogReadsItsInputInFloat) {
    const auto fragile = run(log_energy_model(), "float_fragile_inputs: false\n");
    const auto kept = run(log_energy_model());
    std::set<std::string> left;
    for (const auto& k : kept["plan"]["kept_float"]) left.insert(k["tensor"].get<std::string>());
    // The clamp's output, and the powers the filter bank sums (the energies need no pair of their own).
    EXPECT_TRUE(left.count("clamped") && left.count("p4")) << kept["plan"].dump();
    EXPECT_LT(output_sqnr(fragile, "db"), 20.0) << "small energies rounded to 0";
    EXPECT_GT(output_sqnr(kept, "db"), output_sqnr(fragile, "db") + 10.0);
}

// A keyword model's head: rows of features -> Gemm -> Sigmoid, whose scores
// users rank and threshold. Its scores are mostly below 0.002,
// where a wake-word model spends most of its time.
vaiq::Model score_head_model() {
    GraphBuilder b;
    b.input("x", {8, 16}).output("score", {8, 1});
    b.initializer("w", vaiq::test::ramp({16, 1}, 0.05f, 0.05f));
    b.initializer("b", Tensor::from_values<float>({1}, std::vector<float>{-12.0f}));
    b.node("Gemm", {"x", "w", "b"}, {"logit"}, "head");
    b.node("Sigmoid", {"logit"}, {"score"}, "squash");
    return b.build();
}

size_t distinct(const Tensor& t) {
    const auto v = t.data<float>();
    return std::set<float>(v.begin(), v.end()).size();
}

// On an 8-bit grid of step 1/255 every score below 0.002 is 0: the rows tie and
// the ranking is gone. Computed in float from the quantized logit, it stays.
TEST_F(FieldRun, AScoreTheModelOutputsKeepsItsRanking) {
    const auto report = run(score_head_model());
    ASSERT_FALSE(report["plan"]["kept_float"].empty()) << report["plan"].dump();
    EXPECT_EQ(report["plan"]["kept_float"][0]["tensor"], "score");
    EXPECT_NE(report["plan"]["kept_float"][0]["reason"].get<std::string>().find("a score the model outputs"),
              std::string::npos);
    const auto x = image({8, 16}, 11);
    const auto reference = outputs(dir_ / "in.onnx", x)[0];
    const auto kept = outputs(dir_ / "out.onnx", x)[0];
    ASSERT_EQ(distinct(reference), 8u);
    EXPECT_GE(distinct(kept), 7u);
    EXPECT_GT(kept.data<float>()[0], 0.0f);
    run(score_head_model(), "float_fragile_inputs: false\n");
    EXPECT_LE(distinct(outputs(dir_ / "out.onnx", x)[0]), 3u) << "scores below 0.002 round to 0";
}

}  // namespace
