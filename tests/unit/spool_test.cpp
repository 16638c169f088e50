// Put-aside tensors: held in memory up to the budget, then in a temporary file
// that has no name; a parked model's weights read back where they are used.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "runtime/executor.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/spool.hpp"

namespace fs = std::filesystem;
using vaiq::DataType;
using vaiq::Tensor;

namespace {

bool same_bytes(const Tensor& a, const Tensor& b) {
    return a.type() == b.type() && a.shape() == b.shape() &&
           std::equal(a.bytes().begin(), a.bytes().end(), b.bytes().begin(), b.bytes().end());
}

// TMPDIR pointed at a fresh folder for the test's life.
class SpoolTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = vaiq::test::temp_dir();
        if (const char* old = std::getenv("TMPDIR")) old_ = old;
        ::setenv("TMPDIR", dir_.c_str(), 1);
    }
    void TearDown() override {
        if (old_.empty())
            ::unsetenv("TMPDIR");
        else
            ::setenv("TMPDIR", old_.c_str(), 1);
    }
    bool folder_empty() const { return fs::is_empty(dir_); }
    fs::path dir_;
    std::string old_;
};

TEST_F(SpoolTest, KeepsTheBudgetInMemoryAndTheRestInAFileWithoutAName) {
    vaiq::TensorSpool spool(/*memory_budget=*/64);
    const auto small = vaiq::test::ramp({4, 4});            // 64 bytes: within the budget
    const auto large = vaiq::test::ramp({3, 100}, -5.0f);   // beyond it
    const auto ints = Tensor::from_values<int32_t>({2}, std::vector<int32_t>{7, -9});
    EXPECT_EQ(spool.put(small), 0u);
    EXPECT_EQ(spool.put(large), 1u);
    EXPECT_EQ(spool.put(ints), 2u);
    EXPECT_EQ(spool.spilled_bytes(), large.bytes().size() + ints.bytes().size());
    EXPECT_TRUE(same_bytes(spool.get(1), large));
    EXPECT_TRUE(same_bytes(spool.get(0), small));
    EXPECT_TRUE(same_bytes(spool.get(2), ints));
    EXPECT_TRUE(folder_empty()) << "a killed process leaves nothing behind";
    EXPECT_THROW(spool.get(3), std::out_of_range);
}

// A dropped value gives its memory back to the budget and cannot be read.
TEST_F(SpoolTest, ADroppedValueFreesItsShareOfTheBudget) {
    vaiq::TensorSpool spool(/*memory_budget=*/64);
    const auto small = vaiq::test::ramp({4, 4});  // 64 bytes: the whole budget
    EXPECT_EQ(spool.put(small), 0u);
    spool.drop(0);
    EXPECT_EQ(spool.put(small), 1u);
    EXPECT_EQ(spool.spilled_bytes(), 0u) << "held in memory, in the budget the first one left";
    EXPECT_TRUE(same_bytes(spool.get(1), small));
    EXPECT_THROW(spool.get(0), vaiq::InternalError);
    spool.drop(0);  // twice: nothing more to free
    EXPECT_EQ(spool.put(small), 2u);
    EXPECT_EQ(spool.spilled_bytes(), small.bytes().size()) << "the budget is full again";
}

TEST_F(SpoolTest, ATemporaryFolderThatCannotBeWrittenIsAClearError) {
    ::setenv("TMPDIR", (dir_ / "missing").c_str(), 1);
    vaiq::TensorSpool spool(/*memory_budget=*/0);
    try {
        spool.put(vaiq::test::ramp({4}));
        FAIL() << "expected InputError";
    } catch (const vaiq::InputError& e) {
        EXPECT_NE(std::string(e.what()).find("cannot create a temporary file"), std::string::npos) << e.what();
    }
}

TEST_F(SpoolTest, ParkedWeightsAreReadBackWhereTheModelUsesThem) {
    vaiq::test::GraphBuilder b;
    b.input("x", {1, 512}).output("y", {1, 600});
    const auto w = vaiq::test::ramp({512, 600}, -1.0f, 1.0f / 4096);  // 1.2 MB: parked
    const auto bias = vaiq::test::ramp({600}, 0.5f);                  // 2.4 KB: stays
    b.initializer("w", w).initializer("bias", bias);
    b.node("MatMul", {"x", "w"}, {"xw"});
    b.node("Add", {"xw", "bias"}, {"y"});
    auto model = b.build();
    const auto x = vaiq::test::ramp({1, 512}, 0.0f, 0.01f);
    const auto before = vaiq::runtime::Executor(model, {.threads = 1}).run({{"x", x}})[0];

    vaiq::TensorSpool spool;
    EXPECT_EQ(spool.park_initializers(model, size_t{1} << 20), w.bytes().size());
    const auto& inits = model.graph().initializer();
    ASSERT_EQ(inits.size(), 2);
    for (const auto& init : inits) {
        EXPECT_EQ(vaiq::is_deferred(init), init.name() == "w") << init.name();
        EXPECT_TRUE(same_bytes(Tensor::from_proto(init), init.name() == "w" ? w : bias)) << init.name();
    }
    const auto after = vaiq::runtime::Executor(model, {.threads = 1}).run({{"x", x}})[0];
    EXPECT_TRUE(same_bytes(after, before));
    EXPECT_EQ(spool.park_initializers(model, size_t{1} << 20), 0u) << "parked once";
    EXPECT_TRUE(folder_empty());
}

}  // namespace
