// A third party's path: install vaiq, build a plugin out of tree with
// find_package(vaiq) + vaiq_add_plugin(), see it in `vaiq plugins`, use it in a recipe.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <fstream>

#include "test_support.hpp"
#include "vaiq/qdq_view.hpp"

namespace fs = std::filesystem;

namespace {

int shell(const std::string& command, const fs::path& log) {
    const int status = std::system((command + " > " + log.string() + " 2>&1").c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

using vaiq::test::slurp;

// vaiq installed into a scratch prefix, and tests/external_plugin built against it once.
class ExternalPlugin : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        work_ = new fs::path(vaiq::test::temp_dir());
        const auto prefix = *work_ / "prefix";
        const auto log = *work_ / "log.txt";
        ASSERT_EQ(shell("cmake --install " VAIQ_BINARY_DIR " --prefix " + prefix.string(), log), 0) << slurp(log);
        const auto build = *work_ / "plugin-build";
        ASSERT_EQ(
            shell("cmake -S " VAIQ_EXTERNAL_PLUGIN_DIR " -B " + build.string() +
                      " -G Ninja -DCMAKE_PREFIX_PATH=" + prefix.string() + " -DCMAKE_CXX_FLAGS='" VAIQ_CXX_FLAGS "'",
                  log),
            0)
            << slurp(log);
        ASSERT_EQ(shell("cmake --build " + build.string(), log), 0) << slurp(log);
    }
    static void TearDownTestSuite() { delete work_; }

    static fs::path work() { return *work_; }
    static fs::path prefix() { return *work_ / "prefix"; }
    static fs::path vaiq() { return prefix() / "bin" / "vaiq"; }
    // Runs the installed vaiq in the work folder; returns its exit code, output in `log`.
    static int run(const std::string& args, const fs::path& log) {
        return shell("cd " + work().string() + " && VAIQ_RECIPE_PATH= " + vaiq().string() + " " + args, log);
    }

    // What the installed vaiq lists with the plugins built here on its path; empty when the listing failed.
    static nlohmann::json listed_plugins(const fs::path& log) {
        const int code = shell(
            "VAIQ_PLUGIN_PATH=" + (work() / "plugin-build").string() + " " + vaiq().string() + " plugins --json", log);
        EXPECT_EQ(code, 0) << slurp(log);
        return code == 0 ? nlohmann::json::parse(slurp(log)) : nlohmann::json::array();
    }

  private:
    static fs::path* work_;
};
fs::path* ExternalPlugin::work_ = nullptr;

TEST_F(ExternalPlugin, BuildsAgainstTheInstalledSdkAndRunsInARecipe) {
    const auto work = ExternalPlugin::work();
    const auto prefix = ExternalPlugin::prefix();
    const auto log = work / "log1.txt";
    const fs::path vaiq = ExternalPlugin::vaiq();
    ASSERT_TRUE(fs::exists(vaiq));
    ASSERT_TRUE(fs::exists(prefix / "include" / "vaiq" / "vaiq.hpp"));
    const auto build = work / "plugin-build";
    const auto plugin = build / "vaiq-pass-strip_doc_strings.so";
    ASSERT_TRUE(fs::exists(plugin));
    // The Vitis formats' folder builds against the installed SDK alone, as any plugin.
    EXPECT_TRUE(fs::exists(build / "builtin-copies" / "vaiq-format-vitis.so"));

    // The installed vaiq lists its built-in plugins and, through VAIQ_PLUGIN_PATH, the new one.
    ASSERT_EQ(shell("VAIQ_PLUGIN_PATH=" + build.string() + " " + vaiq.string() + " plugins --json", log), 0)
        << slurp(log);
    const auto plugins = nlohmann::json::parse(slurp(log));
    bool found = false, builtin = false;
    for (const auto& p : plugins) {
        found |= p["name"] == "strip_doc_strings" && p["kind"] == "pass" && p["version"] == "1.0.0";
        builtin |= p["name"] == "minmax" && p["library"].get<std::string>().find(prefix.string()) == 0;
    }
    EXPECT_TRUE(found) << slurp(log);
    EXPECT_TRUE(builtin) << "built-in plugins come from the installation: " << slurp(log);

    // A recipe names the plugin's folder and runs the pass; it extends a shipped, installed recipe.
    auto model = vaiq::test::conv_relu_model();
    model.proto().set_doc_string("exported by a training script");
    model.graph().mutable_node(0)->set_doc_string("conv from layer1");
    vaiq::save_model(model, work / "model.onnx");
    vaiq::test::write_text(work / "recipe.yaml",
                           "recipe_version: 1\n"
                           "extends: cpu.yaml\n"
                           "plugin_paths: [plugin-build]\n"
                           "passes:\n"
                           "  - name: strip_doc_strings\n"
                           "    options: {keep_model_doc: true}\n");
    ASSERT_EQ(shell("cd " + work.string() + " && VAIQ_RECIPE_PATH= " + vaiq.string() +
                        " run recipe.yaml --stop-after prepare --model model.onnx --output out.onnx",
                    log),
              0)
        << slurp(log);
    const auto out = vaiq::load_model(work / "out.onnx");
    EXPECT_EQ(out.graph().node(0).doc_string(), "");
    EXPECT_EQ(out.proto().doc_string(), "exported by a training script") << "keep_model_doc was honoured";
    const auto report = nlohmann::json::parse(slurp(work / "out.report.json"));
    EXPECT_EQ(report["passes"].back()["name"], "strip_doc_strings") << "after the documented optimize_model";
    EXPECT_EQ(report["passes"].back()["changed"], true);
    EXPECT_NE(report["recipe"]["files"].back().get<std::string>().find(prefix.string()), std::string::npos)
        << "cpu.yaml is found among the installed recipes";
}

// Conv -> Relu -> GlobalAveragePool over a 3 x 3 map: the DPU rescales the
// average (63/64), so cnn_npu.yaml inserts a marked rescale Mul after it.
vaiq::Model conv_pool_model() {
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 2, 5, 5}).output("y", {1, 3, 1, 1});
    b.initializer("w", vaiq::test::ramp({3, 2, 3, 3}, -0.5f, 0.01f))
        .initializer("b", vaiq::test::ramp({3}, 0.1f, 0.1f));
    b.node("Conv", {"x", "w", "b"}, {"c"}, "conv");
    b.node("Relu", {"c"}, {"r"}, "relu");
    b.node("GlobalAveragePool", {"r"}, {"y"}, "pool");
    return b.build();
}

