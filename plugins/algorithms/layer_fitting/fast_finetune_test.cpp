// Fast finetune: on one layer, AdaRound and AdaQuant reconstruct the float
// output better than rounding to nearest, with weights on the grid.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <set>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "column_sums.hpp"
#include "data/data_reader.hpp"
#include "fast_finetune.hpp"
#include "plugin/registry.hpp"
#include "runtime/executor.hpp"
#include "runtime/thread_count.hpp"
#include "test_support.hpp"
#include "vaiq/reader.hpp"

namespace fs = std::filesystem;
using vaiq::QuantType;
using vaiq::Tensor;
using vaiq::TensorRole;
using vaiq::test::GraphBuilder;
using vaiq::test::quant_entry;
using vaiq::test::temp_dir;

namespace {

Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed, float lo, float hi) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = u(rng);
    return Tensor::from_values<float>(shape, v);
}

// The model as written with the given weights in place of the float ones.
using Emitter = std::function<vaiq::Model(const std::map<std::string, Tensor>& rounded)>;

// An emitter giving the float model itself: the layer inputs are the float ones.
Emitter same_model(const vaiq::Model& model) {
    return [&model](const std::map<std::string, Tensor>&) { return model; };
}

// Three MatMuls, a Relu after the first: x [8, 6] -> [8, 4].
vaiq::Model three_layers() {
    GraphBuilder b;
    b.input("x", {8, 6}).output("y", {8, 4});
    b.initializer("w1", random_tensor({6, 5}, 3, -0.5f, 0.5f));
    b.initializer("w2", random_tensor({5, 7}, 4, -0.5f, 0.5f));
    b.initializer("w3", random_tensor({7, 4}, 5, -0.5f, 0.5f));
    b.node("MatMul", {"x", "w1"}, {"h1"});
    b.node("Relu", {"h1"}, {"r1"});
    b.node("MatMul", {"r1", "w2"}, {"h2"});
    b.node("MatMul", {"h2", "w3"}, {"y"});
    return b.build();
}

// Its weights on int8 grids of step 0.5 / 7.
vaiq::QuantPlan three_layers_plan() {
    vaiq::QuantPlan plan;
    for (const char* w : {"w1", "w2", "w3"})
        plan.tensors.push_back(quant_entry(w, TensorRole::Weight, QuantType::QInt8, {0.5f / 7}, {0}));
    return plan;
}

// An emitter giving `model` with the chosen weights in place of the float ones.
Emitter with_weights(const vaiq::Model& model) {
    return [&model](const std::map<std::string, Tensor>& rounded) {
        auto out = model;
        for (auto& init : *out.graph().mutable_initializer())
            if (auto it = rounded.find(init.name()); it != rounded.end()) init = it->second.to_proto(init.name());
        return out;
    };
}

// Fast finetune of `model`'s layers that `plan` quantizes, through a context
// whose quantized model `emit` gives.
vaiq::FastFinetuneResult finetune_with(const vaiq::Model& model, const vaiq::QuantPlan& plan, const Emitter& emit,
                                       vaiq::DataReader& data, const vaiq::FastFinetuneOptions& options) {
    vaiq::test::TestAlgorithmContext c(model, data, plan,
                                       [&](const vaiq::QuantPlan&, const std::map<std::string, Tensor>& weights) {
                                           return emit(weights);
                                       });
    return vaiq::fast_finetune(c.context, options);
}

class FastFinetune : public ::testing::Test {
  public:  // the helpers below the fixture build their data here too
    // Samples of `input` (one file each) for the data reader.
    // Sample i holds random_tensor(shape, 100 + i, lo, 1).
    std::unique_ptr<vaiq::DataReader> data(const vaiq::Model& model, std::vector<int64_t> shape, int samples,
                                           float lo = -1.0f) {
        dir_ = temp_dir();
        fs::create_directories(dir_ / "data");
        for (int i = 0; i < samples; ++i)
            vaiq::write_npy(dir_ / "data" / fmt::format("s{}.npy", i), random_tensor(shape, 100 + i, lo, 1.0f));
        return vaiq::open_data_reader(dir_ / "data", model);
    }
    // AdaRound (1000 iterations) of one Gemm, x [16, 12] by `w` [12, 6] (plus
    // `bias`), `w` on a per-tensor grid of step `scale`, over `samples` samples.
    vaiq::FastFinetuneResult fit_one_gemm(const Tensor& w, float scale, int batch_columns,
                                          std::optional<Tensor> bias = std::nullopt, int samples = 4) {
        GraphBuilder b;
        b.input("x", {16, 12}).output("y", {16, 6});
        b.initializer("w", w);
        if (bias) b.initializer("b", *bias);
        b.node("Gemm", bias ? std::vector<std::string>{"x", "w", "b"} : std::vector<std::string>{"x", "w"}, {"y"});
        const auto model = b.build();
        auto reader = data(model, {16, 12}, samples);
        vaiq::QuantPlan plan;
        plan.tensors.push_back(quant_entry("w", TensorRole::Weight, QuantType::QInt8, {scale}, {0}));
        vaiq::FastFinetuneOptions options;
        options.iterations = 1000;
        options.batch_columns = batch_columns;
        return finetune_with(model, plan, same_model(model), *reader, options);
    }
    fs::path dir_;
};

