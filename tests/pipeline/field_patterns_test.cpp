// Patterns of trained models users bring that broke plain recipes: a diagnosis
// that failed the run it was explaining, data for inputs preparation changed,
// an attention mask's infinities, an input empty in every batch. (Comparisons,
// scores and channels on different scales: the fragile_inputs and mixed_scales
// algorithms' tests.)
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "field_run.hpp"
#include "pipeline/pipeline.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"

namespace fs = std::filesystem;
using vaiq::Tensor;
using vaiq::test::FieldRun;
using vaiq::test::GraphBuilder;
using vaiq::test::output_sqnr;
using vaiq::test::temp_dir;

namespace {

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
