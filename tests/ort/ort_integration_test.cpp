// The quantized example in ONNX Runtime, the runtime users deploy with: the
// model vaiq writes loads and runs there, keeps the example's accuracy, agrees
// with vaiq's own execution, and runs its convolutions as integer kernels.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>

#include "runtime/executor.hpp"
#include "test_support.hpp"
#include "util/npy.hpp"

namespace fs = std::filesystem;

namespace {

using vaiq::test::run_command;
using vaiq::test::slurp;

const fs::path kExample = VAIQ_SOURCE_DIR "/examples/mnist";

// Where scripts/install-ort.sh put onnxruntime-node.
fs::path ort_modules() {
    const char* home = std::getenv("VAIQ_ORT_HOME");
    const fs::path base = home ? fs::path(home) : fs::path(std::getenv("HOME")) / ".cache/vaiq/onnxruntime-node";
    return base / "node_modules";
}

// Runs `model` in ONNX Runtime on `input` (a .npy), writing out/output_<i>.npy;
// `optimized`, when given, receives the graph ONNX Runtime runs.
vaiq::test::CommandResult run_in_ort(const fs::path& model, const fs::path& out, const fs::path& input,
                                     const fs::path& optimized = {}) {
    return run_command("NODE_PATH=" + ort_modules().string() + " " VAIQ_NODE " " VAIQ_SOURCE_DIR
                       "/tests/ort/run_model.js " + model.string() + " " + out.string() +
                       (optimized.empty() ? "" : " --optimized " + optimized.string()) + " " + input.string());
}

// Quantizes the example with `recipe` (plus `settings`), runs the result in ONNX
// Runtime on the test digits; returns the report, the logits and where the
// optimized graph went.
struct OrtRun {
    nlohmann::json report;
    vaiq::Tensor logits;
    fs::path model, optimized;
};

OrtRun quantize_and_run(const std::string& recipe, const std::string& settings, bool to_native = false) {
    OrtRun out;
    EXPECT_TRUE(fs::exists(ort_modules() / "onnxruntime-node" / "package.json"))
        << "onnxruntime-node is not installed in " << ort_modules() << ": run scripts/install-ort.sh";
    const auto dir = vaiq::test::temp_dir();
    out.model = dir / "mnist_int8.onnx";
    out.optimized = dir / "optimized.onnx";
    auto r = run_command(std::string(VAIQ_CLI) + " -q run " + (kExample / recipe).string() + " --output " +
                         out.model.string() + " " + settings);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    out.report = nlohmann::json::parse(slurp(dir / "mnist_int8.report.json"));
    if (to_native) {  // a custom-op model, rewritten in the form ONNX Runtime runs
        out.model = dir / "native.onnx";
        r = run_command(std::string(VAIQ_CLI) + " -q convert-format " + (dir / "mnist_int8.onnx").string() + " " +
                        out.model.string());
        EXPECT_EQ(r.exit_code, 0) << r.err;
    }
    r = run_in_ort(out.model, dir / "ort", kExample / "test_images.npy", out.optimized);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    out.logits = vaiq::read_npy(dir / "ort" / "output_0.npy");
    return out;
}

double accuracy(const vaiq::Tensor& logits) {
    const auto labels = vaiq::read_npy(kExample / "test_labels.npy");
    EXPECT_EQ(logits.shape(), (std::vector<int64_t>{1000, 10}));
    int correct = 0;
    for (int64_t i = 0; i < 1000; ++i) {
        const auto row = logits.data<float>().subspan(i * 10, 10);
        correct += std::max_element(row.begin(), row.end()) - row.begin() == labels.data<int64_t>()[i];
    }
    return correct / 1000.0;
}

// The share of vaiq's logits within one output quantization step of ONNX Runtime's.
double within_one_step(const OrtRun& run) {
    float step = 0;
    for (const auto& t : run.report["tensors"])
        if (t["tensor"] == "logits") step = t["scale"].get<float>();
    EXPECT_GT(step, 0.0f);
    const auto quantized = vaiq::load_model(run.model);
    vaiq::runtime::Executor executor(quantized);
    const auto ours = executor.run({{"pixels", vaiq::read_npy(kExample / "test_images.npy")}})[0];
    int64_t within = 0;
    for (int64_t i = 0; i < ours.size(); ++i)
        within += std::abs(ours.data<float>()[i] - run.logits.data<float>()[i]) <= step * 1.001f;
    return static_cast<double>(within) / static_cast<double>(ours.size());
}

class OnnxRuntime : public ::testing::TestWithParam<std::string> {};

TEST_P(OnnxRuntime, RunsTheQuantizedExampleAndKeepsItsAccuracy) {
    const auto run = quantize_and_run("mnist_cpu.yaml", "--set quant_format=" + GetParam());
    // Accuracy in ONNX Runtime: at most 0.3 points below the float model's.
    EXPECT_GE(accuracy(run.logits), run.report["evaluation"]["accuracy"]["float"].get<double>() - 0.003);
    EXPECT_GE(within_one_step(run), 0.999);

    // ONNX Runtime runs every convolution on integers: no float Conv is left.
    const auto optimized = vaiq::load_model(run.optimized);
    int qlinear_conv = 0, float_conv = 0;
    for (const auto& n : optimized.graph().node()) {
        qlinear_conv += n.op_type() == "QLinearConv";
        float_conv += n.op_type() == "Conv" || n.op_type() == "FusedConv";
    }
    EXPECT_EQ(qlinear_conv, 3);
    EXPECT_EQ(float_conv, 0);
}

// The NPU recipe's model (power-of-two scales, int8 biases, DPU approximations)
// is a valid QDQ model too: ONNX Runtime runs it and agrees with vaiq.
TEST(OnnxRuntimeNpu, RunsTheNpuExampleAndAgreesWithVaiq) {
    const auto run = quantize_and_run("mnist_npu.yaml", "");
    EXPECT_GE(accuracy(run.logits), run.report["evaluation"]["accuracy"]["float"].get<double>() - 0.01);
    EXPECT_NEAR(accuracy(run.logits), run.report["evaluation"]["accuracy"]["quantized"].get<double>(), 0.002);
    EXPECT_GE(within_one_step(run), 0.999);
}

// x -> Gemm(w1) -> Relu -> Gemm(w2) -> Relu -> Gemm(w3) -> y, w2 holding one
// value far above the rest: at 8 bits per tensor its other values round to
// zero, so mixed precision leaves w2 float. Between a dequantized input and a
// QuantizeLinear, ONNX Runtime would quantize that float weight itself (its
// WeightBiasQuantization): the layer must be written so that it stays float.
vaiq::Model gemm_chain_with_a_culprit() {
    vaiq::test::GraphBuilder b;
    b.input("x", {16, 8}).output("y", {16, 8});
    const char* names[] = {"w1", "w2", "w3"};
    for (int layer = 1; layer <= 3; ++layer) {
        std::vector<float> w(64);
        for (int i = 0; i < 64; ++i) w[i] = 0.05f * static_cast<float>((i * (3 + 2 * layer)) % 13 - 6);
        if (layer == 2) w[9] = 40.0f;
        b.initializer(names[layer - 1], vaiq::Tensor::from_values<float>({8, 8}, w));
    }
    b.node("Gemm", {"x", "w1"}, {"h1"});
    b.node("Relu", {"h1"}, {"r1"});
    b.node("Gemm", {"r1", "w2"}, {"h2"});
    b.node("Relu", {"h2"}, {"r2"});
    b.node("Gemm", {"r2", "w3"}, {"y"});
    return b.build();
}

TEST(OnnxRuntimeNpu, LayersLeftFloatByMixedPrecisionStayFloatThere) {
    const auto dir = vaiq::test::temp_dir();
    vaiq::save_model(gemm_chain_with_a_culprit(), dir / "in.onnx");
    std::vector<float> x(16 * 8);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(double(i) * 0.7));
    vaiq::write_npy(dir / "x.npy", vaiq::Tensor::from_values<float>({16, 8}, x));
    auto r = run_command(std::string(VAIQ_CLI) + " -q run " VAIQ_SOURCE_DIR "/recipes/cnn_npu.yaml --model " +
                         (dir / "in.onnx").string() + " --data " + (dir / "x.npy").string() + " --output " +
                         (dir / "out.onnx").string() +
                         " --set extra_options.AutoMixprecision.SQNRTarget=35"
                         " --set extra_options.AutoMixprecision.MaxRaisedFraction=0.5");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto report = nlohmann::json::parse(slurp(dir / "out.report.json"));
    const auto& raised = report["mixed_precision"]["raised"];
    ASSERT_FALSE(raised.empty()) << report["mixed_precision"].dump();
    EXPECT_EQ(raised[0]["tensor"], "w2");
    r = run_in_ort(dir / "out.onnx", dir / "ort", dir / "x.npy");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto theirs = vaiq::read_npy(dir / "ort" / "output_0.npy");
    const auto written = vaiq::load_model(dir / "out.onnx");
    vaiq::runtime::Executor executor(written);
    const auto ours = executor.run({{"x", vaiq::read_npy(dir / "x.npy")}})[0];
    float largest = 0;
    for (float v : theirs.data<float>()) largest = std::max(largest, std::abs(v));
    for (int64_t i = 0; i < ours.size(); ++i)  // float summation orders differ: 0.1 % of the largest
        EXPECT_NEAR(ours.data<float>()[i], theirs.data<float>()[i], 1e-3f * largest) << i << " " << raised.dump();
}

