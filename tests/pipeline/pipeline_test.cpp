// The quantization phases on small graphs: data readers, the plan's placement
// rules, calibration, parameters and the evaluation that lands in the report.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <fstream>

#include "data/data_reader.hpp"
#include "pipeline/calibration.hpp"
#include "pipeline/pipeline.hpp"
#include "pipeline/planner.hpp"
#include "report/diagnosis.hpp"
#include "report/evaluation.hpp"
#include "runtime/executor.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/format.hpp"
#include "vaiq/qdq_view.hpp"
#include "vaiq/reader.hpp"

namespace fs = std::filesystem;
using vaiq::DataType;
using vaiq::Tensor;
using vaiq::test::GraphBuilder;
using vaiq::test::ramp;
using vaiq::test::temp_dir;
using vaiq::test::write_text;

using vaiq::test::error_of;

namespace {

vaiq::Recipe recipe_from(const std::string& yaml) {
    return vaiq::load_recipe(write_text(temp_dir() / "r.yaml", "recipe_version: 1\ncalibrate_method: MinMax\n" + yaml));
}

vaiq::Model two_input_model() {
    GraphBuilder b;
    b.input("a", {1, 3}).input("b", {1, 3}).output("y", {1, 3});
    b.node("Add", {"a", "b"}, {"y"}, "add");
    return b.build();
}

// ---------------------------------------------------------------- data readers

// A reader plugin that claims every path at `claim`; its batches' source names it.
class FixedClaim final : public vaiq::Reader {
  public:
    FixedClaim(int claim, std::string name) : claim_(claim), name_(std::move(name)) {}
    int claim(const fs::path&) const override { return claim_; }
    std::unique_ptr<vaiq::DataReader> open(const fs::path&, const vaiq::Model& model,
                                           const std::string&) const override {
        class Named final : public vaiq::DataReader {
          public:
            Named(std::unique_ptr<vaiq::DataReader> inner, std::string name)
                : inner_(std::move(inner)), name_(std::move(name)) {}
            std::optional<vaiq::Batch> next() override {
                auto batch = inner_->next();
                if (batch) batch->source = name_;
                return batch;
            }
            void rewind() override { inner_->rewind(); }
            size_t items() const override { return inner_->items(); }

          private:
            std::unique_ptr<vaiq::DataReader> inner_;
            std::string name_;
        };
        return std::make_unique<Named>(vaiq::random_data_reader(model, nlohmann::json::array(), nullptr, 1), name_);
    }

