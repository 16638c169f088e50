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

// One batch of token rows, given.
class RowsReader final : public vaiq::DataReader {
  public:
    explicit RowsReader(vaiq::Tensor x) : x_(std::move(x)) {}
    std::optional<vaiq::Batch> next() override {
        if (done_) return std::nullopt;
        done_ = true;
        return vaiq::Batch{{{"x", x_}}, "rows"};
    }
    void rewind() override { done_ = false; }
    size_t items() const override { return 1; }

  private:
    vaiq::Tensor x_;
    bool done_ = false;
};

// Three channels are loud on the rows the search weighs and silent on the
// held-out ones (held_out_row): scales that help the searched rows only cost
// the others, and the activation keeps s = 1.
TEST(AwqLite, ScalesThatOnlyHelpTheSearchedRowsAreNotKept) {
    vaiq::test::GraphBuilder b(17);
    b.input("x", {8, 32}).output("y", {8, 48});
    std::vector<float> w(32 * 48);
    for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(static_cast<float>(i * i % 613) * 0.11f) * 0.2f;
    b.initializer("w", vaiq::Tensor::from_values<float>({32, 48}, w));
    b.node("MatMul", {"x", "w"}, {"y"}, "proj");
    const auto model = b.build();
    vaiq::AwqOptions options;
    options.spec = vaiq::test::blocked_spec(vaiq::QuantType::QInt4, true, 16);
    auto run = [&](bool held_rows_loud) {
        std::vector<float> x(8 * 32);
        for (size_t i = 0; i < x.size(); ++i) {
            const size_t row = i / 32, channel = i % 32;
            x[i] = std::sin(static_cast<float>(i) * 0.7f);
            if (channel == 3 || channel == 17 || channel == 29)
                x[i] = vaiq::held_out_row(row) && !held_rows_loud ? 0.0f : 25.0f;
        }
        RowsReader data(vaiq::Tensor::from_values<float>({8, 32}, x));
        auto scaled = model;
        vaiq::test::TestAlgorithmContext test(scaled, data);
        return vaiq::awq_lite(scaled, test.context, options, {"proj"});
    };
    const auto everywhere = run(true);
    EXPECT_EQ(everywhere.scaled, 1) << "loud on every row: the scales help the held-out rows too";
    EXPECT_LT(everywhere.error_awq, everywhere.error_rtn);
    const auto searched_only = run(false);
    EXPECT_EQ(searched_only.activations, 1);
    EXPECT_EQ(searched_only.scaled, 0);
    EXPECT_EQ(searched_only.error_awq, searched_only.error_rtn);
}

}  // namespace
