// k-quant on weights with heavy tails, against round to nearest and against
// ONNX Runtime's own choice (the unrounded fit, rounded afterwards); and the
// plugin named by a recipe, written as MatMulNBits and as QDQ.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "k_quant.hpp"
#include "plugin/registry.hpp"
#include "test_support.hpp"
#include "test_weights.hpp"
#include "vaiq/error.hpp"
#include "vaiq/model.hpp"

namespace {

using vaiq::test::extremes_plan;
using vaiq::test::heavy_tailed;

// ONNX Runtime's k-quant of every block, as its quantizer computes it:
// candidates judged by the unrounded fit, the winner's minimum then rounded.
vaiq::QuantParams onnx_runtime_k_quant(const vaiq::Tensor& w, int64_t block) {
    auto p = extremes_plan(w, block);
    const int64_t k = w.shape()[0], n = w.shape()[1];
    for (size_t param = 0; param < p.scale.size(); ++param) {
        const int64_t b = static_cast<int64_t>(param) / n, c = static_cast<int64_t>(param) % n;
        std::vector<double> x;
        for (int64_t r = b * block; r < std::min(k, (b + 1) * block); ++r)
            x.push_back(w.data<float>()[static_cast<size_t>(r * n + c)]);
        double sq = 0;
        for (double v : x) sq += v * v;
        const double rms = std::sqrt(sq / static_cast<double>(x.size()));
        const double lo = *std::min_element(x.begin(), x.end()), hi = *std::max_element(x.begin(), x.end());
        auto mad = [&](double scale, double min, const std::vector<double>& l) {
            double e = 0;
            for (size_t i = 0; i < x.size(); ++i) e += (rms + std::abs(x[i])) * std::pow(scale * l[i] + min - x[i], 2);
            return e;
        };
        auto levels = [&](double inverse) {
            std::vector<double> l;
            for (double v : x) l.push_back(std::clamp(std::nearbyint(inverse * (v - lo)), 0.0, 15.0));
            return l;
        };
        double scale = (hi - lo) / 15, min = lo, best = mad(scale, min, levels(15 / (hi - lo)));
        for (int i = 0; i < 20; ++i) {
            const auto l = levels((14 + 0.1 * i) / (hi - lo));
            double sw = 0, sx = 0, sl = 0, sl2 = 0, sxl = 0;
            for (size_t j = 0; j < x.size(); ++j) {
                const double a = rms + std::abs(x[j]);
                sw += a, sx += a * x[j], sl += a * l[j], sl2 += a * l[j] * l[j], sxl += a * l[j] * x[j];
            }
            const double d = sw * sl2 - sl * sl, s = (sw * sxl - sx * sl) / d, m = (sl2 * sx - sl * sxl) / d;
            if (const double e = mad(s, m, l); e < best) best = e, scale = s, min = m;
        }
        p.scale[param] = static_cast<float>(scale);
        p.zero_point[param] = std::clamp<int64_t>(static_cast<int64_t>(std::nearbyint(-min / scale)), 0, 15);
    }
    return p;
}

TEST(KQuant, NoBlockGetsWorseThanRoundToNearestAndHeavyTailsGainMost) {
    const auto w = heavy_tailed(200, 24, 5);  // the last block of 64 holds 8 rows
    const auto plan = extremes_plan(w, 64);
    const auto kq = vaiq::k_quant_params(w, plan);
    ASSERT_EQ(kq.scale.size(), plan.scale.size());
    EXPECT_TRUE(kq.float_zero_point.empty()) << "integer zero points";
    for (size_t i = 0; i < kq.scale.size(); ++i) {
        EXPECT_GT(kq.scale[i], 0.0f);
        EXPECT_GE(kq.zero_point[i], 0);
        EXPECT_LE(kq.zero_point[i], 15);
    }
    const double rtn = vaiq::importance_weighted_error(w, plan, "w");
    const double fitted = vaiq::importance_weighted_error(w, kq, "w");
    EXPECT_LT(fitted, 0.95 * rtn) << "round to nearest " << rtn << ", k-quant " << fitted;
    // Column by column (each a weight of its own): never worse.
    for (int64_t c = 0; c < 24; ++c) {
        std::vector<float> column;
        for (int64_t r = 0; r < 200; ++r) column.push_back(w.data<float>()[static_cast<size_t>(r * 24 + c)]);
        const auto one = vaiq::Tensor::from_values<float>({200, 1}, column);
        const auto p = extremes_plan(one, 64);
        EXPECT_LE(vaiq::importance_weighted_error(one, vaiq::k_quant_params(one, p), "c"),
                  vaiq::importance_weighted_error(one, p, "c"));
    }
}

TEST(KQuant, JudgingEachGridAsWrittenBeatsOnnxRuntimesUnroundedChoice) {
    const auto w = heavy_tailed(256, 32, 11);
    const double ours = vaiq::importance_weighted_error(w, vaiq::k_quant_params(w, extremes_plan(w, 32)), "w");
    const double ort = vaiq::importance_weighted_error(w, onnx_runtime_k_quant(w, 32), "w");
    const double rtn = vaiq::importance_weighted_error(w, extremes_plan(w, 32), "w");
    EXPECT_LT(ours, 0.95 * rtn);
    EXPECT_LT(ours, 0.9 * ort) << "ours " << ours << ", ONNX Runtime's " << ort << ", round to nearest " << rtn;
}

TEST(KQuant, EqualValuesKeepThePlanAndOnlyBlocksAlongKAreTaken) {
    const auto flat = vaiq::Tensor::from_values<float>({16, 1}, std::vector<float>(16, 0.25f));
    const auto plan = extremes_plan(flat, 16);
    const auto p = vaiq::k_quant_params(flat, plan);
    EXPECT_EQ(p.scale, plan.scale);
    EXPECT_EQ(p.zero_point, plan.zero_point);
    EXPECT_THROW(vaiq::k_quant_params(flat, vaiq::QuantParams{}), vaiq::InputError);
    auto hqq_like = plan;
    hqq_like.float_zero_point = {0.5f};
    EXPECT_THROW(vaiq::importance_weighted_error(flat, hqq_like, "w"), vaiq::InputError);
}

TEST(KQuantPlugin, ARecipeNamesItAndBothBlockFormatsWriteIt) {
    const auto dir = vaiq::test::temp_dir();
    vaiq::save_model(vaiq::test::matmul_model(heavy_tailed(128, 16, 3), 8, 21), dir / "in.onnx");
    auto registry = vaiq::test::registry_with_installed_plugins();
    const std::string int4 =
        "target: cpu\ncalibrate_method: MinMax\nweight_only: true\nweight_type: QUInt4\nblock_size: 32\n"
        "op_types_to_quantize: [MatMul]\nweight_only_algorithm: k_quant\nextra_options: {WeightSymmetric: false}\n";
    for (const char* format : {"MatMulNBits", "QDQ"}) {
        const auto report = vaiq::test::run_recipe_in(dir, registry, int4 + "quant_format: " + format + "\n",
                                                      std::string(format) + ".yaml");
        ASSERT_EQ(report["k_quant"]["weights"].size(), 1u) << report.dump();
        const auto& weight = report["k_quant"]["weights"][0];
        EXPECT_LT(weight["weighted_squared_error_k_quant"].get<double>(),
                  weight["weighted_squared_error_rtn"].get<double>());
        EXPECT_GT(report["evaluation"]["outputs"][0]["sqnr_db"].get<double>(), 15.0) << report.dump();
        const auto written = vaiq::load_model(dir / "out.onnx");
        bool found = false;
        for (const auto& node : written.graph().node())
            found |= node.op_type() == (std::string(format) == "QDQ" ? "DequantizeLinear" : "MatMulNBits");
        EXPECT_TRUE(found) << format;
    }
}

}  // namespace