  private:
    int claim_;
    std::string name_;
};

vaiq::PluginInstance<vaiq::Reader> fixed_claim(int claim, const std::string& name) {
    return {new FixedClaim(claim, name), [](vaiq::Reader* r) { delete r; }};
}

TEST(DataReaders, APathOpensWithTheReaderThatClaimsItMost) {
    const auto dir = temp_dir();
    const auto model = two_input_model();
    vaiq::DataReaders readers;
    readers.add("low", fixed_claim(1, "low"));
    readers.add("none", fixed_claim(0, "none"));
    EXPECT_EQ(readers.open(dir, model, "calibration data")->next()->source, "low");
    readers.add("high", fixed_claim(3, "high"));
    EXPECT_EQ(readers.open(dir, model, "calibration data")->next()->source, "high") << "the highest claim";
    readers.add("also_high", fixed_claim(3, "also_high"));
    const auto tie = error_of([&] { readers.open(dir, model, "calibration data"); });
    EXPECT_NE(tie.find("readers 'high' and 'also_high' both claim it at 3"), std::string::npos) << tie;
    EXPECT_NE(error_of([&] {
                  readers.open(dir / "missing", model, "evaluation data");
              }).find("evaluation data " + (dir / "missing").string() + " does not exist"),
              std::string::npos);
    vaiq::DataReaders none;
    none.add("none", fixed_claim(0, "none"));
    const auto unclaimed = error_of([&] { none.open(dir, model, "calibration data"); });
    EXPECT_NE(unclaimed.find("is nothing the readers take (readers: none;"), std::string::npos) << unclaimed;
}

TEST(DataReaders, TheInstalledReadersTakeTensorFilesAndImages) {
    const auto dir = temp_dir();
    vaiq::write_npy(dir / "a.npy", ramp({1, 3}));
    GraphBuilder b;
    b.input("x", {1, 3}).output("y", {1, 3});
    b.node("Relu", {"x"}, {"y"});
    auto reader = vaiq::open_data_reader(dir, b.build());
    const auto batch = reader->next();
    ASSERT_TRUE(batch);
    EXPECT_EQ(batch->feeds.at("x").data<float>()[1], 1.0f);
    const auto empty = temp_dir();
    const auto error = error_of([&] { vaiq::open_data_reader(empty, two_input_model()); });
    EXPECT_NE(error.find("(readers: images, random, tensor_files;"), std::string::npos) << error;
}

// ------------------------------------------------------------------ the plan

class Plan : public ::testing::Test {
  protected:
    void SetUp() override {
        registry_.load_default_paths();
        target_ = registry_.create<vaiq::Target>("cpu", {});
    }
    vaiq::DraftPlan plan(const vaiq::Model& model, const std::string& yaml) {
        return plan_recipe(model, recipe_from(yaml));
    }
    vaiq::DraftPlan plan_recipe(const vaiq::Model& model, const vaiq::Recipe& recipe) {
        return vaiq::plan_tensors(vaiq::RunSettings::of(recipe), model, *target_,
                                  vaiq::decide_nodes(recipe, model, *target_), calibrators_);
    }
    vaiq::PluginRegistry registry_;
    vaiq::PluginInstance<vaiq::Target> target_;
    // Each method's calibrator with its default options.
    vaiq::CalibratorSet calibrators_{[this](const std::string& method) {
        return registry_.create<vaiq::Calibrator>(
            method, registry_.resolve_options(registry_.require(vaiq::PluginKind::Calibrator, method, ""), nullptr));
    }};
};

TEST_F(Plan, AsymmetricActivationsLetQuantizeAbsorbTheRelu) {
    const auto p = plan(vaiq::test::conv_relu_model(), "activation_type: QUInt8\n");
    EXPECT_EQ(p.find("conv_out"), nullptr) << "Conv -> Relu -> Q needs no pair between Conv and Relu";
    ASSERT_NE(p.find("x"), nullptr);
    EXPECT_EQ(p.find("w")->role, vaiq::TensorRole::Weight);
    EXPECT_TRUE(p.find("w")->spec.symmetric) << "WeightSymmetric defaults to true";
    EXPECT_EQ(p.find("b")->role, vaiq::TensorRole::Bias);
    EXPECT_EQ(p.find("b")->bias_input, "x");
    EXPECT_EQ(p.find("b")->bias_weight, "w");
    EXPECT_EQ(p.find("y")->calibrate_method, "minmax");
    EXPECT_EQ(p.observed(), (std::vector<std::string>{"x", "y"}));
}

TEST_F(Plan, SymmetricActivationsKeepThePairAndInheritTheReluRange) {
    const auto p = plan(vaiq::test::conv_relu_model(), "extra_options: {ActivationSymmetric: true}\n");
    ASSERT_NE(p.find("conv_out"), nullptr);
    EXPECT_EQ(p.find("conv_out")->range_from, "y");
    // UseUnsignedReLU makes the Relu output asymmetric, and then the pair is absorbed again.
    const auto u =
        plan(vaiq::test::conv_relu_model(), "extra_options: {ActivationSymmetric: true, UseUnsignedReLU: true}\n");
    EXPECT_EQ(u.find("conv_out"), nullptr);
    EXPECT_FALSE(u.find("y")->spec.symmetric);
    EXPECT_TRUE(u.find("x")->spec.symmetric);
}

vaiq::Model matmul_reshape_softmax() {
    GraphBuilder b;
    b.input("x", {2, 4}).input("k", {4, 4}).output("s", {1, 8}).output("t", {2, 4});
    b.initializer("w", ramp({4, 4}, -1.0f, 0.1f))
        .initializer("shape", Tensor::from_values<int64_t>({2}, std::vector<int64_t>{1, 8}));
    b.node("MatMul", {"x", "w"}, {"m"}, "mm_const");
    b.node("MatMul", {"x", "k"}, {"t"}, "mm_dynamic");
    b.node("Reshape", {"m", "shape"}, {"r"}, "reshape");
    b.node("Softmax", {"r"}, {"s"}, "softmax");
    return b.build();
}

TEST_F(Plan, DataMovementSharesParametersAndSoftmaxOutputIsZeroToOne) {
    // (The Softmax output is a graph output, a score that stays float unless float_fragile_inputs is off.)
    const auto p = plan(matmul_reshape_softmax(), "per_channel: true\nfloat_fragile_inputs: false\n");
    ASSERT_NE(p.find("r"), nullptr);
    EXPECT_EQ(p.find("r")->share_with, "m");
    EXPECT_EQ(p.find("shape"), nullptr) << "integer constants are not quantized";
    ASSERT_TRUE(p.find("s")->fixed_range.has_value());
    EXPECT_EQ(p.find("s")->fixed_range->max, 1.0f);
    EXPECT_TRUE(p.find("w")->spec.per_channel);
    EXPECT_EQ(p.find("w")->spec.axis, 1) << "MatMul weights are per output column";
    EXPECT_EQ(p.find("k")->role, vaiq::TensorRole::Activation) << "a non-constant B is an activation";
}

TEST_F(Plan, ExtraOptionsNarrowThePlan) {
    auto p = plan(matmul_reshape_softmax(),
                  "extra_options: {MatMulConstBOnly: true, OpTypesToExcludeOutputQuantization: [Softmax]}\n");
    EXPECT_EQ(p.find("k"), nullptr);
    EXPECT_EQ(p.find("t"), nullptr);
    EXPECT_EQ(p.find("s"), nullptr);
    ASSERT_EQ(p.skipped.size(), 1u);
    EXPECT_EQ(p.skipped[0].first, "mm_dynamic");
    p = plan(matmul_reshape_softmax(), "op_types_to_quantize: [Reshape, Softmax]\n");
    ASSERT_EQ(p.skipped.size(), 1u);
    EXPECT_EQ(p.skipped[0].first, "reshape") << "Reshape's input is not quantized";
    ASSERT_NE(p.find("r"), nullptr) << "Softmax quantizes its own input";
    EXPECT_EQ(p.find("r")->share_with, "");
    p = plan(matmul_reshape_softmax(),
             "op_types_to_quantize: [Reshape]\nextra_options: {ForceQuantizeNoInputCheck: true}\n");
    ASSERT_NE(p.find("r"), nullptr);
    EXPECT_EQ(p.find("r")->share_with, "m");
}

// A LayerNorm spelled out before opset 17 over a class token (zeros, as a
// ViT's starts) and three rows of data: the token's variance is zero.
vaiq::Model class_token_layer_norm() {
    GraphBuilder b(13);
    b.input("x", {1, 3, 8}).output("y", {1, 4, 8});
    b.initializer("token", Tensor::from_values<float>({1, 1, 8}, std::vector<float>(8, 0.0f)));
    vaiq::set_attribute(b.node("Concat", {"token", "x"}, {"tokens"}, "concat"), "axis", 1);
    vaiq::test::add_spelled_layer_norm(b, "tokens", "y", 8);
    return b.build();
}

TEST_F(Plan, ASpelledOutLayerNormKeepsItsStatisticsFloat) {
    const auto model = class_token_layer_norm();
    const auto p = plan(model, "");
    for (const char* t :
         {"ln/ReduceMean_out", "ln/Sub_out", "ln/Pow_out", "ln/ReduceMean_1_out", "ln/Add_out", "ln/Sqrt_out"})
        EXPECT_EQ(p.find(t), nullptr) << t;
    EXPECT_NE(p.find("ln/Div_out"), nullptr) << "the scale's input is quantized";
    EXPECT_NE(p.find("ln/gamma"), nullptr);
    EXPECT_NE(p.find("y"), nullptr);
    const auto all = plan(model, "extra_options: {FloatLayerNormStatistics: false}\n");
    EXPECT_NE(all.find("ln/Add_out"), nullptr);
}

// The token's variance plus epsilon is below half a step of its quantized
// range: quantized, it is zero, and 0 / sqrt(0) makes the row NaN.
TEST(LayerNormStatistics, AZeroVarianceRowNormalizesToItsShiftInsteadOfNaN) {
    vaiq::PluginRegistry registry;
    registry.load_default_paths();
    for (const bool float_statistics : {true, false}) {
        const auto dir = temp_dir();
        vaiq::save_model(class_token_layer_norm(), dir / "in.onnx");
        const auto report = vaiq::test::run_recipe_in(
            dir, registry,
            fmt::format("target: cpu\ncalibrate_method: MinMax\nrandom_data_reader_input_shape: [1, 3, 8]\n"
                        "extra_options: {{FloatLayerNormStatistics: {}}}\n",
                        float_statistics));
        const auto& sqnr = report["evaluation"]["outputs"][0]["sqnr_db"];
        const bool good = sqnr.is_number() && sqnr.get<double>() > 25.0;
        EXPECT_EQ(good, float_statistics) << "SQNR " << sqnr.dump();
        if (!float_statistics) continue;
        const auto written = vaiq::load_model(dir / "out.onnx");
        vaiq::runtime::Executor quantized(written);
        const auto y = quantized.run({{"x", ramp({1, 3, 8}, -1.0f, 0.1f)}})[0];
        for (int64_t i = 0; i < 8; ++i)  // the token's row: beta, to a step of the output
            EXPECT_NEAR(y.data<float>()[i], 0.2f * static_cast<float>(i) - 0.3f, 0.05f) << i;
    }
}

// Block float attributes vaiq does not compute are refused by name, not computed otherwise.
TEST(BlockFloatSettings, WhatIsNotComputedIsRefusedByName) {
    vaiq::PluginRegistry registry;
    registry.load_default_paths();
    const std::pair<const char*, const char*> cases[] = {
        {"activation_type: QBFP\nextra_options: {BFPAttributes: {bfp_method: to_bfp_prime}}\n", "to_bfp_prime"},
        {"activation_type: QBFP\nextra_options: {BFPAttributes: {bit_width: 12}}\n", "bit_width 12"},
        {"weight_type: QMX\nextra_options: {MXAttributes: {rounding_mode: 3}}\n", "rounding_mode 3"},
        {"activation_type: QMXINT8\nextra_options: {MXAttributes: {block_size: 0}}\n", "block_size 0"},
    };
    for (const auto& [yaml, expected] : cases) {
        const auto dir = temp_dir();
        vaiq::save_model(vaiq::test::conv_relu_model(), dir / "in.onnx");
        try {
            vaiq::test::run_recipe_in(dir, registry, std::string("target: cpu\n") + yaml);
            ADD_FAILURE() << yaml << " was accepted";
        } catch (const vaiq::InputError& e) {
            EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
        }
        EXPECT_FALSE(fs::exists(dir / "out.onnx"));
    }
}

// Each phase reports its time and the process's peak memory at its end, which can only grow.
TEST(Report, EachPhaseHasItsTimeAndThePeakMemorySoFar) {
    vaiq::PluginRegistry registry;
    registry.load_default_paths();
    const auto dir = temp_dir();
    vaiq::save_model(class_token_layer_norm(), dir / "in.onnx");
    const auto report = vaiq::test::run_recipe_in(
        dir, registry, "target: cpu\ncalibrate_method: MinMax\nrandom_data_reader_input_shape: [1, 3, 8]\n");
    ASSERT_GE(report["phases"].size(), 8u);
    double before = 0;
    for (const auto& phase : report["phases"]) {
        EXPECT_GE(phase["seconds"].get<double>(), 0.0) << phase.dump();
        const double peak = phase["peak_mb"].get<double>();
        EXPECT_GE(peak, std::max(before, 1.0)) << phase.dump();
        before = peak;
    }
    EXPECT_EQ(report["phases"].back()["name"], "save");
}

TEST_F(Plan, AnInitializerThatIsAlsoAnInputIsNotAConstant) {
    auto model = vaiq::test::conv_relu_model();
    auto* w = model.graph().add_input();
    w->set_name("w");
    w->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
    const auto p = plan(model, "");
    EXPECT_EQ(p.find("w")->role, vaiq::TensorRole::Activation);
    EXPECT_FALSE(p.find("w")->constant);
}

TEST_F(Plan, PerChannelBelowOpset13IsAClearError) {
    EXPECT_NE(error_of([&] { plan(vaiq::test::conv_relu_model(11), "per_channel: true\n"); }).find("opset 13"),
              std::string::npos);
}

// ------------------------------------------------- calibration and parameters

TEST_F(Plan, CalibrationAndParametersFollowTheDocumentedFormulas) {
    const auto model = vaiq::test::conv_relu_model();
    auto draft = plan(model, "activation_type: QUInt8\nper_channel: true\n");
    auto data = vaiq::random_data_reader(model, nlohmann::json::array(), nlohmann::json::parse(R"({"x": [-2, 3]})"), 4);
    const auto outcome = vaiq::calibrate(model, draft, *data, 1);
    EXPECT_EQ(outcome.batches, 4);
    const auto x = outcome.results.at("x").range;
    EXPECT_LT(x.min, -1.5f);
    EXPECT_GT(x.max, 2.5f);
    std::map<std::string, vaiq::TensorRange> ranges;
    const auto plan = vaiq::compute_parameters(model, draft, outcome, &ranges);
    const auto* xq = plan.find("x");
    ASSERT_NE(xq, nullptr);
    EXPECT_FLOAT_EQ(xq->params.scale[0], static_cast<float>((double(x.max) - x.min) / 255.0));
    EXPECT_EQ(xq->params.zero_point[0],
              static_cast<int64_t>(std::nearbyint(-x.min / ((double(x.max) - x.min) / 255.0))));
    const auto* w = plan.find("w");
    ASSERT_EQ(w->params.scale.size(), 3u) << "one scale per output channel";
    EXPECT_EQ(w->params.axis, 0);
    EXPECT_EQ(w->params.zero_point[0], 0) << "symmetric int8";
    const auto* bias = plan.find("b");
    ASSERT_EQ(bias->params.scale.size(), 3u);
    for (int c = 0; c < 3; ++c) EXPECT_EQ(bias->params.scale[c], xq->params.scale[0] * w->params.scale[c]);
    EXPECT_EQ(bias->params.type, vaiq::QuantType::QInt32);
}

// A search computes a plan per candidate: the weights' parameters are kept
// from the first, and computed again only for a weight planned another way.
TEST_F(Plan, AWeightsParametersAreKeptForTheNextPlanOfTheSameSpec) {
    const auto model = vaiq::test::conv_relu_model();
    auto draft = plan(model, "per_channel: true\n");
    auto data = vaiq::random_data_reader(model, nlohmann::json::array(), nullptr, 2);
    const auto outcome = vaiq::calibrate(model, draft, *data, 1);
    vaiq::ConstantParamsCache cache;
    const auto first = vaiq::compute_parameters(model, draft, outcome, nullptr, &cache);
    ASSERT_EQ(cache.weights.count("w"), 1u);
    EXPECT_EQ(cache.weights.at("w").params.scale, first.find("w")->params.scale);
    EXPECT_EQ(cache.weights.count("b"), 0u) << "a bias follows its input's and weight's scales";
    // Marked, so that a second plan shows where its parameters came from.
    cache.weights.at("w").params.scale[0] = 0.5f;
    const auto second = vaiq::compute_parameters(model, draft, outcome, nullptr, &cache);
    EXPECT_EQ(second.find("w")->params.scale[0], 0.5f);
    EXPECT_EQ(second.find("w")->spec, first.find("w")->spec);
    EXPECT_EQ(second.find("b")->params.scale[0], second.find("x")->params.scale[0] * 0.5f);
    auto wider = draft;
    for (auto& t : wider.tensors)
        if (t.tensor == "w") t.spec.type = vaiq::QuantType::QInt16;
    const auto third = vaiq::compute_parameters(model, wider, outcome, nullptr, &cache);
    EXPECT_EQ(third.find("w")->params.type, vaiq::QuantType::QInt16);
    EXPECT_LT(third.find("w")->params.scale[0], first.find("w")->params.scale[0]) << "computed for its new type";
}

TEST_F(Plan, FloatTypesNeedNoCalibrationAndKeepAFloatBias) {
    const auto model = vaiq::test::conv_relu_model();
    auto draft = plan(model, "activation_type: QBFloat16\nweight_type: QFloat16\n");
    EXPECT_TRUE(draft.observed().empty()) << "nothing to calibrate";
    const auto plan = vaiq::compute_parameters(model, draft, {}, nullptr);
    for (const auto& t : plan.tensors) {
        EXPECT_EQ(t.params.scale, std::vector<float>{1.0f}) << t.tensor;
        EXPECT_FALSE(t.spec.power_of_two) << t.tensor;
    }
    EXPECT_EQ(plan.find("x")->params.type, vaiq::QuantType::QBFloat16);
    EXPECT_EQ(plan.find("w")->params.type, vaiq::QuantType::QFloat16);
    EXPECT_EQ(plan.find("b")->params.type, vaiq::QuantType::QFloat16) << "the bias follows float weights";
}

TEST_F(Plan, Int32BiasesThatWouldSaturateGetAWiderScale) {
    // int32 activations and weights: input scale x weight scale is ~1e-19, far too
    // small for a bias of 0.1..0.3; the widened scale keeps it.
    const auto model = vaiq::test::conv_relu_model();
    auto draft = plan(model, "activation_type: QInt32\nweight_type: QInt32\n");
    auto data = vaiq::random_data_reader(model, nlohmann::json::array(), nullptr, 2);
    const auto outcome = vaiq::calibrate(model, draft, *data, 1);
    const auto plan = vaiq::compute_parameters(model, draft, outcome, nullptr);
    const auto* b = plan.find("b");
    ASSERT_NE(b, nullptr);
    ASSERT_EQ(b->params.scale.size(), 1u);
    const auto quantized = vaiq::quantize_tensor(vaiq::test::ramp({3}, 0.1f, 0.1f), b->params, "b");
    const auto stored = quantized.data<int32_t>();
    for (int c = 0; c < 3; ++c) {
        EXPECT_LT(stored[c], 2147483647) << c;
        EXPECT_NEAR(stored[c] * b->params.scale[0], 0.1f * (c + 1), 1e-6f) << c;
    }
}

TEST_F(Plan, TensorsThatTurnOutNotToBeFloatAreDropped) {
    GraphBuilder b;
    b.input("x", {1, 4}).output("y", {1}, DataType::Int64);
    b.node("ArgMax", {"x"}, {"y"}, "argmax");
    const auto model = b.build();
    auto draft = plan(model, "float_fragile_inputs: false\n");  // else x, which a ranking reads, stays float
    ASSERT_NE(draft.find("y"), nullptr) << "planned before its type is known";
    auto data = vaiq::random_data_reader(model, nlohmann::json::array(), nullptr, 1);
    const auto outcome = vaiq::calibrate(model, draft, *data, 1);
    EXPECT_EQ(outcome.not_float, std::vector<std::string>{"y"});
    vaiq::drop_tensors(draft, outcome.not_float);
    EXPECT_EQ(draft.find("y"), nullptr);
    EXPECT_NE(draft.find("x"), nullptr);
}

// Records the batches it sees and whether two calls ever overlapped.
class RecordingObserver final : public vaiq::RangeObserver {
  public:
    void observe(const vaiq::TensorView<float>& batch) override {
        if (busy_.exchange(true)) overlapped_ = true;
        seen_.emplace_back(batch.data.begin(), batch.data.end());
        busy_ = false;
    }
    vaiq::CalibrationResult result() const override { return {}; }
    const std::vector<std::vector<float>>& seen() const { return seen_; }
    bool overlapped() const { return overlapped_; }

