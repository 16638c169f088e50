// Sensitivity analysis and automatic mixed precision on a model with one
// known culprit: a weight whose one large value leaves every other value
// rounded to zero at 8 bits per tensor.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "data/data_reader.hpp"
#include "pipeline/pipeline.hpp"
#include "plugin/registry.hpp"
#include "recipe/recipe.hpp"
#include "report/agreement.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/format.hpp"
#include "vaiq/reader.hpp"

namespace fs = std::filesystem;
using vaiq::Tensor;
using vaiq::test::GraphBuilder;
using vaiq::test::temp_dir;
using vaiq::test::write_text;

namespace {

// x -> Relu -> MatMul(w1) -> Relu -> MatMul(w2) -> y, w2 small values plus one
// 60 in the row that reads channel 1 of r, which is always 0 (w1's column 1 is
// negative on non-negative inputs): the 60 changes nothing in float, but at 8
// bits per tensor it rounds every other value of w2 to zero.
// With `gemm_relu`, the last layer is a Gemm followed by a Relu (g -> y).
vaiq::Model model_with_one_culprit(bool gemm_relu = false) {
    GraphBuilder b;
    b.input("x", {4, 8}).output("y", {4, 8});
    std::vector<float> w1(64), w2(64);
    for (int i = 0; i < 64; ++i) {
        w1[i] = 0.05f * static_cast<float>((i * 7) % 13 - 6);
        w2[i] = 0.02f * static_cast<float>((i * 5) % 11 - 5);
        if (i % 8 == 1) w1[i] = -0.3f;
    }
    w2[9] = 60.0f;
    b.initializer("w1", Tensor::from_values<float>({8, 8}, w1));
    b.initializer("w2", Tensor::from_values<float>({8, 8}, w2));
    b.node("Relu", {"x"}, {"xr"});
    b.node("MatMul", {"xr", "w1"}, {"h"});
    b.node("Relu", {"h"}, {"r"});
    if (gemm_relu) {
        b.node("Gemm", {"r", "w2"}, {"g"});
        b.node("Relu", {"g"}, {"y"});
    } else {
        b.node("MatMul", {"r", "w2"}, {"y"});
    }
    return b.build();
}

class MixedPrecision : public ::testing::Test {
  protected:
    void SetUp() override {
        registry_.load_default_paths();
        dir_ = temp_dir();
        vaiq::save_model(model_with_one_culprit(), dir_ / "in.onnx");
    }
    vaiq::Recipe recipe(const std::string& yaml) const {
        return vaiq::load_recipe(write_text(dir_ / "r.yaml",
                                            "recipe_version: 1\nmodel_input: in.onnx\nmodel_output: out.onnx\n"
                                            "random_data_reader_input_shape: [4, 8]\n"
                                            // w2 stays per tensor: its small values are the culprit here
                                            "mixed_scale_ratio: 0\n" +
                                                yaml));
    }
    nlohmann::json run(const std::string& yaml) { return vaiq::run_pipeline(recipe(yaml), registry_, {}).report_json; }
    static const nlohmann::json* tensor(const nlohmann::json& report, const std::string& name) {
        for (const auto& t : report["tensors"])
            if (t["tensor"] == name) return &t;
        return nullptr;
    }
    static double output_sqnr(const nlohmann::json& report) {
        const auto& db = report["evaluation"]["outputs"][0]["sqnr_db"];
        return db.is_number() ? db.get<double>() : 1e9;
    }
    vaiq::PluginRegistry registry_;
    fs::path dir_;
};

TEST_F(MixedPrecision, TheAnalysisRanksTheWeightThatLosesItsValuesFirst) {
    const auto report = vaiq::analyze_pipeline(recipe(""), registry_, {});
    const auto& tensors = report["sensitivity"]["tensors"];
    ASSERT_GE(tensors.size(), 4u) << "x, w1, h, r, w2";
    EXPECT_EQ(tensors[0]["tensor"], "w2");
    EXPECT_EQ(tensors[0]["role"], "weight");
    const double w2_alone = tensors[0]["output_sqnr_db"].get<double>();
    EXPECT_LT(w2_alone, 10.0) << "w2's small values all round to zero";
    for (size_t i = 1; i < tensors.size(); ++i) {
        if (!tensors[i]["output_sqnr_db"].is_number()) continue;
        EXPECT_GT(tensors[i]["output_sqnr_db"].get<double>(), w2_alone + 10) << tensors[i]["tensor"];
    }
    EXPECT_LT(tensors[0]["tensor_sqnr_db"].get<double>(), 45.0) << "its own error is large too";
    EXPECT_FALSE(fs::exists(dir_ / "out.onnx")) << "analyze writes nothing";
}

TEST_F(MixedPrecision, RaisesOnlyWhatTheTargetNeeds) {
    const auto plain = run("");
    EXPECT_LT(output_sqnr(plain), 20.0);
    const auto report = run("extra_options:\n  AutoMixprecision: {SQNRTarget: 30, MaxRaisedFraction: 0.5}\n");
    const auto& mp = report["mixed_precision"];
    EXPECT_TRUE(mp["met"].get<bool>());
    ASSERT_EQ(mp["raised"].size(), 1u) << mp.dump();
    EXPECT_EQ(mp["raised"][0]["tensor"], "w2");
    EXPECT_EQ(mp["tensors_raised"], 1);
    ASSERT_NE(tensor(report, "w2"), nullptr);
    EXPECT_EQ((*tensor(report, "w2"))["type"], "QInt16");
    EXPECT_EQ((*tensor(report, "w1"))["type"], "QInt8") << "w1 costs little: it stays 8-bit";
    EXPECT_GE(output_sqnr(report), 30.0) << "the written model meets the target on the same data";
    EXPECT_TRUE(fs::exists(dir_ / "out.onnx"));
}

TEST_F(MixedPrecision, KeepsWithinTheBudgetAndSaysTheTargetWasMissed) {
    const auto report = run("extra_options:\n  AutoMixprecision: {SQNRTarget: 30, MaxRaisedFraction: 0}\n");
    const auto& mp = report["mixed_precision"];
    EXPECT_FALSE(mp["met"].get<bool>());
    EXPECT_EQ(mp["tensors_raised"], 0);
    EXPECT_EQ((*tensor(report, "w2"))["type"], "QInt8");
    // The next lever: the weights fitted at 8 bits, kept only where the output agrees better.
    const auto& lever = mp["next_lever"];
    ASSERT_EQ(lever["tried"], "fast_finetune") << mp.dump();
    const double before = lever["before"]["sqnr_db"].get<double>(), after = lever["after"]["sqnr_db"].get<double>();
    EXPECT_EQ(lever["kept"].get<bool>(), after > before) << lever.dump();
    EXPECT_EQ(report.contains("fast_finetune"), lever["kept"].get<bool>());
    EXPECT_NEAR(output_sqnr(report), lever["kept"].get<bool>() ? after : before, 1.0)
        << "the written model is the one kept";
    const auto warned_only =
        run("extra_options:\n  AutoMixprecision: {SQNRTarget: 30, MaxRaisedFraction: 0, NextLever: false}\n");
    EXPECT_FALSE(warned_only["mixed_precision"].contains("next_lever"));
    EXPECT_FALSE(warned_only.contains("fast_finetune"));
    // A run that fits the weights anyway does not try it: it fits them after the
    // precisions are chosen, whatever order the recipe names them in.
    const std::string both = "extra_options:\n  AutoMixprecision: {SQNRTarget: 30, MaxRaisedFraction: 0}\n";
    const auto implied = run(both + "include_fast_ft: true\n");
    EXPECT_FALSE(implied["mixed_precision"].contains("next_lever")) << implied["mixed_precision"].dump();
    ASSERT_TRUE(implied.contains("fast_finetune"));
    const auto fitted = vaiq::test::slurp(dir_ / "out.onnx");
    const auto named = run(both + "algorithms: [fast_finetune, mixed_precision]\n");
    EXPECT_FALSE(named["mixed_precision"].contains("next_lever"));
    EXPECT_EQ(vaiq::test::slurp(dir_ / "out.onnx"), fitted);
}

TEST_F(MixedPrecision, ATargetThatCannotRunSixteenBitsLeavesTheTensorFloat) {
    const auto report = run(
        "target: npu_cnn\ncalibrate_method: NonOverflow\nactivation_type: QInt8\n"
        "extra_options:\n  ActivationSymmetric: true\n  AutoMixprecision: {SQNRTarget: 30, MaxRaisedFraction: 0.5}\n");
    const auto& mp = report["mixed_precision"];
    EXPECT_EQ(mp["raised_to"], "float");
    ASSERT_GE(mp["raised"].size(), 1u);
    EXPECT_EQ(mp["raised"][0]["tensor"], "w2");
    EXPECT_EQ(tensor(report, "w2"), nullptr) << "w2 is left float, not quantized";
    ASSERT_NE(tensor(report, "w1"), nullptr);
}

// ONNX Runtime quantizes a float weight itself (int8 per tensor) when its
// Gemm reads a dequantized input and feeds a QuantizeLinear through Relu/Clip:
// a weight raised to float must take the layer's output with it.
TEST_F(MixedPrecision, ALayerWhoseWeightStaysFloatKeepsItsOutputFloatForOnnxRuntime) {
    vaiq::save_model(model_with_one_culprit(/*gemm_relu=*/true), dir_ / "in.onnx");
    const auto report = run(
        "target: npu_cnn\ncalibrate_method: NonOverflow\nactivation_type: QInt8\n"
        "extra_options:\n  ActivationSymmetric: true\n  AutoMixprecision: {SQNRTarget: 30, MaxRaisedFraction: 0.5}\n");
    EXPECT_EQ(tensor(report, "w2"), nullptr) << "w2 is left float";
    EXPECT_EQ(tensor(report, "g"), nullptr) << "and so is the Gemm's output";
    EXPECT_EQ(tensor(report, "y"), nullptr) << "and the Relu's after it";
    ASSERT_NE(tensor(report, "w1"), nullptr) << "the first layer stays quantized";
    const auto& tried = report["mixed_precision"]["tried"];
    ASSERT_GE(tried.size(), 2u);
    EXPECT_EQ(tried[1]["tensors_raised"], 2) << "raising w2 alone raises the Gemm's output with it: " << tried.dump();
    const auto written = vaiq::load_model(dir_ / "out.onnx");
    for (const auto& node : written.graph().node())
        EXPECT_FALSE(node.op_type() == "QuantizeLinear" && (node.input(0) == "g" || node.input(0) == "y"))
            << node.name();
}

TEST_F(MixedPrecision, RefusesABudgetOutsideZeroToOne) {
    try {
        run("extra_options:\n  AutoMixprecision: {SQNRTarget: 30, MaxRaisedFraction: 1.5}\n");
        FAIL() << "accepted 1.5";
    } catch (const vaiq::InputError& e) {
        EXPECT_NE(std::string(e.what()).find("MaxRaisedFraction must be within [0, 1]"), std::string::npos) << e.what();
    }
}

}  // namespace