// A model written elsewhere: a Conv with a float weight and bias, and a Gemm
// with a dequantized weight and a float bias, each between a DequantizeLinear
// input and a QuantizeLinear. ONNX Runtime quantizes those weights and biases
// itself (WeightBiasQuantization); vaiq's executor must compute the same.
TEST(OnnxRuntimeQdq, FloatWeightsAndBiasesBetweenQdqPairsAreQuantizedAsThere) {
    using vaiq::Tensor;
    vaiq::test::GraphBuilder b(13);
    b.input("x", {2, 3, 5, 5}).output("y", {2, 4});
    auto noise = [](int64_t i, float scale) { return scale * static_cast<float>(std::sin(double(i) * 2.3 + 0.4)); };
    std::vector<float> w(4 * 3 * 3 * 3), cb(4), g(100 * 4), gb(4);
    for (size_t i = 0; i < w.size(); ++i) w[i] = noise(static_cast<int64_t>(i), 0.4f) + 0.05f;
    w[5] = 30.0f;  // int8 steps of 0.12: ONNX Runtime's quantized weight differs visibly from the float one
    for (size_t i = 0; i < cb.size(); ++i) cb[i] = noise(static_cast<int64_t>(i) + 50, 0.3f);
    for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>((i * 7) % 11) - 5.0f;
    for (size_t i = 0; i < gb.size(); ++i) gb[i] = noise(static_cast<int64_t>(i) + 90, 2.0f);
    b.initializer("w", Tensor::from_values<float>({4, 3, 3, 3}, w));
    b.initializer("cb", Tensor::from_values<float>({4}, cb));
    b.initializer("gq", Tensor::from_values<int8_t>({100, 4}, std::vector<int8_t>(g.begin(), g.end())));
    b.initializer("gs", Tensor::from_values<float>({}, std::vector<float>{0.02f}));
    b.initializer("gb", Tensor::from_values<float>({4}, gb));
    b.initializer("flat", Tensor::from_values<int64_t>({2}, std::vector<int64_t>{2, 100}));
    const float scales[] = {0.02f, 0.05f, 0.03f, 0.1f};
    const char* names[] = {"s0", "s1", "s2", "s3"};
    for (int i = 0; i < 4; ++i) b.initializer(names[i], Tensor::from_values<float>({}, std::vector<float>{scales[i]}));
    b.initializer("zp", Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{128}));
    b.node("QuantizeLinear", {"x", "s0", "zp"}, {"xq"});
    b.node("DequantizeLinear", {"xq", "s0", "zp"}, {"xd"});
    vaiq::test::set_ints_attribute(b.node("Conv", {"xd", "w", "cb"}, {"c"}), "pads", {1, 1, 1, 1});
    b.node("Relu", {"c"}, {"r"});
    b.node("QuantizeLinear", {"r", "s1", "zp"}, {"rq"});
    b.node("DequantizeLinear", {"rq", "s1", "zp"}, {"rd"});
    b.node("Reshape", {"rd", "flat"}, {"f"});
    b.node("QuantizeLinear", {"f", "s1", "zp"}, {"fq"});
    b.node("DequantizeLinear", {"fq", "s1", "zp"}, {"fd"});
    b.node("DequantizeLinear", {"gq", "gs"}, {"gd"});
    b.node("Gemm", {"fd", "gd", "gb"}, {"h"});
    b.node("QuantizeLinear", {"h", "s3", "zp"}, {"hq"});
    b.node("DequantizeLinear", {"hq", "s3", "zp"}, {"y"});
    const auto model = b.build();
    const auto dir = vaiq::test::temp_dir();
    vaiq::save_model(model, dir / "m.onnx");
    std::vector<float> x(2 * 75);
    for (size_t i = 0; i < x.size(); ++i) x[i] = noise(static_cast<int64_t>(i) + 7, 2.0f);
    vaiq::write_npy(dir / "x.npy", Tensor::from_values<float>({2, 3, 5, 5}, x));
    const auto r = run_in_ort(dir / "m.onnx", dir / "ort", dir / "x.npy");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto theirs = vaiq::read_npy(dir / "ort" / "output_0.npy");
    vaiq::runtime::Executor executor(model);
    const auto ours = executor.run({{"x", vaiq::read_npy(dir / "x.npy")}})[0];
    ASSERT_EQ(ours.size(), theirs.size());
    for (int64_t i = 0; i < ours.size(); ++i) EXPECT_EQ(ours.data<float>()[i], theirs.data<float>()[i]) << i;
}

