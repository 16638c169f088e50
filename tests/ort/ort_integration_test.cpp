// The quantized example in ONNX Runtime, the runtime users deploy with: the
// model vaiq writes loads and runs there, keeps the example's accuracy, agrees
// with vaiq's own execution, and runs its convolutions as integer kernels.
#include <gtest/gtest.h>

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

class OnnxRuntime : public ::testing::TestWithParam<std::string> {};

TEST_P(OnnxRuntime, RunsTheQuantizedExampleAndKeepsItsAccuracy) {
    ASSERT_TRUE(fs::exists(ort_modules() / "onnxruntime-node" / "package.json"))
        << "onnxruntime-node is not installed in " << ort_modules() << ": run scripts/install-ort.sh";
    const auto dir = vaiq::test::temp_dir();
    const auto model = dir / "mnist_int8.onnx";
    auto r = run_command(std::string(VAIQ_CLI) + " -q run " + (kExample / "mnist_cpu.yaml").string() + " --output " +
                         model.string() + " --set quant_format=" + GetParam());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto report = nlohmann::json::parse(slurp(dir / "mnist_int8.report.json"));

    r = run_command("NODE_PATH=" + ort_modules().string() + " " VAIQ_NODE " " VAIQ_SOURCE_DIR "/tests/ort/run_model.js " +
                    model.string() + " " + (dir / "ort").string() + " --optimized " + (dir / "optimized.onnx").string() +
                    " " + (kExample / "test_images.npy").string());
    ASSERT_EQ(r.exit_code, 0) << r.err;

    // Accuracy in ONNX Runtime: at most 0.3 points below the float model's.
    const auto ort_logits = vaiq::read_npy(dir / "ort" / "output_0.npy");
    const auto labels = vaiq::read_npy(kExample / "test_labels.npy");
    ASSERT_EQ(ort_logits.shape(), (std::vector<int64_t>{1000, 10}));
    int correct = 0;
    for (int64_t i = 0; i < 1000; ++i) {
        const auto row = ort_logits.data<float>().subspan(i * 10, 10);
        correct += std::max_element(row.begin(), row.end()) - row.begin() == labels.data<int64_t>()[i];
    }
    const double float_accuracy = report["evaluation"]["accuracy"]["float"].get<double>();
    EXPECT_GE(correct / 1000.0, float_accuracy - 0.003);

    // vaiq's execution of the same model: within one output quantization step of ONNX Runtime.
    float step = 0;
    for (const auto& t : report["tensors"])
        if (t["tensor"] == "logits") step = t["scale"].get<float>();
    ASSERT_GT(step, 0.0f);
    const auto quantized = vaiq::load_model(model);
    vaiq::runtime::Executor executor(quantized);
    const auto ours = executor.run({{"pixels", vaiq::read_npy(kExample / "test_images.npy")}})[0];
    int64_t within = 0;
    for (int64_t i = 0; i < ours.size(); ++i)
        within += std::abs(ours.data<float>()[i] - ort_logits.data<float>()[i]) <= step * 1.001f;
    EXPECT_GE(static_cast<double>(within) / static_cast<double>(ours.size()), 0.999);

    // ONNX Runtime runs every convolution on integers: no float Conv is left.
    const auto optimized = vaiq::load_model(dir / "optimized.onnx");
    int qlinear_conv = 0, float_conv = 0;
    for (const auto& n : optimized.graph().node()) {
        qlinear_conv += n.op_type() == "QLinearConv";
        float_conv += n.op_type() == "Conv" || n.op_type() == "FusedConv";
    }
    EXPECT_EQ(qlinear_conv, 3);
    EXPECT_EQ(float_conv, 0);
}

INSTANTIATE_TEST_SUITE_P(Formats, OnnxRuntime, ::testing::Values("QDQ", "QOperator"));

}  // namespace