  private:
    std::atomic<bool> busy_{false}, overlapped_{false};
    std::vector<std::vector<float>> seen_;
};

// Batches run several at a time when there are threads for them, but each
// observer sees them one at a time and in the data's order, as with one thread.
TEST_F(Plan, ObserversSeeTheBatchesInTheDataOrderWhateverTheThreads) {
    const auto model = vaiq::test::conv_relu_model();
    const auto draft = plan(model, "");
    auto data = vaiq::random_data_reader(model, nlohmann::json::array(), nullptr, 16);
    std::vector<std::vector<float>> inputs;
    while (auto batch = data->next()) {
        const auto x = batch->feeds.at("x").data<float>();
        inputs.emplace_back(x.begin(), x.end());
    }
    std::map<std::string, std::vector<std::vector<float>>> serial;
    for (int threads : {1, 4}) {
        vaiq::Observations observations;
        std::map<std::string, RecordingObserver*> recorders;
        for (const auto& name : draft.observed()) {
            auto recorder = std::make_unique<RecordingObserver>();
            recorders[name] = recorder.get();
            observations.observers[name] = std::move(recorder);
        }
        ASSERT_GE(recorders.size(), 2u);
        std::vector<std::string> outputs_of;
        vaiq::observe(observations, model, draft, *data, threads, {},
                      [&](const vaiq::Batch& batch, std::vector<Tensor>) { outputs_of.push_back(batch.source); });
        EXPECT_EQ(observations.batches, 16);
        ASSERT_EQ(outputs_of.size(), 16u);
        for (size_t b = 0; b < outputs_of.size(); ++b)
            EXPECT_EQ(outputs_of[b], fmt::format("random batch {}", b + 1)) << threads;
        EXPECT_EQ(recorders.at("x")->seen(), inputs) << threads << " threads: the input's batches out of order";
        for (const auto& [name, recorder] : recorders) {
            EXPECT_FALSE(recorder->overlapped()) << name;
            if (threads == 1) serial[name] = recorder->seen();
            else EXPECT_EQ(recorder->seen(), serial.at(name)) << name << " with " << threads << " threads";
        }
    }
}

// ---------------------------------------------------------------- evaluation

TEST(Evaluation, IdenticalModelsAgreeExactlyAndLabelsGiveAccuracy) {
    GraphBuilder b;
    b.input("x", {2, 3}).output("y", {2, 3});
    b.node("Relu", {"x"}, {"y"});
    const auto model = b.build();
    const auto dir = temp_dir();
    vaiq::write_npy(dir / "a.npy", Tensor::from_values<float>({2, 3}, std::vector<float>{0, 1, 5, 9, 2, 1}));
    auto data = vaiq::open_data_reader(dir / "a.npy", model);
    const auto labels = Tensor::from_values<int64_t>({2}, std::vector<int64_t>{2, 1});
    const auto e = vaiq::compare_outputs(model, model, *data, &labels, 1);
    ASSERT_EQ(e.outputs.size(), 1u);
    EXPECT_TRUE(std::isinf(e.outputs[0].sqnr_db));
    EXPECT_DOUBLE_EQ(e.outputs[0].cosine, 1.0);
    EXPECT_EQ(e.outputs[0].top1_agreement, 1.0);
    EXPECT_EQ(e.samples, 2);
    EXPECT_EQ(e.float_accuracy, 0.5) << "row 0 argmax 2 is right, row 1 argmax 0 is wrong";
    EXPECT_EQ(e.to_json()["outputs"][0]["sqnr_db"], "inf");
}

// Conv -> BatchNormalization -> Clip(0, 6): folding the BatchNormalization keeps the
// function, so evaluation compares against the outputs calibration computed (the given
// model does not run again) and finds what running it finds; replacing the Clip by a
// Relu changes the function, so the given model is the reference again.
TEST(Evaluation, APreparationThatKeepsTheFunctionIsComparedWithCalibrationsOutputs) {
    GraphBuilder b;
    b.input("x", {1, 2, 4, 4}).output("y", {1, 3, 4, 4});
    b.initializer("w", ramp({3, 2, 1, 1}, -0.6f, 0.2f));
    b.initializer("gamma", ramp({3}, 0.5f, 0.25f));
    b.initializer("beta", ramp({3}, -0.2f, 0.3f));
    b.initializer("mean", ramp({3}, 0.1f, -0.05f));
    b.initializer("var", ramp({3}, 0.8f, 0.4f));
    b.initializer("lo", Tensor::from_values<float>({}, std::vector<float>{0.0f}));
    b.initializer("hi", Tensor::from_values<float>({}, std::vector<float>{6.0f}));
    b.node("Conv", {"x", "w"}, {"c"});
    b.node("BatchNormalization", {"c", "gamma", "beta", "mean", "var"}, {"n"});
    b.node("Clip", {"n", "lo", "hi"}, {"y"});
    const auto model = b.build();
    const auto dir = temp_dir();
    vaiq::save_model(model, dir / "in.onnx");
    fs::create_directories(dir / "data");
    for (int k = 0; k < 4; ++k)
        vaiq::write_npy(dir / "data" / ("sample_" + std::to_string(k) + ".npy"),
                        ramp({1, 2, 4, 4}, -3.0f + static_cast<float>(k), 0.11f * static_cast<float>(k + 1)));
    vaiq::PluginRegistry registry;
    registry.load_default_paths();
    auto run = [&](const std::string& extra) {
        return vaiq::test::run_recipe_in(dir, registry, "calibration_data_reader: data\n" + extra);
    };
    const auto kept = run("");
    EXPECT_EQ(kept["evaluation"]["reference"], "prepared model (its preparation keeps the function), as calibrated");
    bool folded = false;
    for (const auto& p : kept["passes"]) folded |= p["changed"] == true && p["keeps_function"] == true;
    EXPECT_TRUE(folded) << kept["passes"].dump();
    auto data = vaiq::open_data_reader(dir / "data", model);
    const auto direct = vaiq::compare_outputs(model, vaiq::load_model(dir / "out.onnx"), *data, nullptr, 1);
    EXPECT_NEAR(kept["evaluation"]["outputs"][0]["sqnr_db"].get<double>(), direct.outputs[0].sqnr_db, 1e-3)
        << "the prepared model's outputs stand for the given model's";
    EXPECT_EQ(kept["evaluation"]["samples"], 4);
    EXPECT_FALSE(kept.contains("preparation_error")) << "nothing to report where the function was kept";

    const auto changed = run("extra_options: {ReplaceClip6Relu: true}\n");
    EXPECT_EQ(changed["evaluation"]["reference"], "input model");
}

// Without held-out data, evaluation compares the first 32 calibration batches
// and says so; evaluation_batches: 0 compares them all, and held-out data is
// compared whole.
TEST(Evaluation, CalibrationDataIsComparedOnItsFirstThirtyTwoBatchesByDefault) {
    GraphBuilder b;
    b.input("x", {1, 4}).output("y", {1, 4});
    b.initializer("w", ramp({4, 4}, -0.5f, 0.07f));
    b.node("MatMul", {"x", "w"}, {"y"});
    const auto dir = temp_dir();
    vaiq::save_model(b.build(), dir / "in.onnx");
    fs::create_directories(dir / "data");
    for (int k = 0; k < 40; ++k)
        vaiq::write_npy(dir / "data" / fmt::format("s{:02}.npy", k), ramp({1, 4}, -1.0f + 0.05f * k, 0.3f));
    vaiq::PluginRegistry registry;
    registry.load_default_paths();
    auto run = [&](const std::string& extra) {
        return vaiq::test::run_recipe_in(dir, registry,
                                         "calibration_data_reader: data\nreport_html: false\n" + extra)["evaluation"];
    };
    const auto limited = run("");
    EXPECT_EQ(limited["samples"], 32);
    EXPECT_EQ(limited["batches_limit"], 32);
    const auto all = run("evaluation_batches: 0\n");
    EXPECT_EQ(all["samples"], 40);
    EXPECT_FALSE(all.contains("batches_limit"));
    const auto held_out = run("evaluation_data: data\n");
    EXPECT_EQ(held_out["samples"], 40) << "held-out data is compared whole";
}

// A reader that yields fewer batches once rewound (a stream consumed as it is read).
class ShrinkingReader final : public vaiq::DataReader {
  public:
    std::optional<vaiq::Batch> next() override {
        if (given_ >= (rewinds_ > 1 ? 1 : 3)) return std::nullopt;
        ++given_;
        return vaiq::Batch{{{"x", Tensor::from_values<float>({2, 3}, std::vector<float>{0, 1, 5, 9, 2, 1})}},
                           "batch " + std::to_string(given_)};
    }
    void rewind() override {
        ++rewinds_;
        given_ = 0;
    }
    size_t items() const override { return 3; }

