// GPTQ's lazy, Cholesky-based column updates against the direct update of the
// optimal brain surgeon formula (the inverse Hessian restricted to the rows not
// yet rounded, updated by Gaussian elimination after each row), and the plugin
// named by a recipe.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "gptq_rounding.hpp"
#include "plugin/registry.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/reader.hpp"

namespace {

using Matrix = std::vector<std::vector<double>>;

Matrix inverse(Matrix a) {
    const size_t n = a.size();
    Matrix inv(n, std::vector<double>(n, 0.0));
    for (size_t i = 0; i < n; ++i) inv[i][i] = 1;
    for (size_t c = 0; c < n; ++c) {
        const double p = a[c][c];
        for (size_t j = 0; j < n; ++j) {
            a[c][j] /= p;
            inv[c][j] /= p;
        }
        for (size_t r = 0; r < n; ++r) {
            if (r == c) continue;
            const double f = a[r][c];
            for (size_t j = 0; j < n; ++j) {
                a[r][j] -= f * a[c][j];
                inv[r][j] -= f * inv[c][j];
            }
        }
    }
    return inv;
}

TEST(Gptq, LazyBatchesMatchTheDirectUpdate) {
    constexpr size_t k = 6, n = 3;
    std::mt19937 rng(3);
    std::normal_distribution<double> normal;
    // H = 2/m Σ xᵀx over correlated inputs.
    Matrix h(k, std::vector<double>(k, 0.0));
    for (int row = 0; row < 40; ++row) {
        std::vector<double> x(k);
        const double shared = normal(rng);
        for (size_t i = 0; i < k; ++i) x[i] = normal(rng) + 0.8 * shared;
        for (size_t i = 0; i < k; ++i)
            for (size_t j = 0; j < k; ++j) h[i][j] += 2.0 / 40 * x[i] * x[j];
    }
    std::vector<float> wv(k * n);
    for (auto& v : wv) v = static_cast<float>(normal(rng) * 0.5);
    const auto w = vaiq::Tensor::from_values<float>({int64_t{k}, int64_t{n}}, wv);
    const auto params = vaiq::constant_params(w, vaiq::test::blocked_spec(vaiq::QuantType::QInt4, true, 3));
    const vaiq::ParamLayout layout(w.shape(), params, "w");

    vaiq::GptqOptions options;
    options.batch_rows = 2;  // a batch boundary inside each block of 3
    std::vector<double> flat;
    for (const auto& row : h) flat.insert(flat.end(), row.begin(), row.end());
    const auto lazy = vaiq::gptq_round(w, params, flat, options);

    // Direct: damp, then for each row i in order round it and move its error into the later rows.
    double mean = 0;
    for (size_t i = 0; i < k; ++i) mean += h[i][i] / k;
    for (size_t i = 0; i < k; ++i) h[i][i] += options.damping * mean;
    Matrix hinv = inverse(h);
    std::vector<std::vector<double>> weights(k, std::vector<double>(n));
    for (size_t i = 0; i < k; ++i)
        for (size_t c = 0; c < n; ++c) weights[i][c] = wv[i * n + c];
    for (size_t i = 0; i < k; ++i) {
        for (size_t c = 0; c < n; ++c) {
            const size_t p = layout.index(i * n + c);
            const double s = params.scale[p];
            const double q = std::clamp(std::nearbyint(weights[i][c] / s), -8.0, 7.0) * s;
            EXPECT_NEAR(lazy.data<float>()[i * n + c], q, 1e-5) << "row " << i << " column " << c;
            const double error = (weights[i][c] - q) / hinv[i][i];
            for (size_t j = i + 1; j < k; ++j) weights[j][c] -= error * hinv[i][j];
        }
        // Row i is fixed now: eliminate it from the inverse Hessian of the rest.
        Matrix next = hinv;
        for (size_t a = i + 1; a < k; ++a)
            for (size_t b = i + 1; b < k; ++b) next[a][b] = hinv[a][b] - hinv[a][i] * hinv[i][b] / hinv[i][i];
        hinv = next;
    }
}

// Act-order rounds the rows with the largest H diagonal first; with H's
// diagonal already falling it is the plain order, else a different rounding
// that still lands on the plan's grid and beats round to nearest on H.
TEST(Gptq, ActOrderRoundsTheHeaviestInputsFirst) {
    constexpr int64_t k = 8, n = 4;
    std::mt19937 rng(5);
    std::normal_distribution<double> normal;
    std::vector<double> h(k * k, 0.0);
    for (int row = 0; row < 64; ++row) {
        std::vector<double> x(k);
        const double shared = normal(rng);
        for (int64_t i = 0; i < k; ++i) x[i] = (normal(rng) + 0.7 * shared) * (1.0 + static_cast<double>(i));
        for (int64_t i = 0; i < k; ++i)
            for (int64_t j = 0; j < k; ++j) h[i * k + j] += 2.0 / 64 * x[i] * x[j];
    }
    std::vector<float> wv(k * n);
    for (auto& v : wv) v = static_cast<float>(normal(rng) * 0.5);
    const auto w = vaiq::Tensor::from_values<float>({k, n}, wv);
    const auto params = vaiq::constant_params(w, vaiq::test::blocked_spec(vaiq::QuantType::QInt4, true, 4));
    vaiq::GptqOptions plain, act;
    act.act_order = true;
    const auto in_order = vaiq::gptq_round(w, params, h, plain);
    const auto by_weight = vaiq::gptq_round(w, params, h, act);
    // The inputs grow with i, so H's diagonal rises: act-order reverses the order and rounds differently.
    int differ = 0;
    for (int64_t i = 0; i < k * n; ++i) differ += in_order.data<float>()[i] != by_weight.data<float>()[i];
    EXPECT_GT(differ, 0);
    // Every value is on its own block's grid.
    const vaiq::ParamLayout layout(w.shape(), params, "w");
    for (int64_t i = 0; i < k * n; ++i) {
        const double steps = by_weight.data<float>()[i] / params.scale[layout.index(static_cast<size_t>(i))];
        EXPECT_NEAR(steps, std::nearbyint(steps), 1e-4) << i;
        EXPECT_LE(std::abs(steps), 8.0);
    }
    auto error = [&](const vaiq::Tensor& q) {  // tr((W - Q)ᵀ H (W - Q))
        double e = 0;
        for (int64_t c = 0; c < n; ++c)
            for (int64_t i = 0; i < k; ++i)
                for (int64_t j = 0; j < k; ++j)
                    e += (wv[i * n + c] - q.data<float>()[i * n + c]) * h[i * k + j] *
                         (wv[j * n + c] - q.data<float>()[j * n + c]);
        return e;
    };
    EXPECT_LT(error(by_weight), error(vaiq::fake_quantize(w, params, "w")));
    // Reversed inputs (H's diagonal falling): act-order keeps the order, the same rounding as without it.
    std::vector<double> reversed_h(k * k);
    std::vector<float> reversed_w(k * n);
    for (int64_t i = 0; i < k; ++i) {
        for (int64_t j = 0; j < k; ++j) reversed_h[i * k + j] = h[(k - 1 - i) * k + (k - 1 - j)];
        for (int64_t c = 0; c < n; ++c) reversed_w[i * n + c] = wv[(k - 1 - i) * n + c];
    }
    const auto rw = vaiq::Tensor::from_values<float>({k, n}, reversed_w);
    const auto rparams = vaiq::constant_params(rw, vaiq::test::blocked_spec(vaiq::QuantType::QInt4, true, 4));
    const auto a = vaiq::gptq_round(rw, rparams, reversed_h, plain), b = vaiq::gptq_round(rw, rparams, reversed_h, act);
    for (int64_t i = 0; i < k * n; ++i) EXPECT_EQ(a.data<float>()[i], b.data<float>()[i]) << i;
}

// A recipe names the algorithm in `algorithms` (or implies it with
// weight_only_algorithm: gptq); its extra options reach it, and a bad one is
// refused as the user's error.
TEST(GptqPlugin, ARecipeNamesItAndItRoundsTheWeights) {
    const auto dir = vaiq::test::temp_dir();
    vaiq::save_model(vaiq::test::matmul_model(vaiq::test::ramp({64, 32}, -0.5f, 0.0005f)), dir / "in.onnx");
    auto registry = vaiq::test::registry_with_installed_plugins();
    const std::string int4 =
        "target: cpu\ncalibrate_method: MinMax\nquant_format: MatMulNBits\nweight_only: true\nweight_type: QInt4\n"
        "block_size: 32\nop_types_to_quantize: [MatMul]\n";
    const std::string base = int4 + "extra_options: {WeightSymmetric: true, GPTQActOrder: true}\n";
    const auto named = vaiq::test::run_recipe_in(dir, registry, base + "algorithms: [gptq]\n");
    ASSERT_TRUE(named.contains("gptq")) << named.dump();
    EXPECT_EQ(named["gptq"]["act_order"], true) << "the extra option reaches the plugin";
    ASSERT_EQ(named["gptq"]["layers"].size(), 1u);
    const auto& layer = named["gptq"]["layers"][0];
    EXPECT_EQ(layer["kept"] == "gptq",
              layer["output_error_gptq"].get<double>() < layer["output_error_rtn"].get<double>())
        << "kept by the held-out error";
    EXPECT_EQ(layer["fitted_rows"].get<int>() + layer["held_out_rows"].get<int>(), 8) << "8 token rows";
    EXPECT_GE(layer["held_out_rows"].get<int>(), 1);
    const auto implied = vaiq::test::run_recipe_in(dir, registry, base + "weight_only_algorithm: gptq\n", "i.yaml");
    EXPECT_EQ(implied["gptq"]["layers"], named["gptq"]["layers"]) << "the documented setting runs the same";
    try {  // a value no algorithm is enabled by: refused, with those that are
        vaiq::test::run_recipe_in(dir, registry, base + "weight_only_algorithm: gptqq\n", "u.yaml");
        ADD_FAILURE() << "weight_only_algorithm: gptqq runs";
    } catch (const vaiq::InputError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("u.yaml:"), std::string::npos) << what;
        EXPECT_NE(what.find("algorithm 'gptq' (weight_only_algorithm=gptq)"), std::string::npos) << what;
        EXPECT_NE(what.find("algorithm 'awq_lite' (weight_only_algorithm=awq_lite|awq_full)"), std::string::npos)
            << what;
    }
    EXPECT_THROW(vaiq::test::run_recipe_in(
                     dir, registry, base + "algorithms: [{name: gptq, options: {GPTQDamping: 0.1}}]\n", "o.yaml"),
                 vaiq::InputError)
        << "a documented extra option is set under extra_options";
    try {
        vaiq::test::run_recipe_in(
            dir, registry, int4 + "algorithms: [gptq]\nextra_options: {WeightSymmetric: true, GPTQDamping: -1}\n",
            "d.yaml");
        ADD_FAILURE() << "a negative damping runs";
    } catch (const vaiq::InputError& e) {
        EXPECT_NE(std::string(e.what()).find("GPTQDamping must be >= 0"), std::string::npos) << e.what();
    }
}

