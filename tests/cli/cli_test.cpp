// End to end: the vaiq executable, its exit codes and what it writes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include "runtime/executor.hpp"
#include "test_support.hpp"
#include "vaiq/model.hpp"
#include "vaiq/reader.hpp"
#include "vaiq/vaiq_ops.hpp"

namespace fs = std::filesystem;

namespace {

using vaiq::test::temp_dir;
using vaiq::test::write_text;

using vaiq::test::slurp;

vaiq::test::CommandResult vaiq_cli(const std::string& args) {
    // Appended rather than `std::string(VAIQ_CLI) + " "`, which GCC 12 wrongly calls out of bounds.
    std::string command = VAIQ_CLI;
    command.append(" ").append(args);
    return vaiq::test::run_command(command);
}

size_t lines(const std::string& s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }

// Lines of stderr that report an error (warnings may precede them).
size_t error_lines(const std::string& err) {
    size_t n = 0;
    for (size_t at = 0; (at = err.find("error: ", at)) != std::string::npos; at += 7)
        n += at == 0 || err[at - 1] == '\n';
    return n;
}

fs::path example_model(const fs::path& dir) {
    auto model = vaiq::test::conv_relu_model();
    // An Identity for the pass to remove, so a prepared model differs from its input.
    auto* relu = model.graph().mutable_node(1);
    relu->set_output(0, "pre_y");
    auto* id = model.graph().add_node();
    id->set_op_type("Identity");
    id->set_name("identity");
    id->add_input("pre_y");
    id->add_output(std::string("y"));  // a std::string: GCC 12 misreads the char* overload here (-Wrestrict)
    vaiq::save_model(model, dir / "model.onnx");
    return dir / "model.onnx";
}

TEST(Cli, VersionAndHelp) {
    auto r = vaiq_cli("--version");
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_EQ(r.out, "0.1.0\n");
    for (const char* sub :
         {"run", "validate", "explain", "plugins", "convert-opset", "convert-format", "preprocess", "dump"}) {
        r = vaiq_cli(std::string(sub) + " --help");
        EXPECT_EQ(r.exit_code, 0) << sub;
        EXPECT_NE(r.out.find("Usage"), std::string::npos) << sub;
    }
}

// OpenMP's idle threads spin briefly unless the user says how they wait (the
// setting reaches libgomp before it loads; infer reports it with its timings).
TEST(Cli, OpenMpThreadsSpinBrieflyUnlessTheUserSaysOtherwise) {
    const std::string model = VAIQ_SOURCE_DIR "/examples/mnist/mnist_cnn.onnx";
    const auto wait_of = [&](const std::string& env) {
        const auto r =
            vaiq::test::run_command("env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT " + env + " " VAIQ_CLI " infer " + model +
                                    " -i " VAIQ_SOURCE_DIR "/examples/mnist/calibration.npy --json");
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return nlohmann::json::parse(r.out).value("openmp_wait", "");
    };
    EXPECT_EQ(wait_of(""), "GOMP_SPINCOUNT=5000");
    EXPECT_EQ(wait_of("OMP_WAIT_POLICY=passive"), "OMP_WAIT_POLICY=passive");
    EXPECT_EQ(wait_of("GOMP_SPINCOUNT=77"), "GOMP_SPINCOUNT=77");
}

// The restart that sets OpenMP's wait keeps the process's name (ps, top and
// pkill find "vaiq", not "exe"): read once the restarted program's environment
// has the spin count it set.
TEST(Cli, TheRestartedProcessKeepsItsName) {
    const auto dir = temp_dir();
    const auto script = dir / "name.sh";
    std::ofstream(script) << "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT " VAIQ_CLI " infer " VAIQ_SOURCE_DIR
                             "/examples/mnist/mnist_cnn.onnx -i " VAIQ_SOURCE_DIR
                             "/examples/mnist/calibration.npy --repeat 100000000 --output-dir "
                          << (dir / "out").string()
                          << " >/dev/null 2>&1 &\n"
                             "pid=$!\n"
                             "for i in $(seq 200); do\n"
                             "  tr '\\0' '\\n' < /proc/$pid/environ 2>/dev/null | grep -q '^GOMP_SPINCOUNT=' && break\n"
                             "  sleep 0.05\n"
                             "done\n"
                             "cat /proc/$pid/comm\n"
                             "kill $pid\n";
    const auto r = vaiq::test::run_command("sh " + script.string());
    EXPECT_EQ(r.out, "vaiq\n") << r.err;
}

TEST(Cli, UsageErrorsExitOne) {
    EXPECT_EQ(vaiq_cli("").exit_code, 1);
    EXPECT_EQ(vaiq_cli("frobnicate").exit_code, 1);
    EXPECT_EQ(vaiq_cli("run").exit_code, 1);
}

TEST(Cli, PluginsListsAllSevenKinds) {
    auto r = vaiq_cli("plugins --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto plugins = nlohmann::json::parse(r.out);
    std::set<std::string> kinds;
    for (const auto& p : plugins) {
        kinds.insert(p["kind"].get<std::string>());
        EXPECT_TRUE(p.contains("version") && p.contains("summary") && p.contains("options"));
    }
    EXPECT_EQ(kinds,
              (std::set<std::string>{"calibrator", "format", "target", "pass", "algorithm", "reader", "report"}));
    r = vaiq_cli("plugins");
    EXPECT_NE(r.out.find("minmax"), std::string::npos);
    EXPECT_NE(r.out.find("CalibMovingAverage (bool, default false)"), std::string::npos);
    EXPECT_NE(r.out.find("GPTQDamping (float, default 0.01)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("image_preprocess.mean (list of numbers, default null)"), std::string::npos) << r.out;
}

// The algorithms a recipe runs, with the extra options that reach them; a
// misspelt algorithm is refused at its line.
TEST(Cli, ExplainShowsTheAlgorithmsARecipeRuns) {
    auto r = vaiq_cli("explain " VAIQ_SOURCE_DIR "/recipes/int4_gptq.yaml");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("algorithm:  gptq"), std::string::npos) << r.out;
    const auto at = r.out.find("    GPTQDamping");
    ASSERT_NE(at, std::string::npos) << r.out;
    const auto damping = r.out.substr(at, r.out.find('\n', at) - at);
    EXPECT_NE(damping.find("0.01"), std::string::npos) << damping;
    EXPECT_NE(damping.find("int4_gptq.yaml:"), std::string::npos) << "set by the recipe: " << damping;
    // An algorithm a documented setting implies takes the options `algorithms:` gives it.
    r = vaiq_cli("explain " VAIQ_SOURCE_DIR
                 "/recipes/int4_awq.yaml --set weight_only_algorithm=awq_clip "
                 "--set 'algorithms=[{name: awq_clip, options: {sample_rows: 60}}]'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto rows = r.out.find("    sample_rows");
    ASSERT_NE(rows, std::string::npos) << r.out;
    EXPECT_NE(r.out.substr(rows, r.out.find('\n', rows) - rows).find("60"), std::string::npos) << r.out;
    const auto dir = temp_dir();
    const auto recipe = write_text(dir / "r.yaml", "recipe_version: 1\nextends: cpu.yaml\nalgorithms: [gtpq]\n");
    r = vaiq_cli("validate " + recipe.string());
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("r.yaml:3:14: no algorithm plugin named 'gtpq' is installed; did you mean 'gptq'?"),
              std::string::npos)
        << r.err;
}

TEST(Cli, ValidateAcceptsShippedRecipesAndRejectsBadOnesOnOneLine) {
    auto r = vaiq_cli("validate " VAIQ_SOURCE_DIR "/recipes/cpu.yaml");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("valid (target cpu, format qdq, calibrator minmax, 0 passes)"), std::string::npos) << r.out;
    r = vaiq_cli("validate " VAIQ_SOURCE_DIR "/tests/recipes/bad/unknown_extra_option.yaml");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(lines(r.err), 1u) << r.err;
    EXPECT_NE(r.err.find("unknown_extra_option.yaml:7:3: unknown key 'ActivatonSymmetric'"), std::string::npos)
        << r.err;
}

TEST(Cli, ExplainShowsSettingsAndPerNodeDecisions) {
    const auto dir = temp_dir();
    const auto model = example_model(dir);
    auto r = vaiq_cli("explain " VAIQ_SOURCE_DIR "/recipes/cpu.yaml --model " + model.string() +
                      " --set nodes_to_exclude=[relu]");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("activation_type"), std::string::npos);
    EXPECT_NE(r.out.find("cpu.yaml:17:1"), std::string::npos) << "origins are shown";
    EXPECT_NE(r.out.find("relu                             Relu"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("not quantized: in nodes_to_exclude"), std::string::npos);
    EXPECT_NE(r.out.find("1 of 3 nodes quantized"), std::string::npos) << r.out;
}

TEST(Cli, RunQuantizesOnRandomDataAndReports) {
    const auto dir = temp_dir();
    const auto model = example_model(dir);
    auto r = vaiq_cli("run " VAIQ_SOURCE_DIR "/recipes/cpu.yaml --model " + model.string() + " --output " +
                      (dir / "out.onnx").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("random data"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("SQNR"), std::string::npos) << "the terminal summary: " << r.err;
    const auto out = vaiq::load_model(dir / "out.onnx");
    int q = 0, dq = 0;
    for (const auto& n : out.graph().node()) {
        q += n.op_type() == "QuantizeLinear";
        dq += n.op_type() == "DequantizeLinear";
    }
    EXPECT_EQ(q, 2) << "the input and the Relu output";
    EXPECT_EQ(dq, 4) << "input, weight, bias, Relu output";
    const auto report = nlohmann::json::parse(slurp(dir / "out.report.json"));
    EXPECT_EQ(report["quantized"], true);
    EXPECT_EQ(report["calibration"]["batches"], 1);
    ASSERT_EQ(report["evaluation"]["outputs"].size(), 1u);
    EXPECT_GT(report["evaluation"]["outputs"][0]["sqnr_db"].get<double>(), 20.0);
}

// An output below warn_output_sqnr_db: the warning names where the error starts
// and the accurate recipe of the run's target as the first thing to try.
TEST(Cli, ALowOutputNamesTheAccurateRecipeToTry) {
    const auto dir = temp_dir();
    const auto model = example_model(dir);
    for (const auto& [recipe, accurate] : {std::pair{"cpu.yaml", "cpu_accurate.yaml"},
                                           std::pair{"cnn_npu.yaml", "cnn_npu_accurate.yaml"}}) {
        auto r = vaiq_cli(std::string("run " VAIQ_SOURCE_DIR "/recipes/") + recipe + " --model " + model.string() +
                          " --output " + (dir / "out.onnx").string() + " --set warn_output_sqnr_db=200");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_NE(r.err.find("far from the float model's"), std::string::npos) << r.err;
        EXPECT_NE(r.err.find(std::string("To try: the accurate recipe for this target (") + accurate),
                  std::string::npos)
            << r.err;
    }
    auto accurate = vaiq_cli("run " VAIQ_SOURCE_DIR "/recipes/cpu_accurate.yaml --model " + model.string() +
                             " --output " + (dir / "out.onnx").string() + " --set warn_output_sqnr_db=200");
    ASSERT_EQ(accurate.exit_code, 0) << accurate.err;
    EXPECT_EQ(accurate.err.find("the accurate recipe for this target"), std::string::npos)
        << "an accurate run is not told to use itself";
    // With a tensor ranking in the report (its section's kind says so), the advice names its most harmful tensors.
    auto ranked =
        vaiq_cli("run " VAIQ_SOURCE_DIR "/recipes/cpu.yaml --model " + model.string() + " --output " +
                 (dir / "out.onnx").string() + " --set warn_output_sqnr_db=200 --set sensitivity_analysis=true");
    ASSERT_EQ(ranked.exit_code, 0) << ranked.err;
    EXPECT_NE(ranked.err.find("16 bits for the tensors that cost the output most alone ('"), std::string::npos)
        << ranked.err;
}

TEST(Cli, AnalyzeRanksTheQuantizedTensorsAndWritesOnlyTheReport) {
    const auto dir = temp_dir();
    const auto model = example_model(dir);
    auto r = vaiq_cli("analyze " VAIQ_SOURCE_DIR "/recipes/cpu.yaml --model " + model.string() + " --report " +
                      (dir / "analysis.json").string() + " --top 2 --set model_output=" + (dir / "q.onnx").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("rank"), std::string::npos) << r.out;
    EXPECT_EQ(lines(r.out), 5u) << "the output line, the header, two tensors, the legend:\n" << r.out;
    const auto report = nlohmann::json::parse(slurp(dir / "analysis.json"));
    const auto& tensors = report["sensitivity"]["tensors"];
    ASSERT_GE(tensors.size(), 3u) << "x, w, b and the Relu's output";
    for (size_t i = 1; i < tensors.size(); ++i) {
        if (!tensors[i]["output_sqnr_db"].is_number() || !tensors[i - 1]["output_sqnr_db"].is_number()) continue;
        EXPECT_LE(tensors[i - 1]["output_sqnr_db"].get<double>(), tensors[i]["output_sqnr_db"].get<double>());
    }
    EXPECT_FALSE(fs::exists(dir / "q.onnx")) << "analyze writes no model";
}

TEST(Cli, TheCnnTargetWarnsOnAModelOfMatMuls) {
    const auto dir = temp_dir();
    vaiq::test::GraphBuilder b;
    b.input("x", {2, 4}).output("y", {2, 4});
    b.initializer("w1", vaiq::test::ramp({4, 4}, -0.5f, 0.07f));
    b.initializer("w2", vaiq::test::ramp({4, 4}, 0.4f, -0.05f));
    b.node("MatMul", {"x", "w1"}, {"h"});
    b.node("MatMul", {"h", "w2"}, {"y"});
    vaiq::save_model(b.build(), dir / "mlp.onnx");
    auto r = vaiq_cli("run " VAIQ_SOURCE_DIR "/recipes/cnn_npu.yaml --model " + (dir / "mlp.onnx").string() +
                      " --output " + (dir / "q.onnx").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("made for CNNs, but this model has 2 MatMul/Gemm against 0 Conv"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("transformer_npu.yaml"), std::string::npos) << r.err;
    r = vaiq_cli("run " VAIQ_SOURCE_DIR "/recipes/cnn_npu.yaml --model " + example_model(dir).string() + " --output " +
                 (dir / "q.onnx").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err.find("made for CNNs"), std::string::npos) << r.err;
}

// A DPU simulation that alone takes the output below warn_output_sqnr_db is a
// warning before anything is quantized; above it, a line of the log.
TEST(Cli, ASimulationThatAloneCostsTheOutputIsAWarning) {
    const auto dir = temp_dir();
    vaiq::save_model(vaiq::test::swish_model(), dir / "swish.onnx");
    auto run = [&](const std::string& extra) {
        return vaiq_cli("run " VAIQ_SOURCE_DIR "/recipes/cnn_npu.yaml --model " + (dir / "swish.onnx").string() +
                        " --output " + (dir / "q.onnx").string() + extra);
    };
    const std::string what = "(convert_sigmoid_to_hard_sigmoid, convert_hard_sigmoid_to_dpu_version changed what it";
    auto strict = run(" --set warn_output_sqnr_db=40");
    ASSERT_EQ(strict.exit_code, 0) << strict.err;
    EXPECT_NE(strict.err.find("warning: the prepared float model against the input model " + what), std::string::npos)
        << strict.err;
    EXPECT_NE(strict.err.find("below warn_output_sqnr_db 40 before anything is quantized"), std::string::npos)
        << strict.err;
    auto usual = run("");
    ASSERT_EQ(usual.exit_code, 0) << usual.err;
    EXPECT_NE(usual.err.find("info: the prepared float model against the input model " + what), std::string::npos)
        << usual.err;
    EXPECT_EQ(usual.err.find("before anything is quantized"), std::string::npos) << usual.err;
}

// vaiq tune on the bundled example: a candidate that clips every activation
// to its median misses the target, the recipe as written meets it and is kept;
// a target no candidate meets writes the best and exits with 3.
TEST(Cli, TuneKeepsTheFirstCandidateThatMeetsTheTarget) {
    const auto dir = temp_dir();
    const auto space = vaiq::test::write_text(dir / "space.yaml", R"(
candidates:
  - name: clipped
    set: {calibrate_method: Percentile, plugin_options: {calibrator: {percentile: 50}}}
  - name: as written
  - recipe: cpu_accurate.yaml
)");
    const std::string tune = "tune " VAIQ_SOURCE_DIR "/examples/mnist/mnist_cpu.yaml --space " + space.string();
    auto r = vaiq_cli(tune + " --target 'accuracy_drop<=0.01' --output " + (dir / "m.onnx").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto trials = nlohmann::json::parse(slurp(dir / "m.tune.json"));
    EXPECT_EQ(trials["kept"], "as written");
    EXPECT_EQ(trials["met"], true);
    ASSERT_EQ(trials["trials"].size(), 2u) << "it stops at the first that meets the target";
    EXPECT_EQ(trials["trials"][0]["met"], false);
    EXPECT_GT(trials["trials"][0]["score"].get<double>(), 0.5) << "clipped at the median: the digits are lost";
    EXPECT_LE(trials["trials"][1]["score"].get<double>(), 0.01);
    const auto report = nlohmann::json::parse(slurp(dir / "m.report.json"));
    EXPECT_NEAR(report["evaluation"]["accuracy"]["float"].get<double>() -
                    report["evaluation"]["accuracy"]["quantized"].get<double>(),
                trials["trials"][1]["score"].get<double>(), 1e-12)
        << "the report is the kept trial's";
    EXPECT_TRUE(fs::exists(dir / "m.onnx"));
    for (const auto& e : fs::directory_iterator(dir))
        EXPECT_EQ(e.path().filename().string().find(".vaiq-tune"), std::string::npos) << "trial files are gone";

    // Nothing meets it: every candidate runs, the best is written, exit 3.
    r = vaiq_cli(tune + " --target 'accuracy>=1.01' --output " + (dir / "best.onnx").string());
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find("no candidate met accuracy>=1.01"), std::string::npos) << r.err;
    const auto all = nlohmann::json::parse(slurp(dir / "best.tune.json"));
    EXPECT_EQ(all["trials"].size(), 3u);
    EXPECT_EQ(all["met"], false);
    // cpu_accurate.yaml calibrates as the recipe as written does: once for both.
    EXPECT_EQ(all["trials"][1]["calibration_reused"], false);
    EXPECT_EQ(all["trials"][2]["calibration_reused"], true);
    EXPECT_NE(all["kept"], "clipped");
    EXPECT_TRUE(fs::exists(dir / "best.onnx"));

    // A target it cannot read, and one the report cannot score: the user's error, nothing written.
    r = vaiq_cli(tune + " --target accuracy=0.9 --output " + (dir / "bad.onnx").string());
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("MEASURE>=VALUE"), std::string::npos) << r.err;
    r = vaiq_cli(tune + " --target 'perplexity<=5' --output " + (dir / "bad.onnx").string());
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("evaluation_labels of tokens"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir / "bad.onnx"));
}

TEST(Cli, QuantizesTheBundledExampleAndReportsAccuracy) {
    const auto dir = temp_dir();
    auto r =
        vaiq_cli("run " VAIQ_SOURCE_DIR "/examples/mnist/mnist_cpu.yaml --output " + (dir / "mnist.onnx").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto report = nlohmann::json::parse(slurp(dir / "mnist.report.json"));
    const auto& e = report["evaluation"];
    EXPECT_EQ(e["samples"], 1000);
    EXPECT_EQ(e["data"], "evaluation_data");
    EXPECT_GT(e["accuracy"]["float"].get<double>(), 0.95);
    EXPECT_GT(e["accuracy"]["quantized"].get<double>(), 0.95);
    EXPECT_GT(e["outputs"][0]["top1_agreement"].get<double>(), 0.98);
    EXPECT_GT(e["outputs"][0]["sqnr_db"].get<double>(), 25.0);
    // Every Conv and the Gemm read dequantized int8 weights.
    const auto model = vaiq::load_model(dir / "mnist.onnx");
    int weights = 0;
    for (const auto& init : model.graph().initializer())
        weights += init.data_type() == onnx::TensorProto::INT8 && init.dims_size() > 1;
    EXPECT_EQ(weights, 4);
}

// The device checks of the written model read the Vitis formats' own pairs as
// they read standard Q/DQ: the same nodes checked whatever the format.
TEST(Cli, TheNpuChecksTheWrittenModelInEveryFormat) {
    const auto dir = temp_dir();
    std::map<std::string, int> checked;
    for (const std::string format : {"QDQ", "VitisQuantFormat.QDQ", "VitisQuantFormat.FixNeuron"}) {
        const auto out = dir / (format + ".onnx");
        auto r = vaiq_cli("run " VAIQ_SOURCE_DIR "/examples/mnist/mnist_npu.yaml --set quant_format=" + format +
                          " --output " + out.string() + " --report " + (dir / (format + ".json")).string());
        ASSERT_EQ(r.exit_code, 0) << format << ": " << r.err;
        const auto report = nlohmann::json::parse(slurp(dir / (format + ".json")));
        for (const auto& c : report["constraints_written"]) {
            EXPECT_EQ(c["violated"], 0) << format << " " << c.dump();
            checked[format] += c["checked"].get<int>();
        }
    }
    EXPECT_GT(checked["QDQ"], 20);
    EXPECT_EQ(checked["VitisQuantFormat.QDQ"], checked["QDQ"]);
    EXPECT_EQ(checked["VitisQuantFormat.FixNeuron"], checked["QDQ"]);
}

// The NPU recipe: every scale a power of two, every device limit holding in
// the written model, and the example's accuracy within a point of float.
TEST(Cli, QuantizesTheBundledExampleForTheNpu) {
    const auto dir = temp_dir();
    auto r =
        vaiq_cli("run " VAIQ_SOURCE_DIR "/examples/mnist/mnist_npu.yaml --output " + (dir / "mnist.onnx").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("device constraints hold in the written model"), std::string::npos) << r.err;
    const auto report = nlohmann::json::parse(slurp(dir / "mnist.report.json"));
    const auto& e = report["evaluation"];
    EXPECT_GT(e["accuracy"]["quantized"].get<double>(), e["accuracy"]["float"].get<double>() - 0.01);
    ASSERT_FALSE(report["constraints"].empty());
    int checked = 0;
    for (const auto& c : report["constraints_written"]) {
        EXPECT_EQ(c["violated"], 0) << c.dump();
        checked += c["checked"].get<int>();
    }
    EXPECT_GT(checked, 20);
    const auto model = vaiq::load_model(dir / "mnist.onnx");
    int scales = 0;
    for (const auto& init : model.graph().initializer()) {
        if (init.name().find("_scale") == std::string::npos) continue;
        const auto scale = vaiq::Tensor::from_proto(init);
        const auto s = scale.data<float>()[0];
        EXPECT_EQ(std::exp2(std::round(std::log2(s))), s) << init.name();
        ++scales;
    }
    EXPECT_GT(scales, 10);
}

// With include_cle the recipe is also quantized without CLE; the better output
// is written, both figures are in the report, and cle_guard: false keeps CLE.
TEST(Cli, CleGuardKeepsTheBetterOfWithAndWithoutCle) {
    const auto dir = temp_dir();
    const std::string run = "run " VAIQ_SOURCE_DIR "/examples/mnist/mnist_npu.yaml --set include_cle=true --output ";
    auto r = vaiq_cli(run + (dir / "guarded.onnx").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto guarded = nlohmann::json::parse(slurp(dir / "guarded.report.json"));
    const auto& guard = guarded["cle_guard"];
    ASSERT_TRUE(guard.is_object()) << guarded.dump();
    const double with_cle = guard["sqnr_db_with_cle"].get<double>(),
                 without = guard["sqnr_db_without_cle"].get<double>();
    EXPECT_EQ(guard["kept_cle"].get<bool>(), with_cle >= without);
    const double written = guarded["evaluation"]["outputs"][0]["sqnr_db"].get<double>();
    EXPECT_DOUBLE_EQ(written, std::max(with_cle, without));

    r = vaiq_cli(run + (dir / "forced.onnx").string() + " --set cle_guard=false");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto forced = nlohmann::json::parse(slurp(dir / "forced.report.json"));
    EXPECT_FALSE(forced.contains("cle_guard"));
    EXPECT_DOUBLE_EQ(forced["evaluation"]["outputs"][0]["sqnr_db"].get<double>(), with_cle);
    bool cle_ran = false;
    for (const auto& p : forced["passes"]) cle_ran |= p["name"] == "cross_layer_equalization";
    EXPECT_TRUE(cle_ran);
}

TEST(Cli, RunRejectsCalibrationDataOfTheWrongShape) {
    const auto dir = temp_dir();
    const auto model = example_model(dir);
    fs::create_directories(dir / "data");
    vaiq::write_npy(dir / "data" / "a.npy", vaiq::Tensor(vaiq::DataType::Float, {1, 3, 4, 4}));
    auto r = vaiq_cli("run " VAIQ_SOURCE_DIR "/recipes/cpu.yaml --model " + model.string() + " --output " +
                      (dir / "out.onnx").string() + " --data " + (dir / "data").string());
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("a.npy"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("input 'x' has shape [1, 3, 4, 4], but the model expects [1, 2, 4, 4]"), std::string::npos)
        << r.err;
    EXPECT_FALSE(fs::exists(dir / "out.onnx"));
}

TEST(Cli, PreprocessOptimizesInfersShapesAndWritesExternalData) {
    const auto dir = temp_dir();
    const auto model = example_model(dir);
    const auto before = slurp(model);
    auto r = vaiq_cli("preprocess " + model.string() + " " + (dir / "prepared.onnx").string() +
                      " --pass cross_layer_equalization --save_as_external_data --all_tensors_to_one_file "
                      "--external_data_location data "
                      "--external_data_size_threshold 0");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("4 steps"), std::string::npos) << r.out;  // symbolic, optimize, CLE, ONNX shapes
    EXPECT_EQ(slurp(model), before) << "the input model changed";
    EXPECT_TRUE(fs::exists(dir / "data" / "prepared.onnx.data"));
    const auto out = vaiq::load_model(dir / "prepared.onnx");
    EXPECT_EQ(out.graph().node_size(), 2) << "the Identity is optimized away";
    EXPECT_GE(out.graph().value_info_size(), 1) << "the intermediate tensor has a shape";

    r = vaiq_cli("preprocess " + model.string() + " " + (dir / "split.onnx").string() +
                 " --skip_optimization --save_as_external_data --external_data_size_threshold 0");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(fs::exists(dir / "w")) << "one file per tensor, named after it";
    EXPECT_EQ(vaiq::load_model(dir / "split.onnx").graph().node_size(), 3) << "optimization was skipped";

    EXPECT_EQ(vaiq_cli("preprocess " + (dir / "missing.onnx").string() + " " + (dir / "x.onnx").string()).exit_code, 1);
    r = vaiq_cli("preprocess " + model.string() + " " + (dir / "x.onnx").string() + " --pass no_such_pass");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("no_such_pass"), std::string::npos) << r.err;
    r = vaiq_cli("preprocess " + model.string() + " " + model.string());
    EXPECT_EQ(r.exit_code, 1) << "never writes over its input";
    EXPECT_EQ(vaiq_cli("preprocess " + model.string() + " " + (dir / "x.onnx").string() +
                       " --save_as_external_data --external_data_location ../outside")
                  .exit_code,
              1);
    EXPECT_FALSE(fs::exists(dir / "x.onnx"));
}

TEST(Cli, RecipeSwitchesRunThePreparationPasses) {
    const auto dir = temp_dir();
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 2, 4, 4}).output("y", {1, 2, 4, 4});
    b.initializer("w1", vaiq::test::ramp({3, 2, 1, 1}, -1.0f, 0.4f))
        .initializer("w2", vaiq::test::ramp({2, 3, 1, 1}, 0.1f, 0.3f));
    b.node("Conv", {"x", "w1"}, {"a"});
    b.node("Relu", {"a"}, {"r"});
    b.node("Conv", {"r", "w2"}, {"y"});
    vaiq::save_model(b.build(), dir / "model.onnx");
    auto r = vaiq_cli("run " VAIQ_SOURCE_DIR "/recipes/cpu.yaml --stop-after prepare --model " +
                      (dir / "model.onnx").string() + " --output " + (dir / "out.onnx").string() +
                      " --set include_cle=true --set convert_nchw_to_nhwc=true --set extra_options.CLESteps=-1");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto report = nlohmann::json::parse(slurp(dir / "out.report.json"));
    std::vector<std::string> passes;
    for (const auto& p : report["passes"]) passes.push_back(p["name"].get<std::string>());
    EXPECT_EQ(passes, (std::vector<std::string>{"convert_nchw_to_nhwc", "optimize_model", "cross_layer_equalization"}));
    EXPECT_EQ(report["passes"][2]["changed"], true);
    const auto out = vaiq::load_model(dir / "out.onnx");
    EXPECT_EQ(out.graph().input(0).type().tensor_type().shape().dim(3).dim_value(), 2) << "NHWC input";
    r = vaiq_cli("run " VAIQ_SOURCE_DIR "/recipes/cpu.yaml --stop-after prepare --model " +
                 (dir / "model.onnx").string() + " --output " + (dir / "bad.onnx").string() +
                 " --set include_cle=true --set extra_options.CLESteps=0");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("CLESteps"), std::string::npos) << r.err;
}