// The chosen values are on the weight's grid and each is w/s rounded down or up.
void expect_on_grid(const Tensor& chosen, const Tensor& w, float scale) {
    for (int64_t i = 0; i < w.size(); ++i) {
        const float q = chosen.data<float>()[i] / scale;
        EXPECT_NEAR(q, std::nearbyint(q), 1e-4) << i;
        const float lo = std::floor(w.data<float>()[i] / scale);
        EXPECT_TRUE(std::nearbyint(q) == lo || std::nearbyint(q) == lo + 1) << i << ": " << q;
    }
}

// On sampled columns: 4 a step, fewer than half the layer's 12 inputs (with
// more, the fit runs on the columns' sums; TheRoundingMakesUpForTheBiasAsWritten).
TEST_F(FastFinetune, AdaRoundReconstructsAGemmBetterThanNearestRounding) {
    const auto w = random_tensor({12, 6}, 7, -0.5f, 0.5f);
    const float scale = 0.5f / 7;  // a coarse 4-bit-like grid makes rounding matter
    const auto r = fit_one_gemm(w, scale, 4, Tensor::from_values<float>({6}, std::vector<float>(6, 0.1f)));
    ASSERT_EQ(r.layers.size(), 1u);
    EXPECT_EQ(r.layers[0].columns, 64) << "16 rows x 4 samples";
    EXPECT_LT(r.layers[0].loss, 0.9 * r.layers[0].loss_nearest)
        << r.layers[0].loss << " vs nearest " << r.layers[0].loss_nearest;
    expect_on_grid(r.rounded.at("w"), w, scale);
}

// Weights already on their grid: nearest rounding reconstructs the held-out
// columns exactly, and the relaxed weights at the warm start's end do no
// better, so no rounding is sought past it. With fewer held-out columns than
// it takes to judge that (a squeeze-excitation Conv sees one a sample), the
// fit ends after five checks without progress, counted from halfway through
// the regulariser's annealing (before it, AdaRound's rounding is undecided).
TEST_F(FastFinetune, AFitThatCannotBeatNearestRoundingStopsAtTheWarmStartsEnd) {
    const float scale = 0.5f / 7;
    std::vector<float> on_grid(72);
    for (size_t i = 0; i < on_grid.size(); ++i) on_grid[i] = scale * static_cast<float>(static_cast<int>(i % 9) - 4);
    const auto weights = Tensor::from_values<float>({12, 6}, on_grid);
    const auto judged = fit_one_gemm(weights, scale, 32, std::nullopt, 64);  // 1024 columns, a fifth held out
    ASSERT_EQ(judged.layers.size(), 1u);
    EXPECT_LT(judged.layers[0].loss, 1e-9) << "exact but for the sums' rounding";
    EXPECT_EQ(judged.layers[0].iterations, 200) << "the warm start only";
    const auto few = fit_one_gemm(weights, scale, 32);  // 64 columns
    ASSERT_EQ(few.layers.size(), 1u);
    EXPECT_LT(few.layers[0].loss, 1e-9);
    EXPECT_EQ(few.layers[0].iterations, 200 + 400 + 4 * 50)
        << "the warm start, half the annealing, then five checks (from its end) without progress";
}

// A fit that helps ends once a rounding is within 0.1 % of the loss the
// relaxed weights reached, before the patience rule could end it (five checks
// without progress from halfway through the annealing: 800 steps at the
// least). As in a quantized model, the layer's input there differs from the
// float one (the MatMul before it computes it from other weights), so no
// weights reproduce the float output, and a rounding can come as close as the
// relaxed weights do.
TEST_F(FastFinetune, AFitEndsOnceARoundingReachesTheRelaxedLoss) {
    auto layers = [](const Tensor& mix) {
        GraphBuilder b;
        b.input("z", {16, 24}).output("y", {16, 8});
        b.initializer("mix", mix);
        b.initializer("w", random_tensor({24, 8}, 7, -0.5f, 0.5f));
        b.node("MatMul", {"z", "mix"}, {"x"});
        b.node("Gemm", {"x", "w"}, {"y"});
        return b.build();
    };
    const auto mix = random_tensor({24, 24}, 5, -0.2f, 0.2f);
    auto noisy_mix = mix;
    const auto noise = random_tensor({24, 24}, 6, -0.02f, 0.02f);
    for (int64_t i = 0; i < mix.size(); ++i) noisy_mix.mutable_data<float>()[i] += noise.data<float>()[i];
    const auto model = layers(mix), quantized = layers(noisy_mix);
    auto reader = data(model, {16, 24}, 64);
    vaiq::QuantPlan plan;
    plan.tensors.push_back(quant_entry("w", TensorRole::Weight, QuantType::QInt8, {0.5f / 31}, {0}));
    vaiq::FastFinetuneOptions options;
    options.iterations = 1000;
    const auto r = finetune_with(model, plan, with_weights(quantized), *reader, options);
    ASSERT_EQ(r.layers.size(), 1u);
    EXPECT_LT(r.layers[0].loss, 0.8 * r.layers[0].loss_nearest)
        << r.layers[0].loss << " vs nearest " << r.layers[0].loss_nearest;
    EXPECT_LT(r.layers[0].iterations, 800);
    EXPECT_GE(r.layers[0].iterations, 200) << "not before the warm start's end";
}

