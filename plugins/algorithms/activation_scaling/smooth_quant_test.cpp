// SmoothQuant keeps the float function and moves the activations' outliers into the weights.
#include <gtest/gtest.h>

#include <cmath>

#include "data/data_reader.hpp"
#include "plugin/registry.hpp"
#include "runtime/executor.hpp"
#include "smooth_quant.hpp"
#include "test_support.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/reader.hpp"

namespace fs = std::filesystem;
using vaiq::Tensor;
using vaiq::test::GraphBuilder;
using vaiq::test::ramp;
using vaiq::test::temp_dir;

namespace {

// LayerNormalization -> ln, read by two MatMuls (q, k); ln also feeds a residual Add
// when `residual`, so it cannot be folded.
vaiq::Model attention_inputs(bool residual) {
    GraphBuilder b(17);
    b.input("x", {2, 4}).output("q", {2, 3}).output("k", {2, 3});
    if (residual) b.output("r", {2, 4});
    b.initializer("gamma", Tensor::from_values<float>({4}, std::vector<float>{1.0f, 8.0f, 0.5f, 1.0f}));
    b.initializer("beta", Tensor::from_values<float>({4}, std::vector<float>{0.1f, 2.0f, -0.1f, 0.0f}));
    b.initializer("wq", ramp({4, 3}, -0.5f, 0.1f));
    b.initializer("wk", ramp({4, 3}, 0.3f, -0.07f));
    b.node("LayerNormalization", {"x", "gamma", "beta"}, {"ln"});
    b.node("MatMul", {"ln", "wq"}, {"q"});
    b.node("MatMul", {"ln", "wk"}, {"k"});
    if (residual) b.node("Add", {"ln", "x"}, {"r"});
    return b.build();
}

std::vector<Tensor> run(const vaiq::Model& model, const Tensor& x) {
    vaiq::runtime::Executor executor(model);
    return executor.run({{"x", x}});
}

const onnx::TensorProto& initializer(const vaiq::Model& m, const std::string& name) {
    return *vaiq::GraphIndex(m).initializer(name);
}

class SmoothQuant : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = temp_dir();
        x_ = Tensor::from_values<float>({2, 4}, std::vector<float>{0.3f, -1.2f, 2.0f, 0.7f, -0.4f, 1.5f, 0.2f, -2.2f});
        vaiq::write_npy(dir_ / "x.npy", x_);
    }
    vaiq::SmoothQuantResult smooth(vaiq::Model& m, bool folding) {
        auto data = vaiq::open_data_reader(dir_ / "x.npy", m);
        vaiq::SmoothQuantOptions options;
        options.folding = folding;
        vaiq::test::TestAlgorithmContext test(m, *data);
        return vaiq::smooth_quant(m, test.context, options);
    }
    fs::path dir_;
    Tensor x_;
};

TEST_F(SmoothQuant, FoldsIntoTheLayerNormAndKeepsTheFloatOutputs) {
    auto model = attention_inputs(false);
    const auto before = run(model, x_);
    const auto r = smooth(model, true);
    EXPECT_EQ(r.activations, 1);
    EXPECT_EQ(r.weights, 2);
    EXPECT_EQ(r.folded, 1);
    EXPECT_EQ(model.graph().node_size(), 3) << "no Mul inserted";
    const auto after = run(model, x_);
    for (size_t o = 0; o < before.size(); ++o)
        for (int64_t i = 0; i < before[o].size(); ++i)
            EXPECT_NEAR(after[o].data<float>()[i], before[o].data<float>()[i], 1e-5) << o << " " << i;
    // Channel 1 (gamma 8, beta 2) is the outlier: its scale shrinks, its weight rows grow.
    const auto gamma = Tensor::from_proto(initializer(model, "gamma"));
    EXPECT_LT(gamma.data<float>()[1], 8.0f);
    const auto wq = Tensor::from_proto(initializer(model, "wq"));
    EXPECT_GT(std::abs(wq.data<float>()[3]), std::abs(-0.5f + 0.3f));
}

TEST_F(SmoothQuant, WithAnotherReaderAMulFeedsOnlyTheMatMuls) {
    auto model = attention_inputs(true);
    const auto before = run(model, x_);
    const auto r = smooth(model, true);
    EXPECT_EQ(r.activations, 1);
    EXPECT_EQ(r.folded, 0) << "the residual Add reads ln too";
    ASSERT_EQ(model.graph().node_size(), 5);
    EXPECT_EQ(model.graph().node(1).op_type(), "Mul") << "in place before the MatMuls";
    EXPECT_EQ(model.graph().node(4).input(0), "ln") << "the residual still reads the unscaled ln";
    const auto after = run(model, x_);
    for (size_t o = 0; o < before.size(); ++o)
        for (int64_t i = 0; i < before[o].size(); ++i)
            EXPECT_NEAR(after[o].data<float>()[i], before[o].data<float>()[i], 1e-5) << o << " " << i;
}

