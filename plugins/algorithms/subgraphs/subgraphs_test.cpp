// EnableSubgraph: If branches quantized by nested runs of the recipe.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "loop_iterations.hpp"
#include "pipeline/pipeline.hpp"
#include "runtime/executor.hpp"
#include "scopes.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/reader.hpp"

namespace fs = std::filesystem;
using vaiq::DataType;
using vaiq::Tensor;

namespace {

// Calibration samples: x a ramp that moves, flag as `flags` says.
void write_samples(const fs::path& dir, const std::vector<bool>& flags) {
    for (size_t i = 0; i < flags.size(); ++i) {
        const auto sample = dir / "data" / std::to_string(i);
        fs::create_directories(sample);
        vaiq::write_npy(sample / "x.npy", vaiq::test::ramp({1, 8}, -1.0f + 0.1f * static_cast<float>(i), 0.25f));
        Tensor flag(DataType::Bool, {});
        flag.mutable_bytes()[0] = std::byte{flags[i]};
        vaiq::write_npy(sample / "flag.npy", flag);
    }
}

const onnx::GraphProto& branch_of(const vaiq::Model& model, const std::string& attr) {
    for (const auto& node : model.graph().node())
        for (const auto& a : node.attribute())
            if (node.op_type() == "If" && a.name() == attr) return a.g();
    throw std::runtime_error("no " + attr);
}

int count_ops(const onnx::GraphProto& graph, const std::string& op) {
    int n = 0;
    for (const auto& node : graph.node()) n += node.op_type() == op;
    return n;
}

// Every value the model defines, at every depth, with how often.
void count_defined(const onnx::GraphProto& graph, std::map<std::string, int>& seen) {
    for (const auto& i : graph.initializer()) ++seen[i.name()];
    for (const auto& node : graph.node()) {
        for (const auto& o : node.output()) ++seen[o];
        for (const auto& a : node.attribute())
            if (a.has_g()) count_defined(a.g(), seen);
    }
}

const std::string kRecipe =
    "target: cpu\ncalibrate_method: MinMax\ncalibration_data_reader: data\nextra_options: {EnableSubgraph: true}\n";

class Subgraphs : public ::testing::Test {
  protected:
    void SetUp() override { registry.load_default_paths(); }
    vaiq::PluginRegistry registry;
    fs::path dir = vaiq::test::temp_dir();
};

}  // namespace

TEST(OuterReferences, AreWhatAGraphReadsAndDefinesNowhereInside) {
    const auto model = vaiq::test::branching_model();
    EXPECT_EQ(vaiq::subgraphs::outer_references(branch_of(model, "then_branch")), (std::vector<std::string>{"W", "x"}));
    EXPECT_EQ(vaiq::subgraphs::outer_references(model.graph()), std::vector<std::string>{});
}

TEST_F(Subgraphs, TheBranchTheDataTakesIsQuantizedAndTheOtherStaysFloat) {
    const auto model = vaiq::test::branching_model();
    vaiq::save_model(model, dir / "in.onnx");
    write_samples(dir, {true, true, true, true});
    const auto report = vaiq::test::run_recipe_in(dir, registry, kRecipe);

    ASSERT_EQ(report["subgraphs"].size(), 2u) << report["subgraphs"].dump();
    for (const auto& entry : report["subgraphs"]) {
        EXPECT_EQ(entry["node"], "choose");
        if (entry["branch"] == "then_branch") {
            EXPECT_TRUE(entry["quantized"].get<bool>());
            EXPECT_EQ(entry["batches"], 4);
            EXPECT_GT(entry["quantized_tensors"].get<int>(), 0);
        } else {
            EXPECT_FALSE(entry["quantized"].get<bool>());
            EXPECT_EQ(entry["why"], "no calibration batch took it");
        }
    }
    const auto written = vaiq::load_model(dir / "out.onnx");
    const auto& then = branch_of(written, "then_branch");
    EXPECT_GT(count_ops(then, "QuantizeLinear"), 0);
    EXPECT_EQ(then.input_size(), 0) << "the branch reads x from the main graph again";
    EXPECT_EQ(count_ops(branch_of(written, "else_branch"), "QuantizeLinear"), 0);
    EXPECT_EQ(count_ops(written.graph(), "QuantizeLinear"), 0) << "the main graph has nothing to quantize";

    // The written model computes what the float one does, within 8-bit error.
    vaiq::runtime::Executor quantized(written), reference(model);
    const std::map<std::string, Tensor> feeds = {{"x", vaiq::read_npy(dir / "data" / "2" / "x.npy")},
                                                 {"flag", vaiq::read_npy(dir / "data" / "2" / "flag.npy")}};
    const auto q = quantized.run(feeds).at(0), f = reference.run(feeds).at(0);
    ASSERT_EQ(q.size(), f.size());
    float largest = 0;
    for (int64_t i = 0; i < f.size(); ++i) largest = std::max(largest, std::abs(f.data<float>()[i]));
    ASSERT_GT(largest, 0.1f);
    for (int64_t i = 0; i < f.size(); ++i) EXPECT_NEAR(q.data<float>()[i], f.data<float>()[i], 0.03f * largest) << i;
}