// An int8 bias has a grid of its own (here a step of 1, so 0.3 is written as
// 0): the layer is fitted as the quantized model computes it, with that bias,
// and the rounding of the weights takes the bias's error back where the inputs
// let it (all positive here).
TEST_F(FastFinetune, TheRoundingMakesUpForTheBiasAsWritten) {
    GraphBuilder b;
    b.input("x", {16, 12}).output("y", {16, 6});
    const auto w = random_tensor({12, 6}, 7, -0.5f, 0.5f);
    const float bias = 0.3f, scale = 0.5f / 7;
    b.initializer("w", w);
    b.initializer("b", Tensor::from_values<float>({6}, std::vector<float>(6, bias)));
    b.node("Gemm", {"x", "w", "b"}, {"y"});
    const auto model = b.build();
    // 16 columns: too few to hold any out, more than half the 12 inputs: fitted on their sums
    auto reader = data(model, {16, 12}, 1, 0.0f);
    vaiq::QuantPlan plan;
    plan.tensors.push_back(quant_entry("w", TensorRole::Weight, QuantType::QInt8, {scale}, {0}));
    plan.tensors.push_back(quant_entry("b", TensorRole::Bias, QuantType::QInt8, {1.0f}, {0}));
    vaiq::FastFinetuneOptions options;
    options.iterations = 1000;
    options.batch_columns = 16;
    const auto r = finetune_with(model, plan, same_model(model), *reader, options);
    ASSERT_EQ(r.layers.size(), 1u);

    // The written layer against the float one: per row, the summed squared error and the mean error.
    const auto x = random_tensor({16, 12}, 100, 0.0f, 1.0f);
    auto error = [&](const std::function<float(int64_t)>& weight, double& mean) {
        double squared = 0;
        mean = 0;
        for (int64_t n = 0; n < 16; ++n)
            for (int64_t o = 0; o < 6; ++o) {
                double e = -bias;  // the written bias is 0
                for (int64_t k = 0; k < 12; ++k)
                    e += x.data<float>()[n * 12 + k] * (weight(k * 6 + o) - w.data<float>()[k * 6 + o]);
                squared += e * e, mean += e / 96;
            }
        return squared / 16;
    };
    double mean_nearest = 0, mean_fitted = 0;
    const double nearest =
        error([&](int64_t i) { return std::nearbyint(w.data<float>()[i] / scale) * scale; }, mean_nearest);
    const double fitted = error([&](int64_t i) { return r.rounded.at("w").data<float>()[i]; }, mean_fitted);
    EXPECT_NEAR(r.layers[0].loss_nearest, nearest, 1e-4 * nearest) << "the loss counts the bias as written";
    EXPECT_NEAR(r.layers[0].loss, fitted, 1e-4 * fitted);
    EXPECT_LT(fitted, 0.5 * nearest);
    EXPECT_LT(std::abs(mean_fitted), 0.4 * std::abs(mean_nearest))
        << "nearest rounding leaves the bias's " << mean_nearest << " on average";
    expect_on_grid(r.rounded.at("w"), w, scale);
}

// Layer by layer: the second layer is sampled from a model that already
// carries the first layer's fitted weights.
TEST_F(FastFinetune, EachLayerIsFittedOnTheLayersBeforeItAsFitted) {
    GraphBuilder b;
    b.input("x", {8, 6}).output("y", {8, 4});
    b.initializer("w1", random_tensor({6, 5}, 3, -0.5f, 0.5f));
    b.initializer("w2", random_tensor({5, 4}, 4, -0.5f, 0.5f));
    b.node("MatMul", {"x", "w1"}, {"h"});
    b.node("MatMul", {"h", "w2"}, {"y"});
    const auto model = b.build();
    auto reader = data(model, {8, 6}, 3);
    vaiq::QuantPlan plan;
    plan.tensors.push_back(quant_entry("w1", TensorRole::Weight, QuantType::QInt8, {0.5f / 7}, {0}));
    plan.tensors.push_back(quant_entry("w2", TensorRole::Weight, QuantType::QInt8, {0.5f / 7}, {0}));
    std::vector<std::set<std::string>> given;
    const Emitter emit = [&](const std::map<std::string, Tensor>& rounded) {
        given.emplace_back();
        auto out = model;
        for (auto& init : *out.graph().mutable_initializer())
            if (auto it = rounded.find(init.name()); it != rounded.end()) {
                init = it->second.to_proto(init.name());
                given.back().insert(init.name());
            }
        return out;
    };
    vaiq::FastFinetuneOptions options;
    options.iterations = 200;
    const auto r = finetune_with(model, plan, emit, *reader, options);
    ASSERT_EQ(r.layers.size(), 2u);
    ASSERT_EQ(given.size(), 2u) << "one quantized model per layer";
    EXPECT_TRUE(given[0].empty());
    EXPECT_EQ(given[1], (std::set<std::string>{"w1"}));
}