INSTANTIATE_TEST_SUITE_P(Formats, OnnxRuntime, ::testing::Values("QDQ", "QOperator"));

// 16-bit activations (the documented A16W8 mixed precision) as com.microsoft
// QuantizeLinear/DequantizeLinear pairs: ONNX Runtime runs them natively.
TEST(OnnxRuntime16Bit, RunsA16W8AndKeepsItsAccuracy) {
    const auto run = quantize_and_run("mnist_cpu.yaml", "--set activation_type=QInt16");
    EXPECT_GE(accuracy(run.logits), run.report["evaluation"]["accuracy"]["float"].get<double>() - 0.003);
    // One 16-bit step is 256 times finer than an 8-bit one: float ops between the pairs
    // (ONNX Runtime's and vaiq's summation orders) may move an element by a step.
    EXPECT_GE(within_one_step(run), 0.99);
    const double sqnr = run.report["evaluation"]["outputs"][0]["sqnr_db"].get<double>();
    EXPECT_GT(sqnr, 32.0) << "int8 activations give about 30 dB here";
}

// The documented float16 and bfloat16 recipes write Cast pairs: ONNX Runtime
// runs them, and each logit is within one step of the type of vaiq's.
TEST(OnnxRuntimeFloatTypes, RunsFloat16AndBfloat16CastPairs) {
    for (const auto& [recipe, bits] : {std::pair{"fp16.yaml", 11}, std::pair{"bf16.yaml", 8}}) {
        const auto run = quantize_and_run(
            "../../recipes/" + std::string(recipe),
            "--model " + (kExample / "mnist_cnn.onnx").string() + " --data " + (kExample / "calibration.npy").string());
        EXPECT_GE(accuracy(run.logits), 0.95) << recipe;
        const auto quantized = vaiq::load_model(run.model);
        vaiq::runtime::Executor executor(quantized);
        const auto ours = executor.run({{"pixels", vaiq::read_npy(kExample / "test_images.npy")}})[0];
        // Float ops between the Casts sum in another order than ONNX Runtime's, so a
        // rounding can flip a step upstream; nearly every logit is within one step and
        // the two agree far more closely than either with the float model.
        int64_t within = 0;
        double signal = 0, noise = 0;
        for (int64_t i = 0; i < ours.size(); ++i) {
            const double theirs = run.logits.data<float>()[i], mine = ours.data<float>()[i];
            within += std::abs(mine - theirs) <= std::ldexp(std::abs(theirs), 1 - bits) * 1.001 + 1e-6;
            signal += theirs * theirs;
            noise += (mine - theirs) * (mine - theirs);
        }
        EXPECT_GE(static_cast<double>(within) / static_cast<double>(ours.size()), 0.99) << recipe;
        const double agreement_db = 10 * std::log10(signal / std::max(noise, 1e-30));
        EXPECT_GT(agreement_db, run.report["evaluation"]["outputs"][0]["sqnr_db"].get<double>() + 6) << recipe;
        fmt::print("{}: {:.2f} % within one step, agreement {:.1f} dB\n", recipe,
                   100.0 * static_cast<double>(within) / static_cast<double>(ours.size()), agreement_db);
    }
}