// A power-of-two calibrator built out of tree gets what the built-in ones get:
// power-of-two scales everywhere, weights searched, the NPU's checks passing;
// the same algorithm as nonoverflow writes the same bytes.
TEST_F(ExternalPlugin, APowerOfTwoCalibratorIsTreatedAsTheBuiltInOnes) {
    vaiq::save_model(conv_pool_model(), work() / "pool.onnx");
    const auto log = work() / "log2.txt";
    for (const std::string method : {"pow2_extremes", "NonOverflow"}) {
        vaiq::test::write_text(work() / ("pool_" + method + ".yaml"),
                               "recipe_version: 1\nextends: cnn_npu.yaml\nplugin_paths: [plugin-build]\n"
                               "calibrate_method: " +
                                   method + "\n");
        ASSERT_EQ(run("run pool_" + method + ".yaml --model pool.onnx --output pool_" + method + ".onnx", log), 0)
            << slurp(log);
    }
    EXPECT_EQ(slurp(work() / "pool_pow2_extremes.onnx"), slurp(work() / "pool_NonOverflow.onnx"));
    const auto report = nlohmann::json::parse(slurp(work() / "pool_pow2_extremes.report.json"));
    ASSERT_FALSE(report["constraints_written"].empty());
    for (const auto& c : report["constraints_written"]) EXPECT_EQ(c["violated"], 0) << c.dump();
    const auto view = vaiq::read_qdq(vaiq::load_model(work() / "pool_pow2_extremes.onnx"));
    ASSERT_GE(view.plan.tensors.size(), 4u);
    for (const auto& t : view.plan.tensors) EXPECT_TRUE(vaiq::exact_position(t.params)) << t.tensor;
    // It keeps no statistics a file could hold: vaiq calibrate says so rather than write a partial file.
    EXPECT_EQ(run("calibrate pool_pow2_extremes.yaml --model pool.onnx --output pool_stats.json", log), 1);
    EXPECT_NE(slurp(log).find("calibrator 'pow2_extremes' cannot save its statistics"), std::string::npos)
        << slurp(log);
    EXPECT_FALSE(fs::exists(work() / "pool_stats.json"));
}