TEST_F(Subgraphs, BothBranchesQuantizedKeepEveryNameUnique) {
    vaiq::save_model(vaiq::test::branching_model(), dir / "in.onnx");
    write_samples(dir, {true, false, true, false, false});
    const auto report = vaiq::test::run_recipe_in(dir, registry, kRecipe);
    for (const auto& entry : report["subgraphs"]) EXPECT_TRUE(entry["quantized"].get<bool>()) << entry.dump();

    const auto written = vaiq::load_model(dir / "out.onnx");
    EXPECT_GT(count_ops(branch_of(written, "then_branch"), "QuantizeLinear"), 0);
    EXPECT_GT(count_ops(branch_of(written, "else_branch"), "QuantizeLinear"), 0);
    std::map<std::string, int> defined;
    count_defined(written.graph(), defined);
    for (const auto& [name, count] : defined) EXPECT_EQ(count, 1) << name << " is defined more than once";
    EXPECT_NO_THROW(vaiq::check_model(written));
    for (const auto& init : written.graph().initializer())
        EXPECT_TRUE(init.name() != "W" && init.name() != "V") << init.name() << ": each branch holds its own now";
}

TEST_F(Subgraphs, NodeListsMayNameTheNodesOfBranches) {
    vaiq::save_model(vaiq::test::branching_model(), dir / "in.onnx");
    write_samples(dir, {true, false});
    const auto report = vaiq::test::run_recipe_in(dir, registry, kRecipe + "nodes_to_exclude: [then_mm, then_relu]\n");
    for (const auto& entry : report["subgraphs"])
        EXPECT_EQ(entry["quantized_tensors"].get<int>() > 0, entry["branch"] == "else_branch") << entry.dump();

    // Without EnableSubgraph a branch's node is not one the run decides.
    const auto other = vaiq::test::temp_dir();
    vaiq::save_model(vaiq::test::branching_model(), other / "in.onnx");
    write_samples(other, {true});
    try {
        vaiq::test::run_recipe_in(other, registry,
                                  "target: cpu\ncalibration_data_reader: data\nnodes_to_exclude: [then_mm]\n");
        ADD_FAILURE() << "a branch's node was accepted without EnableSubgraph";
    } catch (const vaiq::InputError& e) {
        EXPECT_NE(std::string(e.what()).find("which is not a node of the model"), std::string::npos) << e.what();
    }
}

namespace {

// `count` calibration samples of one input, ramps that move from sample to sample.
void write_ramps(const fs::path& dir, const std::string& name, const std::vector<int64_t>& shape, int count) {
    for (int i = 0; i < count; ++i) {
        const auto sample = dir / "data" / std::to_string(i);
        fs::create_directories(sample);
        vaiq::write_npy(sample / (name + ".npy"),
                        vaiq::test::ramp(shape, -0.9f + 0.15f * static_cast<float>(i), 0.05f));
    }
}

const onnx::GraphProto& body_of(const vaiq::Model& model) {
    for (const auto& node : model.graph().node())
        for (const auto& a : node.attribute())
            if (a.name() == "body") return a.g();
    throw std::runtime_error("no body");
}

// Every output of the written model within 8-bit error of the float one's.
// `first`: the first output compared (a long loop's last state has decayed to nothing).
void expect_outputs_near(const vaiq::Model& written, const vaiq::Model& model,
                         const std::map<std::string, Tensor>& feeds, size_t first = 0) {
    vaiq::runtime::Executor quantized(written), reference(model);
    const auto q = quantized.run(feeds), f = reference.run(feeds);
    ASSERT_EQ(q.size(), f.size());
    for (size_t o = first; o < f.size(); ++o) {
        ASSERT_EQ(q[o].shape(), f[o].shape()) << "output " << o;
        float largest = 0;
        for (auto v : f[o].data<float>()) largest = std::max(largest, std::abs(v));
        ASSERT_GT(largest, 0.1f) << "output " << o;
        for (int64_t i = 0; i < f[o].size(); ++i)
            EXPECT_NEAR(q[o].data<float>()[i], f[o].data<float>()[i], 0.03f * largest) << "output " << o << ", " << i;
    }
}

}  // namespace

