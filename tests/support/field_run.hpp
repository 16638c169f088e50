// A run of a recipe on a tiny model built in code, on calibration data of
// smooth random images: the fixture of the tests of patterns trained models
// bring (the pipeline's, and those of the plugins that handle them).
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "plugin/registry.hpp"
#include "runtime/executor.hpp"
#include "test_support.hpp"
#include "vaiq/reader.hpp"

namespace vaiq::test {

class FieldRun : public ::testing::Test {
  protected:
    void SetUp() override { registry_.load_default_paths(); }
    static constexpr const char* kCpu = "target: cpu\ncalibrate_method: MinMax\nactivation_type: QUInt8\n";
    static constexpr const char* kNpu =
        "target: npu_cnn\ncalibrate_method: MinMSE\nactivation_type: QUInt8\nenable_dpu: true\n"
        "extra_options: {ActivationSymmetric: true}\n";
    // `base` (cpu.yaml's settings) and `yaml` on `model`, on calibration data of smooth random images.
    nlohmann::json run(const vaiq::Model& model, const std::string& yaml = "", const std::string& base = kCpu) {
        dir_ = vaiq::test::temp_dir();
        vaiq::save_model(model, dir_ / "in.onnx");
        const auto& in = model.graph().input(0).type().tensor_type().shape();
        std::vector<int64_t> shape;
        for (const auto& d : in.dim()) shape.push_back(d.dim_value());
        std::filesystem::create_directories(dir_ / "data");
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
    std::vector<Tensor> outputs(const std::filesystem::path& model_path, const Tensor& input) {
        const auto model = vaiq::load_model(model_path);
        vaiq::runtime::Executor executor(model);
        return executor.run({{model.graph().input(0).name(), input}});
    }
    vaiq::PluginRegistry registry_;
    std::filesystem::path dir_;
};

inline double output_sqnr(const nlohmann::json& report, const std::string& name) {
    for (const auto& o : report["evaluation"]["outputs"])
        if (o["name"] == name) return o["sqnr_db"].is_number() ? o["sqnr_db"].get<double>() : 1e9;
    ADD_FAILURE() << "no output " << name;
    return 0;
}

}  // namespace vaiq::test