// The example model and a ramp input in a fresh folder, quantized with `recipe`
// (plus `settings`, where {dir} stands for the folder) to `output` in that folder.
struct QuantizedExample {
    fs::path dir, model;
    vaiq::Tensor input;
    vaiq::test::CommandResult run;
};

QuantizedExample quantize_example(const std::string& recipe, const std::string& output,
                                  const std::string& settings = "") {
    QuantizedExample q;
    q.dir = temp_dir();
    q.model = example_model(q.dir);
    q.input = vaiq::test::ramp({1, 2, 4, 4}, -1.0f, 0.07f);
    vaiq::write_npy(q.dir / "x.npy", q.input);
    std::string expanded = settings;
    for (size_t at; (at = expanded.find("{dir}")) != std::string::npos;) expanded.replace(at, 5, q.dir.string());
    q.run = vaiq_cli("run " VAIQ_SOURCE_DIR "/recipes/" + recipe + " --model " + q.model.string() + " --data " +
                     (q.dir / "x.npy").string() + " --output " + (q.dir / output).string() + " " + expanded);
    return q;
}

TEST(Cli, DumpWritesWhatTheExecutorComputes) {
    const auto q = quantize_example("cpu.yaml", "q.onnx", "--set dump_output_dir={dir}/from_recipe");
    const auto& dir = q.dir;
    const auto& model = q.model;
    const auto& input = q.input;
    auto r = q.run;
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto report = nlohmann::json::parse(slurp(dir / "q.report.json"));
    EXPECT_GT(report["dump"]["quantized_tensors"].get<int>(), 0);

    r = vaiq_cli("dump " + (dir / "q.onnx").string() + " --data " + (dir / "x.npy").string() +
                 " --dump-float --output-dir " + (dir / "d").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // The same tensors, computed here with the executor on the same input.
    const auto quantized = vaiq::load_model(dir / "q.onnx");
    std::map<std::string, std::string> integer_of;  // DequantizeLinear output -> the tensor it reads
    for (const auto& n : quantized.graph().node())
        if (n.op_type() == "DequantizeLinear") integer_of[n.output(0)] = n.input(0);
    ASSERT_FALSE(integer_of.empty());
    std::vector<std::string> taps;
    for (const auto& [dq, q] : integer_of) taps.push_back(q);
    taps.push_back("conv_out");
    std::map<std::string, vaiq::Tensor> computed;
    vaiq::runtime::Executor executor(quantized, {.fuse_qdq = false});
    executor.run({{"x", input}}, taps, [&](const std::string& name, const vaiq::Tensor& v) { computed[name] = v; });
    for (const auto& [dq, q] : integer_of) {
        vaiq::Tensor expected;
        bool stored = false;
        for (const auto& init : quantized.graph().initializer())
            if (init.name() == q) expected = vaiq::Tensor::from_proto(init), stored = true;
        if (!stored) expected = computed.at(q);
        const auto bytes = slurp(dir / "d" / (dq + ".bin"));
        EXPECT_EQ(bytes, std::string(reinterpret_cast<const char*>(expected.bytes().data()), expected.bytes().size()))
            << dq;
        std::ifstream text(dir / "d" / (dq + ".txt"));
        std::string line;
        int64_t lines = 0;
        while (std::getline(text, line)) ++lines;
        EXPECT_EQ(lines, expected.size()) << dq;
        EXPECT_TRUE(fs::exists(dir / "from_recipe" / (dq + ".bin"))) << dq;
    }
    const auto conv = computed.at("conv_out");
    EXPECT_EQ(slurp(dir / "d" / "conv_out_float.bin"),
              std::string(reinterpret_cast<const char*>(conv.bytes().data()), conv.bytes().size()));

    r = vaiq_cli("dump " + model.string() + " --output-dir " + (dir / "none").string());
    EXPECT_EQ(r.exit_code, 1) << "a float model has no quantized tensors";
    EXPECT_NE(r.err.find("--dump-float"), std::string::npos) << r.err;
    EXPECT_EQ(vaiq_cli("dump " + (dir / "q.onnx").string() + " --random-input-shape x=1,two").exit_code, 1);
    r = vaiq_cli("dump " + (dir / "q.onnx").string() + " --random-input-shape x=1,2,4,4 --output-dir " +
                 (dir / "random").string());
    EXPECT_EQ(r.exit_code, 0) << r.err;
}

// Runs a model on one input with vaiq's executor; returns the tapped values.
std::map<std::string, vaiq::Tensor> execute(const vaiq::Model& model, const vaiq::Tensor& x,
                                            const std::vector<std::string>& taps) {
    std::map<std::string, vaiq::Tensor> values;
    vaiq::runtime::Executor executor(model, {.fuse_qdq = false});
    executor.run({{"x", x}}, taps, [&](const std::string& name, const vaiq::Tensor& v) { values[name] = v; });
    return values;
}

TEST(Cli, FixNeuronModelsDumpTheirIntegersAndConvertToNativeQdq) {
    const auto q = quantize_example("cpu.yaml", "fix.onnx",
                                    "--set quant_format=VitisQuantFormat.FixNeuron --set calibrate_method=MinMSE"
                                    " --set extra_options.ActivationSymmetric=true");
    const auto& dir = q.dir;
    const auto& model = q.model;
    const auto& input = q.input;
    auto r = q.run;
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto fix = vaiq::load_model(dir / "fix.onnx");
    std::map<std::string, vaiq::FixNeuronAttributes> fixneurons;
    for (const auto& n : fix.graph().node())
        if (n.op_type() == "FixNeuron") fixneurons[n.output(0)] = vaiq::fixneuron_attributes(n);
    ASSERT_GE(fixneurons.size(), 4u);  // x, w, b, y

    // dump: each FixNeuron's output as the integers it stands for.
    r = vaiq_cli("dump " + (dir / "fix.onnx").string() + " --data " + (dir / "x.npy").string() + " --output-dir " +
                 (dir / "d").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::vector<std::string> taps{"y"};
    for (const auto& [out, a] : fixneurons) taps.push_back(out);
    const auto values = execute(fix, input, taps);
    for (const auto& [out, a] : fixneurons) {
        const auto bytes = slurp(dir / "d" / (out + ".bin"));
        const auto v = values.at(out).data<float>();
        ASSERT_EQ(bytes.size(), v.size() * (a.bit_width / 8)) << out;
        for (size_t i = 0; i < v.size(); ++i) {
            const int64_t stored = a.bit_width == 8 ? int64_t{reinterpret_cast<const int8_t*>(bytes.data())[i]}
                                                    : int64_t{reinterpret_cast<const int32_t*>(bytes.data())[i]};
            EXPECT_EQ(std::ldexp(static_cast<double>(stored), -a.pos), v[i]) << out << " " << i;
        }
    }

    // convert-format: native Q/DQ that computes the same, and no custom op left.
    r = vaiq_cli("convert-format " + (dir / "fix.onnx").string() + " " + (dir / "native.onnx").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto native = vaiq::load_model(dir / "native.onnx");
    for (const auto& n : native.graph().node()) EXPECT_NE(n.op_type(), "FixNeuron");
    EXPECT_EQ(native.opset("com.vaiq"), 0) << "the custom domain is no longer imported";
    const auto y = execute(native, input, {"y"}).at("y");
    const auto expected = values.at("y");
    ASSERT_EQ(y.size(), expected.size());
    for (int64_t i = 0; i < y.size(); ++i) EXPECT_EQ(y.data<float>()[i], expected.data<float>()[i]) << i;

    // int32 activations have no native form: a one-line error naming them, nothing written.
    r = vaiq_cli("run " VAIQ_SOURCE_DIR "/recipes/cpu.yaml --model " + model.string() + " --data " +
                 (dir / "x.npy").string() + " --output " + (dir / "i32.onnx").string() +
                 " --set quant_format=VitisQuantFormat.QDQ --set activation_type=QInt32");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = vaiq_cli("convert-format " + (dir / "i32.onnx").string() + " " + (dir / "i32_native.onnx").string());
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(error_lines(r.err), 1u) << r.err;
    EXPECT_NE(r.err.find("'x' (int32 has no native QuantizeLinear)"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir / "i32_native.onnx"));
}

// A float16 model's Cast pairs dump like Q/DQ pairs: the stored bits in .bin.
TEST(Cli, DumpWritesTheFloat16ValuesOfCastPairs) {
    const auto q = quantize_example("fp16.yaml", "fp16.onnx");
    const auto& dir = q.dir;
    const auto& input = q.input;
    auto r = q.run;
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = vaiq_cli("dump " + (dir / "fp16.onnx").string() + " --data " + (dir / "x.npy").string() + " --output-dir " +
                 (dir / "d").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto bytes = slurp(dir / "d" / "x_DequantizeLinear_Output.bin");
    ASSERT_EQ(bytes.size(), static_cast<size_t>(input.size()) * 2);
    for (int64_t i = 0; i < input.size(); ++i) {
        uint16_t bits = 0;
        std::memcpy(&bits, bytes.data() + 2 * i, 2);
        EXPECT_EQ(bits, vaiq::float_to_half(input.data<float>()[i])) << i;
    }
}

TEST(Cli, RunStopsAfterPrepareAndWritesModelAndReport) {
    const auto dir = temp_dir();
    const auto model = example_model(dir);
    const auto before = slurp(model);
    const auto recipe = write_text(dir / "prep.yaml",
                                   "recipe_version: 1\nextends: cpu.yaml\noptimize_model: false\n"
                                   "passes: [eliminate_identity]\n");
    auto r = vaiq_cli("run " + recipe.string() + " --stop-after prepare --model " + model.string() + " --output " +
                      (dir / "out.onnx").string() + " --report " + (dir / "report.json").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("the output is not quantized"), std::string::npos) << r.err;
    EXPECT_EQ(slurp(model), before) << "the input model changed";
    const auto out = vaiq::load_model(dir / "out.onnx");
    EXPECT_EQ(out.graph().node_size(), 2) << "the Identity should be gone";
    const auto report = nlohmann::json::parse(slurp(dir / "report.json"));
    EXPECT_EQ(report["quantized"], false);
    EXPECT_EQ(report["stopped_after"], "prepare");
    ASSERT_EQ(report["passes"].size(), 1u);
    EXPECT_EQ(report["passes"][0]["name"], "eliminate_identity");
    EXPECT_EQ(report["passes"][0]["changed"], true);
    EXPECT_EQ(report["recipe"]["settings"]["activation_type"]["value"], "QUInt8");
    // No temporary files are left behind.
    for (const auto& e : fs::directory_iterator(dir))
        EXPECT_EQ(e.path().filename().string()[0] == '.', false) << e.path();
}

TEST(Cli, RunNeverOverwritesTheInput) {
    const auto dir = temp_dir();
    const auto model = example_model(dir);
    const auto before = slurp(model);
    auto r = vaiq_cli("run " VAIQ_SOURCE_DIR "/recipes/cpu.yaml --stop-after prepare --model " + model.string() +
                      " --output " + model.string());
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("refusing to write over the input model"), std::string::npos) << r.err;
    EXPECT_EQ(slurp(model), before);
}

TEST(Cli, CorruptModelIsAOneLineErrorAndExitOne) {
    const auto dir = temp_dir();
    const auto model = example_model(dir);
    const auto bytes = slurp(model);
    std::ofstream(dir / "cut.onnx", std::ios::binary) << bytes.substr(0, bytes.size() / 3);
    auto r = vaiq_cli("run " VAIQ_SOURCE_DIR "/recipes/cpu.yaml --stop-after prepare --model " +
                      (dir / "cut.onnx").string() + " --output " + (dir / "out.onnx").string());
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(error_lines(r.err), 1u) << r.err;
    EXPECT_EQ(lines(r.err), 1u) << "nothing but the error is printed before the model loads: " << r.err;
    EXPECT_NE(r.err.find("cut.onnx: not a valid ONNX model"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir / "out.onnx"));
}

TEST(Cli, MissingPluginIsAnError) {
    const auto recipe = write_text(temp_dir() / "r.yaml", "recipe_version: 1\ntarget: gpu\ncalibrate_method: MinMax\n");
    auto r = vaiq_cli("validate " + recipe.string());
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(
        r.err.find("no target plugin named 'gpu' is installed; did you mean 'cpu'? (installed targets: cpu, npu_cnn,"),
        std::string::npos)
        << r.err;
}

TEST(Cli, BrokenPluginOnThePluginPathIsAnError) {
    const auto dir = temp_dir();
    write_text(dir / "libbroken.so", "not a library");
    auto r = vaiq_cli("plugins 2>&1; VAIQ_PLUGIN_PATH=" + dir.string() + " " VAIQ_CLI " plugins");
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("libbroken.so is not a loadable plugin library"), std::string::npos) << r.err;
}

TEST(Cli, ConvertOpset) {
    const auto dir = temp_dir();
    vaiq::save_model(vaiq::test::conv_relu_model(9), dir / "old.onnx");
    auto r = vaiq_cli("explain " VAIQ_SOURCE_DIR "/recipes/cpu.yaml --model " + (dir / "old.onnx").string());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("uses opset 9: converted to opset 13"), std::string::npos) << r.err;
    r = vaiq_cli("convert-opset " + (dir / "old.onnx").string() + " " + (dir / "new.onnx").string() + " --opset 13");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(vaiq::load_model(dir / "new.onnx").opset(), 13);

    // An opset-9 export whose Softmax input has no declared shape (as PP-OCR's):
    // symbolic shape inference gives the adapters what they need.
    vaiq::test::GraphBuilder b(9);
    b.input("x", {1, 3, 8}).output("y", {1, 3, 8});
    b.node("Relu", {"x"}, {"r"});
    vaiq::set_attribute(b.node("Softmax", {"r"}, {"y"}), "axis", 2);
    vaiq::save_model(b.build(), dir / "softmax9.onnx");
    r = vaiq_cli("convert-opset " + (dir / "softmax9.onnx").string() + " " + (dir / "softmax13.onnx").string() +
                 " --opset 13");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(vaiq::load_model(dir / "softmax13.onnx").opset(), 13);
}

// Models of opset 7 to 9 are converted to 13 as they are loaded (one warning,
// the report's opset_converted), by run and preprocess alike; older ones are
// refused with advice. The input file stays as it was.
TEST(Cli, RunAndPreprocessConvertOldOpsetsThemselves) {
    const auto dir = temp_dir();
    vaiq::save_model(vaiq::test::conv_relu_model(9), dir / "old.onnx");
    const auto before = vaiq::test::slurp(dir / "old.onnx");
    auto r = vaiq_cli("run " VAIQ_SOURCE_DIR "/recipes/cpu.yaml --model " + (dir / "old.onnx").string() +
                      " --output " + (dir / "q.onnx").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("uses opset 9: converted to opset 13"), std::string::npos) << r.err;
    EXPECT_EQ(vaiq::load_model(dir / "q.onnx").opset(), 13);
    const auto report = nlohmann::json::parse(vaiq::test::slurp(dir / "q.report.json"));
    EXPECT_EQ(report["opset_converted"]["from"], 9);
    EXPECT_EQ(report["opset_converted"]["to"], 13);
    EXPECT_EQ(vaiq::test::slurp(dir / "old.onnx"), before) << "the input is not touched";

    r = vaiq_cli("preprocess " + (dir / "old.onnx").string() + " " + (dir / "pre.onnx").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(vaiq::load_model(dir / "pre.onnx").opset(), 13);

    vaiq::save_model(vaiq::test::conv_relu_model(6), dir / "older.onnx");
    r = vaiq_cli("run " VAIQ_SOURCE_DIR "/recipes/cpu.yaml --model " + (dir / "older.onnx").string() +
                 " --output " + (dir / "q6.onnx").string());
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("uses opset 6"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("Re-export"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir / "q6.onnx"));
}

}  // namespace

namespace {

// The bundled example's calibration data cut in two along the batch dimension.
std::pair<fs::path, fs::path> example_data_halves(const fs::path& dir) {
    const auto whole = vaiq::read_npy(VAIQ_SOURCE_DIR "/examples/mnist/calibration.npy");
    auto shape = whole.shape();
    const int64_t first = shape[0] / 2;
    const size_t sample = whole.bytes().size() / static_cast<size_t>(shape[0]);
    std::pair<fs::path, fs::path> out{dir / "a.npy", dir / "b.npy"};
    for (const auto& [path, from, count] : {std::tuple{out.first, int64_t{0}, first},
                                            std::tuple{out.second, first, shape[0] - first}}) {
        shape[0] = count;
        vaiq::Tensor half(whole.type(), shape);
        std::memcpy(half.mutable_bytes().data(), whole.bytes().data() + static_cast<size_t>(from) * sample,
                    half.bytes().size());
        vaiq::write_npy(path, half);
    }
    return out;
}

const std::string kExampleRecipe = VAIQ_SOURCE_DIR "/examples/mnist/mnist_cpu.yaml";

}  // namespace

TEST(Cli, ShardStatisticsQuantizeAsTheWholeDataDoes) {
    const auto dir = temp_dir();
    const auto [a, b] = example_data_halves(dir);
    for (const auto& [data, stats] : {std::pair{a, dir / "a.json"}, std::pair{b, dir / "b.json"}}) {
        const auto r = vaiq_cli("-q calibrate " + kExampleRecipe + " --data " + data.string() + " --output " +
                                stats.string());
        ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    auto r = vaiq_cli("-q run " + kExampleRecipe + " --output " + (dir / "whole.onnx").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = vaiq_cli("-q run " + kExampleRecipe + " --calibration " + (dir / "a.json").string() + " " +
                 (dir / "b.json").string() + " --output " + (dir / "merged.onnx").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(slurp(dir / "merged.onnx"), slurp(dir / "whole.onnx")) << "MinMax: bit for bit";
    const auto report = nlohmann::json::parse(slurp(dir / "merged.report.json"));
    EXPECT_EQ(report["calibration"]["statistics_files"].size(), 2u);
    EXPECT_GE(report["evaluation"]["accuracy"]["quantized"].get<double>(), 0.9);
    // Two statistics files merge into one that quantizes the same way.
    r = vaiq_cli("-q calibrate " + kExampleRecipe + " --calibration " + (dir / "a.json").string() + " " +
                 (dir / "b.json").string() + " --output " + (dir / "ab.json").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = vaiq_cli("-q run " + kExampleRecipe + " --calibration " + (dir / "ab.json").string() + " --output " +
                 (dir / "ab.onnx").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(slurp(dir / "ab.onnx"), slurp(dir / "whole.onnx"));
}

TEST(Cli, CalibrateWritesOnnxRuntimeCalibrationTables) {
    const auto dir = temp_dir();
    const auto r = vaiq_cli("-q calibrate " + kExampleRecipe + " --set calibrate_method=Percentile --output " +
                            (dir / "s.json").string() + " --ort-tables " + (dir / "ort").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto stats = nlohmann::json::parse(slurp(dir / "s.json"));
    EXPECT_EQ(stats["format"], "vaiq-calibration-statistics");
    EXPECT_EQ(stats["version"], 1);
    EXPECT_TRUE(stats["tensors"].begin()->at("statistics").contains("hist_counts"));
    const auto ranges = nlohmann::json::parse(slurp(dir / "ort" / "calibration.json"));
    EXPECT_EQ(ranges.size(), stats["tensors"].size());
    std::istringstream cache(slurp(dir / "ort" / "calibration.cache"));
    std::string name, previous;
    double absmax = 0;
    size_t count = 0;
    while (cache >> name >> absmax) {
        ASSERT_TRUE(ranges.contains(name)) << name;
        const auto& range = ranges[name];
        EXPECT_FLOAT_EQ(static_cast<float>(absmax), std::max(std::abs(range[0].get<float>()), range[1].get<float>()));
        EXPECT_LT(previous, name) << "sorted by name";
        previous = name;
        ++count;
    }
    EXPECT_EQ(count, ranges.size());
}

TEST(Cli, StatisticsOfAnotherModelOrCalibratorAreRefused) {
    const auto dir = temp_dir();
    auto r = vaiq_cli("-q calibrate " + kExampleRecipe + " --output " + (dir / "s.json").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string quantize = "-q run " + kExampleRecipe + " --output " + (dir / "q.onnx").string() + " ";
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"--model " + example_model(dir).string() + " --calibration " + (dir / "s.json").string(), "another model"},
        {"--set extra_options.CalibTensorRangeSymmetric=true --calibration " + (dir / "s.json").string(),
         "calibrator 'minmax' ran with CalibTensorRangeSymmetric: false"},
        {"--set calibrate_method=Percentile --calibration " + (dir / "s.json").string(), "no statistics of"},
        {"--calibration " + write_text(dir / "other.json", "{\"a\": 1}").string(),
         "not a vaiq calibration statistics file"},
        {"--calibration " + write_text(dir / "cut.json", slurp(dir / "s.json").substr(0, 100)).string(), "not JSON"},
    };
    for (const auto& [args, message] : cases) {
        r = vaiq_cli(quantize + args);
        EXPECT_EQ(r.exit_code, 1) << args;
        EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
        EXPECT_FALSE(fs::exists(dir / "q.onnx")) << args;
    }
}

TEST(Cli, AFolderOfPngDigitsCalibratesAsTheSameDigitsAsNpy) {
    const auto dir = temp_dir();
    const auto digits = vaiq::read_npy(VAIQ_SOURCE_DIR "/examples/mnist/calibration.npy");  // uint8 [200, 1, 28, 28]
    fs::create_directories(dir / "png");
    fs::create_directories(dir / "npy");
    for (int64_t i = 0; i < 20; ++i) {
        const auto* first = digits.data<uint8_t>().data() + i * 28 * 28;
        vaiq::test::write_png(dir / "png" / ("digit_" + std::to_string(i) + ".png"), 28, 28, 1, first);
        vaiq::Tensor one(vaiq::DataType::UInt8, {1, 1, 28, 28});
        std::memcpy(one.mutable_bytes().data(), first, 28 * 28);
        vaiq::write_npy(dir / "npy" / ("digit_" + std::to_string(i) + ".npy"), one);
    }
    for (const char* kind : {"png", "npy"}) {
        const auto r = vaiq_cli("-q calibrate " + kExampleRecipe + " --data " + (dir / kind).string() + " --output " +
                                (dir / (std::string(kind) + ".json")).string());
        ASSERT_EQ(r.exit_code, 0) << r.err;
    }
    const auto png = nlohmann::json::parse(slurp(dir / "png.json")), npy = nlohmann::json::parse(slurp(dir / "npy.json"));
    EXPECT_EQ(png["batches"], 20);
    EXPECT_EQ(png["tensors"], npy["tensors"]) << "the same ranges, bit for bit";
    // A preset takes effect (its [-1, 1] pixels change every range) ...
    auto r = vaiq_cli("-q calibrate " + kExampleRecipe + " --data " + (dir / "png").string() +
                      " --set data_preprocess=preprocess_method1 --output " + (dir / "m1.json").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(nlohmann::json::parse(slurp(dir / "m1.json"))["tensors"], npy["tensors"]);
    // ... and one that does not fit the input is a clear error.
    r = vaiq_cli("-q calibrate " + kExampleRecipe + " --data " + (dir / "png").string() +
                 " --set data_preprocess=preprocess_method2 --output " + (dir / "m2.json").string());
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("preprocess_method2 gives 3 means or stds for a 1-channel input"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir / "m2.json"));
}

// x [1, 16, 64] with four loud channels -> MatMul(w [64, 128]) -> y.
TEST(Cli, AwqLiteAndGptqBeatRoundToNearestWhereActivationsHaveLoudChannels) {
    const auto dir = temp_dir();
    vaiq::test::GraphBuilder b(17);
    b.input("x", {1, 16, 64}).output("y", {1, 16, 128});
    std::vector<float> w(64 * 128);
    for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(static_cast<float>(i * i % 977) * 0.37f) * 0.1f;
    b.initializer("w", vaiq::Tensor::from_values<float>({64, 128}, w));
    b.node("MatMul", {"x", "w"}, {"y"}, "proj");
    vaiq::save_model(b.build(), dir / "m.onnx");
    fs::create_directories(dir / "data");
    // Channels that move together (four shared factors), as a language model's do: GPTQ's gain
    // comes from those correlations. 256 token rows: H fitted on 192, GPTQ judged on the other 64.
    for (int s = 0; s < 16; ++s) {
        auto batch = vaiq::test::normal_batches(1, 16 * 64, 1.0f, static_cast<unsigned>(s + 1))[0];
        const auto factors = vaiq::test::normal_batches(1, 16 * 4, 1.0f, static_cast<unsigned>(s + 101))[0];
        for (size_t i = 0; i < batch.size(); ++i)
            for (size_t f = 0; f < 4; ++f)
                batch[i] += 2.0f * factors[i / 64 * 4 + f] * std::sin(static_cast<float>((i % 64) * (f + 1)));
        for (size_t i = 0; i < batch.size(); ++i)
            if (i % 64 < 4) batch[i] *= 30.0f;  // loud channels, as language models have
        vaiq::write_npy(dir / "data" / ("s" + std::to_string(s) + ".npy"),
                        vaiq::Tensor::from_values<float>({1, 16, 64}, batch));
    }
    std::map<std::string, nlohmann::json> reports;
    for (const char* recipe : {"int4_rtn", "int4_awq", "int4_gptq"}) {
        const auto r = vaiq_cli("-q run " VAIQ_SOURCE_DIR "/recipes/" + std::string(recipe) + ".yaml --model " +
                                (dir / "m.onnx").string() + " --data " + (dir / "data").string() + " --set block_size=32 --output " +
                                (dir / (std::string(recipe) + ".onnx")).string());
        ASSERT_EQ(r.exit_code, 0) << r.err;
        reports[recipe] = nlohmann::json::parse(slurp(dir / (std::string(recipe) + ".report.json")));
    }
    const auto& awq = reports["int4_awq"]["awq_lite"];
    EXPECT_EQ(awq["scaled"], 1);
    EXPECT_LT(awq["output_error_awq"].get<double>(), awq["output_error_rtn"].get<double>());
    const double rtn_db = reports["int4_rtn"]["evaluation"]["outputs"][0]["sqnr_db"].get<double>();
    const double awq_db = reports["int4_awq"]["evaluation"]["outputs"][0]["sqnr_db"].get<double>();
    EXPECT_GT(awq_db, rtn_db + 0.8) << "AWQ " << awq_db << " dB, RTN " << rtn_db << " dB";
    const double gptq_db = reports["int4_gptq"]["evaluation"]["outputs"][0]["sqnr_db"].get<double>();
    EXPECT_GT(gptq_db, rtn_db + 2.0) << "GPTQ " << gptq_db << " dB, RTN " << rtn_db << " dB";
    const auto& layer = reports["int4_gptq"]["gptq"]["layers"][0];
    EXPECT_LT(layer["output_error_gptq"].get<double>(), layer["output_error_rtn"].get<double>());
    // The graph input has no producer to fold 1/s into: a Mul feeds the MatMulNBits.
    const auto model = vaiq::load_model(dir / "int4_awq.onnx");
    EXPECT_EQ(model.graph().node(0).op_type(), "Mul");
    EXPECT_EQ(model.graph().node(1).op_type(), "MatMulNBits");
}

// The language-model example in 4 bits: perplexity on held-out text.
TEST(Cli, TheLanguageModelExampleKeepsItsPerplexityInFourBits) {
    const auto dir = temp_dir();
    std::map<std::string, double> perplexity;
    for (const char* algorithm : {"rtn", "awq_lite", "awq_clip", "awq_full", "gptq"}) {
        const auto out = dir / (std::string(algorithm) + ".onnx");
        const auto r = vaiq_cli("-q run " VAIQ_SOURCE_DIR "/examples/charlm/charlm_int4.yaml --output " + out.string() +
                                " --set weight_only_algorithm=" + algorithm);
        ASSERT_EQ(r.exit_code, 0) << r.err;
        const auto report = nlohmann::json::parse(slurp(dir / (std::string(algorithm) + ".report.json")));
        const auto& p = report["evaluation"]["perplexity"];
        EXPECT_NEAR(p["float"].get<double>(), 4.385, 0.001) << "what the trainer measured";
        perplexity[algorithm] = p["quantized"].get<double>();
        EXPECT_LT(fs::file_size(out), 0.3 * fs::file_size(VAIQ_SOURCE_DIR "/examples/charlm/charlm.onnx"));
    }
    EXPECT_LT(perplexity["rtn"], 4.385 * 1.10) << "RTN within 10 % of float";
    // With no data at all, AWQ searches on random decoder inputs.
    const auto r = vaiq_cli("-q run " VAIQ_SOURCE_DIR "/recipes/int4_awq.yaml --model " VAIQ_SOURCE_DIR
                            "/examples/charlm/charlm.onnx --output " + (dir / "no_data.onnx").string());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_LT(perplexity["awq_lite"], perplexity["rtn"]);
    EXPECT_LT(perplexity["awq_clip"], perplexity["rtn"]);
    EXPECT_LT(perplexity["awq_full"], perplexity["awq_lite"]) << "clipping after the scales helps again";
    EXPECT_LT(perplexity["gptq"], perplexity["rtn"]);
    // HQQ's float zero points and k-quant's searched grids against round to nearest on the same unsigned grid
    // (4.436, 4.401 and 4.455 measured).
    for (const char* algorithm : {"rtn", "hqq", "k_quant"}) {
        const auto out = dir / (std::string("unsigned_") + algorithm + ".onnx");
        const auto run = vaiq_cli("-q run " VAIQ_SOURCE_DIR "/examples/charlm/charlm_int4.yaml --output " +
                                  out.string() + " --set weight_only_algorithm=" + algorithm +
                                  " --set weight_type=QUInt4 --set extra_options.WeightSymmetric=false");
        ASSERT_EQ(run.exit_code, 0) << run.err;
        const auto report = nlohmann::json::parse(slurp(dir / (std::string("unsigned_") + algorithm + ".report.json")));
        perplexity[std::string("unsigned_") + algorithm] =
            report["evaluation"]["perplexity"]["quantized"].get<double>();
    }
    EXPECT_LT(perplexity["unsigned_hqq"], perplexity["unsigned_rtn"]);
    EXPECT_LT(perplexity["unsigned_k_quant"], perplexity["unsigned_rtn"]);
}

// The language model in 8 bits (cpu.yaml): its attention masks hold -inf (the
// masked scores and the fill constant) and its past is empty in every
// calibration sample; those stay float, the rest is quantized.
TEST(Cli, EightBitsOnTheLanguageModelLeaveItsMasksAndEmptyPastFloat) {
    const auto dir = temp_dir();
    const std::string example = VAIQ_SOURCE_DIR "/examples/charlm/";
    const auto r =
        vaiq_cli("-q run cpu.yaml --model " + example + "charlm.onnx --data " + example +
                 "calibration --set evaluation_data=" + example + "evaluation --set evaluation_labels=" + example +
                 "evaluation_labels.npy --output " + (dir / "q.onnx").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto report = nlohmann::json::parse(slurp(dir / "q.report.json"));
    const auto& calibration = report["calibration"];
    auto listed = [](const nlohmann::json& list, const std::string& name) {
        return std::find(list.begin(), list.end(), name) != list.end();
    };
    EXPECT_TRUE(listed(calibration["not_finite"], "/blocks.0/Where_output_0")) << calibration.dump();
    EXPECT_TRUE(listed(calibration["not_finite"], "/blocks.0/Constant_17_output_0")) << "the -inf fill";
    EXPECT_TRUE(listed(calibration["empty"], "past_key_values.0.key")) << calibration.dump();
    EXPECT_LT(report["evaluation"]["perplexity"]["quantized"].get<double>(), 4.385 * 1.02) << "float 4.385";
}

TEST(Cli, TheInt4RecipesLeaveTheLanguageModelHeadFloat) {
    const auto dir = temp_dir();
    vaiq::test::GraphBuilder b(17);
    b.input("x", {1, 4, 32}).output("logits", {1, 4, 40});
    b.initializer("w", vaiq::test::ramp({32, 32}, -0.5f, 0.001f)).initializer("head", vaiq::test::ramp({32, 40}, -0.5f, 0.001f));
    b.node("MatMul", {"x", "w"}, {"h"}, "/model/layers.0/mlp/MatMul");
    b.node("MatMul", {"h", "head"}, {"logits"}, "/lm_head/MatMul");
    vaiq::save_model(b.build(), dir / "m.onnx");
    const auto r = vaiq_cli("-q run " VAIQ_SOURCE_DIR "/recipes/int4_rtn.yaml --model " + (dir / "m.onnx").string() +
                            " --set block_size=16 --output " + (dir / "q.onnx").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto model = vaiq::load_model(dir / "q.onnx");
    ASSERT_EQ(model.graph().node_size(), 2);
    EXPECT_EQ(model.graph().node(0).op_type(), "MatMulNBits");
    EXPECT_EQ(model.graph().node(1).op_type(), "MatMul") << "the head stays float";
}