TEST_F(Subgraphs, ALoopsBodyCalibratesOnItsIterations) {
    const auto model = vaiq::test::looping_model(4);
    vaiq::save_model(model, dir / "in.onnx");
    write_ramps(dir, "x", {1, 8}, 3);
    const auto report = vaiq::test::run_recipe_in(dir, registry, kRecipe);

    ASSERT_EQ(report["subgraphs"].size(), 1u) << report["subgraphs"].dump();
    const auto& entry = report["subgraphs"][0];
    EXPECT_EQ(entry["node"], "repeat");
    EXPECT_EQ(entry["op_type"], "Loop");
    EXPECT_TRUE(entry["quantized"].get<bool>()) << entry.dump();
    EXPECT_EQ(entry["batches"], 3);
    EXPECT_EQ(entry["iterations"], 12) << "four iterations of each of three batches";
    EXPECT_GT(entry["quantized_tensors"].get<int>(), 0);

    const auto written = vaiq::load_model(dir / "out.onnx");
    const auto& body = body_of(written);
    EXPECT_GT(count_ops(body, "QuantizeLinear"), 0);
    ASSERT_EQ(body.input_size(), 3) << "the body takes the iteration, the condition and h, and reads x no more";
    EXPECT_EQ(body.input(2).name(), "h_in");
    EXPECT_EQ(body.input(2).type().tensor_type().shape().dim(1).dim_value(), 8) << "as declared";
    for (const auto& init : written.graph().initializer()) EXPECT_NE(init.name(), "W") << "the body holds its own";
    EXPECT_NO_THROW(vaiq::check_model(written));
    expect_outputs_near(written, model, {{"x", vaiq::read_npy(dir / "data" / "1" / "x.npy")}});
}

TEST_F(Subgraphs, ALongLoopKeepsASampleOfItsIterations) {
    vaiq::save_model(vaiq::test::looping_model(300), dir / "in.onnx");
    write_ramps(dir, "x", {1, 8}, 2);
    const auto report = vaiq::test::run_recipe_in(dir, registry, kRecipe);
    ASSERT_EQ(report["subgraphs"].size(), 1u);
    EXPECT_TRUE(report["subgraphs"][0]["quantized"].get<bool>());
    EXPECT_EQ(report["subgraphs"][0]["iterations"], 2 * vaiq::subgraphs::kIterationsKept) << "of each batch's 300";
}

// Without a trip count the loop's length is known only as it runs. This
// loop's state alternates in sign and decays: a body calibrated on every other
// iteration, or on a sample that misses the first ones, clips the rest.
TEST_F(Subgraphs, ALoopEndedByItsConditionKeepsIterationsFromItsWholeRun) {
    const auto model = vaiq::test::looping_model(100, /*conditional=*/true);
    vaiq::save_model(model, dir / "in.onnx");
    write_ramps(dir, "x", {1, 8}, 2);
    const auto report = vaiq::test::run_recipe_in(dir, registry, kRecipe);
    ASSERT_EQ(report["subgraphs"].size(), 1u);
    const auto& entry = report["subgraphs"][0];
    EXPECT_TRUE(entry["quantized"].get<bool>()) << entry.dump();
    EXPECT_EQ(entry["iterations"], 2 * 100) << "every iteration of a run this short";
    const auto written = vaiq::load_model(dir / "out.onnx");
    EXPECT_GT(count_ops(body_of(written), "QuantizeLinear"), 0);
    expect_outputs_near(written, model, {{"x", vaiq::read_npy(dir / "data" / "1" / "x.npy")}}, 1);
}

TEST_F(Subgraphs, AScansBodyCalibratesOnItsSteps) {
    const auto model = vaiq::test::scanning_model(5);
    vaiq::save_model(model, dir / "in.onnx");
    write_ramps(dir, "xs", {5, 8}, 3);
    const auto report = vaiq::test::run_recipe_in(dir, registry, kRecipe);

    ASSERT_EQ(report["subgraphs"].size(), 1u) << report["subgraphs"].dump();
    const auto& entry = report["subgraphs"][0];
    EXPECT_EQ(entry["op_type"], "Scan");
    EXPECT_TRUE(entry["quantized"].get<bool>()) << entry.dump();
    EXPECT_EQ(entry["iterations"], 15);

    const auto written = vaiq::load_model(dir / "out.onnx");
    const auto& body = body_of(written);
    EXPECT_GT(count_ops(body, "QuantizeLinear"), 0);
    ASSERT_EQ(body.input_size(), 2);
    EXPECT_EQ(body.input(1).name(), "x_t");
    EXPECT_NO_THROW(vaiq::check_model(written));
    expect_outputs_near(written, model, {{"xs", vaiq::read_npy(dir / "data" / "2" / "xs.npy")}});
}