  private:
    int given_ = 0, rewinds_ = 0;
};

// The float model runs over the data first, then the quantized one: a reader
// that cannot give the same batches twice is named, not compared against nothing.
TEST(Evaluation, DataThatEndsEarlyOnTheSecondPassIsAClearError) {
    GraphBuilder b;
    b.input("x", {2, 3}).output("y", {2, 3});
    b.node("Relu", {"x"}, {"y"});
    const auto model = b.build();
    ShrinkingReader data;
    EXPECT_EQ(error_of([&] { vaiq::compare_outputs(model, model, data, nullptr, 1); }),
              "the evaluation data ended early on its second pass: batch 2 (batch 2) is missing");
}

}  // namespace

namespace {

// The documented PowerOfTwoMethods give every scale a power of two: activations
// from the calibrator's position, weights from their own search, biases as the
// product of the two.
TEST_F(Plan, PowerOfTwoMethodsGiveEveryTensorAPowerOfTwoScale) {
    const auto model = vaiq::test::conv_relu_model();
    for (const char* method : {"MinMSE", "NonOverflow"}) {
        const auto recipe =
            vaiq::load_recipe(write_text(temp_dir() / "r.yaml", std::string("recipe_version: 1\ncalibrate_method: ") +
                                                                    method + "\nactivation_type: QUInt8\n"));
        auto draft = plan_recipe(model, recipe);
        EXPECT_TRUE(draft.find("w")->spec.power_of_two);
        auto data =
            vaiq::random_data_reader(model, nlohmann::json::array(), nlohmann::json::parse(R"({"x": [-2, 3]})"), 3);
        const auto outcome = vaiq::calibrate(model, draft, *data, 1);
        const auto plan = vaiq::compute_parameters(model, draft, outcome);
        ASSERT_EQ(plan.tensors.size(), 4u);
        for (const auto& t : plan.tensors)
            for (float s : t.params.scale) {
                const double e = std::log2(static_cast<double>(s));
                EXPECT_EQ(e, std::round(e)) << method << " " << t.tensor << " scale " << s;
            }
    }
}

}  // namespace