// The float inputs of the layers kept over the data (all, some, none within the
// budget), with those the cache cannot hold from a segmented run of the float
// model, give the fits exactly what running the float model per layer gives.
TEST_F(FastFinetune, CachedFloatInputsFitAsRunningTheFloatModelPerLayerDoes) {
    const auto model = three_layers();
    const auto plan = three_layers_plan();
    const Emitter emit = with_weights(model);
    std::vector<vaiq::FastFinetuneResult> results;
    // Over 3 batches x takes 576 bytes, r1 480 and h2 672. A budget of 1100 caches x
    // and r1, and h2 comes from a segment run from the inputs; 700 caches x alone,
    // and the segments give r1, then h2 from r1 (each kept within it); with none,
    // the segmented run outgrows it at once and the float model runs up to each layer.
    for (const size_t budget : {size_t{1} << 30, size_t{1100}, size_t{700}, size_t{0}}) {
        auto reader = data(model, {8, 6}, 3);
        vaiq::FastFinetuneOptions options;
        options.iterations = 100;
        options.drop_ratio = 0.5;  // the float inputs enter the fit itself too
        options.float_cache_bytes = budget;
        results.push_back(finetune_with(model, plan, emit, *reader, options));
    }
    for (size_t i = 1; i < results.size(); ++i) {
        ASSERT_EQ(results[i].layers.size(), 3u);
        for (size_t l = 0; l < 3; ++l) EXPECT_EQ(results[i].layers[l].loss, results[0].layers[l].loss) << i << " " << l;
        for (const auto& [name, weight] : results[0].rounded) {
            const auto other = results[i].rounded.at(name).data<float>();
            EXPECT_TRUE(std::equal(other.begin(), other.end(), weight.data<float>().begin())) << i << " " << name;
        }
    }
}

// Trials run in step (the float inputs cached once, or a layer's computed once
// for all where the cache holds none; each layer's samplings, on passes of
// their own over the batches, and fits side by side on two threads) give each
// seed what a fast finetune with that seed alone gives, with and without
// SelectiveUpdate (which keeps a pending layer per trial and samples in turns).
TEST_F(FastFinetune, TrialsInStepFitAsOneSeedAtATimeDoes) {
    const vaiq::runtime::ThreadCount two(2);
    const auto model = three_layers();
    const auto plan = three_layers_plan();
    const Emitter emit = with_weights(model);
    const std::vector<uint64_t> seeds{0, 1, 2};
    // Cached float inputs, none (each layer's computed once for the three), and SelectiveUpdate.
    for (const auto& [selective, budget] :
         {std::pair{false, size_t{1} << 30}, {false, size_t{0}}, {true, size_t{1} << 30}}) {
        vaiq::FastFinetuneOptions options;
        options.iterations = 100;
        options.batch_columns = 8;
        options.drop_ratio = 0.5;  // draws of their own in every step
        options.selective_update = selective;
        options.float_cache_bytes = budget;
        auto reader = data(model, {8, 6}, 3);
        vaiq::test::TestAlgorithmContext c(
            model, *reader, plan,
            [&](const vaiq::QuantPlan&, const std::map<std::string, Tensor>& weights) { return emit(weights); });
        const auto together = vaiq::fast_finetune(c.context, options, seeds);
        ASSERT_EQ(together.size(), seeds.size());
        std::set<std::vector<float>> distinct;
        for (size_t t = 0; t < seeds.size(); ++t) {
            options.seed = seeds[t];
            const auto alone = finetune_with(model, plan, emit, *reader, options);
            ASSERT_EQ(together[t].layers.size(), alone.layers.size());
            for (size_t l = 0; l < alone.layers.size(); ++l) {
                EXPECT_EQ(together[t].layers[l].loss, alone.layers[l].loss) << selective << " " << t << " " << l;
                EXPECT_EQ(together[t].layers[l].reverted, alone.layers[l].reverted) << selective << " " << t;
            }
            for (const auto& [name, weight] : alone.rounded) {
                const auto got = together[t].rounded.at(name).data<float>();
                EXPECT_TRUE(std::equal(got.begin(), got.end(), weight.data<float>().begin()))
                    << selective << " " << t << " " << name;
            }
            std::vector<float> all;
            for (const auto& [name, weight] : together[t].rounded)
                all.insert(all.end(), weight.data<float>().begin(), weight.data<float>().end());
            distinct.insert(std::move(all));
        }
        EXPECT_GT(distinct.size(), 1u) << "the seeds must matter for the comparison to mean anything";
    }
}

