// HQQ's solver on weights with heavy tails (where a few large values set each
// block's range), and the plugin named by a recipe: float zero points written
// as MatMulNBits, refused by quant_format QDQ.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "hqq.hpp"
#include "plugin/registry.hpp"
#include "test_support.hpp"
#include "test_weights.hpp"
#include "vaiq/error.hpp"
#include "vaiq/model.hpp"

namespace {

using vaiq::test::extremes_plan;
using vaiq::test::heavy_tailed;

TEST(Hqq, FloatZeroPointsLowerTheErrorOfHeavyTailedBlocks) {
    const auto w = heavy_tailed(200, 24, 5);  // the last block of 64 holds 8 rows
    const auto plan = extremes_plan(w, 64);
    const auto hqq = vaiq::hqq_params(w, plan, {});
    ASSERT_EQ(hqq.float_zero_point.size(), plan.scale.size());
    for (size_t i = 0; i < hqq.float_zero_point.size(); ++i) {
        EXPECT_TRUE(std::isfinite(hqq.float_zero_point[i]));
        EXPECT_GE(hqq.zero_point[i], 0);
        EXPECT_LE(hqq.zero_point[i], 15);
        EXPECT_GT(hqq.scale[i], 0.0f);
    }
    const double rtn = vaiq::mean_absolute_error(w, plan, "w"), fitted = vaiq::mean_absolute_error(w, hqq, "w");
    EXPECT_LT(fitted, 0.95 * rtn) << "round to nearest " << rtn << ", HQQ " << fitted;
    // The zero points moved off the integers the extremes give.
    int moved = 0;
    for (size_t i = 0; i < hqq.float_zero_point.size(); ++i)
        moved += std::abs(hqq.float_zero_point[i] - static_cast<float>(plan.zero_point[i])) > 0.05f;
    EXPECT_GT(moved, static_cast<int>(plan.scale.size()) / 2);
}

TEST(Hqq, EachBlockKeepsItsBestIterationAndEqualValuesGetAStepOfOne) {
    const auto w = heavy_tailed(64, 6, 9);
    const auto plan = extremes_plan(w, 32);
    vaiq::HqqOptions one;
    one.iterations = 1;  // the extremes' zero point, rounded: round to nearest's own error
    const auto first = vaiq::hqq_params(w, plan, one), all = vaiq::hqq_params(w, plan, {});
    EXPECT_LE(vaiq::mean_absolute_error(w, all, "w"), vaiq::mean_absolute_error(w, first, "w"));
    const auto flat = vaiq::Tensor::from_values<float>({16, 1}, std::vector<float>(16, 0.25f));
    auto flat_plan = extremes_plan(flat, 16);
    const auto p = vaiq::hqq_params(flat, flat_plan, {});
    EXPECT_FLOAT_EQ(p.scale[0], 1.0f) << "ONNX Runtime's step for a block of equal values";
    EXPECT_THROW(vaiq::hqq_params(flat, vaiq::QuantParams{}, {}), vaiq::InputError) << "not blocked along K";
}

TEST(HqqPlugin, ARecipeNamesItAndMatMulNBitsStoresFloatZeroPoints) {
    const auto dir = vaiq::test::temp_dir();
    vaiq::save_model(vaiq::test::matmul_model(heavy_tailed(128, 16, 3)), dir / "in.onnx");
    auto registry = vaiq::test::registry_with_installed_plugins();
    const std::string int4 =
        "target: cpu\ncalibrate_method: MinMax\nweight_only: true\nweight_type: QUInt4\nblock_size: 32\n"
        "op_types_to_quantize: [MatMul]\nweight_only_algorithm: hqq\n";
    const auto report = vaiq::test::run_recipe_in(dir, registry, int4 + "quant_format: MatMulNBits\n");
    ASSERT_EQ(report["hqq"]["weights"].size(), 1u) << report.dump();
    const auto& weight = report["hqq"]["weights"][0];
    EXPECT_LT(weight["mean_abs_error_hqq"].get<double>(), weight["mean_abs_error_rtn"].get<double>());
    const auto written = vaiq::load_model(dir / "out.onnx");
    const auto& node = written.graph().node(0);
    ASSERT_EQ(node.op_type(), "MatMulNBits");
    ASSERT_EQ(node.input_size(), 4) << "the zero points are written";
    for (const auto& init : written.graph().initializer())
        if (init.name() == node.input(3)) {
            EXPECT_EQ(init.data_type(), onnx::TensorProto::FLOAT) << "float zero points, unpacked";
            EXPECT_EQ(std::vector<int64_t>(init.dims().begin(), init.dims().end()), (std::vector<int64_t>{16, 4}));
        }
    EXPECT_GT(report["evaluation"]["outputs"][0]["sqnr_db"].get<double>(), 15.0) << report.dump();
    try {
        vaiq::test::run_recipe_in(dir, registry, int4 + "quant_format: QDQ\n", "qdq.yaml");
        ADD_FAILURE() << "DequantizeLinear with float zero points was written";
    } catch (const vaiq::InputError& e) {
        EXPECT_NE(std::string(e.what()).find("MatMulNBits stores them"), std::string::npos) << e.what();
    }
}

}  // namespace
