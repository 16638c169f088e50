// The given model joined into the prepared one: shared nodes run once, the
// joined model's outputs are both models' outputs, and the join undoes cleanly.
#include <gtest/gtest.h>

#include <fstream>

#include "data/data_reader.hpp"
#include "pipeline/joined_reference.hpp"
#include "pipeline/pipeline.hpp"
#include "report/evaluation.hpp"
#include "runtime/executor.hpp"
#include "test_support.hpp"
#include "vaiq/reader.hpp"

namespace fs = std::filesystem;
using vaiq::Tensor;
using vaiq::test::GraphBuilder;
using vaiq::test::ramp;

namespace {

// x -> Conv(w1) -> Relu -> Conv(w2) -> Relu -> (the tail) -> y: the given model's
// tail is a GlobalAveragePool then a Mul by 2; the prepared one's a
// GlobalAveragePool then a Mul by 2.5 (a rewrite that changes the function), with
// the weights as copies under other names.
vaiq::Model block(bool prepared) {
    GraphBuilder b;
    b.input("x", {1, 2, 4, 4}).output("y", {1, 3, 1, 1});
    b.initializer(prepared ? "w1_copy" : "w1", ramp({3, 2, 1, 1}, -0.6f, 0.2f));
    b.initializer(prepared ? "w2_copy" : "w2", ramp({3, 3, 1, 1}, 0.5f, -0.1f));
    b.initializer("k", Tensor::from_values<float>({}, std::vector<float>{prepared ? 2.5f : 2.0f}));
    b.node("Conv", {"x", prepared ? "w1_copy" : "w1"}, {"c1"}, "conv1");
    b.node("Relu", {"c1"}, {prepared ? "r1_renamed" : "r1"}, "relu1");
    b.node("Conv", {prepared ? "r1_renamed" : "r1", prepared ? "w2_copy" : "w2"}, {"c2"}, "conv2");
    b.node("Relu", {"c2"}, {"r2"}, "relu2");
    b.node("GlobalAveragePool", {"r2"}, {"pool"}, "pool");
    b.node("Mul", {"pool", "k"}, {"y"}, "scale");
    return b.build();
}

TEST(JoinedReference, SharedNodesRunOnceAndBothModelsOutputsComeOut) {
    auto prepared = block(true);
    const auto given = block(false);
    const auto before = prepared.proto().SerializeAsString();
    const auto joined = vaiq::join_given_model(prepared, given);
    ASSERT_TRUE(joined);
    // Conv, Relu, Conv, Relu and the pool compute alike; the Mul reads another constant.
    EXPECT_EQ(joined->shared_nodes, 5);
    EXPECT_EQ(joined->added_nodes, 1);
    EXPECT_EQ(prepared.graph().node_size(), 7);
    ASSERT_EQ(joined->given_outputs.size(), 1u);
    const auto x = ramp({1, 2, 4, 4}, -2.0f, 0.13f);
    const auto both = vaiq::runtime::Executor(prepared).run({{"x", x}});
    const auto alone_given = vaiq::runtime::Executor(given).run({{"x", x}})[0];
    const auto& from_join = both.at(static_cast<size_t>(joined->given_outputs[0]));
    ASSERT_EQ(from_join.size(), alone_given.size());
    for (int64_t i = 0; i < from_join.size(); ++i) EXPECT_EQ(from_join.data<float>()[i], alone_given.data<float>()[i]);
    vaiq::remove_joined(prepared, *joined);
    EXPECT_EQ(prepared.proto().SerializeAsString(), before) << "the join undoes to the prepared model";
    const auto alone_prepared = vaiq::runtime::Executor(prepared).run({{"x", x}})[0];
    for (int64_t i = 0; i < from_join.size(); ++i)
        EXPECT_EQ(both[0].data<float>()[i], alone_prepared.data<float>()[i]);
    EXPECT_NE(alone_prepared.data<float>()[0], alone_given.data<float>()[0]) << "the test needs the tails to differ";
}

TEST(JoinedReference, RefusesWhatItCannotJoinAndLeavesThePreparedModelAsItWas) {
    const auto given = block(false);
    // Other weights in the first layer: nothing is shared, and running the given
    // model apart costs the same.
    auto other = block(true);
    *other.graph().mutable_initializer(0) = ramp({3, 2, 1, 1}, 0.6f, -0.2f).to_proto("w1_copy");
    const auto before = other.proto().SerializeAsString();
    EXPECT_FALSE(vaiq::join_given_model(other, given));
    EXPECT_EQ(other.proto().SerializeAsString(), before);
    // Another opset.
    GraphBuilder b(11);
    b.input("x", {1, 2, 4, 4}).output("y", {1, 2, 4, 4});
    b.node("Relu", {"x"}, {"y"});
    auto old = b.build();
    EXPECT_FALSE(vaiq::join_given_model(old, given));
    // Other outputs.
    auto renamed = block(true);
    renamed.graph().mutable_output(0)->set_name("z");
    renamed.graph().mutable_node(5)->set_output(0, "z");
    EXPECT_FALSE(vaiq::join_given_model(renamed, given));
}

// Weights left in their file (a large model's) are compared by where they lie
// there, not read: the same place is the same weight, another place is not.
TEST(JoinedReference, WeightsLeftInTheirFileAreComparedByWhereTheyLie) {
    const auto dir = vaiq::test::temp_dir();
    const auto file = fs::absolute(dir / "weights.bin");
    const auto w = ramp({3, 2, 1, 1}, -0.6f, 0.2f);
    {
        std::ofstream out(file, std::ios::binary);
        for (int copy = 0; copy < 2; ++copy)
            out.write(reinterpret_cast<const char*>(w.bytes().data()), static_cast<std::streamsize>(w.bytes().size()));
    }
    auto deferred = [&](vaiq::Model& m, const std::string& name, size_t offset) {
        for (auto& init : *m.graph().mutable_initializer()) {
            if (init.name() != name) continue;
            init.clear_raw_data();
            init.set_data_location(onnx::TensorProto::EXTERNAL);
            for (const auto& [key, value] : {std::pair<std::string, std::string>{"location", file.string()},
                                             {"offset", std::to_string(offset)},
                                             {"length", std::to_string(w.bytes().size())}}) {
                auto* entry = init.add_external_data();
                entry->set_key(key);
                entry->set_value(value);
            }
        }
    };
    const auto x = ramp({1, 2, 4, 4}, -2.0f, 0.13f);
    for (const size_t given_offset : {size_t{0}, w.bytes().size()}) {
        auto prepared = block(true);
        auto given = block(false);
        deferred(prepared, "w1_copy", 0);
        deferred(given, "w1", given_offset);
        const auto joined = vaiq::join_given_model(prepared, given);
        if (given_offset == 0) {
            ASSERT_TRUE(joined);
            EXPECT_EQ(joined->shared_nodes, 5);
            const auto both = vaiq::runtime::Executor(prepared).run({{"x", x}});
            const auto alone = vaiq::runtime::Executor(given).run({{"x", x}})[0];
            const auto& from_join = both.at(static_cast<size_t>(joined->given_outputs[0]));
            for (int64_t i = 0; i < alone.size(); ++i) EXPECT_EQ(from_join.data<float>()[i], alone.data<float>()[i]);
        } else {
            EXPECT_FALSE(joined) << "equal bytes at another place are not looked at: nothing shared";
        }
    }
}

// In a run whose preparation changes the function (ReplaceClip6Relu), the input
// model's outputs come from calibration and evaluate as running it again does.
TEST(JoinedReference, ARunEvaluatesAgainstTheInputModelJoinedIntoCalibration) {
    GraphBuilder b;
    b.input("x", {1, 2, 4, 4}).output("y", {1, 3, 4, 4});
    b.initializer("w1", ramp({3, 2, 1, 1}, -0.6f, 0.2f));
    b.initializer("w2", ramp({3, 3, 1, 1}, 0.5f, -0.1f));
    b.initializer("w3", ramp({3, 3, 1, 1}, 0.3f, 0.4f));
    b.initializer("lo", Tensor::from_values<float>({}, std::vector<float>{0.0f}));
    b.initializer("hi", Tensor::from_values<float>({}, std::vector<float>{6.0f}));
    b.node("Conv", {"x", "w1"}, {"c1"});
    b.node("Relu", {"c1"}, {"r1"});
    b.node("Conv", {"r1", "w2"}, {"c2"});
    b.node("Relu", {"c2"}, {"r2"});
    b.node("Conv", {"r2", "w3"}, {"c3"});
    b.node("Clip", {"c3", "lo", "hi"}, {"y"});
    const auto model = b.build();
    const auto dir = vaiq::test::temp_dir();
    vaiq::save_model(model, dir / "in.onnx");
    fs::create_directories(dir / "data");
    float largest = 0;  // the Clip must bind, so that the prepared model's outputs differ
    for (int k = 0; k < 4; ++k) {
        const auto x = ramp({1, 2, 4, 4}, -3.0f + static_cast<float>(k), 0.61f * static_cast<float>(k + 1));
        vaiq::write_npy(dir / "data" / ("sample_" + std::to_string(k) + ".npy"), x);
        vaiq::runtime::Executor executor(model, {.taps = {"c3"}});
        executor.run({{"x", x}}, {"c3"}, [&](const std::string&, const Tensor& c3) {
            for (float v : c3.data<float>()) largest = std::max(largest, v);
        });
    }
    ASSERT_GT(largest, 6.0f);
    vaiq::PluginRegistry registry;
    registry.load_default_paths();
    auto run = [&](const std::string& extra) {
        return vaiq::test::run_recipe_in(
            dir, registry, "calibration_data_reader: data\nextra_options: {ReplaceClip6Relu: true}\n" + extra);
    };
    const auto joined = run("");
    EXPECT_EQ(joined["evaluation"]["reference"], "input model, joined into calibration");
    const auto apart = run("evaluation_data: data\n");  // held-out data: the input model runs again
    EXPECT_EQ(apart["evaluation"]["reference"], "input model");
    const double sqnr = joined["evaluation"]["outputs"][0]["sqnr_db"].get<double>();
    EXPECT_NEAR(sqnr, apart["evaluation"]["outputs"][0]["sqnr_db"].get<double>(), 1e-6);
    EXPECT_EQ(joined["evaluation"]["samples"], 4);
    auto data = vaiq::open_data_reader(dir / "data", model);
    const auto direct = vaiq::compare_outputs(model, vaiq::load_model(dir / "out.onnx"), *data, nullptr, 1);
    EXPECT_NEAR(sqnr, direct.outputs[0].sqnr_db, 1e-3);

    // What preparation alone costs, the input model against the same model with Relu for its Clip:
    // from calibration's joined outputs and from evaluation's second run alike.
    auto relu_model = model;
    auto& clip = *relu_model.graph().mutable_node(relu_model.graph().node_size() - 1);
    clip.set_op_type("Relu");
    clip.mutable_input()->DeleteSubrange(1, 2);
    const auto expected = vaiq::compare_outputs(model, relu_model, *data, nullptr, 1).outputs[0].sqnr_db;
    ASSERT_LT(expected, 60.0) << "the Clip must bind";
    for (const auto* report : {&joined, &apart}) {
        const auto& preparation = (*report)["preparation_error"];
        ASSERT_TRUE(preparation.is_object()) << report->dump();
        EXPECT_NEAR(preparation["outputs"][0]["sqnr_db"].get<double>(), expected, 1e-3);
        EXPECT_EQ(preparation["passes"], nlohmann::json::array({"replace_clip6_relu"}));
    }
    EXPECT_EQ(joined["preparation_error"]["data"], "calibration_data");
    EXPECT_EQ(apart["preparation_error"]["data"], "evaluation_data");
}

}  // namespace