// ------------------------------------------------------------ bias correction

namespace {

using vaiq::QuantType;
using vaiq::TensorRole;
using vaiq::test::quant_entry;

TEST_F(MixedPrecision, BiasCorrectionRemovesASystematicShiftFromTheOutput) {
    // Inputs in [1, 2]: w2's rounding errors add up to a shift rather than cancelling.
    const std::string base = "extra_options:\n  RandomDataReaderInputDataRange: {x: [1, 2]}\n  BiasCorrection: ";
    GraphBuilder b;
    b.input("x", {4, 8}).output("y", {4, 3});
    std::vector<float> w(24, 0.0123f);
    w[0] = 1.0f;
    b.initializer("w", Tensor::from_values<float>({8, 3}, w));
    b.initializer("b", Tensor::from_values<float>({3}, std::vector<float>{0.5f, 0.5f, 0.5f}));
    b.node("Gemm", {"x", "w", "b"}, {"y"});
    vaiq::save_model(b.build(), dir_ / "in.onnx");
    const auto plain = run(base + "false\n");
    const auto corrected = run(base + "true\n");
    EXPECT_EQ(corrected["bias_correction"]["layers"], 1);
    EXPECT_GT(output_sqnr(corrected), output_sqnr(plain) + 6.0)
        << output_sqnr(plain) << " dB without, " << output_sqnr(corrected) << " dB with";
}

// One score a row (a wake word's sigmoid): top-1 agreement is whether the
// decision, the score against 0.5, agrees; an argmax over one value always did.
TEST(OutputMeaning, OneScoreARowAgreesByItsDecision) {
    vaiq::ReferenceBatches reference;
    reference.measured = {{0, "y", {}}};
    const auto scores = Tensor::from_values<float>({4, 1}, std::vector<float>{0.1f, 0.45f, 0.55f, 0.9f});
    reference.feeds.push_back({{"x", scores}});
    reference.outputs.push_back({scores});
    auto shifted = [](float by) {
        GraphBuilder b;
        b.input("x", {4, 1}).output("y", {4, 1});
        b.initializer("by", Tensor::from_values<float>({}, std::vector<float>{by}));
        b.node("Add", {"x", "by"}, {"y"});
        return b.build();
    };
    const auto same = vaiq::measure_output(shifted(0.0f), reference, 1);
    EXPECT_EQ(same.rows, 4);
    EXPECT_DOUBLE_EQ(same.top1_agreement, 1.0);
    EXPECT_DOUBLE_EQ(vaiq::measure_output(shifted(0.1f), reference, 1).top1_agreement, 0.75) << "0.45 crosses 0.5";
}

}  // namespace