namespace {

// What the qdq format writes reads back as the float graph and the plan's parameters.
TEST_F(Plan, AWrittenQdqModelReadsBackAsItsGraphAndParameters) {
    const auto model = vaiq::test::conv_relu_model();
    const auto recipe = recipe_from("activation_type: QUInt8\n");
    auto draft = plan_recipe(model, recipe);
    auto data = vaiq::random_data_reader(model, nlohmann::json::array(), nullptr, 2);
    const auto plan = vaiq::compute_parameters(model, draft, vaiq::calibrate(model, draft, *data, 1));
    auto written = model;
    registry_
        .create<vaiq::Format>(
            "qdq", registry_.resolve_options(registry_.require(vaiq::PluginKind::Format, "qdq", ""), nullptr))
        ->emit(written, plan);

    const auto view = vaiq::read_qdq(written);
    std::vector<std::string> ops;
    for (const auto& n : view.graph.graph().node()) ops.push_back(n.op_type());
    EXPECT_EQ(ops, (std::vector<std::string>{"Conv", "Relu"}));
    const auto& conv = view.graph.graph().node(0);
    EXPECT_EQ(conv.input(0), "x") << "the activation pair collapses into the tensor it quantizes";
    ASSERT_EQ(view.plan.tensors.size(), plan.tensors.size());
    for (const auto& t : plan.tensors) {
        // Stored weights are known by their DequantizeLinear's output.
        const auto* back = view.plan.find(t.tensor == "w" ? conv.input(1) : t.tensor == "b" ? conv.input(2) : t.tensor);
        ASSERT_NE(back, nullptr) << t.tensor;
        EXPECT_EQ(back->params.scale, t.params.scale) << t.tensor;
        EXPECT_EQ(back->params.zero_point, t.params.zero_point) << t.tensor;
        EXPECT_EQ(back->params.type, t.params.type) << t.tensor;
    }
}

// Every Q/DQ-style format reads back as the plan it wrote (a format's own
// pairs through its conversion to ONNX Runtime's native form).
TEST_F(Plan, EveryPairFormatReadsBackAsItsPlan) {
    const auto model = vaiq::test::conv_relu_model();
    const auto recipe =
        vaiq::load_recipe(write_text(temp_dir() / "r.yaml",
                                     "recipe_version: 1\ncalibrate_method: NonOverflow\n"
                                     "activation_type: QInt8\nextra_options: {ActivationSymmetric: true}\n"));
    auto draft = plan_recipe(model, recipe);
    auto data = vaiq::random_data_reader(model, nlohmann::json::array(), nullptr, 2);
    const auto plan = vaiq::compute_parameters(model, draft, vaiq::calibrate(model, draft, *data, 1));
    for (const std::string format : {"qdq", "vitis_qdq", "fixneuron"}) {
        auto written = model;
        const auto writer = registry_.create<vaiq::Format>(
            format, registry_.resolve_options(registry_.require(vaiq::PluginKind::Format, format, ""), nullptr));
        writer->emit(written, plan);
        if (format != "qdq") writer->to_native(written);  // its own pairs as standard Q/DQ
        const auto view = vaiq::read_qdq(written);
        std::vector<std::string> ops;
        for (const auto& n : view.graph.graph().node()) ops.push_back(n.op_type());
        EXPECT_EQ(ops, (std::vector<std::string>{"Conv", "Relu"})) << format;
        ASSERT_EQ(view.plan.tensors.size(), plan.tensors.size()) << format;
        const auto& conv = view.graph.graph().node(0);
        EXPECT_EQ(conv.input(0), "x") << format;
        for (const auto& t : plan.tensors) {
            const auto* back = view.plan.find(t.tensor == "w"   ? conv.input(1)
                                              : t.tensor == "b" ? conv.input(2)
                                                                : t.tensor);
            ASSERT_NE(back, nullptr) << format << " " << t.tensor;
            EXPECT_EQ(back->params.scale, t.params.scale) << format << " " << t.tensor;
            EXPECT_EQ(back->params.zero_point, t.params.zero_point) << format << " " << t.tensor;
            EXPECT_EQ(back->params.type, t.params.type) << format << " " << t.tensor;
        }
    }
}

}  // namespace