// Node marks live beside the model, not in doc strings: a pass that strips doc
// strings after the DPU transforms changes nothing that is quantized.
TEST_F(ExternalPlugin, NodeMarksSurviveAPassThatStripsDocStrings) {
    vaiq::save_model(conv_pool_model(), work() / "marks.onnx");
    const auto log = work() / "log3.txt";
    vaiq::test::write_text(work() / "strip.yaml",
                           "recipe_version: 1\nextends: cnn_npu.yaml\nplugin_paths: [plugin-build]\n"
                           "passes: [strip_doc_strings]\n");
    vaiq::test::write_text(work() / "kept.yaml", "recipe_version: 1\nextends: cnn_npu.yaml\n");
    ASSERT_EQ(run("run kept.yaml --model marks.onnx --output kept.onnx", log), 0) << slurp(log);
    ASSERT_EQ(run("run strip.yaml --model marks.onnx --output stripped.onnx", log), 0) << slurp(log);
    const auto kept = nlohmann::json::parse(slurp(work() / "kept.report.json"));
    const auto stripped = nlohmann::json::parse(slurp(work() / "stripped.report.json"));
    EXPECT_EQ(stripped["passes"].back()["name"], "strip_doc_strings");
    EXPECT_EQ(stripped["passes"].back()["changed"], true) << "the rescale's doc string was there to strip";
    EXPECT_EQ(stripped["model"]["quantized_tensors"], kept["model"]["quantized_tensors"]);
    EXPECT_EQ(stripped["tensors"], kept["tensors"]) << "the rescale's factor is not quantized as a weight";
}

// A target built out of tree declares a documented option; recipes set it
// under extra_options, and a misspelling is an error at its file and line.
TEST_F(ExternalPlugin, ATargetsOwnOptionIsCheckedWithFileAndLine) {
    vaiq::save_model(vaiq::test::conv_relu_model(), work() / "edge.onnx");
    const auto log = work() / "log4.txt";
    vaiq::test::write_text(work() / "typo.yaml",
                           "recipe_version: 1\nplugin_paths: [plugin-build]\ntarget: edge_npu\n"
                           "extra_options:\n  EdgeFuseRelus: true\n");
    EXPECT_EQ(run("validate typo.yaml", log), 1);
    EXPECT_NE(
        slurp(log).find("typo.yaml:5:3: unknown key 'EdgeFuseRelus' in extra_options; did you mean 'EdgeFuseRelu'?"),
        std::string::npos)
        << slurp(log);
    std::map<bool, nlohmann::json> tensors;
    for (bool fuse : {false, true}) {
        vaiq::test::write_text(
            work() / "edge.yaml",
            std::string("recipe_version: 1\nplugin_paths: [plugin-build]\n"
                        "target: edge_npu\nextra_options: {ActivationSymmetric: true, EdgeFuseRelu: ") +
                (fuse ? "true" : "false") + "}\n");
        ASSERT_EQ(run("run edge.yaml --model edge.onnx --output edge.q.onnx", log), 0) << slurp(log);
        tensors[fuse] = nlohmann::json::parse(slurp(work() / "edge.q.report.json"))["tensors"];
    }
    auto has = [](const nlohmann::json& ts, const std::string& name) {
        return std::any_of(ts.begin(), ts.end(), [&](const auto& t) { return t["tensor"] == name; });
    };
    EXPECT_TRUE(has(tensors[false], "conv_out")) << "symmetric: the Relu's input keeps its pair";
    EXPECT_FALSE(has(tensors[true], "conv_out")) << "fused: the Conv computes the Relu";
}