TEST(SequenceAgreement, GreedyDecodingMergesRepeatsAndDropsTheBlank) {
    // Rows of 3 classes; argmaxes 1 1 0 1 2 2 0.
    const std::vector<float> rows = {0, 5, 1, 0, 5, 1, 5, 0, 1, 0, 5, 1, 0, 1, 5, 0, 1, 5, 5, 0, 0};
    EXPECT_EQ(vaiq::greedy_decode(rows, 3), (std::vector<int64_t>{1, 1, 2}));
    EXPECT_TRUE(vaiq::greedy_decode(std::vector<float>{5, 1, 0}, 3).empty()) << "one blank row: nothing";
    EXPECT_EQ(vaiq::greedy_decode(std::vector<float>{0, 1, 5}, 3), (std::vector<int64_t>{2})) << "a classifier's row";
}

// Long rows take a vectorised argmax where the CPU has it: the same first
// greatest value as the scalar loop, ties, NaN, signed zeros and a tail included.
TEST(SequenceAgreement, LongRowsDecodeAsTheScalarArgmaxDoes) {
    constexpr int64_t kClasses = 70;  // four vectors of 16 and a tail of 6
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    auto row = [](std::vector<std::pair<int64_t, float>> set, float rest) {
        std::vector<float> r(kClasses, rest);
        for (const auto& [c, v] : set) r[static_cast<size_t>(c)] = v;
        return r;
    };
    const std::vector<std::vector<float>> rows = {
        row({{40, 3}, {45, 3}, {55, 3}}, 1),  // a tie: the first, 40
        row({{0, nan}, {40, 9}}, 1),          // NaN first: nothing is greater, 0 (the blank)
        row({{40, 3}}, 1),                    // 40 again, after the blank
        row({{10, nan}, {66, 7}}, 1),         // NaN passed over; the greatest in the tail, 66
        row({{60, nan}, {20, 7}}, 1),         // NaN in the last whole vector passed over: 20
        row({{33, -0.0f}, {36, 0.0f}}, -1),   // -0 and +0 equal: the first, 33
        row({}, -inf),                        // all equal: 0
    };
    std::vector<float> flat;
    for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
    EXPECT_EQ(vaiq::greedy_decode(flat, kClasses), (std::vector<int64_t>{40, 40, 66, 20, 33}));
}