namespace {

// ------------------------------------------------- whole runs on the NPU target

// The pattern that zeroed the PP-OCRv4 detector on the NPU: a layer's output
// scaled and shifted by scalar constants (x * 0.943 + 3, PP-LCNet's learnable
// affine blocks and HardSwish), and a HardSigmoid reading a tensor with a far
// wider range than it can tell apart (DBNet's logits).
vaiq::Model scalar_affine_model() {
    GraphBuilder b;
    b.input("x", {1, 2, 4, 4}).output("y", {1, 3, 4, 4}).output("g", {1, 3, 4, 4});
    b.initializer("w", ramp({3, 2, 1, 1}, -0.6f, 0.2f));
    b.initializer("k", Tensor::from_values<float>({1}, std::vector<float>{0.943f}));
    b.initializer("three", Tensor::from_values<float>({}, std::vector<float>{3.0f}));
    b.initializer("wide", Tensor::from_values<float>({}, std::vector<float>{40.0f}));
    b.node("Conv", {"x", "w"}, {"c"});
    b.node("Mul", {"c", "k"}, {"m"});
    b.node("Add", {"m", "three"}, {"y"});
    b.node("Mul", {"c", "wide"}, {"s"});
    b.node("HardSigmoid", {"s"}, {"g"});
    return b.build();
}

class NpuRun : public ::testing::Test {
  protected:
    void SetUp() override { registry_.load_default_paths(); }
    // `extra_options`: more entries of that map, each after ", ".
    nlohmann::json run(const vaiq::Model& model, const std::string& yaml, const std::string& extra_options = "") {
        const auto dir = temp_dir();
        vaiq::save_model(model, dir / "in.onnx");
        output_ = dir / "out.onnx";
        return vaiq::test::run_recipe_in(
            dir, registry_,
            "target: npu_cnn\ncalibrate_method: MinMSE\nactivation_type: QUInt8\nweight_type: QInt8\n"
            "enable_dpu: true\nextra_options: {ActivationSymmetric: true" +
                extra_options + "}\nrandom_data_reader_input_shape: [1, 2, 4, 4]\n" + yaml);
    }
    static double sqnr(const nlohmann::json& report, const std::string& output) {
        for (const auto& o : report["evaluation"]["outputs"])
            if (o["name"] == output) return o["sqnr_db"].is_number() ? o["sqnr_db"].get<double>() : 1e9;
        ADD_FAILURE() << "no output " << output;
        return 0;
    }
    static const nlohmann::json& tensor(const nlohmann::json& report, const std::string& name) {
        for (const auto& t : report["tensors"])
            if (t["tensor"] == name) return t;
        throw std::runtime_error("no tensor " + name);
    }
    vaiq::PluginRegistry registry_;
    fs::path output_;
};

TEST_F(NpuRun, ScalarConstantsKeepTheirValuesWithSymmetricUint8) {
    const auto report = run(scalar_affine_model(), "");
    // Stored with the activation type, zero point 128: 126 steps up, not 254.
    for (const auto& [name, value] : {std::pair{"k", 0.943}, std::pair{"three", 3.0}}) {
        const auto& t = tensor(report, name);
        EXPECT_EQ(t["zero_point"], 128) << name;
        const double scale = t["scale"].get<double>();
        const double stored = std::min(std::nearbyint(value / scale) + 128.0, 254.0);
        EXPECT_NEAR((stored - 128.0) * scale, value, 0.01 * value) << name << " at scale " << scale;
    }
    EXPECT_GT(sqnr(report, "y"), 30.0) << "the constants lost their value (the output once halved)";
}

TEST_F(NpuRun, AHardSigmoidsInputIsCalibratedOverTheRangeItDistinguishes) {
    const auto report = run(scalar_affine_model(), "");
    const auto& s = tensor(report, "s");
    EXPECT_FLOAT_EQ(s["range"][0].get<float>(), -2.5f);
    EXPECT_FLOAT_EQ(s["range"][1].get<float>(), 2.5f);
    EXPECT_LE(s["scale"].get<double>(), 2.5 / 64) << "a scale for [-2.5, 2.5], not for the full +-40 x |c|";
    EXPECT_GT(sqnr(report, "g"), 25.0);
}

TEST_F(NpuRun, AnOutputBelowTheFloorFailsTheRunAndWritesNothing) {
    const auto ok = run(scalar_affine_model(), "min_output_sqnr_db: 20\n");
    EXPECT_TRUE(fs::exists(output_));
    EXPECT_FALSE(ok["evaluation"].contains("first_divergence")) << "nothing below warn_output_sqnr_db";
    const std::string message = error_of([&] { run(scalar_affine_model(), "min_output_sqnr_db: 200\n"); });
    EXPECT_NE(message.find("min_output_sqnr_db 200: output 'y' has"), std::string::npos) << message;
    EXPECT_NE(message.find("nothing was written"), std::string::npos) << message;
    EXPECT_FALSE(fs::exists(output_));
    EXPECT_FALSE(fs::exists(fs::path(output_).replace_extension(".report.json")));
}

// A quantized tensor holding NaN (a division by a zero that quantization made)
// diverges with an SQNR of -infinity, not NaN (which compares false with any threshold).
TEST(CompareTensors, NaNInTheQuantizedValuesIsMinusInfinity) {
    auto model_with = [](const std::string& op) {
        vaiq::test::GraphBuilder b;
        b.input("x", {1, 4}).output("y", {1, 4});
        b.node(op, {"x"}, {"c"}, "first");
        b.node("Neg", {"c"}, {"y"}, "second");
        return b.build();
    };
    const auto reference = model_with("Abs"), broken = model_with("Sqrt");  // Sqrt of -1: NaN
    const std::map<std::string, vaiq::Tensor> feeds{
        {"x", vaiq::Tensor::from_values<float>({1, 4}, std::vector<float>{-1.0f, 4.0f, 9.0f, 16.0f})}};
    std::map<std::string, double> seen;
    vaiq::compare_tensors(reference, broken, feeds, 1, {}, [&](const vaiq::TensorComparison& c) {
        seen[c.tensor] = c.sqnr_db;
        return true;
    });
    ASSERT_TRUE(seen.count("c")) << "the first tensor is compared";
    EXPECT_EQ(seen["c"], -std::numeric_limits<double>::infinity());
}

// The DPU's HardSigmoid for a swish's Sigmoid changes what the float model
// computes: the report says how much before quantization, and the switch that
// keeps the Sigmoid (quantized at 8 bits as any activation) removes that error.
TEST_F(NpuRun, TheReportSaysWhatTheSigmoidsApproximationCostsAndItsSwitchKeepsTheSigmoid) {
    auto run_with = [&](const std::string& convert) {
        return run(vaiq::test::swish_model(), "", ", ConvertSigmoidToHardSigmoid: " + convert);
    };
    const auto hard = run_with("true");
    ASSERT_TRUE(hard.contains("preparation_error")) << hard.dump();
    const auto& passes = hard["preparation_error"]["passes"];
    EXPECT_NE(std::find(passes.begin(), passes.end(), "convert_sigmoid_to_hard_sigmoid"), passes.end()) << passes;
    const double approximation = hard["preparation_error"]["outputs"][0]["sqnr_db"].get<double>();
    EXPECT_LT(approximation, 40.0) << "x * HardSigmoid(x) is not x * Sigmoid(x)";
    EXPECT_GT(approximation, 10.0);
    EXPECT_GE(sqnr(hard, "y"), approximation - 3.0) << "the approximation is most of the quantized model's error";

    const auto kept = run_with("false");
    EXPECT_FALSE(kept.contains("preparation_error")) << kept["preparation_error"].dump();
    EXPECT_EQ(tensor(kept, "s")["type"], "QUInt8") << "the Sigmoid is quantized as any activation";
    EXPECT_GT(sqnr(kept, "y"), sqnr(hard, "y") + 3.0);
}

TEST_F(NpuRun, ALowOutputNamesTheFirstTensorWhoseErrorReachesTheWarning) {
    // At 200 dB every quantized tensor is "low": the first in graph order is the Conv's output.
    const auto report = run(scalar_affine_model(), "warn_output_sqnr_db: 200\n");
    ASSERT_TRUE(report["evaluation"].contains("first_divergence"));
    EXPECT_EQ(report["evaluation"]["first_divergence"]["tensor"], "c");
    EXPECT_LT(report["evaluation"]["first_divergence"]["sqnr_db"].get<double>(), 200.0);
}

}  // namespace

