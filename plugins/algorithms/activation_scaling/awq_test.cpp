// AWQ-lite: the float function is kept, the quantized weights' output error never grows.
#include <gtest/gtest.h>

#include <cmath>

#include "awq.hpp"
#include "data/data_reader.hpp"
#include "runtime/executor.hpp"
#include "test_support.hpp"

namespace {

// x -> LayerNormalization (a few loud channels through gamma) -> MatMul(w [32, 48]) -> y
vaiq::Model layer_norm_matmul() {
    vaiq::test::GraphBuilder b(17);
    b.input("x", {4, 32}).output("y", {4, 48});
    std::vector<float> gamma(32, 1.0f), beta(32, 0.1f), w(32 * 48);
    for (int j : {3, 17, 29}) gamma[static_cast<size_t>(j)] = 25.0f;
    for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(static_cast<float>(i * i % 613) * 0.11f) * 0.2f;
    b.initializer("gamma", vaiq::Tensor::from_values<float>({32}, gamma))
        .initializer("beta", vaiq::Tensor::from_values<float>({32}, beta))
        .initializer("w", vaiq::Tensor::from_values<float>({32, 48}, w));
    vaiq::test::set_attribute(b.node("LayerNormalization", {"x", "gamma", "beta"}, {"n"}, "ln"), "axis", -1);
    b.node("MatMul", {"n", "w"}, {"y"}, "proj");
    return b.build();
}

TEST(AwqLite, FoldsIntoTheLayerNormAndNeverIncreasesTheError) {
    auto model = layer_norm_matmul();
    const auto original = model;
    auto data = vaiq::random_data_reader(model, nlohmann::json::array(), nullptr, 4, 7);
    vaiq::AwqOptions options;
    options.spec = vaiq::test::blocked_spec(vaiq::QuantType::QInt4, true, 16);
    vaiq::test::TestAlgorithmContext test(model, *data);
    const auto r = vaiq::awq_lite(model, test.context, options, {"proj"});
    EXPECT_EQ(r.activations, 1);
    EXPECT_EQ(r.scaled, 1);
    EXPECT_EQ(r.folded, 1) << "1/s goes into gamma and beta: no Mul";
    EXPECT_EQ(model.graph().node_size(), 2);
    EXPECT_LT(r.error_awq, r.error_rtn);
    // The float function is unchanged.
    const auto x = vaiq::test::ramp({4, 32}, -1.0f, 0.02f);
    const auto before = vaiq::runtime::Executor(original).run({{"x", x}})[0];
    const auto after = vaiq::runtime::Executor(model).run({{"x", x}})[0];
    for (int64_t i = 0; i < before.size(); ++i)
        EXPECT_NEAR(after.data<float>()[i], before.data<float>()[i], 1e-4f * (1 + std::abs(before.data<float>()[i])));
    // A node left out of the plan is left alone.
    auto untouched = layer_norm_matmul();
    EXPECT_EQ(vaiq::awq_lite(untouched, test.context, options, {}).activations, 0);
}

}  // namespace