// Two samples of 4 rows of 3 classes. The candidate adds `e` to the float
// output: in sample 0 it turns a repeat into a blank (a row differs, the
// decoding does not), in sample 1 a leading blank into a character.
TEST(SequenceAgreement, CountsTheSamplesWhoseDecodingAgrees) {
    const std::vector<float> x = {0, 5, 1, 0, 5, 1, 5, 0, 1, 0, 1, 5,   // 1 1 0 2 -> [1, 2]
                                  5, 0, 1, 0, 5, 1, 5, 0, 1, 0, 1, 5};  // 0 1 0 2 -> [1, 2]
    std::vector<float> e(24, 0.0f);
    e[3] = 9;   // sample 0, row 1: 1 -> 0: 1 0 0 2, still [1, 2]
    e[14] = 9;  // sample 1, row 0: 0 -> 2: 2 1 0 2, [2, 1, 2]
    GraphBuilder b;
    b.input("x", {2, 4, 3}).output("y", {2, 4, 3});
    b.initializer("e", Tensor::from_values<float>({2, 4, 3}, e));
    b.node("Add", {"x", "e"}, {"y"});
    vaiq::ReferenceBatches reference;
    reference.measured = {{0, "y", {}}};
    const auto t = Tensor::from_values<float>({2, 4, 3}, x);
    reference.feeds.push_back({{"x", t}});
    reference.outputs.push_back({t});
    const auto error = vaiq::measure_output(b.build(), reference, 1);
    EXPECT_EQ(error.rows, 8);
    EXPECT_DOUBLE_EQ(error.top1_agreement, 6.0 / 8.0);
    EXPECT_EQ(error.samples, 2);
    EXPECT_DOUBLE_EQ(error.sequence_agreement, 0.5);
    EXPECT_TRUE(reference.decodes_samples()) << "the samples sequence_agreement counted";
}