namespace {

// A dynamic batch leaves the exporter's shape arithmetic (Shape -> Gather ->
// Unsqueeze -> Concat, int64, no declared types) in the graph: float quant
// types, which calibrate nothing, must still leave those tensors alone.
TEST(FloatTypes, LeaveUntypedShapeArithmeticAlone) {
    GraphBuilder b;
    b.input("x", {1, 4, 8}).output("y", {1, 32});
    b.initializer("i0", Tensor::from_values<int64_t>({1}, std::vector<int64_t>{0}));
    b.initializer("rest", Tensor::from_values<int64_t>({1}, std::vector<int64_t>{-1}));
    b.initializer("pos", ramp({1, 4, 8}, -1.0f, 0.05f));
    b.node("Shape", {"x"}, {"shape"});
    b.node("Gather", {"shape", "i0"}, {"n"});
    vaiq::test::set_attribute(b.node("Concat", {"n", "rest"}, {"target"}), "axis", 0);
    b.node("Add", {"x", "pos"}, {"xp"});
    b.node("Reshape", {"xp", "target"}, {"y"});
    auto model = b.build();
    for (auto* v : {model.graph().mutable_input(0), model.graph().mutable_output(0)})
        v->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0)->set_dim_param("N");
    const auto dir = temp_dir();
    vaiq::save_model(model, dir / "in.onnx");
    vaiq::PluginRegistry registry;
    registry.load_default_paths();
    for (const std::string type : {"QFloat16", "QBFloat16"}) {
        const auto report = vaiq::test::run_recipe_in(dir, registry,
                                                      "activation_type: " + type + "\nweight_type: " + type +
                                                          "\nrandom_data_reader_input_shape: [2, 4, 8]\n");
        EXPECT_GT(report["evaluation"]["outputs"][0]["sqnr_db"].get<double>(), 30.0) << type;
        for (const auto& t : report["tensors"])
            EXPECT_TRUE(t["tensor"] != "n" && t["tensor"] != "target" && t["tensor"] != "shape") << t.dump();
    }
}

