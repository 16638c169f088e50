// The mixed_scales algorithm: tensors whose channels live on scales far apart.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <set>

#include "field_run.hpp"
#include "pipeline/pipeline.hpp"
#include "recipe/recipe.hpp"

namespace fs = std::filesystem;
using vaiq::Tensor;
using vaiq::test::FieldRun;
using vaiq::test::GraphBuilder;
using vaiq::test::output_sqnr;
using vaiq::test::temp_dir;

namespace {

// Score channels of a few units next to offsets of hundreds, cut apart by two
// Slices: each piece gets its own grid, and the scores keep their precision.
vaiq::Model packed_head_model(bool split) {
    GraphBuilder b;
    b.input("x", {1, 1, 8, 8});
    std::vector<float> w(4, 0.0f);
    w[0] = 2.0f, w[1] = -1.5f, w[2] = 300.0f, w[3] = -250.0f;
    b.initializer("w", Tensor::from_values<float>({4, 1, 1, 1}, w));
    if (!split) {
        b.output("head", {1, 4, 8, 8});
        b.node("Conv", {"x", "w"}, {"head"}, "head_conv");
        return b.build();
    }
    b.output("scores", {1, 2, 8, 8}).output("offsets", {1, 2, 8, 8});
    for (const auto& [name, v] : {std::pair{"zero", 0}, std::pair{"one", 1}, std::pair{"two", 2}, std::pair{"four", 4}})
        b.initializer(name, Tensor::from_values<int64_t>({1}, std::vector<int64_t>{v}));
    b.node("Conv", {"x", "w"}, {"head"}, "head_conv");
    b.node("Slice", {"head", "zero", "two", "one"}, {"scores"}, "score_slice");
    b.node("Slice", {"head", "two", "four", "one"}, {"offsets"}, "offset_slice");
    return b.build();
}

// x -> two 1x1 Convs of two channels each -> Concat -> Conv. `scale` sizes the second
// branch; the first has a nearly dead channel (weights 0.001) beside a live one.
vaiq::Model concat_model(float scale) {
    GraphBuilder b;
    b.input("x", {1, 1, 8, 8}).output("y", {1, 1, 8, 8});
    b.initializer("wa", Tensor::from_values<float>({2, 1, 1, 1}, std::vector<float>{1.0f, 0.001f}));
    b.initializer("wy", Tensor::from_values<float>({1, 4, 1, 1}, std::vector<float>{0.5f, 0.5f, 0.01f, 0.01f}));
    b.initializer("wb", Tensor::from_values<float>({2, 1, 1, 1}, std::vector<float>{scale, -scale}));
    b.node("Conv", {"x", "wa"}, {"a"}, "branch_a");
    b.node("Conv", {"x", "wb"}, {"b"}, "branch_b");
    vaiq::set_attribute(b.node("Concat", {"a", "b"}, {"joined"}, "join"), "axis", 1);
    b.node("Conv", {"joined", "wy"}, {"y"}, "mix");
    return b.build();
}

// A concatenation is mixed where its branches are, not where one feature map's
// channels differ (a ReLU's nearly dead channel beside a live one, in every CNN).
TEST_F(FieldRun, AConcatenationIsMixedWhereItsBranchesAre) {
    const auto similar = run(concat_model(1.5f));
    EXPECT_TRUE(similar["mixed_scales"]["tensors"].empty()) << similar["mixed_scales"]["tensors"].dump();
    const auto apart = run(concat_model(300.0f));
    ASSERT_EQ(apart["mixed_scales"]["tensors"].size(), 1u) << apart["mixed_scales"]["tensors"].dump();
    const auto& m = apart["mixed_scales"]["tensors"][0];
    EXPECT_EQ(m["tensor"], "joined");
    EXPECT_EQ(m["narrow_channels"], nlohmann::json::array({0, 1})) << "the first branch's channels";
}

const nlohmann::json& mixed_scale(const nlohmann::json& report, const std::string& role) {
    for (const auto& m : report["mixed_scales"]["tensors"])
        if (m["role"] == role) return m;
    throw std::runtime_error("no mixed-scale " + role + " in " + report["mixed_scales"]["tensors"].dump());
}

TEST_F(FieldRun, AHeadTheGraphSplitsIsQuantizedPieceByPiece) {
    const auto shared = run(packed_head_model(true), "mixed_scale_ratio: 0\n");
    const auto split = run(packed_head_model(true));
    ASSERT_EQ(split["mixed_scales"]["tensors"].size(), 2u) << split.dump();
    const auto& m = mixed_scale(split, "activation");
    EXPECT_EQ(m["tensor"], "head");
    EXPECT_EQ(m["action"], "split");
    EXPECT_EQ(m["narrow_channels"], nlohmann::json::array({0, 1}));
    const auto& w = mixed_scale(split, "weight");
    EXPECT_EQ(w["tensor"], "w");
    EXPECT_EQ(w["action"], "per_channel") << "the scores' weights on the offsets' grid round to a step or two";
    EXPECT_LT(output_sqnr(shared, "scores"), 10.0) << "the scores on the offsets' grid";
    EXPECT_GT(output_sqnr(split, "scores"), 35.0);
    EXPECT_GT(output_sqnr(split, "offsets"), 35.0);
}

TEST_F(FieldRun, AHeadOnOneGridIsNamedWithWhatToDo) {
    const auto report = run(packed_head_model(false));
    EXPECT_TRUE(fs::exists(dir_ / "out.onnx"));
    const auto& m = mixed_scale(report, "activation");
    EXPECT_EQ(m["action"], "named");
    EXPECT_NE(m["advice"].get<std::string>().find("activation_type: QInt16"), std::string::npos) << m.dump();
    EXPECT_NE(m["advice"].get<std::string>().find("head_conv"), std::string::npos) << m.dump();
    const auto html = vaiq::test::slurp(dir_ / "out.report.html");
    EXPECT_NE(html.find("one 8-bit grid leaves them"), std::string::npos) << "the page's notes say it too";
    ASSERT_EQ(report["plan"]["mixed_scales"], nlohmann::json::array({"head"})) << "what the ranking raises first";
}

// An NPU computes per tensor: a head's weights on scales far apart are named, not changed.
TEST_F(FieldRun, AHeadsWeightsAreNamedWhereTheTargetComputesPerTensor) {
    const auto report = run(packed_head_model(false), "", kNpu);
    const auto& w = mixed_scale(report, "weight");
    EXPECT_EQ(w["action"], "named");
    EXPECT_NE(w["advice"].get<std::string>().find("per_channel: true"), std::string::npos) << w.dump();
}

}  // namespace
