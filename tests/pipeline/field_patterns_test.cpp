// Patterns of trained models users bring that broke plain recipes: a diagnosis
// that failed the run it was explaining, a peak test Equal(MaxPool(x), x) that
// rounding turned into peaks everywhere, and a head whose score channels share
// one 8-bit grid with offsets a hundred times wider.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <set>

#include "pipeline/pipeline.hpp"
#include "runtime/executor.hpp"
#include "sdk/npy.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"

namespace fs = std::filesystem;
using vaiq::Tensor;
using vaiq::test::GraphBuilder;
using vaiq::test::temp_dir;

namespace {

class FieldRun : public ::testing::Test {
  protected:
    void SetUp() override { registry_.load_default_paths(); }
    static constexpr const char* kCpu = "target: cpu\ncalibrate_method: MinMax\nactivation_type: QUInt8\n";
    static constexpr const char* kNpu =
        "target: npu_cnn\ncalibrate_method: MinMSE\nactivation_type: QUInt8\nenable_dpu: true\n"
        "extra_options: {ActivationSymmetric: true}\n";
    // `base` (cpu.yaml's settings) and `yaml` on `model`, on calibration data of smooth random images.
    nlohmann::json run(const vaiq::Model& model, const std::string& yaml = "", const std::string& base = kCpu) {
        dir_ = temp_dir();
        vaiq::save_model(model, dir_ / "in.onnx");
        const auto& in = model.graph().input(0).type().tensor_type().shape();
        std::vector<int64_t> shape;
        for (const auto& d : in.dim()) shape.push_back(d.dim_value());
        fs::create_directories(dir_ / "data");
        for (int i = 0; i < 4; ++i) vaiq::write_npy(dir_ / "data" / fmt::format("{}.npy", i), image(shape, i));
        return vaiq::test::run_recipe_in(
            dir_, registry_,
            base + "weight_type: QInt8\ncalibration_data_reader: " + (dir_ / "data").string() + "\n" + yaml);
    }
    // Blobs of several heights on a low background: local maxima a peak test finds.
    static Tensor image(const std::vector<int64_t>& shape, int seed) {
        std::mt19937 rng(static_cast<unsigned>(seed));
        std::uniform_real_distribution<float> u(0.0f, 1.0f);
        const int64_t h = shape[shape.size() - 2], w = shape.back();
        std::vector<float> v(static_cast<size_t>(vaiq::element_count(shape)), 0.0f);
        for (int blob = 0; blob < 6; ++blob) {
            const float cy = u(rng) * static_cast<float>(h), cx = u(rng) * static_cast<float>(w), a = 0.5f + u(rng);
            for (size_t i = 0; i < v.size(); ++i) {
                const auto y = static_cast<float>((static_cast<int64_t>(i) / w) % h), x = static_cast<float>(i % w);
                v[i] += a * std::exp(-((y - cy) * (y - cy) + (x - cx) * (x - cx)) / 6.0f);
            }
        }
        return Tensor::from_values<float>(shape, v);
    }
    std::vector<Tensor> outputs(const fs::path& model_path, const Tensor& input) {
        const auto model = vaiq::load_model(model_path);
        vaiq::runtime::Executor executor(model);
        return executor.run({{model.graph().input(0).name(), input}});
    }
    vaiq::PluginRegistry registry_;
    fs::path dir_;
};

double output_sqnr(const nlohmann::json& report, const std::string& name) {
    for (const auto& o : report["evaluation"]["outputs"])
        if (o["name"] == name) return o["sqnr_db"].is_number() ? o["sqnr_db"].get<double>() : 1e9;
    ADD_FAILURE() << "no output " << name;
    return 0;
}

// A TensorFlow export: NHWC between layers, a transpose pair around each
// convolution, the bias a separate Add that preparation folds.
vaiq::Model tensorflow_export() {
    GraphBuilder b;
    b.input("input:0", {1, 8, 8, 3}).output("out:0", {1, 8, 8, 4});
    std::string x = "input:0";
    int channels = 3;
    for (int i = 0; i < 3; ++i) {
        const auto at = [&](const std::string& what) { return fmt::format("conv2d_{}/{}", i, what); };
        b.initializer(at("w"), vaiq::test::ramp({4, channels, 3, 3}, -0.5f, 1.0f / (9.0f * channels)));
        b.initializer(at("b"), vaiq::test::ramp({1, 4, 1, 1}, -0.1f, 0.07f));
        vaiq::test::set_ints_attribute(b.node("Transpose", {x}, {at("Conv2D__1:0")}), "perm", {0, 3, 1, 2});
        vaiq::test::set_ints_attribute(b.node("Conv", {at("Conv2D__1:0"), at("w")}, {at("Conv2D:0")}, at("Conv2D")),
                                       "pads", {1, 1, 1, 1});
        b.node("Add", {at("Conv2D:0"), at("b")}, {at("BiasAdd:0")}, at("BiasAdd"));
        vaiq::test::set_ints_attribute(b.node("Transpose", {at("BiasAdd:0")}, {at("BiasAdd__128:0")}), "perm",
                                       {0, 2, 3, 1});
        x = i == 2 ? "out:0" : at("Relu:0");
        b.node(i == 2 ? "Identity" : "Relu", {at("BiasAdd__128:0")}, {x});
        channels = 4;
    }
    return b.build();
}

// Every output "low" (at 200 dB), so the run looks for the first diverging
// tensor in the given model and the quantized one: it once tapped a transpose
// the executor had cancelled and failed the run after evaluating it.
TEST_F(FieldRun, ADiagnosisOfATensorFlowExportNeverFailsTheRun) {
    const auto report = run(tensorflow_export(), "warn_output_sqnr_db: 200\nreport_html: true\n");
    EXPECT_TRUE(fs::exists(dir_ / "out.onnx"));
    EXPECT_FALSE(report.contains("diagnoses_unavailable")) << report["diagnoses_unavailable"].dump();
    ASSERT_TRUE(report["evaluation"].contains("first_divergence")) << report["evaluation"].dump();
    EXPECT_FALSE(report["evaluation"]["tensors"].empty());
}

// A recipe that makes the model channels-last, given the channels-first data the
// model took: the error says that preparation changed the inputs.
TEST_F(FieldRun, DataForTheInputsPreparationChangedIsAClearError) {
    try {
        run(vaiq::test::conv_relu_model(), "convert_nchw_to_nhwc: true\n");
        FAIL() << "NCHW data for an NHWC model";
    } catch (const vaiq::InputError& e) {
        EXPECT_NE(std::string(e.what()).find("preparation changed the model's inputs"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(dir_ / "out.onnx"));
}

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
    EXPECT_NE(text.find("tensors left float (float_fragile_inputs)"), std::string::npos) << text;
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

// Score channels of a few units next to offsets of hundreds, cut apart by two
// Slices: each piece gets its own grid, and the scores keep their precision.
vaiq::Model packed_head_model(bool split) {
    GraphBuilder b;
    b.input("x", {1, 1, 8, 8});
    std::vector<float> w(4, 0.0f);
    w[0] = 2.0f, w[1] = -1.5f, w[2] = 300.0f, w[3] = -250.0f;
    b.initializer("w", Tensor::from_values<float>({4, 1, 1, 1}, w));
    if (!split) {
        b.output("head", {1, 4, 8, 8});
        b.node("Conv", {"x", "w"}, {"head"}, "head_conv");
        return b.build();
    }
    b.output("scores", {1, 2, 8, 8}).output("offsets", {1, 2, 8, 8});
    for (const auto& [name, v] : {std::pair{"zero", 0}, std::pair{"one", 1}, std::pair{"two", 2}, std::pair{"four", 4}})
        b.initializer(name, Tensor::from_values<int64_t>({1}, std::vector<int64_t>{v}));
    b.node("Conv", {"x", "w"}, {"head"}, "head_conv");
    b.node("Slice", {"head", "zero", "two", "one"}, {"scores"}, "score_slice");
    b.node("Slice", {"head", "two", "four", "one"}, {"offsets"}, "offset_slice");
    return b.build();
}

// x -> two 1x1 Convs of two channels each -> Concat -> Conv. `scale` sizes the second
// branch; the first has a nearly dead channel (weights 0.001) beside a live one.
vaiq::Model concat_model(float scale) {
    GraphBuilder b;
    b.input("x", {1, 1, 8, 8}).output("y", {1, 1, 8, 8});
    b.initializer("wa", Tensor::from_values<float>({2, 1, 1, 1}, std::vector<float>{1.0f, 0.001f}));
    b.initializer("wy", Tensor::from_values<float>({1, 4, 1, 1}, std::vector<float>{0.5f, 0.5f, 0.01f, 0.01f}));
    b.initializer("wb", Tensor::from_values<float>({2, 1, 1, 1}, std::vector<float>{scale, -scale}));
    b.node("Conv", {"x", "wa"}, {"a"}, "branch_a");
    b.node("Conv", {"x", "wb"}, {"b"}, "branch_b");
    vaiq::set_attribute(b.node("Concat", {"a", "b"}, {"joined"}, "join"), "axis", 1);
    b.node("Conv", {"joined", "wy"}, {"y"}, "mix");
    return b.build();
}

// A concatenation is mixed where its branches are, not where one feature map's
// channels differ (a ReLU's nearly dead channel beside a live one, in every CNN).
TEST_F(FieldRun, AConcatenationIsMixedWhereItsBranchesAre) {
    const auto similar = run(concat_model(1.5f));
    EXPECT_TRUE(similar["mixed_scale_tensors"].empty()) << similar["mixed_scale_tensors"].dump();
    const auto apart = run(concat_model(300.0f));
    ASSERT_EQ(apart["mixed_scale_tensors"].size(), 1u) << apart["mixed_scale_tensors"].dump();
    const auto& m = apart["mixed_scale_tensors"][0];
    EXPECT_EQ(m["tensor"], "joined");
    EXPECT_EQ(m["narrow_channels"], nlohmann::json::array({0, 1})) << "the first branch's channels";
}

const nlohmann::json& mixed_scale(const nlohmann::json& report, const std::string& role) {
    for (const auto& m : report["mixed_scale_tensors"])
        if (m["role"] == role) return m;
    throw std::runtime_error("no mixed-scale " + role + " in " + report["mixed_scale_tensors"].dump());
}

TEST_F(FieldRun, AHeadTheGraphSplitsIsQuantizedPieceByPiece) {
    const auto shared = run(packed_head_model(true), "mixed_scale_ratio: 0\n");
    const auto split = run(packed_head_model(true));
    ASSERT_EQ(split["mixed_scale_tensors"].size(), 2u) << split.dump();
    const auto& m = mixed_scale(split, "activation");
    EXPECT_EQ(m["tensor"], "head");
    EXPECT_EQ(m["action"], "split");
    EXPECT_EQ(m["narrow_channels"], nlohmann::json::array({0, 1}));
    const auto& w = mixed_scale(split, "weight");
    EXPECT_EQ(w["tensor"], "w");
    EXPECT_EQ(w["action"], "per_channel") << "the scores' weights on the offsets' grid round to a step or two";
    EXPECT_LT(output_sqnr(shared, "scores"), 10.0) << "the scores on the offsets' grid";
    EXPECT_GT(output_sqnr(split, "scores"), 35.0);
    EXPECT_GT(output_sqnr(split, "offsets"), 35.0);
}

TEST_F(FieldRun, AHeadOnOneGridIsNamedWithWhatToDo) {
    const auto report = run(packed_head_model(false));
    EXPECT_TRUE(fs::exists(dir_ / "out.onnx"));
    const auto& m = mixed_scale(report, "activation");
    EXPECT_EQ(m["action"], "named");
    EXPECT_NE(m["advice"].get<std::string>().find("activation_type: QInt16"), std::string::npos) << m.dump();
    EXPECT_NE(m["advice"].get<std::string>().find("head_conv"), std::string::npos) << m.dump();
    const auto html = vaiq::test::slurp(dir_ / "out.report.html");
    EXPECT_NE(html.find("Channels on different scales"), std::string::npos) << "the page names it too";
}

// An NPU computes per tensor: a head's weights on scales far apart are named, not changed.
TEST_F(FieldRun, AHeadsWeightsAreNamedWhereTheTargetComputesPerTensor) {
    const auto report = run(packed_head_model(false), "", kNpu);
    const auto& w = mixed_scale(report, "weight");
    EXPECT_EQ(w["action"], "named");
    EXPECT_NE(w["advice"].get<std::string>().find("per_channel: true"), std::string::npos) << w.dump();
}

// A mask: Where(hidden, -inf, scores) before the Softmax, as decoders are
// exported. The masked scores and the -inf fill have no range; they stay float
// and the rest is quantized, where the run used to fail.
// scores = x w, kept = Where(x < 0.2, -inf, scores), y = Softmax(kept): an
// attention mask's fill, as exporters write it.
vaiq::Model masked_softmax() {
    GraphBuilder b(17);
    b.input("x", {1, 8, 8}).output("y", {1, 8, 8});
    std::vector<float> w(64);
    for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(static_cast<float>(i) * 0.7f);
    b.initializer("w", Tensor::from_values<float>({8, 8}, w));
    vaiq::test::set_attribute(b.node("Constant", {}, {"masked"}), "value_float",
                              -std::numeric_limits<float>::infinity());
    b.initializer("low", Tensor::from_values<float>({}, std::vector<float>{0.2f}));
    b.node("Less", {"x", "low"}, {"hidden"});  // a mask computed from the input, as exporters build one
    b.node("MatMul", {"x", "w"}, {"scores"});
    b.node("Where", {"hidden", "masked", "scores"}, {"kept"});
    vaiq::test::set_attribute(b.node("Softmax", {"kept"}, {"y"}), "axis", -1);
    return b.build();
}

TEST_F(FieldRun, AnAttentionMasksInfinitiesStayFloat) {
    const auto report = run(masked_softmax());
    const auto& not_finite = report["calibration"]["not_finite"];
    EXPECT_NE(std::find(not_finite.begin(), not_finite.end(), "kept"), not_finite.end()) << not_finite.dump();
    EXPECT_GT(output_sqnr(report, "y"), 20.0);
    const auto written = vaiq::load_model(dir_ / "out.onnx");
    int quantized = 0;
    for (const auto& node : written.graph().node()) {
        quantized += node.op_type() == "QuantizeLinear";
        for (const auto& in : node.input()) {
            if (in == "masked") {
                EXPECT_EQ(node.op_type(), "Where") << "the -inf fill is read as it is";
            }
        }
    }
    EXPECT_GE(quantized, 1) << "the MatMul's input is still quantized";
}

// Block float activations calibrate nothing, but calibration still watches
// them: a block holding the mask's -inf would turn into NaNs.
TEST_F(FieldRun, ABlockFloatActivationHoldingAMasksInfinityStaysFloat) {
    const auto report = run(masked_softmax(), "activation_type: QBFP16\n", "target: cpu\ncalibrate_method: MinMax\n");
    const auto& not_finite = report["calibration"]["not_finite"];
    EXPECT_NE(std::find(not_finite.begin(), not_finite.end(), "kept"), not_finite.end()) << not_finite.dump();
    EXPECT_GT(output_sqnr(report, "y"), 20.0) << "no NaN reaches the output";
}

// A decoder's past is empty in every calibration batch: no range, so it stays float.
TEST_F(FieldRun, AnInputEmptyInEveryBatchStaysFloat) {
    GraphBuilder b(17);
    b.input("x", {1, 2, 4}).input("past", {1, 0, 4}).output("y", {1, 2, 4});
    b.initializer("w", vaiq::test::ramp({4, 4}, -0.5f, 0.07f));
    vaiq::test::set_attribute(b.node("Concat", {"past", "x"}, {"all"}), "axis", 1);
    b.node("MatMul", {"all", "w"}, {"y"});
    dir_ = temp_dir();
    vaiq::save_model(b.build(), dir_ / "in.onnx");
    for (int i = 0; i < 3; ++i) {
        const auto sample = dir_ / "data" / std::to_string(i);
        fs::create_directories(sample);
        vaiq::write_npy(sample / "x.npy", vaiq::test::ramp({1, 2, 4}, -1.0f + 0.2f * static_cast<float>(i), 0.3f));
        vaiq::write_npy(sample / "past.npy", Tensor(vaiq::DataType::Float, {1, 0, 4}));
    }
    const auto report = vaiq::test::run_recipe_in(
        dir_, registry_, std::string(kCpu) + "calibration_data_reader: " + (dir_ / "data").string() + "\n");
    const auto& empty = report["calibration"]["empty"];
    EXPECT_NE(std::find(empty.begin(), empty.end(), "past"), empty.end()) << report["calibration"].dump();
    EXPECT_GT(output_sqnr(report, "y"), 20.0);
}

}  // namespace