TEST_F(FastFinetune, AdaQuantDoesNoWorseThanNearestRounding) {
    GraphBuilder b;
    b.input("x", {8, 10}).output("y", {8, 5});
    b.initializer("w", random_tensor({10, 5}, 9, -0.5f, 0.5f));
    b.node("MatMul", {"x", "w"}, {"y"});
    const auto model = b.build();
    auto reader = data(model, {8, 10}, 4);
    vaiq::QuantPlan plan;
    plan.tensors.push_back(quant_entry("w", TensorRole::Weight, QuantType::QInt8, {0.5f / 7}, {0}));
    vaiq::FastFinetuneOptions options;
    options.algorithm = "adaquant";
    options.iterations = 300;
    options.learning_rate = 1e-3;
    const auto r = finetune_with(model, plan, same_model(model), *reader, options);
    ASSERT_EQ(r.layers.size(), 1u);
    EXPECT_LE(r.layers[0].loss, r.layers[0].loss_nearest);
}

// The columns a strided, padded, grouped convolution is fitted on are its own:
// the error reported for nearest rounding is the executor's, computed apart.
// A grouped, strided, padded Conv on `samples` inputs of h x w: the loss of
// nearest rounding that fast finetune measures on its columns (the held-out
// ones once there are 20) against the executor's outputs. `summed`: the fit
// runs on the columns' sums (column_sums.hpp), else on the columns kept.
void expect_columns_match_the_executor(FastFinetune& test, int64_t h, int64_t w_, int samples, bool summed) {
    GraphBuilder b;
    const int64_t oh = (h + 2 - 3) / 2 + 1, ow = (w_ + 1 - 3) / 2 + 1;
    b.input("x", {1, 4, h, w_}).output("y", {1, 6, oh, ow});
    const auto w = random_tensor({6, 2, 3, 3}, 11, -0.4f, 0.4f);
    b.initializer("w", w);
    b.initializer("b", random_tensor({6}, 12, -0.1f, 0.1f));
    auto& conv = b.node("Conv", {"x", "w", "b"}, {"y"});
    vaiq::test::set_attribute(conv, "group", 2);
    vaiq::test::set_ints_attribute(conv, "strides", {2, 2});
    vaiq::test::set_ints_attribute(conv, "pads", {1, 1, 1, 0});
    const auto model = b.build();
    auto reader = test.data(model, {1, 4, h, w_}, samples);
    const float scale = 0.4f / 7;
    vaiq::QuantPlan plan;
    plan.tensors.push_back(quant_entry("w", TensorRole::Weight, QuantType::QInt8, {scale}, {0}));
    vaiq::FastFinetuneOptions options;
    options.iterations = 0;  // only the measurement
    options.batch_columns = summed ? 256 : 8;  // k is 18 a group: summed up to 2 x ColumnsPerStep
    const auto r = finetune_with(model, plan, same_model(model), *reader, options);
    ASSERT_EQ(r.layers.size(), 1u);
    const int64_t columns = samples * oh * ow;
    EXPECT_EQ(r.layers[0].columns, columns);
    // The held-out columns: those of the sums' first fold, or the reservoir's
    // last fifth (every column fits in it, in order).
    auto judged = [&](int64_t column) {
        if (columns < 20) return true;
        return summed ? vaiq::ColumnSums::fold_of(options.seed, column) == 0 : column >= columns - columns / 5;
    };

    auto rounded = model;
    for (auto& init : *rounded.graph().mutable_initializer()) {
        if (init.name() != "w") continue;
        Tensor t = Tensor::from_proto(init);
        for (auto& v : t.mutable_data<float>()) v = std::nearbyint(v / scale) * scale;
        init = t.to_proto("w");
    }
    vaiq::runtime::Executor f(model), q(rounded);
    double sum = 0;
    int64_t count = 0;
    reader->rewind();
    for (int64_t n = 0; auto batch = reader->next(); ++n) {
        const auto a = f.run(batch->feeds)[0], c = q.run(batch->feeds)[0];
        for (int64_t i = 0; i < a.size(); ++i) {
            if (!judged(n * oh * ow + i % (oh * ow))) continue;
            const double d = a.data<float>()[i] - c.data<float>()[i];
            sum += d * d;
        }
        for (int64_t p = 0; p < oh * ow; ++p) count += judged(n * oh * ow + p);
    }
    const double expected = sum / static_cast<double>(count);
    EXPECT_NEAR(r.layers[0].loss_nearest, expected, 1e-4 * expected + 1e-9);
}

TEST_F(FastFinetune, ConvolutionColumnsMatchTheExecutor) {
    // One sample: its 12 positions are too few to hold any out, so the loss is on all of them.
    expect_columns_match_the_executor(*this, 7, 6, 1, false);
    expect_columns_match_the_executor(*this, 7, 6, 1, true);
}