TEST_F(SmoothQuant, ScalesFollowTheDocumentedFormula) {
    // One MatMul on the raw input: s_j = sqrt(max|x_j| / max|w_j|) with alpha 0.5.
    GraphBuilder b;
    b.input("x", {2, 4}).output("y", {2, 1});
    b.initializer("w", Tensor::from_values<float>({4, 1}, std::vector<float>{0.5f, 2.0f, 1.0f, 0.25f}));
    b.node("MatMul", {"x", "w"}, {"y"});
    auto model = b.build();
    smooth(model, false);
    const auto w = Tensor::from_proto(initializer(model, "w"));
    const float amax[] = {0.4f, 1.5f, 2.0f, 2.2f}, wmax[] = {0.5f, 2.0f, 1.0f, 0.25f};
    for (int j = 0; j < 4; ++j) EXPECT_NEAR(w.data<float>()[j], wmax[j] * std::sqrt(amax[j] / wmax[j]), 1e-5) << j;
}

// x [64, 32] -> LayerNormalization (three channels 25x louder through gamma) -> MatMul(w [32, 48]).
vaiq::Model loud_channels() {
    GraphBuilder b(17);
    b.input("x", {64, 32}).output("y", {64, 48});
    std::vector<float> gamma(32, 1.0f), w(32 * 48);
    for (int j : {3, 17, 29}) gamma[static_cast<size_t>(j)] = 25.0f;
    for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(static_cast<float>(i * i % 613) * 0.11f) * 0.2f;
    b.initializer("gamma", Tensor::from_values<float>({32}, gamma))
        .initializer("beta", Tensor::from_values<float>({32}, std::vector<float>(32, 0.0f)))
        .initializer("w", Tensor::from_values<float>({32, 48}, w));
    vaiq::test::set_attribute(b.node("LayerNormalization", {"x", "gamma", "beta"}, {"ln"}), "axis", -1);
    b.node("MatMul", {"ln", "w"}, {"y"});
    return b.build();
}

// alpha_search: an alpha is chosen where 8-bit activations lose the quiet channels,
// the float function is kept, and the plugin reports each input's alpha.
TEST_F(SmoothQuant, AlphaSearchChoosesASmoothingThatBeatsNone) {
    auto model = loud_channels();
    const auto original = model;
    const auto x = vaiq::test::normal_batches(1, 64 * 32, 1.0f, 4)[0];
    vaiq::write_npy(dir_ / "rows.npy", Tensor::from_values<float>({64, 32}, x));
    auto data = vaiq::open_data_reader(dir_ / "rows.npy", model);
    vaiq::SmoothQuantOptions options;
    options.alpha_search = true;
    options.activation_spec.type = vaiq::QuantType::QUInt8;
    options.weight_spec.symmetric = true;
    options.weight_spec.axis = 1;
    vaiq::test::TestAlgorithmContext test(model, *data);
    const auto r = vaiq::smooth_quant(model, test.context, options);
    ASSERT_EQ(r.alphas.count("ln"), 1u);
    ASSERT_TRUE(r.alphas.at("ln").has_value()) << "smoothing beats none on the held-out rows";
    EXPECT_GT(*r.alphas.at("ln"), 0.0);
    EXPECT_LT(*r.alphas.at("ln"), 1.0);
    EXPECT_EQ(r.activations, 1);
    const auto input = Tensor::from_values<float>({64, 32}, x);
    const auto before = vaiq::runtime::Executor(original).run({{"x", input}})[0];
    const auto after = vaiq::runtime::Executor(model).run({{"x", input}})[0];
    for (int64_t i = 0; i < before.size(); ++i)
        EXPECT_NEAR(after.data<float>()[i], before.data<float>()[i], 1e-3f * (1 + std::abs(before.data<float>()[i])));

    vaiq::save_model(loud_channels(), dir_ / "in.onnx");
    auto registry = vaiq::test::registry_with_installed_plugins();
    const auto report = vaiq::test::run_recipe_in(
        dir_, registry,
        "target: cpu\nquant_format: QDQ\ncalibration_data_reader: " + (dir_ / "rows.npy").string() +
            "\nextra_options: {SmoothQuant: true}\nalgorithms: [{name: smooth_quant, options: {alpha_search: "
            "true}}]\n");
    ASSERT_TRUE(report["smooth_quant"].contains("alphas")) << report["smooth_quant"].dump();
    EXPECT_TRUE(report["smooth_quant"]["alphas"]["ln"].is_number()) << report["smooth_quant"].dump();
}

}  // namespace