// An algorithm built out of tree is listed with its kind, named by a recipe,
// and changes the written model: the weight with an outlier gets a clipped
// scale, which the written model carries.
TEST_F(ExternalPlugin, AnAlgorithmNamedByARecipeChangesTheWrittenModel) {
    const auto log = work() / "log5.txt";
    const auto plugins = listed_plugins(log);
    EXPECT_TRUE(std::any_of(plugins.begin(), plugins.end(), [](const auto& p) {
        return p["name"] == "clip_search" && p["kind"] == "algorithm" &&
               p["enabled_by"] == nlohmann::json::array({"extra_options.ClipSearch.Enable"});
    })) << plugins.dump();

    // One outlier among 9216 values: clipping it a little costs less than the
    // coarser grid costs all the others (each rounds with error scale^2 / 12).
    // Every output channel holds the same ramp, so the weight stays per tensor.
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 32, 6, 6}).output("y", {1, 32, 4, 4});
    std::vector<float> values(9216);
    for (size_t i = 0; i < values.size(); ++i) values[i] = -0.35f + 0.7f * static_cast<float>(i % 288) / 288;
    values[5] = 1.0f;
    b.initializer("w", vaiq::Tensor::from_values<float>({32, 32, 3, 3}, values));
    b.node("Conv", {"x", "w"}, {"c"}, "conv");
    b.node("Relu", {"c"}, {"y"}, "relu");
    vaiq::save_model(b.build(), work() / "outlier.onnx");
    std::map<std::string, nlohmann::json> reports;
    const std::map<std::string, std::string> asks = {
        {"plain", ""},
        {"clipped", "algorithms: [clip_search]\n"},
        // Its own switch and option, spelled as documented extra options are: no host change.
        {"switched", "extra_options:\n  ClipSearch: {Enable: true, MinRatio: 0.9}\n"},
        {"switched_off", "extra_options:\n  ClipSearch: {Enable: false}\n"}};
    for (const auto& [name, ask] : asks) {
        vaiq::test::write_text(
            work() / (name + ".yaml"),
            "recipe_version: 1\nextends: cpu.yaml\nplugin_paths: [plugin-build]\nper_channel: false\n" + ask);
        ASSERT_EQ(run("run " + name + ".yaml --model outlier.onnx --output " + name + ".onnx", log), 0) << slurp(log);
        reports[name] = nlohmann::json::parse(slurp(work() / (name + ".report.json")));
    }
    ASSERT_TRUE(reports["clipped"].contains("clip_search")) << reports["clipped"].dump();
    ASSERT_EQ(reports["clipped"]["clip_search"]["clipped"], 1) << reports["clipped"]["clip_search"].dump();
    const double ratio = reports["clipped"]["clip_search"]["ratios"]["w"].get<double>();
    EXPECT_LT(ratio, 1.0);
    EXPECT_FALSE(reports["switched_off"].contains("clip_search"));
    ASSERT_TRUE(reports["switched"].contains("clip_search")) << reports["switched"].dump();
    const double switched_ratio = reports["switched"]["clip_search"]["ratios"]["w"].get<double>();
    EXPECT_GE(switched_ratio, 0.9) << "its MinRatio reached it";
    EXPECT_LT(switched_ratio, 1.0);
    auto scale_of = [](const nlohmann::json& report) {
        for (const auto& t : report["tensors"])
            if (t["tensor"] == "w") return t["scale"].get<double>();
        return -1.0;
    };
    EXPECT_NEAR(scale_of(reports["clipped"]), scale_of(reports["plain"]) * ratio, 1e-6 * scale_of(reports["plain"]));
    // The written model carries it.
    auto written_scale = [&](const std::string& name) {
        const auto view = vaiq::read_qdq(vaiq::load_model(work() / (name + ".onnx")));
        for (const auto& node : view.graph.graph().node())  // the weight the Conv reads
            if (const auto* t = node.op_type() == "Conv" ? view.plan.find(node.input(1)) : nullptr)
                return static_cast<double>(t->params.scale[0]);
        return -1.0;
    };
    EXPECT_NEAR(written_scale("clipped"), scale_of(reports["clipped"]), 1e-9);
    EXPECT_GT(written_scale("plain"), written_scale("clipped"));
}