// A detector's outputs: class scores and box values. Measured on every output,
// a candidate whose scores agree but whose boxes are off counts as its boxes:
// each output by what it means, the worst counting; an integer output is not measured.
TEST(OutputAgreement, EveryOutputIsMeasuredAndTheWorstCounts) {
    auto detector = [](float box_error) {
        GraphBuilder b;
        b.input("x", {4, 3})
            .output("scores", {4, 3})
            .output("boxes", {4, 3})
            .output("best", {4, 1}, vaiq::DataType::Int64);
        vaiq::set_attribute(b.node("Softmax", {"x"}, {"scores"}, "classify"), "axis", 1);
        b.initializer("e", Tensor::from_values<float>({1}, std::vector<float>{box_error}));
        b.node("Add", {"x", "e"}, {"boxes"});
        auto& best = b.node("ArgMax", {"x"}, {"best"});
        vaiq::set_attribute(best, "axis", 1);
        return b.build();
    };
    const auto float_model = detector(0.0f);
    auto data = vaiq::random_data_reader(float_model, nlohmann::json::array(), nullptr, 3, 7);
    const auto every = vaiq::reference_batches(float_model, *data, 0, vaiq::kEveryOutput, 1);
    ASSERT_EQ(every.measured.size(), 2u) << "the int64 ArgMax is not measured";
    EXPECT_EQ(every.measured[0].meaning.source, "Softmax 'classify'");
    EXPECT_EQ(every.describe_outputs(), "every output (2: 'scores', 'boxes')");
    EXPECT_TRUE(every.decodes_samples()) << "the Softmax's classes, a sample each row";
    const auto first = vaiq::reference_batches(float_model, *data, 0, 0, 1);

    const auto candidate = detector(0.25f);
    const auto on_first = vaiq::measure_output(candidate, first, 1);
    EXPECT_EQ(on_first.top1_agreement, 1.0);
    EXPECT_TRUE(std::isinf(on_first.sqnr_db)) << "the scores are exact";
    const auto on_every = vaiq::measure_output(candidate, every, 1);
    EXPECT_LT(on_every.sqnr_db, 40.0) << "the boxes' error counts";
    EXPECT_GT(on_every.relative_l2, 0.0);
    EXPECT_EQ(on_every.batches, 3);
    EXPECT_THROW(vaiq::reference_batches(float_model, *data, 0, 2, 1), vaiq::InputError) << "ArgMax is not float";
}