TEST_F(FastFinetune, ManyColumnsMatchTheExecutorToo) {
    // 1,500 positions: the float layer's outputs are computed in several blocks.
    expect_columns_match_the_executor(*this, 50, 40, 3, false);
    expect_columns_match_the_executor(*this, 50, 40, 3, true);
}

// A reservoir smaller than the columns draws slots again, several times a
// batch, and fills its blocks of columns on several threads: each slot's input
// and float output must still come from one column (the last drawn into it).
// Kept from the first column drawn into it instead, the held-out columns' error
// here is 2.5 times the rounding's own.
TEST_F(FastFinetune, AReservoirThatDrawsSlotsAgainKeepsEachSlotsInputAndOutputTogether) {
    GraphBuilder b;
    const int64_t h = 40, w_ = 50, oh = h - 2, ow = w_ - 2;
    b.input("x", {1, 8, h, w_}).output("y", {1, 4, oh, ow});
    b.initializer("w", random_tensor({4, 8, 3, 3}, 21, -0.4f, 0.4f));  // 72 values a column
    b.node("Conv", {"x", "w"}, {"y"});
    const auto model = b.build();
    auto reader = data(model, {1, 8, h, w_}, 2);
    const float scale = 0.4f / 7;
    vaiq::QuantPlan plan;
    plan.tensors.push_back(quant_entry("w", TensorRole::Weight, QuantType::QInt8, {scale}, {0}));
    vaiq::FastFinetuneOptions options;
    options.iterations = 0;                     // only the measurement
    options.batch_columns = 8;                  // k = 72: kept columns, not their sums
    options.memory_bytes = 600 * (72 + 4) * 4;  // 600 of 3,648 columns kept
    const auto r = finetune_with(model, plan, same_model(model), *reader, options);
    ASSERT_EQ(r.layers.size(), 1u);
    EXPECT_EQ(r.layers[0].columns, 600);

    // The rounding's mean error over every column, from the executor.
    auto rounded = model;
    for (auto& init : *rounded.graph().mutable_initializer()) {
        Tensor t = Tensor::from_proto(init);
        for (auto& v : t.mutable_data<float>()) v = std::nearbyint(v / scale) * scale;
        init = t.to_proto(init.name());
    }
    vaiq::runtime::Executor f(model), q(rounded);
    double sum = 0;
    reader->rewind();
    while (auto batch = reader->next()) {
        const auto a = f.run(batch->feeds)[0], c = q.run(batch->feeds)[0];
        for (int64_t i = 0; i < a.size(); ++i) sum += std::pow(a.data<float>()[i] - c.data<float>()[i], 2);
    }
    const double expected = sum / (2.0 * oh * ow);
    // 120 held-out columns drawn at random: their mean is near the whole's (1.01 times it).
    EXPECT_GT(r.layers[0].loss_nearest, 0.8 * expected);
    EXPECT_LT(r.layers[0].loss_nearest, 1.25 * expected);
}

// Fits: the roundings that several fits vote for depend less on the draws
// than those of one fit.
TEST_F(FastFinetune, VotedFitsDependLessOnTheSeed) {
    GraphBuilder b;
    b.input("x", {16, 24}).output("y", {16, 8});
    const auto w = random_tensor({24, 8}, 31, -0.5f, 0.5f);
    b.initializer("w", w);
    b.node("MatMul", {"x", "w"}, {"y"});
    const auto model = b.build();
    auto reader = data(model, {16, 24}, 8);
    vaiq::QuantPlan plan;
    const float scale = 0.5f / 7;
    plan.tensors.push_back(quant_entry("w", TensorRole::Weight, QuantType::QInt8, {scale}, {0}));
    // The weights on which the results for seeds 0..4 disagree, summed over pairs of seeds.
    auto disagreements = [&](int fits) {
        std::vector<Tensor> chosen;
        for (uint64_t seed = 0; seed < 5; ++seed) {
            vaiq::FastFinetuneOptions options;
            options.iterations = 300;
            options.batch_columns = 16;
            options.fits = fits;
            options.seed = seed;
            const auto r = finetune_with(model, plan, same_model(model), *reader, options);
            expect_on_grid(r.rounded.at("w"), w, scale);
            chosen.push_back(r.rounded.at("w"));
        }
        int differ = 0;
        for (size_t i = 0; i < chosen.size(); ++i)
            for (size_t j = i + 1; j < chosen.size(); ++j)
                for (int64_t k = 0; k < w.size(); ++k)
                    differ += chosen[i].data<float>()[k] != chosen[j].data<float>()[k];
        return differ;
    };
    const int single = disagreements(1), voted = disagreements(5);
    EXPECT_GT(single, 0) << "the draws must matter for the comparison to mean anything";
    EXPECT_LT(voted, single);
}