// A FixNeuron model converted by vaiq convert-format runs in ONNX Runtime and
// computes what vaiq computes for the FixNeuron original.
TEST(OnnxRuntimeConverted, FixNeuronModelsRunAfterConvertFormat) {
    const auto run = quantize_and_run("mnist_npu.yaml", "--set quant_format=VitisQuantFormat.FixNeuron", true);
    EXPECT_NEAR(accuracy(run.logits), run.report["evaluation"]["accuracy"]["quantized"].get<double>(), 0.002);
    EXPECT_GE(within_one_step(run), 0.999);
}

// Float ops whose last bit decides which integer a following QuantizeLinear
// rounds to compute exactly as in ONNX Runtime: LayerNormalization (a row
// length with and without a tail past the 8-lane blocks), com.microsoft Gelu
// (and its tail past 16-lane blocks), Erf past its clamp, and the bfloat16
// rounding the DPU Softmax simulation relies on.
TEST(OnnxRuntimeFloat, LayerNormGeluErfAndBfloat16AgreeToTheBit) {
    for (int64_t hidden : {384, 100}) {
        vaiq::test::GraphBuilder b(17);
        b.input("x", {2, 37, hidden}).output("y", {2, 37, hidden}).output("e", {2, 37, hidden});
        b.initializer("k", vaiq::test::ramp({}, 1.7f));
        b.node("Mul", {"x", "k"}, {"xk"});
        b.node("Erf", {"xk"}, {"e"});
        std::vector<float> gamma(hidden), beta(hidden);
        for (int64_t i = 0; i < hidden; ++i) {
            gamma[i] = 0.5f + 0.01f * static_cast<float>(i % 97);
            beta[i] = 0.03f * static_cast<float>(i % 13) - 0.2f;
        }
        b.initializer("gamma", vaiq::Tensor::from_values<float>({hidden}, gamma));
        b.initializer("beta", vaiq::Tensor::from_values<float>({hidden}, beta));
        auto& ln = b.node("LayerNormalization", {"x", "gamma", "beta"}, {"n"});
        auto* eps = ln.add_attribute();
        eps->set_name("epsilon");
        eps->set_type(onnx::AttributeProto::FLOAT);
        eps->set_f(1e-6f);
        b.node("Gelu", {"n"}, {"g"}).set_domain("com.microsoft");
        vaiq::test::set_int_attribute(b.node("Cast", {"g"}, {"h"}), "to", onnx::TensorProto::BFLOAT16);
        vaiq::test::set_int_attribute(b.node("Cast", {"h"}, {"y"}), "to", onnx::TensorProto::FLOAT);
        auto model = b.build();
        auto* ms = model.proto().add_opset_import();
        ms->set_domain("com.microsoft");
        ms->set_version(1);
        const auto dir = vaiq::test::temp_dir();
        vaiq::save_model(model, dir / "m.onnx");
        std::vector<float> x(static_cast<size_t>(2 * 37 * hidden));
        for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(0.37 * double(i)) * 3.0 + 0.7);
        const auto input = vaiq::Tensor::from_values<float>({2, 37, hidden}, x);
        vaiq::write_npy(dir / "x.npy", input);
        const auto r = run_in_ort(dir / "m.onnx", dir / "ort", dir / "x.npy");
        ASSERT_EQ(r.exit_code, 0) << r.err;
        vaiq::runtime::Executor executor(model);
        const auto ours = executor.run({{"x", input}});
        for (size_t o = 0; o < ours.size(); ++o) {
            const auto theirs = vaiq::read_npy(dir / "ort" / fmt::format("output_{}.npy", o));
            ASSERT_EQ(ours[o].size(), theirs.size());
            int64_t different = 0;
            for (int64_t i = 0; i < ours[o].size(); ++i)
                different += ours[o].data<float>()[i] != theirs.data<float>()[i];
            EXPECT_EQ(different, 0) << "output " << o << ", hidden size " << hidden;
        }
    }
}

}  // namespace