// GPTQ's arithmetic is float32: a float16 weight is refused, naming the way out.
TEST(GptqPlugin, AFloat16WeightIsRefusedWithTheConversionToAsk) {
    const auto dir = vaiq::test::temp_dir();
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 8, 64}, vaiq::DataType::Float16).output("y", {1, 8, 32}, vaiq::DataType::Float16);
    b.initializer("w", vaiq::convert_float_type(vaiq::test::ramp({64, 32}, -0.5f, 0.0005f), vaiq::DataType::Float16));
    b.node("MatMul", {"x", "w"}, {"y"});
    vaiq::save_model(b.build(), dir / "in.onnx");
    auto registry = vaiq::test::registry_with_installed_plugins();
    const std::string recipe =
        "target: cpu\ncalibrate_method: MinMax\nquant_format: MatMulNBits\nweight_only: true\nweight_type: QInt4\n"
        "block_size: 32\nop_types_to_quantize: [MatMul]\nweight_only_algorithm: gptq\n";
    try {
        vaiq::test::run_recipe_in(dir, registry, recipe);
        ADD_FAILURE() << "GPTQ ran on float16 weights";
    } catch (const vaiq::InputError& e) {
        EXPECT_NE(std::string(e.what()).find("gptq needs float32 weights and 'w' is float16"), std::string::npos)
            << e.what();
        EXPECT_NE(std::string(e.what()).find("convert_fp16_to_fp32: true"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(dir / "out.onnx")) << "nothing written";
    EXPECT_NO_THROW(vaiq::test::run_recipe_in(dir, registry, recipe + "convert_fp16_to_fp32: true\n", "c.yaml"));
}

// Inputs whose channels are independent: H's off-diagonal terms on a few
// rows are noise, and GPTQ's compensation through them fits the rows it saw.
// Judged on the rows it did not see, it loses to round to nearest, which the
// weight keeps.
TEST(GptqPlugin, ARoundingThatOnlyWinsOnTheRowsItFittedIsNotKept) {
    const auto dir = vaiq::test::temp_dir();
    std::vector<float> w(64 * 128);
    for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(static_cast<float>(i * i % 977) * 0.37f) * 0.1f;
    vaiq::save_model(vaiq::test::matmul_model(vaiq::Tensor::from_values<float>({64, 128}, w), 16, 17), dir / "in.onnx");
    std::filesystem::create_directories(dir / "data");
    for (int s = 0; s < 4; ++s)
        vaiq::write_npy(
            dir / "data" / ("s" + std::to_string(s) + ".npy"),
            vaiq::Tensor::from_values<float>(
                {1, 16, 64}, vaiq::test::normal_batches(1, 16 * 64, 1.0f, static_cast<unsigned>(s + 1))[0]));
    auto registry = vaiq::test::registry_with_installed_plugins();
    const auto report = vaiq::test::run_recipe_in(
        dir, registry,
        "target: cpu\ncalibrate_method: MinMax\nquant_format: MatMulNBits\nweight_only: true\nweight_type: QInt4\n"
        "block_size: 32\nop_types_to_quantize: [MatMul]\nweight_only_algorithm: gptq\ncalibration_data_reader: " +
            (dir / "data").string() + "\nextra_options: {WeightSymmetric: true}\n");
    const auto& layer = report["gptq"]["layers"][0];
    EXPECT_EQ(layer["fitted_rows"].get<int>() + layer["held_out_rows"].get<int>(), 64);
    EXPECT_NEAR(layer["held_out_rows"].get<int>(), 16, 8) << "about a quarter held out";
    EXPECT_GT(layer["output_error_gptq"].get<double>(), layer["output_error_rtn"].get<double>());
    EXPECT_EQ(layer["kept"], "rtn");
}

}  // namespace