// What an output means is read from the op that computes it.
TEST(OutputMeaning, ComesFromTheOpThatComputesTheOutput) {
    GraphBuilder b;
    b.input("x", {1, 3, 2, 2}).output("classes", {1, 3, 2, 2}).output("mask", {1, 12}).output("peaks", {1, 3, 2, 2});
    b.output("logits", {1, 3, 2, 2});
    vaiq::set_attribute(b.node("Softmax", {"x"}, {"classes"}, "per_pixel"), "axis", 1);
    b.node("Sigmoid", {"x"}, {"p"}, "squash");
    b.node("Flatten", {"p"}, {"mask"});
    auto& pool = b.node("MaxPool", {"p"}, {"pooled"});
    vaiq::test::set_ints_attribute(pool, "kernel_shape", {1, 1});
    b.node("Equal", {"pooled", "p"}, {"is_peak"});
    vaiq::set_attribute(b.node("Cast", {"is_peak"}, {"peak_mask"}), "to", 1);
    b.node("Mul", {"peak_mask", "p"}, {"peaks"}, "keep_peaks");
    b.node("Identity", {"x"}, {"logits"});
    const auto model = b.build();
    using Kind = vaiq::OutputMeaning::Kind;
    const auto classes = vaiq::output_meaning(model, "classes");
    EXPECT_EQ(classes.kind, Kind::Argmax);
    EXPECT_EQ(classes.axis, 1);
    EXPECT_EQ(classes.source, "Softmax 'per_pixel'");
    EXPECT_EQ(vaiq::output_meaning(model, "mask").kind, Kind::Threshold) << "a reshape keeps decisions";
    EXPECT_EQ(vaiq::output_meaning(model, "peaks").kind, Kind::NonZero);
    const auto logits = vaiq::output_meaning(model, "logits");
    EXPECT_EQ(logits.kind, Kind::Argmax);
    EXPECT_TRUE(logits.source.empty()) << "logits: the last axis, as before";
    EXPECT_EQ(vaiq::output_meaning(model, "logits", 4).kind, Kind::Values)
        << "a map of rank 4 no op explains: its last axis is no class axis";
    EXPECT_EQ(vaiq::output_meaning(model, "classes", 4).kind, Kind::Argmax) << "a Softmax says where classes are";
}

namespace {

// A reference of one batch, `x` fed and output as it is, with `meaning`, and
// a candidate that adds `e` to x before `op` (or returns x + e).
vaiq::ReferenceBatches identity_reference(const Tensor& x, vaiq::OutputMeaning meaning) {
    vaiq::ReferenceBatches reference;
    reference.measured = {{0, "y", {}}};
    reference.feeds.push_back({{"x", x}});
    reference.outputs.push_back({x});
    reference.measured.front().meaning = std::move(meaning);
    return reference;
}

vaiq::Model plus(const std::vector<int64_t>& shape, const std::vector<float>& e) {
    GraphBuilder b;
    b.input("x", shape).output("y", shape);
    b.initializer("e", Tensor::from_values<float>(shape, e));
    b.node("Add", {"x", "e"}, {"y"});
    return b.build();
}

}  // namespace

