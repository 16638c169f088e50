// The data an algorithm reads: after its first whole pass, the passes are
// replayed from memory when the data fits the budget, and read from the run's
// reader every time when it does not; either way each pass gives the same batches.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pipeline/algorithm_context.hpp"
#include "test_support.hpp"

namespace {

using vaiq::Tensor;

// In-memory batches of x that count how many were read.
class CountingReader final : public vaiq::DataReader {
  public:
    explicit CountingReader(size_t batches) {
        for (size_t b = 0; b < batches; ++b)
            batches_.push_back(Tensor::from_values<float>({1, 8, 4}, std::vector<float>(32, static_cast<float>(b))));
    }
    std::optional<vaiq::Batch> next() override {
        if (at_ >= batches_.size()) return std::nullopt;
        ++reads;
        const size_t b = at_++;
        return vaiq::Batch{{{"x", batches_[b]}}, "batch " + std::to_string(b)};
    }
    void rewind() override { at_ = 0; }
    size_t items() const override { return batches_.size(); }
    size_t reads = 0;

  private:
    std::vector<Tensor> batches_;
    size_t at_ = 0;
};

// A pass from the start: the value each batch holds.
std::vector<float> pass(vaiq::DataStream& data) {
    std::vector<float> seen;
    data.rewind();
    while (auto feeds = data.next()) seen.push_back(feeds->at("x").data<float>()[0]);
    return seen;
}

struct Context {
    Context(size_t batches, size_t budget) : reader(batches), inputs(model, plan, reader, 1) {
        inputs.data_kept_bytes = budget;
    }
    vaiq::Model model = vaiq::test::matmul_model(Tensor::from_values<float>({4, 2}, std::vector<float>(8, 1.0f)));
    vaiq::QuantPlan plan;
    CountingReader reader;
    vaiq::AlgorithmInputs inputs;
};

TEST(AlgorithmData, PassesAfterTheFirstWholeOneComeFromMemoryWhenTheDataFits) {
    Context c(3, size_t{1} << 20);  // 3 batches of 128 bytes
    vaiq::HostAlgorithmContext context(c.inputs);
    auto& data = context.data();
    ASSERT_TRUE(data.next());  // read before any rewind: not a pass from the start
    data.rewind();
    ASSERT_TRUE(data.next());  // a pass left unfinished
    const std::vector<float> all{0, 1, 2};
    EXPECT_EQ(pass(data), all);
    const size_t after_first = c.reader.reads;
    EXPECT_EQ(after_first, 5u);
    EXPECT_EQ(pass(data), all);
    EXPECT_EQ(pass(data), all);
    EXPECT_EQ(c.reader.reads, after_first) << "the passes after a whole one replay it";
}

TEST(AlgorithmData, DataLargerThanTheBudgetIsReadEveryPass) {
    Context c(3, 300);  // the third batch outgrows it
    vaiq::HostAlgorithmContext context(c.inputs);
    auto& data = context.data();
    const std::vector<float> all{0, 1, 2};
    for (int p = 1; p <= 3; ++p) {
        EXPECT_EQ(pass(data), all) << p;
        EXPECT_EQ(c.reader.reads, 3u * static_cast<size_t>(p)) << p;
    }
}

}  // namespace