TEST_F(Subgraphs, AnIfInsideALoopsBodyIsQuantizedOnTheIterationsThatTakeEachBranch) {
    const auto model = vaiq::test::looping_branching_model(5);
    vaiq::save_model(model, dir / "in.onnx");
    write_ramps(dir, "x", {1, 8}, 3);
    const auto report = vaiq::test::run_recipe_in(dir, registry, kRecipe);

    ASSERT_EQ(report["subgraphs"].size(), 1u) << report["subgraphs"].dump();
    const auto& loop = report["subgraphs"][0];
    EXPECT_TRUE(loop["quantized"].get<bool>()) << loop.dump();
    EXPECT_EQ(loop["iterations"], 15);
    ASSERT_EQ(loop["subgraphs"].size(), 2u) << loop.dump();
    for (const auto& branch : loop["subgraphs"]) {
        EXPECT_TRUE(branch["quantized"].get<bool>()) << branch.dump();
        EXPECT_EQ(branch["batches"], branch["branch"] == "then_branch" ? 6 : 9) << "iterations 0-1, then 2-4";
    }
    const auto written = vaiq::load_model(dir / "out.onnx");
    const onnx::GraphProto* then = nullptr;
    for (const auto& node : body_of(written).node())
        for (const auto& a : node.attribute())
            if (a.name() == "then_branch") then = &a.g();
    ASSERT_NE(then, nullptr);
    EXPECT_GT(count_ops(*then, "QuantizeLinear"), 0);
    std::map<std::string, int> defined;
    count_defined(written.graph(), defined);
    for (const auto& [name, count] : defined) EXPECT_EQ(count, 1) << name << " is defined more than once";
    EXPECT_NO_THROW(vaiq::check_model(written));
    expect_outputs_near(written, model, {{"x", vaiq::read_npy(dir / "data" / "0" / "x.npy")}});
}

namespace {

// h = x @ U, y = If(flag, then: Relu(h @ W), else: h @ V), z = y @ T: the main
// graph quantizes h and y, which the branches read and write.
vaiq::Model quantized_around_branches() {
    auto model = vaiq::test::branching_model();
    auto& graph = model.graph();
    for (auto& node : *graph.mutable_node())
        for (auto& a : *node.mutable_attribute())
            for (auto& n : *a.mutable_g()->mutable_node())
                for (auto& i : *n.mutable_input())
                    if (i == "x") i = "h";
    auto* mm = graph.add_node();
    mm->set_op_type("MatMul");
    mm->set_name("before");
    mm->add_input("x");
    mm->add_input("U");
    mm->add_output("h");
    auto* after = graph.add_node();
    after->set_op_type("MatMul");
    after->set_name("after");
    after->add_input("y");
    after->add_input("T");
    after->add_output("z");
    *graph.add_initializer() = vaiq::test::ramp({8, 8}, 0.2f, -0.006f).to_proto("U");
    *graph.add_initializer() = vaiq::test::ramp({8, 8}, -0.3f, 0.009f).to_proto("T");
    graph.mutable_output(0)->set_name("z");
    vaiq::sort_nodes(graph);
    return model;
}

// The scale of the first QuantizeLinear of `tensor` in `graph`, or of the
// DequantizeLinear that writes it (a graph output the writer renamed the producer of).
float scale_of(const onnx::GraphProto& graph, const vaiq::Model& model, const std::string& tensor) {
    for (const auto& node : graph.node())
        if ((node.op_type() == "QuantizeLinear" && node.input(0) == tensor) ||
            (node.op_type() == "DequantizeLinear" && node.output(0) == tensor))
            for (const auto* g : {&graph, &model.graph()})
                for (const auto& init : g->initializer())
                    if (init.name() == node.input(1)) {
                        const auto scale = Tensor::from_proto(init);
                        return scale.data<float>()[0];
                    }
    return 0.0f;
}

}  // namespace

