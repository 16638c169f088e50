// vaiq tune's parts: targets read from the command line and scored on a
// report, and space files (explicit candidates, grids cheapest first).
#include <gtest/gtest.h>

#include <cmath>

#include "pipeline/calibration_cache.hpp"
#include "recipe/recipe.hpp"
#include "test_support.hpp"
#include "tune/tune.hpp"
#include "vaiq/error.hpp"

namespace {

using vaiq::TuneTarget;

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const vaiq::InputError& e) {
        return e.what();
    }
    return "no error";
}

TEST(TuneTarget, ReadsABoundAndScoresEachMeasureOnAReport) {
    const auto report = nlohmann::json::parse(R"({"evaluation": {
        "accuracy": {"float": 0.95, "quantized": 0.93},
        "perplexity": {"float": 4.0, "quantized": 4.2},
        "outputs": [{"sqnr_db": 31.5, "cosine_similarity": 0.999, "top1_agreement": 0.98}, {"sqnr_db": 1.0}]}})");
    const auto drop = TuneTarget::parse("accuracy_drop<=0.01");
    EXPECT_FALSE(drop.at_least);
    EXPECT_NEAR(drop.score(report, "m.onnx"), 0.02, 1e-12);
    EXPECT_FALSE(drop.met(drop.score(report, "m.onnx")));
    EXPECT_TRUE(drop.met(0.01)) << "the bound itself meets it";
    EXPECT_TRUE(TuneTarget::parse("accuracy_drop<=0.005").met(0.975 - 0.97)) << "0.0050000000000000044 too";
    EXPECT_FALSE(TuneTarget::parse("accuracy_drop<=0.005").met(0.0051));
    EXPECT_DOUBLE_EQ(TuneTarget::parse("accuracy>=0.9").score(report, "m.onnx"), 0.93);
    EXPECT_NEAR(TuneTarget::parse("perplexity_increase<=0.1").score(report, "m.onnx"), 0.05, 1e-12);
    EXPECT_DOUBLE_EQ(TuneTarget::parse("perplexity<=5").score(report, "m.onnx"), 4.2);
    EXPECT_DOUBLE_EQ(TuneTarget::parse("sqnr_db>=30").score(report, "m.onnx"), 31.5) << "the first output";
    EXPECT_DOUBLE_EQ(TuneTarget::parse("cosine>=0.99").score(report, "m.onnx"), 0.999);
    EXPECT_DOUBLE_EQ(TuneTarget::parse("top1_agreement>=0.97").score(report, "m.onnx"), 0.98);
    const auto exact = nlohmann::json::parse(R"({"evaluation": {"outputs": [{"sqnr_db": null}]}})");
    EXPECT_TRUE(std::isinf(TuneTarget::parse("sqnr_db>=30").score(exact, "m.onnx"))) << "an exact output";
    EXPECT_EQ(TuneTarget::parse("sqnr_db>=30").text(), "sqnr_db>=30");
    auto own = TuneTarget::parse("metric>=0.5");
    own.metric = [](const std::filesystem::path& model, const nlohmann::json& r) {
        return model.filename() == "m.onnx" ? r["evaluation"]["accuracy"]["quantized"].get<double>() : -1.0;
    };
    EXPECT_DOUBLE_EQ(own.score(report, "dir/m.onnx"), 0.93) << "the caller's metric, of the model and its report";
}

TEST(TuneTarget, RefusesWhatItCannotReadOrScore) {
    EXPECT_NE(error_of([] { TuneTarget::parse("accuracy=0.9"); }).find("MEASURE>=VALUE"), std::string::npos);
    EXPECT_NE(error_of([] { TuneTarget::parse("accuracy>=high"); }).find("'high' is not a number"), std::string::npos);
    EXPECT_NE(error_of([] { TuneTarget::parse("latency<=3"); }).find("unknown measure 'latency'"), std::string::npos);
    EXPECT_NE(error_of([] { TuneTarget::parse("metric>=1").score({}, "m.onnx"); }).find("no metric was given"),
              std::string::npos);
    const auto unlabelled = nlohmann::json::parse(R"({"evaluation": {"outputs": [{"sqnr_db": 20}]}})");
    EXPECT_NE(
        error_of([&] { TuneTarget::parse("accuracy>=0.9").score(unlabelled, "m.onnx"); }).find("evaluation_labels"),
        std::string::npos);
}