// A reader built out of tree takes the data paths it claims: a recipe's run
// calibrates on its .csv samples, and its extra option reaches it.
TEST_F(ExternalPlugin, AReaderOpensTheDataItClaims) {
    const auto log = work() / "log6.txt";
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 4}).output("y", {1, 2});
    b.initializer("w", vaiq::test::ramp({4, 2}, -0.5f, 0.1f));
    b.node("MatMul", {"x", "w"}, {"y"}, "matmul");
    vaiq::save_model(b.build(), work() / "rows.onnx");
    fs::create_directories(work() / "csv");
    vaiq::test::write_text(work() / "csv" / "a.csv", "0.5, 1.0\n2.0, -1.0\n");
    vaiq::test::write_text(work() / "csv" / "b.csv", "3.0,1,1,1\n");
    std::map<std::string, double> largest;
    for (const std::string scale : {"1", "2"}) {
        vaiq::test::write_text(work() / ("csv" + scale + ".yaml"),
                               "recipe_version: 1\nextends: cpu.yaml\nplugin_paths: [plugin-build]\n"
                               "calibrate_method: MinMax\nextra_options: {CsvScale: " +
                                   scale + "}\n");
        ASSERT_EQ(run("run csv" + scale + ".yaml --model rows.onnx --data csv --output csv" + scale + ".onnx", log), 0)
            << slurp(log);
        const auto report = nlohmann::json::parse(slurp(work() / ("csv" + scale + ".report.json")));
        EXPECT_EQ(report["calibration"]["batches"], 2) << report["calibration"].dump();
        for (const auto& t : report["tensors"])
            if (t["tensor"] == "x") largest[scale] = t["range"][1].get<double>();
    }
    EXPECT_FLOAT_EQ(largest["1"], 3.0f) << "the largest number of the samples";
    EXPECT_FLOAT_EQ(largest["2"], 6.0f) << "CsvScale reached the reader";
}

// A report built out of tree is written beside the JSON report with its own
// extension and options, in place of the page or beside it; a misspelt one is
// refused at its recipe line before anything runs.
TEST_F(ExternalPlugin, AReportNamedByARecipeIsWrittenBesideTheJson) {
    const auto log = work() / "log7.txt";
    const auto plugins = listed_plugins(log);
    EXPECT_TRUE(std::any_of(plugins.begin(), plugins.end(), [](const auto& p) {
        return p["name"] == "markdown_summary" && p["kind"] == "report" && p["options"][0]["name"] == "title";
    })) << plugins.dump();
    vaiq::save_model(vaiq::test::conv_relu_model(), work() / "summary.onnx");
    vaiq::test::write_text(work() / "summary.yaml",
                           "recipe_version: 1\nplugin_paths: [plugin-build]\nreport_html: false\n"
                           "reports:\n  - {name: markdown_summary, options: {title: Edge camera}}\n");
    ASSERT_EQ(run("run summary.yaml --model summary.onnx --output summary.q.onnx", log), 0) << slurp(log);
    EXPECT_NE(slurp(log).find("summary.q.report.md"), std::string::npos)
        << "the run names what it wrote: " << slurp(log);
    const auto page = slurp(work() / "summary.q.report.md");
    EXPECT_EQ(page.rfind("# Edge camera\n", 0), 0u) << page;
    const auto report = nlohmann::json::parse(slurp(work() / "summary.q.report.json"));
    const auto output = report["evaluation"]["outputs"][0];
    EXPECT_NE(page.find("| " + output["name"].get<std::string>() + " | " + output["sqnr_db"].dump() + " |"),
              std::string::npos)
        << page;
    EXPECT_FALSE(fs::exists(work() / "summary.q.report.html")) << "report_html: false";
    EXPECT_TRUE(std::any_of(report["plugins"].begin(), report["plugins"].end(),
                            [](const auto& p) { return p["kind"] == "report" && p["name"] == "markdown_summary"; }));

    vaiq::test::write_text(work() / "both.yaml",
                           "recipe_version: 1\nplugin_paths: [plugin-build]\nreports: [markdown_summary]\n");
    ASSERT_EQ(run("run both.yaml --model summary.onnx --output both.onnx", log), 0) << slurp(log);
    EXPECT_EQ(slurp(work() / "both.report.md").rfind("# vaiq run\n", 0), 0u) << "its option's default";
    EXPECT_TRUE(fs::exists(work() / "both.report.html")) << "report_html's page as well";

    vaiq::test::write_text(work() / "typo.yaml",
                           "recipe_version: 1\nplugin_paths: [plugin-build]\nreports: [markdown_sumary]\n");
    EXPECT_EQ(run("run typo.yaml --model summary.onnx --output typo.onnx", log), 1);
    EXPECT_NE(slurp(log).find("typo.yaml:3:11"), std::string::npos) << slurp(log);
    EXPECT_NE(slurp(log).find("markdown_summary"), std::string::npos) << "what is installed: " << slurp(log);
    EXPECT_FALSE(fs::exists(work() / "typo.onnx"));
}

}  // namespace