TEST_F(Subgraphs, ABranchTakesTheEnclosingGraphsParametersOfTheValuesItShares) {
    vaiq::save_model(quantized_around_branches(), dir / "in.onnx");
    write_samples(dir, {true, true, false, false});  // each branch sees part of the main graph's range
    const auto report = vaiq::test::run_recipe_in(dir, registry, kRecipe);
    const auto written = vaiq::load_model(dir / "out.onnx");
    const float h = scale_of(written.graph(), written, "h"), y = scale_of(written.graph(), written, "y");
    ASSERT_GT(h, 0.0f) << "the main graph quantizes h";
    ASSERT_GT(y, 0.0f) << "and y";
    for (const auto& entry : report["subgraphs"]) {
        ASSERT_TRUE(entry["quantized"].get<bool>()) << entry.dump();
        const bool then = entry["branch"] == "then_branch";
        EXPECT_EQ(entry.value("shared_parameters", nlohmann::json()),
                  nlohmann::json::array({"h", then ? "then_out" : "else_product"}));
        const auto& branch = branch_of(written, entry["branch"].get<std::string>());
        EXPECT_EQ(scale_of(branch, written, "h"), h) << entry["branch"];
        EXPECT_EQ(scale_of(branch, written, then ? "then_out" : "else_product"), y) << entry["branch"];
    }
}

namespace {

onnx::GraphProto body_with_inputs(const std::vector<std::string>& names) {
    onnx::GraphProto g;
    for (const auto& n : names) g.add_input()->set_name(n);
    return g;
}

}  // namespace

// The replay follows the node's semantics: a Loop without a trip count runs
// until its body's condition is false; a Scan slices along its axes, reversed
// where its directions say so.
TEST(LoopIterations, ReplayLoopsAndScansAsTheRuntimeRunsThem) {
    onnx::NodeProto loop;
    loop.set_op_type("Loop");
    std::vector<int64_t> seen;
    const auto counter = Tensor::from_values<float>({}, std::vector<float>{0.0f});
    vaiq::subgraphs::iterate(loop, 13, body_with_inputs({"i", "going", "n"}), {std::nullopt, std::nullopt, counter},
                             [&](int64_t i, std::map<std::string, Tensor> feeds) {
                                 EXPECT_EQ(feeds.at("i").data<int64_t>()[0], i);
                                 EXPECT_EQ(feeds.at("n").data<float>()[0], static_cast<float>(i)) << "carried";
                                 seen.push_back(i);
                                 Tensor going(DataType::Bool, {});
                                 going.mutable_bytes()[0] = std::byte{i < 3};
                                 return std::vector<Tensor>{
                                     going,
                                     Tensor::from_values<float>({}, std::vector<float>{static_cast<float>(i + 1)})};
                             });
    EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3}));

    onnx::NodeProto scan;
    scan.set_op_type("Scan");
    vaiq::set_attribute(scan, "num_scan_inputs", int64_t{1});
    vaiq::set_attribute(scan, "scan_input_axes", std::vector<int64_t>{1});
    vaiq::set_attribute(scan, "scan_input_directions", std::vector<int64_t>{1});
    const auto xs = Tensor::from_values<float>({2, 3}, std::vector<float>{0, 1, 2, 10, 11, 12});
    std::vector<std::vector<float>> columns;
    vaiq::subgraphs::iterate(scan, 13, body_with_inputs({"x_t"}), {xs},
                             [&](int64_t, std::map<std::string, Tensor> feeds) {
                                 const auto v = feeds.at("x_t").data<float>();
                                 columns.emplace_back(v.begin(), v.end());
                                 return std::vector<Tensor>{};
                             });
    EXPECT_EQ(columns, (std::vector<std::vector<float>>{{2, 12}, {1, 11}, {0, 10}}));

    // Iterations kept: drawn uniformly from the whole run, however long.
    for (const int64_t run : {10, 256, 3000}) {
        vaiq::subgraphs::IterationSample<int64_t> sample;
        int64_t made = 0, displaced = 0;
        for (int64_t i = 0; i < run; ++i)
            sample.offer(
                i,
                [&made, i] {
                    ++made;
                    return i;
                },
                [&](int64_t) { ++displaced; });
        auto iterations = sample.take();
        EXPECT_EQ(made, static_cast<int64_t>(iterations.size()) + displaced)
            << "every one made and not kept is given back";
        EXPECT_EQ(displaced > 0, run > vaiq::subgraphs::kIterationsKept);
        EXPECT_EQ(iterations.size(), static_cast<size_t>(std::min<int64_t>(run, vaiq::subgraphs::kIterationsKept)));
        std::sort(iterations.begin(), iterations.end());
        EXPECT_EQ(std::adjacent_find(iterations.begin(), iterations.end()), iterations.end()) << "each once";
        EXPECT_GT(iterations.back(), run / 2) << "the last half of the run is sampled too (" << run << ")";
        const auto odd = std::count_if(iterations.begin(), iterations.end(), [](int64_t i) { return i % 2 == 1; });
        if (run > vaiq::subgraphs::kIterationsKept) {
            EXPECT_GT(odd, 4) << "no stride that sees only even iterations";
        }
    }
}