// A segmenter's [N, C, H, W] Softmax: each pixel's class along axis 1, not the
// argmax over a row of pixels.
TEST(OutputMeaning, ASegmentersClassesAreCountedPerPixel) {
    // 2 classes, 1x4 pixels; class 1 wins at pixels 0 and 3.
    const auto x = Tensor::from_values<float>({1, 2, 1, 4}, std::vector<float>{0, 5, 1, 0, 1, 0, 0, 1});
    vaiq::OutputMeaning meaning;
    meaning.axis = 1;
    meaning.source = "Softmax 's'";
    std::vector<float> e(8, 0.0f);
    e[3] = 2;  // pixel 3: class 0 now wins
    const auto error = vaiq::measure_output(plus({1, 2, 1, 4}, e), identity_reference(x, meaning), 1);
    EXPECT_EQ(error.rows, 4) << "one decision a pixel";
    EXPECT_DOUBLE_EQ(error.top1_agreement, 0.75);
    // Read as rows over the last axis (4 pixels of one class), the change is not seen.
    const auto rows = vaiq::measure_output(plus({1, 2, 1, 4}, e), identity_reference(x, {}), 1);
    EXPECT_DOUBLE_EQ(rows.top1_agreement, 1.0);
}

// A mask's background agrees trivially: a map's decisions count as the IoU of
// the positives, so losing half an object is half, not 98 %.
TEST(OutputMeaning, AMasksAgreementIsTheIouOfItsPositives) {
    std::vector<float> p(100, 0.1f);
    for (int i = 0; i < 4; ++i) p[i] = 0.9f;  // a 4-pixel object in a 10x10 map
    const auto x = Tensor::from_values<float>({1, 1, 10, 10}, p);
    vaiq::OutputMeaning meaning;
    meaning.kind = vaiq::OutputMeaning::Kind::Threshold;
    meaning.source = "Sigmoid 'm'";
    std::vector<float> e(100, 0.0f);
    e[0] = e[1] = -0.8f;  // two of the object's pixels fall below 0.5
    const auto error = vaiq::measure_output(plus({1, 1, 10, 10}, e), identity_reference(x, meaning), 1);
    EXPECT_DOUBLE_EQ(error.top1_agreement, 0.5);
    EXPECT_EQ(error.rows, 4) << "the union of the positives";
    EXPECT_FALSE(identity_reference(x, meaning).decodes_samples()) << "a map decodes no samples";
    // A peak map: its nonzero elements.
    meaning.kind = vaiq::OutputMeaning::Kind::NonZero;
    std::vector<float> peaks(100, 0.0f), moved(100, 0.0f);
    peaks[10] = 0.3f, peaks[50] = 0.7f;
    moved[10] = -0.3f, moved[11] = 0.3f;  // one peak found a pixel off
    const auto y = Tensor::from_values<float>({1, 1, 10, 10}, peaks);
    const auto shifted = vaiq::measure_output(plus({1, 1, 10, 10}, moved), identity_reference(y, meaning), 1);
    EXPECT_DOUBLE_EQ(shifted.top1_agreement, 1.0 / 3.0) << "one of three positives in both";
}

// An embedding's or a feature map's values agree when they stay within 5 % of
// the float output's range, wherever its largest value moves.
TEST(OutputMeaning, AFeatureMapsValuesAgreeWithinATolerance) {
    std::vector<float> v(8);
    for (int i = 0; i < 8; ++i) v[i] = static_cast<float>(i);  // range 7: tolerance 0.35
    const auto x = Tensor::from_values<float>({1, 2, 1, 4}, v);
    vaiq::OutputMeaning meaning;
    meaning.kind = vaiq::OutputMeaning::Kind::Values;
    std::vector<float> e(8, 0.3f);
    e[7] = -1.0f;  // beyond the tolerance (and no longer the largest value)
    e[2] = 0.4f;   // beyond it
    const auto error = vaiq::measure_output(plus({1, 2, 1, 4}, e), identity_reference(x, meaning), 1);
    EXPECT_EQ(error.rows, 8);
    EXPECT_DOUBLE_EQ(error.top1_agreement, 6.0 / 8.0);
    EXPECT_FALSE(identity_reference(x, meaning).decodes_samples()) << "nor do feature values";
}