// A layer whose input the quantized model doubles and whose output it halves:
// fitted on the quantized inputs, the rounding shrinks the weights to make up
// for inputs that the end-to-end output does not see doubled.
class DoubledInput : public FastFinetune {
  protected:
    static vaiq::Model model(float input_gain, float output_gain, const Tensor& w) {
        GraphBuilder b;
        b.input("x", {16, 12}).output("y", {16, 6});
        b.initializer("gain_in", Tensor::from_values<float>({}, std::vector<float>{input_gain}));
        b.initializer("gain_out", Tensor::from_values<float>({}, std::vector<float>{output_gain}));
        b.initializer("w", w);
        b.node("Mul", {"x", "gain_in"}, {"h"});
        b.node("MatMul", {"h", "w"}, {"hw"});
        b.node("Mul", {"hw", "gain_out"}, {"y"});
        return b.build();
    }
    vaiq::FastFinetuneResult finetune(double drop_ratio, bool selective_update) {
        const auto float_model = model(1.0f, 1.0f, w_);
        auto reader = data(float_model, {16, 12}, 10);
        vaiq::QuantPlan plan;
        plan.tensors.push_back(quant_entry("w", TensorRole::Weight, QuantType::QInt8, {kScale}, {0}));
        const Emitter emit = [&](const std::map<std::string, Tensor>& rounded) {
            return model(2.0f, 0.5f, rounded.count("w") ? rounded.at("w") : nearest());
        };
        vaiq::FastFinetuneOptions options;
        options.iterations = 500;
        options.batch_columns = 64;
        options.drop_ratio = drop_ratio;
        options.selective_update = selective_update;
        return finetune_with(float_model, plan, emit, *reader, options);
    }
    // The mean magnitude of the chosen weights, in grid steps.
    static double mean_steps(const Tensor& t) {
        double sum = 0;
        for (float v : t.data<float>()) sum += std::abs(v) / kScale;
        return sum / static_cast<double>(t.size());
    }
    Tensor nearest() const {
        Tensor t = w_;
        for (auto& v : t.mutable_data<float>()) v = std::nearbyint(v / kScale) * kScale;
        return t;
    }
    static constexpr float kScale = 0.5f / 7;
    const Tensor w_ = random_tensor({12, 6}, 21, -0.5f, 0.5f);
};

TEST_F(DoubledInput, DropRatioChoosesWhichInputsTheRoundingIsFittedTo) {
    const auto on_quantized = finetune(1.0, false), on_float = finetune(0.0, false);
    ASSERT_EQ(on_quantized.layers.size(), 1u);
    ASSERT_EQ(on_float.layers.size(), 1u);
    // Fitted to doubled inputs, most weights round towards zero; fitted to the
    // float inputs, the rounding stays about as large as nearest rounding.
    const double steps = mean_steps(nearest());
    EXPECT_LT(mean_steps(on_quantized.rounded.at("w")), steps - 0.3);
    EXPECT_GT(mean_steps(on_float.rounded.at("w")), steps - 0.1);
    EXPECT_TRUE(std::isnan(on_quantized.layers[0].output_error)) << "measured only for SelectiveUpdate";
}

TEST_F(DoubledInput, SelectiveUpdateDropsAFitThatMovesTheOutputAway) {
    const auto r = finetune(1.0, true);
    ASSERT_EQ(r.layers.size(), 1u);
    const auto& layer = r.layers[0];
    EXPECT_GT(layer.output_error, layer.output_error_nearest) << "the shrunken weights halve what the output sees";
    EXPECT_TRUE(layer.reverted);
    EXPECT_EQ(layer.loss, layer.loss_nearest);
    const Tensor expected_tensor = nearest();
    const auto chosen = r.rounded.at("w").data<float>(), expected = expected_tensor.data<float>();
    for (size_t i = 0; i < chosen.size(); ++i) EXPECT_FLOAT_EQ(chosen[i], expected[i]) << i;
    const auto json = r.to_json();
    EXPECT_EQ(json[0]["selective_update"]["reverted"], true);

    // Fitted on the float inputs the layer's fit helps the output too, and stays.
    const auto kept = finetune(0.0, true);
    ASSERT_EQ(kept.layers.size(), 1u);
    EXPECT_LE(kept.layers[0].output_error, kept.layers[0].output_error_nearest);
    EXPECT_FALSE(kept.layers[0].reverted);
}

}  // namespace

// Trials are ranked by their metric, the finer measures deciding its ties.
TEST(TrialOrder, AFinerMeasureDecidesATie) {
    vaiq::OutputAgreement a, b;
    a.sequence_agreement = b.sequence_agreement = 28.0 / 32.0;
    a.top1_agreement = 0.9711, b.top1_agreement = 0.9695;
    a.sqnr_db = 10, b.sqnr_db = 12;
    EXPECT_TRUE(vaiq::agrees_better(a, b, "sequence")) << "same lines: more rows agree";
    EXPECT_FALSE(vaiq::agrees_better(b, a, "sequence"));
    EXPECT_TRUE(vaiq::agrees_better(a, b, "top1"));
    EXPECT_TRUE(vaiq::agrees_better(b, a, "sqnr"));
    b.sequence_agreement = 29.0 / 32.0;
    EXPECT_TRUE(vaiq::agrees_better(b, a, "sequence")) << "one more line outweighs any number of rows";
    a.top1_agreement = b.top1_agreement;
    EXPECT_TRUE(vaiq::agrees_better(b, a, "top1")) << "same rows: the higher SQNR";
    EXPECT_FALSE(vaiq::agrees_better(a, a, "sequence")) << "a full tie is no gain";
}

