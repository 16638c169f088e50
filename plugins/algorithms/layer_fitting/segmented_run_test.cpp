// A model run a segment at a time gives each requested tensor as the whole
// run does, keeps only what later nodes read, honours weights that change
// after a segment ran when no node run so far read them, and gives up past its budget.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <random>

#include "data/data_reader.hpp"
#include "runtime/executor.hpp"
#include "segmented_run.hpp"
#include "test_support.hpp"
#include "vaiq/reader.hpp"

namespace fs = std::filesystem;
using vaiq::Tensor;
using vaiq::test::GraphBuilder;

namespace {

Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = u(rng);
    return Tensor::from_values<float>(shape, v);
}

// x -> MatMul w1 -> a -> Relu -> r -> MatMul w2 -> m -> Add(m, r) -> s -> MatMul w3 -> y:
// the layers' inputs are x, r and s; r is read again after its layer (a skip).
vaiq::Model skip_model(const Tensor& w2) {
    GraphBuilder b;
    b.input("x", {3, 4}).output("y", {3, 2});
    b.initializer("w1", random_tensor({4, 4}, 1));
    b.initializer("w2", w2);
    b.initializer("w3", random_tensor({4, 2}, 3));
    b.node("MatMul", {"x", "w1"}, {"a"}, "layer1");
    b.node("Relu", {"a"}, {"r"});
    b.node("MatMul", {"r", "w2"}, {"m"}, "layer2");
    b.node("Add", {"m", "r"}, {"s"});
    b.node("MatMul", {"s", "w3"}, {"y"}, "layer3");
    return b.build();
}

class SegmentedRun : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = vaiq::test::temp_dir();
        fs::create_directories(dir_ / "data");
        for (int i = 0; i < 3; ++i)
            vaiq::write_npy(dir_ / "data" / fmt::format("s{}.npy", i), random_tensor({3, 4}, 100 + i));
    }
    // The tensor's value in each batch, from whole runs of `model`.
    std::vector<Tensor> whole_runs(const vaiq::Model& model, const std::string& tensor) {
        auto reader = vaiq::open_data_reader(dir_ / "data", model);
        vaiq::runtime::Executor executor(model);
        std::vector<Tensor> out;
        while (auto batch = reader->next())
            executor.run(batch->feeds, {tensor}, [&](const std::string&, const Tensor& v) { out.push_back(v); });
        return out;
    }
    fs::path dir_;
};

void expect_same(const std::vector<Tensor>& got, const std::vector<Tensor>& expected) {
    ASSERT_EQ(got.size(), expected.size());
    for (size_t b = 0; b < got.size(); ++b) {
        ASSERT_EQ(got[b].shape(), expected[b].shape());
        const auto g = got[b].data<float>(), e = expected[b].data<float>();
        for (size_t i = 0; i < g.size(); ++i) EXPECT_FLOAT_EQ(g[i], e[i]) << "batch " << b << ", element " << i;
    }
}

TEST_F(SegmentedRun, GivesEachLayerInputAsTheWholeRunAndKeepsOnlyWhatIsStillRead) {
    const auto model = skip_model(random_tensor({4, 4}, 2));
    auto reader = vaiq::open_data_reader(dir_ / "data", model);
    vaiq::test::TestAlgorithmContext c(model, *reader);
    vaiq::SegmentedRun run(c.context, c.context.data(), size_t{1} << 20);
    for (const std::string tensor : {"x", "r", "s"}) {
        std::vector<Tensor> got(3);
        ASSERT_TRUE(run.compute(model, tensor, [&](size_t b, const Tensor& v) { got.at(b) = v; })) << tensor;
        expect_same(got, whole_runs(model, tensor));
        if (tensor == "r") {
            EXPECT_EQ(run.kept_bytes(), 3u * 3 * 4 * sizeof(float)) << "r, read by layer2 and the Add";
        }
    }
    EXPECT_EQ(run.kept_bytes(), 3u * 3 * 4 * sizeof(float)) << "only s is still read (by layer3)";
}

TEST_F(SegmentedRun, AWeightNoNodeRunSoFarReadsMayChangeBetweenCalls) {
    const auto before = skip_model(random_tensor({4, 4}, 2));
    const auto fitted = skip_model(random_tensor({4, 4}, 7));  // layer2 fitted after r was computed
    auto reader = vaiq::open_data_reader(dir_ / "data", before);
    vaiq::test::TestAlgorithmContext c(before, *reader);
    vaiq::SegmentedRun run(c.context, c.context.data(), size_t{1} << 20);
    ASSERT_TRUE(run.compute(before, "r", [](size_t, const Tensor&) {}));
    std::vector<Tensor> got(3);
    ASSERT_TRUE(run.compute(fitted, "s", [&](size_t b, const Tensor& v) { got.at(b) = v; }));
    expect_same(got, whole_runs(fitted, "s"));
}

TEST_F(SegmentedRun, PastItsBudgetTheCallDeliversAndLaterCallsDecline) {
    const auto model = skip_model(random_tensor({4, 4}, 2));
    auto reader = vaiq::open_data_reader(dir_ / "data", model);
    vaiq::test::TestAlgorithmContext c(model, *reader);
    vaiq::SegmentedRun run(c.context, c.context.data(), 16);  // bytes: less than r over three batches
    size_t delivered = 0;
    EXPECT_TRUE(run.compute(model, "r", [&](size_t, const Tensor&) { ++delivered; }));
    EXPECT_EQ(delivered, 3u);
    EXPECT_EQ(run.kept_bytes(), 0u);
    EXPECT_FALSE(run.compute(model, "s", [&](size_t, const Tensor&) { ++delivered; }));
    EXPECT_EQ(delivered, 3u);
}

}  // namespace