// per_channel on an opset-11 model: the run converts it to 13 (DequantizeLinear's
// axis) rather than refusing, and says so in the report.
TEST(PerChannel, UpgradesAnOlderModelToOpset13) {
    const auto dir = temp_dir();
    vaiq::save_model(vaiq::test::conv_relu_model(11), dir / "in.onnx");
    vaiq::PluginRegistry registry;
    registry.load_default_paths();
    const auto report =
        vaiq::test::run_recipe_in(dir, registry, "per_channel: true\nrandom_data_reader_input_shape: [1, 2, 4, 4]\n");
    EXPECT_EQ(report["opset_converted"]["from"], 11);
    EXPECT_EQ(report["opset_converted"]["to"], 13);
    const auto out = vaiq::load_model(dir / "out.onnx");
    EXPECT_EQ(out.opset(), 13);
    bool per_channel_weight = false;
    for (const auto& n : out.graph().node())
        per_channel_weight |= n.op_type() == "DequantizeLinear" && vaiq::int_attribute(n, "axis", -1) == 0 &&
                              n.input(0).find('w') != std::string::npos;
    EXPECT_TRUE(per_channel_weight) << vaiq::test::dump_graph(out);
    EXPECT_EQ(vaiq::load_model(dir / "in.onnx").opset(), 11) << "the input model is never modified";
}

}  // namespace

// An algorithm's context offers each service only in the stages that have it,
// and takes corrected initializers only of the names, shapes and types the model has.
TEST(AlgorithmContext, AServiceItsStageLacksIsNamedAndInitializersKeepTheirForm) {
    GraphBuilder b;
    b.input("x", {1, 4}).output("y", {1, 4});
    b.initializer("bias", Tensor::from_values<float>({4}, std::vector<float>{1, 2, 3, 4}));
    b.node("Add", {"x", "bias"}, {"y"});
    const auto model = b.build();
    const auto dir = temp_dir();
    vaiq::write_npy(dir / "x.npy", Tensor::from_values<float>({1, 4}, std::vector<float>{0, 1, 2, 3}));
    auto data = vaiq::open_data_reader(dir / "x.npy", model);
    vaiq::test::TestAlgorithmContext c(model, *data);
    vaiq::AlgorithmContext& context = c.context;  // as a plugin sees it
    try {
        context.agreement(model);
        ADD_FAILURE() << "a test context measures agreement";
    } catch (const vaiq::InternalError& e) {
        EXPECT_NE(std::string(e.what()).find("agreement() is not offered"), std::string::npos) << e.what();
    }
    EXPECT_THROW(context.set_precision({"x"}, {}), vaiq::InternalError);
    EXPECT_THROW(context.set_initializers({{"nothing", Tensor::from_values<float>({4}, std::vector<float>(4))}}),
                 vaiq::InputError);
    EXPECT_THROW(context.set_initializers({{"bias", Tensor::from_values<float>({2}, std::vector<float>(2))}}),
                 vaiq::InputError)
        << "another shape";
    context.set_initializers({{"bias", Tensor::from_values<float>({4}, std::vector<float>{4, 3, 2, 1})}});
    ASSERT_EQ(c.initializers.count("bias"), 1u);
    EXPECT_EQ(c.initializers.at("bias").data<float>()[0], 4.0f);
}

// A plugin's forking runner forks at a convolution's output, which the
// executor's channels-last layout would otherwise compute only for taps, and
// resumes from there: the Relu after it sees the replacement.
TEST(AlgorithmContext, AForkingRunnerResumesFromAConvolutionsOutput) {
    GraphBuilder b;
    b.input("x", {1, 1, 2, 2}).output("y", {1, 1, 2, 2});
    b.initializer("w", Tensor::from_values<float>({1, 1, 1, 1}, std::vector<float>{2}));
    b.node("Conv", {"x", "w"}, {"c"});
    b.node("Relu", {"c"}, {"y"});
    const auto model = b.build();
    const auto dir = temp_dir();
    const auto x = Tensor::from_values<float>({1, 1, 2, 2}, std::vector<float>{-1, 1, 2, 3});
    vaiq::write_npy(dir / "x.npy", x);
    auto data = vaiq::open_data_reader(dir / "x.npy", model);
    vaiq::test::TestAlgorithmContext c(model, *data);
    vaiq::AlgorithmContext& context = c.context;
    const auto runner = context.forking_runner(model, {"c"});
    std::vector<float> seen, resumed;
    const auto y = runner->run_forking(
        {{"x", x}}, {"c"}, [&](const std::string&, const Tensor& value, const vaiq::ResumeFunction& resume) {
            seen.assign(value.data<float>().begin(), value.data<float>().end());
            const auto out = resume(Tensor::from_values<float>({1, 1, 2, 2}, std::vector<float>{5, -5, 1, -1}));
            resumed.assign(out[0].data<float>().begin(), out[0].data<float>().end());
        });
    EXPECT_EQ(seen, (std::vector<float>{-2, 2, 4, 6}));
    EXPECT_EQ(resumed, (std::vector<float>{5, 0, 1, 0})) << "the Relu of the replacement";
    EXPECT_EQ(std::vector<float>(y[0].data<float>().begin(), y[0].data<float>().end()),
              (std::vector<float>{0, 2, 4, 6}));
    EXPECT_THROW(context.runner(model)->run_forking({{"x", x}}, {"c"}, {}), vaiq::InputError)
        << "a plain runner computes the output in channels-last and hides it";
}