// Three trials compared by `metric`, on random inputs of x in `range`.
static std::string trials_recipe(const std::string& metric, const std::string& range) {
    return "target: cpu\ncalibrate_method: MinMax\ninclude_fast_ft: true\nextra_options:\n"
           "  RandomDataReaderInputDataRange: {x: " +
           range + "}\n  FastFinetune: {NumIterations: 20, Trials: 3, TrialMetric: " + metric + "}\n";
}

// A recipe's trials: on a model that agrees fully after the first fit (one
// class far ahead in every row), one runs; with TrialMetric sqnr, all do.
TEST(FastFinetuneTrials, StopWhenTheFirstAgreesFully) {
    const auto dir = temp_dir();
    GraphBuilder b;
    b.input("x", {4, 16}).output("y", {4, 8});
    std::vector<float> w(16 * 8, 0.01f);
    for (size_t i = 0; i < 16; ++i) w[i * 8 + 2] = 0.5f;  // column 2 wins every row by far
    b.initializer("w", Tensor::from_values<float>({16, 8}, w));
    b.node("Gemm", {"x", "w"}, {"y"});
    vaiq::save_model(b.build(), dir / "in.onnx");
    auto registry = vaiq::test::registry_with_installed_plugins();
    auto recipe = [](const std::string& metric) { return trials_recipe(metric, "[0.5, 1.5]"); };
    const auto top1 = vaiq::test::run_recipe_in(dir, registry, recipe("top1"));
    const auto& trials = top1["fast_finetune"]["trials"];
    EXPECT_EQ(trials["asked"], 3);
    ASSERT_EQ(trials["runs"].size(), 1u) << trials.dump();
    EXPECT_EQ(trials["runs"][0]["top1_agreement"], 1.0);
    const auto sqnr = vaiq::test::run_recipe_in(dir, registry, recipe("sqnr"), "s.yaml");
    EXPECT_EQ(sqnr["fast_finetune"]["trials"]["runs"].size(), 3u);
}

// TrialMetric sequence on an output that decodes no samples (independent
// decisions, as a detector's map): nothing to compare, so the first fit is
// kept and the others are not run; by top1 the trials still compete.
TEST(FastFinetuneTrials, SequenceOnAnOutputWithoutSamplesKeepsTheFirst) {
    const auto dir = temp_dir();
    GraphBuilder b;
    b.input("x", {64, 16}).output("p", {64, 8});
    std::vector<float> w(16 * 8);
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.2f * std::sin(1.7f * static_cast<float>(i));
    w[0] = 12.0f;  // one grid for the weight, sized by it: the others round coarsely
    b.initializer("w", Tensor::from_values<float>({16, 8}, w));
    b.node("Gemm", {"x", "w"}, {"z"});
    b.node("Sigmoid", {"z"}, {"p"});  // decisions near 0.5 flip when quantized
    vaiq::save_model(b.build(), dir / "in.onnx");
    auto registry = vaiq::test::registry_with_installed_plugins();
    auto recipe = [](const std::string& metric) { return trials_recipe(metric, "[-1, 1]"); };
    const auto sequence = vaiq::test::run_recipe_in(dir, registry, recipe("sequence"));
    const auto& trials = sequence["fast_finetune"]["trials"];
    ASSERT_EQ(trials["runs"].size(), 1u) << trials.dump();
    ASSERT_LT(trials["runs"][0]["top1_agreement"].get<double>(), 1.0) << "else every row agreeing stops them anyway";
    EXPECT_EQ(sequence["fast_finetune"]["seed"], 0);
    const auto top1 = vaiq::test::run_recipe_in(dir, registry, recipe("top1"), "t.yaml");
    EXPECT_EQ(top1["fast_finetune"]["trials"]["runs"].size(), 3u);
}

// Trials stop after a fit that agrees on every row (and sample): nothing but SQNR could beat it.
TEST(TrialOrder, FullAgreementLeavesOnlySqnrToGain) {
    vaiq::OutputAgreement e;
    e.top1_agreement = e.sequence_agreement = 1.0;
    EXPECT_TRUE(vaiq::agrees_fully(e, "top1"));
    EXPECT_TRUE(vaiq::agrees_fully(e, "sequence"));
    EXPECT_FALSE(vaiq::agrees_fully(e, "sqnr")) << "SQNR can always improve";
    e.sequence_agreement = 31.0 / 32.0;
    EXPECT_TRUE(vaiq::agrees_fully(e, "top1"));
    EXPECT_FALSE(vaiq::agrees_fully(e, "sequence"));
    e.sequence_agreement = 1.0, e.top1_agreement = 0.9995;
    EXPECT_FALSE(vaiq::agrees_fully(e, "sequence")) << "every line read, not every row";
}