TEST(TuneSpace, CandidatesInOrderThenTheGridCheapestFirst) {
    const auto dir = vaiq::test::temp_dir();
    const auto file = vaiq::test::write_text(dir / "space.yaml", R"(
candidates:
  - name: as written
  - set: {per_channel: true, extra_options: {SmoothQuant: true, SmoothQuantAlpha: 0.75}}
  - recipe: cpu_accurate.yaml
dimensions:
  calibrate_method: [MinMax, Percentile, Entropy]
  include_cle: [false, true]
)");
    const auto space = vaiq::load_tune_space(file);
    ASSERT_EQ(space.size(), 3u + 6u);
    EXPECT_EQ(space[0].name, "as written");
    EXPECT_TRUE(space[0].assignments.empty());
    EXPECT_EQ(space[1].assignments,
              (std::vector<std::string>{"extra_options.SmoothQuant=true", "extra_options.SmoothQuantAlpha=0.75",
                                        "per_channel=true"}));
    ASSERT_TRUE(space[2].recipe);
    EXPECT_EQ(space[2].recipe->filename(), "cpu_accurate.yaml");
    // The grid: position sums 0, 1, 1, 2, 2, 3; ties in the order the values were written.
    std::vector<std::string> names;
    for (size_t i = 3; i < space.size(); ++i) names.push_back(space[i].name);
    EXPECT_EQ(names, (std::vector<std::string>{"first values", "include_cle=true", "calibrate_method=\"Percentile\"",
                                               "calibrate_method=\"Percentile\", include_cle=true",
                                               "calibrate_method=\"Entropy\"",
                                               "calibrate_method=\"Entropy\", include_cle=true"}));
    EXPECT_EQ(space[3].assignments, (std::vector<std::string>{"calibrate_method=\"MinMax\"", "include_cle=false"}));
}

TEST(TuneSpace, RefusesUnknownKeysAndFindsTheShippedSpaces) {
    const auto dir = vaiq::test::temp_dir();
    EXPECT_NE(error_of([&] {
                  vaiq::load_tune_space(vaiq::test::write_text(dir / "a.yaml", "candidate: []\n"));
              }).find("unknown key 'candidate'"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  vaiq::load_tune_space(vaiq::test::write_text(dir / "b.yaml", "candidates: [{settings: {}}]\n"));
              }).find("unknown candidate key 'settings'"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  vaiq::load_tune_space(vaiq::test::write_text(dir / "c.yaml", "dimensions: {x: 1}\n"));
              }).find("dimensions.x is a list"),
              std::string::npos);
    EXPECT_NE(error_of([&] { vaiq::load_tune_space(dir / "none.yaml"); }).find("no such space file"),
              std::string::npos);
    for (const char* shipped : {"cpu.yaml", "cnn_npu.yaml", "transformer_npu.yaml"}) {
        const auto space = vaiq::load_tune_space(shipped);
        ASSERT_GE(space.size(), 3u) << shipped;
        EXPECT_EQ(space.front().name, "as written") << shipped;
        ASSERT_TRUE(space.back().recipe) << shipped << ": the accurate recipe last";
        EXPECT_NE(space.back().recipe->string().find("_accurate.yaml"), std::string::npos);
        // Every candidate's settings hold on the recipe of the same name.
        for (const auto& c : space)
            EXPECT_EQ(error_of([&] { vaiq::load_recipe(c.recipe ? *c.recipe : shipped, c.assignments); }), "no error")
                << shipped << ": " << c.name;
    }
}

}  // namespace

// Runs sharing a calibration cache (vaiq tune's trials): a run that observes the
// same tensors of the same prepared model on the same data with the same
// calibrators takes the first run's calibration and writes what calibrating
// afresh writes; another calibrator calibrates.
TEST(CalibrationCache, ARunOfTheSameCalibrationTakesItAndWritesTheSameModel) {
    vaiq::PluginRegistry registry;
    registry.load_default_paths();
    const auto dir = vaiq::test::temp_dir();
    auto run = [&](const std::string& name, std::vector<std::string> settings,
                   std::shared_ptr<vaiq::CalibrationCache> cache) {
        settings.push_back("model_output=" + nlohmann::json((dir / (name + ".onnx")).string()).dump());
        vaiq::RunOptions options;
        options.calibration_cache = std::move(cache);
        return vaiq::run_pipeline(vaiq::load_recipe(VAIQ_SOURCE_DIR "/examples/mnist/mnist_cpu.yaml", settings),
                                  registry, options)
            .report_json;
    };
    auto reused = [](const nlohmann::json& report) { return report["calibration"].value("reused", false); };
    const auto cache = std::make_shared<vaiq::CalibrationCache>();
    EXPECT_FALSE(reused(run("first", {}, cache)));
    ASSERT_EQ(cache->entries.size(), 1u);
    // Weights are not observed: per-channel weights calibrate the same activations.
    const auto second = run("second", {"per_channel=true"}, cache);
    EXPECT_TRUE(reused(second));
    EXPECT_EQ(cache->reused, 1);
    const auto alone = run("alone", {"per_channel=true"}, nullptr);
    EXPECT_FALSE(reused(alone));
    EXPECT_EQ(vaiq::test::slurp(dir / "second.onnx"), vaiq::test::slurp(dir / "alone.onnx"));
    EXPECT_EQ(second["evaluation"]["outputs"], alone["evaluation"]["outputs"]) << "compared against the same outputs";
    EXPECT_EQ(second["mixed_scales"], alone["mixed_scales"]);
    // Another calibrator observes anew, and is kept too.
    EXPECT_FALSE(reused(run("percentile", {"calibrate_method=Percentile"}, cache)));
    EXPECT_EQ(cache->entries.size(), 2u);
    EXPECT_EQ(cache->reused, 1);
}
