// Calibration data as it arrives from users: NaN and infinity, all zeros,
// constants, the wrong dtype, a shape that changes mid-stream, nothing at all.
// Each is either handled as documented (docs/data.md) or refused
// with one error line naming the file, with nothing written; never a garbage scale.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

#include "test_support.hpp"
#include "vaiq/model.hpp"
#include "vaiq/reader.hpp"

namespace fs = std::filesystem;
using namespace vaiq;
using vaiq::test::run_command;
using vaiq::test::slurp;

namespace {

class BadData : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = vaiq::test::temp_dir();
        save_model(vaiq::test::conv_relu_model(), dir_ / "model.onnx");
        fs::create_directories(dir_ / "data");
    }

    // Writes data/<name>.npy: one [1, 2, 4, 4] sample whose values come from `value(i)`.
    template <typename T, typename F>
    void sample(const std::string& name, F value, std::vector<int64_t> shape = {1, 2, 4, 4}) {
        int64_t count = 1;
        for (auto d : shape) count *= d;
        std::vector<T> values(static_cast<size_t>(count));
        for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<T>(value(static_cast<int>(i)));
        write_npy(dir_ / "data" / (name + ".npy"), Tensor::from_values<T>(shape, values));
    }

    vaiq::test::CommandResult run(const std::string& recipe = "cpu.yaml") {
        return run_command(std::string(VAIQ_CLI) + " -q run " VAIQ_SOURCE_DIR "/recipes/" + recipe + " --model " +
                           (dir_ / "model.onnx").string() + " --data " + (dir_ / "data").string() + " --output " +
                           (dir_ / "out.onnx").string());
    }

    // The one error line, and that nothing was written.
    void expect_refused(const vaiq::test::CommandResult& r, const std::string& names) {
        EXPECT_EQ(r.exit_code, 1) << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
        EXPECT_NE(r.err.find(names), std::string::npos) << "the error names " << names << ": " << r.err;
        EXPECT_FALSE(fs::exists(dir_ / "out.onnx"));
        EXPECT_FALSE(fs::exists(dir_ / "out.report.json"));
    }

    // Every scale in the written report is finite and positive.
    nlohmann::json expect_sane_scales() {
        const auto report = nlohmann::json::parse(slurp(dir_ / "out.report.json"));
        for (const auto& t : report["tensors"]) {
            const double scale = t.contains("scale") ? t["scale"].get<double>() : t.value("scale_min", 1.0);
            EXPECT_TRUE(std::isfinite(scale) && scale > 0) << t.dump();
            if (t.contains("range")) {
                EXPECT_TRUE(std::isfinite(t["range"][0].get<double>()) && std::isfinite(t["range"][1].get<double>()))
                    << t.dump();
            }
        }
        return report;
    }

    fs::path dir_;
};

TEST_F(BadData, NanOrInfinityInAnInputIsRefusedNamingTheFile) {
    sample<float>("a", [](int i) { return i * 0.1f; });
    sample<float>("b", [](int i) { return i == 7 ? std::numeric_limits<float>::quiet_NaN() : 1.0f; });
    expect_refused(run(), "b.npy");
    fs::remove(dir_ / "data" / "b.npy");
    sample<float>("c", [](int i) { return i == 3 ? -std::numeric_limits<float>::infinity() : 1.0f; });
    expect_refused(run(), "c.npy");
}

TEST_F(BadData, AllZeroInputsGiveValidScales) {
    sample<float>("a", [](int) { return 0.0f; });
    sample<float>("b", [](int) { return 0.0f; });
    const auto r = run();
    ASSERT_EQ(r.exit_code, 0) << r.err;
    expect_sane_scales();
    EXPECT_NO_THROW(check_model(load_model(dir_ / "out.onnx")));
}

TEST_F(BadData, ConstantActivationsGiveValidScalesInEveryCalibrator) {
    sample<float>("a", [](int) { return 0.75f; });
    for (const char* recipe : {"cpu.yaml", "cnn_npu.yaml", "cpu_accurate.yaml"}) {
        const auto r = run(recipe);
        ASSERT_EQ(r.exit_code, 0) << recipe << ": " << r.err;
        expect_sane_scales();
        fs::remove(dir_ / "out.onnx");
    }
}

TEST_F(BadData, AnotherDtypeIsRefusedNamingTheFileAndTheTypes) {
    sample<double>("a", [](int i) { return i * 0.1; });
    expect_refused(run(), "a.npy");
}

TEST_F(BadData, AShapeThatChangesMidStreamIsRefusedNamingTheFile) {
    sample<float>("a", [](int i) { return i * 0.1f; });
    sample<float>("b", [](int i) { return i * 0.1f; }, {1, 2, 5, 4});
    expect_refused(run(), "b.npy");
}

TEST_F(BadData, AnEmptyFolderIsRefused) {
    expect_refused(run(), (dir_ / "data").string());
}

}  // namespace