// Fast finetune's Trials: each trial's model is measured on the calibration
// data, the best kept and written. A MatMul and a Gemm with varied weights on 64
// rows a batch, so that the seeds' fits differ.
class FastFinetuneTrials : public MixedPrecision {
  protected:
    void SetUp() override {
        MixedPrecision::SetUp();
        GraphBuilder b;
        b.input("x", {64, 8}).output("y", {64, 8});
        std::vector<float> w1(128), w2(128);
        for (int i = 0; i < 128; ++i) {
            w1[i] = 0.037f * static_cast<float>((i * 7) % 23 - 11);
            w2[i] = 0.029f * static_cast<float>((i * 5) % 19 - 9);
        }
        b.initializer("w1", Tensor::from_values<float>({8, 16}, w1));
        b.initializer("w2", Tensor::from_values<float>({16, 8}, w2));
        b.node("MatMul", {"x", "w1"}, {"h"});
        b.node("Relu", {"h"}, {"r"});
        b.initializer("b2", Tensor::from_values<float>({8}, std::vector<float>(8, 0.25f)));
        b.node("Gemm", {"r", "w2", "b2"}, {"y"});
        vaiq::save_model(b.build(), dir_ / "in.onnx");
    }
    nlohmann::json run_trials(const std::string& yaml) {
        return vaiq::test::run_recipe_in(
            dir_, registry_, "random_data_reader_input_shape: [64, 8]\ninclude_fast_ft: true\n" + yaml, "t.yaml");
    }
};

TEST_F(FastFinetuneTrials, KeepTheFitWhoseModelAgreesBest) {
    for (const bool bias_correction : {false, true}) {
        const auto report =
            run_trials(fmt::format("extra_options:\n  BiasCorrection: {}\n"
                                   "  FastFinetune: {{Trials: 3, TrialMetric: sqnr, FixedSeed: 5}}\n",
                                   bias_correction));
        const auto& ft = report["fast_finetune"];
        EXPECT_EQ(ft["trials"]["metric"], "sqnr");
        const auto& runs = ft["trials"]["runs"];
        ASSERT_EQ(runs.size(), 3u);
        std::set<double> distinct;
        double best = -1e9;
        int64_t best_seed = -1;
        for (size_t i = 0; i < runs.size(); ++i) {
            EXPECT_EQ(runs[i]["seed"], 5 + static_cast<int64_t>(i));
            const double db = runs[i]["sqnr_db"].get<double>();
            distinct.insert(db);
            if (db > best) best = db, best_seed = runs[i]["seed"].get<int64_t>();
        }
        EXPECT_GT(distinct.size(), 1u) << "the seeds fit differently, so the choice matters";
        if (bias_correction) {
            EXPECT_EQ(
                report["bias_correction"]["layers"].get<int>() + report["bias_correction"]["left_as_fitted"].get<int>(),
                1)
                << "the Gemm's bias is corrected or left as its fit";
        }
        EXPECT_EQ(ft["seed"], best_seed);
        EXPECT_NEAR(output_sqnr(report), best, 1e-4) << "the model written is the trial kept, as it was measured";
    }
}

TEST_F(FastFinetuneTrials, RefuseNoTrialsAndAnUnknownMetric) {
    EXPECT_THROW(run_trials("extra_options:\n  FastFinetune: {Trials: 0}\n"), vaiq::InputError);
    EXPECT_THROW(run_trials("extra_options:\n  FastFinetune: {TrialMetric: accuracy}\n"), vaiq::InputError);
    EXPECT_FALSE(fs::exists(dir_ / "out.onnx"));
}
