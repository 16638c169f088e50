// The executor itself: running graphs, taps, feeds, errors, subgraphs, constant folding, npy and infer.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <fstream>
#include <limits>
#include <numeric>
#include <random>

#include "executor_test_support.hpp"
#include "runtime/executor.hpp"
#include "runtime/infer.hpp"
#include "runtime/kernels/ort_float.hpp"
#include "runtime/layout.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/quant.hpp"
#include "vaiq/reader.hpp"

namespace fs = std::filesystem;

namespace {

using vaiq::DataType;
using vaiq::Tensor;
using vaiq::runtime::Executor;
using vaiq::runtime::test::error_of;
using vaiq::runtime::test::reference_conv_relu;

TEST(Executor, ConvReluMatchesADirectComputation) {
    const auto model = vaiq::test::conv_relu_model();
    Executor executor(model, {.threads = 1});
    EXPECT_EQ(executor.input_names(), (std::vector<std::string>{"x"}));
    const Tensor x = vaiq::test::ramp({1, 2, 4, 4}, -1.0f, 0.0625f);
    const auto out = executor.run({{"x", x}});
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].shape(), (std::vector<int64_t>{1, 3, 4, 4}));
    const auto want = reference_conv_relu(x, Tensor::from_proto(model.graph().initializer(0)),
                                          Tensor::from_proto(model.graph().initializer(1)));
    const auto got = out[0].data<float>();
    int positives = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_NEAR(got[i], want[i], 1e-5) << i;
        positives += want[i] > 0;
    }
    EXPECT_GT(positives, 5) << "the test should exercise more than the Relu's zeros";
}

TEST(Executor, TapsStreamEachRequestedTensorOncePerRun) {
    const auto model = vaiq::test::conv_relu_model();
    Executor executor(model);
    std::vector<std::pair<std::string, std::vector<int64_t>>> seen;
    for (int batch = 0; batch < 3; ++batch)
        executor.run({{"x", vaiq::test::ramp({1, 2, 4, 4}, static_cast<float>(batch))}}, {"x", "conv_out"},
                     [&](const std::string& name, const Tensor& t) { seen.emplace_back(name, t.shape()); });
    ASSERT_EQ(seen.size(), 6u);
    EXPECT_EQ(seen[0].first, "x");
    EXPECT_EQ(seen[1].first, "conv_out");
    EXPECT_EQ(seen[1].second, (std::vector<int64_t>{1, 3, 4, 4}));
    EXPECT_NE(error_of([&] {
                  executor.run({{"x", vaiq::test::ramp({1, 2, 4, 4})}}, {"nope"}, {});
              }).find("no such tensor"),
              std::string::npos);
}

TEST(Executor, FeedsAreChecked) {
    const auto model = vaiq::test::conv_relu_model();
    Executor executor(model);
    EXPECT_EQ(error_of([&] {
                  executor.run({{"x", vaiq::test::ramp({1, 2, 4, 5})}});
              }),
              "input 'x' has shape [1, 2, 4, 5], but the model expects [1, 2, 4, 4]");
    EXPECT_EQ(error_of([&] {
                  executor.run({{"x", Tensor(DataType::Int64, {1, 2, 4, 4})}});
              }),
              "input 'x' is int64, but the model expects float");
    EXPECT_EQ(error_of([&] { executor.run({}); }), "input 'x' was not given");
    EXPECT_EQ(error_of([&] {
                  executor.run({{"x", vaiq::test::ramp({1, 2, 4, 4})}, {"z", vaiq::test::ramp({1})}});
              }),
              "the model has no input 'z' (inputs: x)");
}

TEST(Executor, UnsupportedOpsAreListedUpFront) {
    vaiq::test::GraphBuilder b;
    b.input("x", {2}).output("y", {2});
    b.node("FancyOp", {"x"}, {"t"}, "fancy").set_domain("com.example");
    b.node("Relu", {"t"}, {"y"}, "relu");
    const auto model = b.build();
    EXPECT_EQ(error_of([&] { Executor e(model); }),
              "vaiq's executor has no kernel for 1 node: fancy (com.example:FancyOp, opset 0)");
}

TEST(Executor, KernelErrorsNameTheNode) {
    vaiq::test::GraphBuilder b;
    b.input("a", {2, 3}).input("c", {4, 5}).output("y", {2, 5});
    b.node("MatMul", {"a", "c"}, {"y"}, "mm");
    const auto model = b.build();
    Executor e(model);
    EXPECT_EQ(error_of([&] {
                  e.run({{"a", vaiq::test::ramp({2, 3})}, {"c", vaiq::test::ramp({4, 5})}});
              }),
              "node 'mm' (MatMul, opset 13): inner dimensions differ: 3 and 4");
}

// A subgraph (a branch, a body): typed inputs and outputs of unknown shape.
onnx::GraphProto body_graph(const std::vector<std::pair<std::string, onnx::TensorProto::DataType>>& inputs,
                            const std::vector<onnx::NodeProto>& nodes,
                            const std::vector<std::pair<std::string, onnx::TensorProto::DataType>>& outputs) {
    onnx::GraphProto g;
    g.set_name("subgraph");
    for (const auto& [name, type] : inputs) {
        auto* i = g.add_input();
        i->set_name(name);
        i->mutable_type()->mutable_tensor_type()->set_elem_type(type);
    }
    for (const auto& n : nodes) *g.add_node() = n;
    for (const auto& [name, type] : outputs) {
        auto* o = g.add_output();
        o->set_name(name);
        o->mutable_type()->mutable_tensor_type()->set_elem_type(type);
    }
    return g;
}

onnx::NodeProto simple_node(const std::string& op, const std::vector<std::string>& inputs, const std::string& out) {
    onnx::NodeProto n;
    n.set_op_type(op);
    n.set_name(out);
    for (const auto& i : inputs) n.add_input(i);
    n.add_output(out);
    return n;
}

std::vector<float> floats(const Tensor& t) {
    return std::vector<float>(t.data<float>().begin(), t.data<float>().end());
}

// Gives `node` the graph attribute `name` (an If's branch, a Loop's or Scan's body).
void set_graph(onnx::NodeProto& node, const std::string& name, const onnx::GraphProto& graph) {
    auto* a = node.add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::GRAPH);
    *a->mutable_g() = graph;
}

TEST(Executor, IfBranchesReadTheEnclosingScope) {
    // y = If(c) { Relu(t) } else { Neg(t) } where t = x * 2 lives in the outer graph.
    auto branch = [](const std::string& op, const std::string& out) {
        onnx::GraphProto g;
        g.set_name(op);
        auto* n = g.add_node();
        n->set_op_type(op);
        n->add_input("t");
        n->add_output(out);
        auto* o = g.add_output();
        o->set_name(out);
        o->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
        return g;
    };
    vaiq::test::GraphBuilder b;
    b.input("x", {3}).input("c", {}, DataType::Bool).output("y", {3});
    b.initializer("two", Tensor::from_values<float>({}, std::vector<float>{2.0f}));
    b.node("Mul", {"x", "two"}, {"t"}, "double");
    auto& node = b.node("If", {"c"}, {"y"}, "choose");
    set_graph(node, "then_branch", branch("Relu", "r"));
    set_graph(node, "else_branch", branch("Neg", "n"));
    const auto model = b.build();
    Executor executor(model);
    const Tensor x = Tensor::from_values<float>({3}, std::vector<float>{-1.0f, 0.5f, 2.0f});
    auto run = [&](bool c) {
        Tensor cond(DataType::Bool, {});
        cond.mutable_bytes()[0] = std::byte{c};
        return executor.run({{"x", x}, {"c", cond}})[0];
    };
    const auto then_out = run(true), else_out = run(false);
    EXPECT_EQ(std::vector<float>(then_out.data<float>().begin(), then_out.data<float>().end()),
              (std::vector<float>{0.0f, 1.0f, 4.0f}));
    EXPECT_EQ(std::vector<float>(else_out.data<float>().begin(), else_out.data<float>().end()),
              (std::vector<float>{2.0f, -1.0f, -4.0f}));
}

TEST(Executor, AnIfInsideABranchReadsTheBranchsOwnValues) {
    // y = If(c) { u = Neg(x); If(c) { Relu(u) } else { Abs(u) } } else { Identity(x) }: u is the then
    // branch's own value, read only by the inner If's branches (as Silero VAD's exports do); the outer
    // graph has no 'u'.
    auto graph_of = [](const std::string& name, std::vector<onnx::NodeProto> nodes, const std::string& out) {
        onnx::GraphProto g;
        g.set_name(name);
        for (auto& n : nodes) *g.add_node() = std::move(n);
        auto* o = g.add_output();
        o->set_name(out);
        o->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
        return g;
    };
    auto node = [](const std::string& op, std::vector<std::string> inputs, const std::string& out) {
        onnx::NodeProto n;
        n.set_op_type(op);
        n.set_name(out + "_" + op);
        for (const auto& i : inputs) n.add_input(i);
        n.add_output(out);
        return n;
    };
    auto with_branches = [](onnx::NodeProto n, const onnx::GraphProto& then_g, const onnx::GraphProto& else_g) {
        set_graph(n, "then_branch", then_g);
        set_graph(n, "else_branch", else_g);
        return n;
    };
    const auto inner = with_branches(node("If", {"c"}, "v"), graph_of("relu", {node("Relu", {"u"}, "r")}, "r"),
                                     graph_of("abs", {node("Abs", {"u"}, "a")}, "a"));
    vaiq::test::GraphBuilder b;
    b.input("x", {3}).input("c", {}, DataType::Bool).output("y", {3});
    b.node("If", {"c"}, {"y"}, "outer") =
        with_branches(node("If", {"c"}, "y"), graph_of("then", {node("Neg", {"x"}, "u"), inner}, "v"),
                      graph_of("else", {node("Identity", {"x"}, "i")}, "i"));
    const auto model = b.build();
    Executor executor(model);
    const Tensor x = Tensor::from_values<float>({3}, std::vector<float>{-1.0f, 0.5f, 2.0f});
    Tensor cond(DataType::Bool, {});
    cond.mutable_bytes()[0] = std::byte{1};
    const auto y = executor.run({{"x", x}, {"c", cond}})[0];
    EXPECT_EQ(std::vector<float>(y.data<float>().begin(), y.data<float>().end()),
              (std::vector<float>{1.0f, 0.0f, 0.0f}))
        << "Relu(-x)";
    EXPECT_EQ(vaiq::outer_scope_reads(model.graph().node(0)), (std::vector<std::string>{"c", "x"}))
        << "the outer If reads c and x from outside, not the branch's u";
}

// A branch borrows what it reads of the enclosing graph: a weight initializer
// counts as its constant (prepared once, as Silero VAD's branches read theirs),
// an enclosing input does not (its next value must be used), and a value the
// enclosing graph reads again after the If is not the branch's to reuse.
TEST(Executor, ABranchBorrowsTheEnclosingValuesAndPreparesOnlyItsConstants) {
    auto branch = [](const std::string& weight, const std::string& out) {
        return body_graph({},
                          {simple_node("MatMul", {"x", weight}, out + "_p"), simple_node("Relu", {out + "_p"}, out)},
                          {{out, onnx::TensorProto::FLOAT}});
    };
    vaiq::test::GraphBuilder b;
    b.input("x", {2, 4}).input("v", {4, 3}).input("c", {}, DataType::Bool).output("y", {2, 3}).output("z", {2, 4});
    const std::vector<float> w_values{1, -2, 3, -1, 0, 2, 0.5f, 1, -1, 2, 2, 0};
    b.initializer("w", Tensor::from_values<float>({4, 3}, w_values));
    auto& node = b.node("If", {"c"}, {"y"}, "choose");
    set_graph(node, "then_branch", branch("w", "t"));
    set_graph(node, "else_branch", branch("v", "e"));
    b.node("Neg", {"x"}, {"z"}, "after");
    const auto model = b.build();
    Executor executor(model);
    // relu(x w) by the definition.
    auto expected = [](const Tensor& x, const std::vector<float>& w) {
        std::vector<float> y(6);
        for (int i = 0; i < 2; ++i)
            for (int j = 0; j < 3; ++j) {
                float sum = 0;
                for (int k = 0; k < 4; ++k) sum += x.data<float>()[i * 4 + k] * w[k * 3 + j];
                y[i * 3 + j] = std::max(sum, 0.0f);
            }
        return y;
    };
    const Tensor x1 = vaiq::test::ramp({2, 4});
    const Tensor x2 = Tensor::from_values<float>({2, 4}, std::vector<float>{3, -1, 2, 0, -2, 1, 4, 1});
    const std::vector<float> v1{2, 0, 1, -1, 1, 0, 0, 3, 1, 1, -1, 2}, v2{-1, 1, 0, 2, 0, 1, 1, -2, 3, 0, 1, 1};
    for (const auto& [then_branch, x, v] : {std::tuple{true, x1, v1}, std::tuple{true, x2, v2},
                                            std::tuple{false, x1, v1}, std::tuple{false, x1, v2},
                                            std::tuple{false, x2, v1}, std::tuple{true, x1, v2}}) {
        Tensor cond(DataType::Bool, {});
        cond.mutable_bytes()[0] = std::byte{then_branch};
        const auto out = executor.run({{"x", x}, {"v", Tensor::from_values<float>({4, 3}, v)}, {"c", cond}});
        EXPECT_EQ(floats(out[0]), expected(x, then_branch ? w_values : v)) << (then_branch ? "then" : "else");
        auto negated = floats(x);
        for (auto& e : negated) e = -e;
        EXPECT_EQ(floats(out[1]), negated) << "the If must leave x as it was";
    }
}

// acc += step (a weight of the enclosing graph) while the trip count allows and
// the body's condition (acc < 20) holds; each iteration's acc is scanned out.
TEST(Executor, ALoopRunsItsBodyWhileTheTripCountAndConditionAllow) {
    using onnx::TensorProto;
    const auto body =
        body_graph({{"i", TensorProto::INT64}, {"keep", TensorProto::BOOL}, {"acc", TensorProto::FLOAT}},
                   {simple_node("Add", {"acc", "step"}, "next"), simple_node("Less", {"next", "limit"}, "more"),
                    simple_node("Identity", {"next"}, "seen")},
                   {{"more", TensorProto::BOOL}, {"next", TensorProto::FLOAT}, {"seen", TensorProto::FLOAT}});
    vaiq::test::GraphBuilder b;
    b.input("m", {}, DataType::Int64).input("c", {}, DataType::Bool).input("start", {1});
    b.output("final", {1}).output("all", {-1, 1});
    b.initializer("step", Tensor::from_values<float>({1}, std::vector<float>{3}));
    b.initializer("limit", Tensor::from_values<float>({1}, std::vector<float>{20}));
    set_graph(b.node("Loop", {"m", "c", "start"}, {"final", "all"}, "loop"), "body", body);
    const auto model = b.build();
    Executor executor(model);
    auto run = [&](int64_t trips, bool keep) {
        Tensor cond(DataType::Bool, {});
        cond.mutable_bytes()[0] = std::byte{keep};
        return executor.run({{"m", Tensor::from_values<int64_t>({}, std::vector<int64_t>{trips})},
                             {"c", cond},
                             {"start", Tensor::from_values<float>({1}, std::vector<float>{1})}});
    };
    const auto until_false = run(100, true);
    EXPECT_EQ(floats(until_false[0]), (std::vector<float>{22}));
    EXPECT_EQ(until_false[1].shape(), (std::vector<int64_t>{7, 1}));
    EXPECT_EQ(floats(until_false[1]), (std::vector<float>{4, 7, 10, 13, 16, 19, 22}));
    const auto three = run(3, true);
    EXPECT_EQ(floats(three[0]), (std::vector<float>{10}));
    EXPECT_EQ(floats(three[1]), (std::vector<float>{4, 7, 10}));
    const auto none = run(5, false);
    EXPECT_EQ(floats(none[0]), (std::vector<float>{1})) << "cond false before the first iteration";
    EXPECT_EQ(none[1].shape(), (std::vector<int64_t>{0}));
    const auto negative = run(-1, true);
    EXPECT_EQ(floats(negative[0]), (std::vector<float>{1})) << "a negative trip count runs no iteration";
    // A body without the loop-carried input the node gives it.
    vaiq::test::GraphBuilder bad;
    bad.input("m", {}, DataType::Int64).input("start", {1}).output("final", {1});
    set_graph(bad.node("Loop", {"m", "", "start"}, {"final"}, "loop"), "body",
              body_graph({{"i", TensorProto::INT64}, {"keep", TensorProto::BOOL}},
                         {simple_node("Identity", {"keep"}, "more")}, {{"more", TensorProto::BOOL}}));
    const auto bad_model = bad.build();
    Executor bad_executor(bad_model);
    EXPECT_EQ(error_of([&] {
                  bad_executor.run({{"m", Tensor::from_values<int64_t>({}, std::vector<int64_t>{2})},
                                    {"start", Tensor::from_values<float>({1}, std::vector<float>{1})}});
              }),
              "node 'loop' (Loop, opset 13): the body takes 2 inputs; the node gives it 1 loop-carried values");
}

// A running sum over x's rows taken last to first, each step's sum stacked
// along axis 1 of the output.
TEST(Executor, AScanCarriesItsStateThroughTheSlicesInTheirDirections) {
    using onnx::TensorProto;
    const auto body = body_graph({{"s", TensorProto::FLOAT}, {"row", TensorProto::FLOAT}},
                                 {simple_node("Add", {"s", "row"}, "s2"), simple_node("Mul", {"s2", "k"}, "out")},
                                 {{"s2", TensorProto::FLOAT}, {"out", TensorProto::FLOAT}});
    vaiq::test::GraphBuilder b(11);
    b.input("init", {2}).input("x", {3, 2}).output("last", {2}).output("each", {2, 3});
    b.initializer("k", Tensor::from_values<float>({}, std::vector<float>{10}));
    auto& node = b.node("Scan", {"init", "x"}, {"last", "each"}, "scan");
    set_graph(node, "body", body);
    vaiq::test::set_attribute(node, "num_scan_inputs", 1);
    vaiq::test::set_ints_attribute(node, "scan_input_directions", {1});
    vaiq::test::set_ints_attribute(node, "scan_output_axes", {-1});
    const auto model = b.build();
    Executor executor(model);
    const auto out = executor.run({{"init", Tensor::from_values<float>({2}, std::vector<float>{100, 200})},
                                   {"x", vaiq::test::ramp({3, 2}, 1)}});  // rows [1 2] [3 4] [5 6]
    EXPECT_EQ(floats(out[0]), (std::vector<float>{109, 212}));
    // Sums after rows 3, 2, 1: [105 206] [108 210] [109 212], times 10, on axis 1.
    EXPECT_EQ(out[1].shape(), (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(floats(out[1]), (std::vector<float>{1050, 1080, 1090, 2060, 2100, 2120}));
}

// A run's thread count lasts that run: constant folding runs one-thread
// executors, and a count they left set held for the calibration after them.
TEST(Executor, ARunsThreadCountLastsOnlyThatRun) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(3);
    const auto model = vaiq::test::conv_relu_model();
    Executor(model, {.threads = 1}).run({{"x", vaiq::test::ramp({1, 2, 4, 4}, -1.0f, 0.0625f)}});
    EXPECT_EQ(omp_get_max_threads(), 3);
    omp_set_num_threads(before);
}

// A run for taps alone ends with the last tapped tensor: x -> Relu -> Neg -> Exp,
// tapping the Neg's output runs neither the Exp nor anything after; a tap of a
// feed needs no step at all. The tapped values are those of a whole run.
TEST(Executor, ARunForTapsStopsAtTheLastTappedTensor) {
    vaiq::test::GraphBuilder b;
    b.input("x", {4}).output("y", {4});
    b.node("Relu", {"x"}, {"r"});
    b.node("Neg", {"r"}, {"n"});
    b.node("Exp", {"n"}, {"y"});
    const auto model = b.build();
    Executor executor(model, {.threads = 1, .profile = true});
    const auto x = Tensor::from_values<float>({4}, std::vector<float>{-1, 2, -3, 4});
    std::map<std::string, Tensor> whole, taps_only;
    executor.run({{"x", x}}, {"n"}, [&](const std::string& name, const Tensor& t) { whole[name] = t; });
    std::map<std::string, int64_t> calls_before;
    for (const auto& p : executor.profile()) calls_before[p.op_type] = p.calls;
    executor.run_taps({{"x", x}}, {"n"}, [&](const std::string& name, const Tensor& t) { taps_only[name] = t; });
    executor.run_taps({{"x", x}}, {"x"}, [&](const std::string& name, const Tensor& t) { taps_only[name] = t; });
    std::map<std::string, int64_t> calls;
    for (const auto& p : executor.profile()) calls[p.op_type] = p.calls - calls_before[p.op_type];
    EXPECT_EQ(calls["Relu"], 1);
    EXPECT_EQ(calls["Neg"], 1);
    EXPECT_EQ(calls["Exp"], 0) << "the run went on past its last tap";
    ASSERT_EQ(taps_only.count("n"), 1u);
    ASSERT_EQ(taps_only.count("x"), 1u);
    EXPECT_EQ(std::vector<float>(taps_only["n"].data<float>().begin(), taps_only["n"].data<float>().end()),
              std::vector<float>(whole["n"].data<float>().begin(), whole["n"].data<float>().end()));
}

// x -> Relu r -> Neg n -> Add(n, x) a -> Mul(a, w) y, w = {1, 2, 3, 4}: the forking tests' model.
vaiq::Model relu_neg_add_mul() {
    vaiq::test::GraphBuilder b;
    b.input("x", {4}).output("y", {4});
    b.initializer("w", Tensor::from_values<float>({4}, std::vector<float>{1, 2, 3, 4}));
    b.node("Relu", {"x"}, {"r"});
    b.node("Neg", {"r"}, {"n"});
    b.node("Add", {"n", "x"}, {"a"});
    b.node("Mul", {"a", "w"}, {"y"});
    const auto model = b.build();
    return model;
}

// A run forks where a tensor is computed (a weight: before its first reader; a
// graph output: at the end) and resumes from the values live there with that
// tensor replaced: x -> Relu r -> Neg n -> Add(n, x) a -> Mul(a, w) y. Only the
// steps after the fork run again; the run itself goes on unchanged.
TEST(Executor, ARunForksAndResumesWithATensorReplaced) {
    const auto model = relu_neg_add_mul();
    Executor executor(model, {.threads = 1, .profile = true});
    const std::vector<float> x{-1, 2, -3, 4}, w{1, 2, 3, 4};
    auto relu = [](float v) { return std::max(v, 0.0f); };
    // y from r (n = -r) or from n when given.
    auto y_of = [&](const std::vector<float>& r, const std::vector<float>& n, const std::vector<float>& weight) {
        std::vector<float> y(4);
        for (size_t i = 0; i < 4; ++i) y[i] = ((n.empty() ? -r[i] : n[i]) + x[i]) * weight[i];
        return y;
    };
    std::vector<float> r(4), twice_r(4);
    for (size_t i = 0; i < 4; ++i) r[i] = relu(x[i]), twice_r[i] = 2 * r[i];
    auto values = [](const Tensor& t) { return std::vector<float>(t.data<float>().begin(), t.data<float>().end()); };
    auto doubled = [&](const Tensor& t) {
        auto v = values(t);
        for (auto& e : v) e *= 2;
        return Tensor::from_values<float>(t.shape(), std::span<const float>(v));
    };
    std::map<std::string, std::vector<float>> seen, resumed;
    std::vector<std::string> order;
    const auto y = executor.run_forking(
        {{"x", Tensor::from_values<float>({4}, std::span<const float>(x))}}, {"w", "n", "r", "y"},
        [&](const std::string& name, const Tensor& value, const vaiq::runtime::Resume& resume) {
            order.push_back(name);
            seen[name] = values(value);
            const auto first = resume(doubled(value));
            ASSERT_EQ(first.size(), 1u);
            EXPECT_EQ(values(resume(doubled(value))[0]), values(first[0])) << "resumed twice from " << name;
            resumed[name] = values(first[0]);
        });
    EXPECT_EQ(order, (std::vector<std::string>{"r", "n", "w", "y"})) << "each fork comes before its first reader";
    ASSERT_EQ(y.size(), 1u);
    const auto plain = y_of(r, {}, w);
    EXPECT_EQ(values(y[0]), plain) << "the run itself is unchanged by its forks";
    EXPECT_EQ(seen["r"], r);
    EXPECT_EQ(resumed["r"], y_of(twice_r, {}, w));
    std::vector<float> twice_n(4), twice_w(4), twice_y(4);
    for (size_t i = 0; i < 4; ++i) twice_n[i] = -2 * r[i], twice_w[i] = 2 * w[i], twice_y[i] = 2 * plain[i];
    EXPECT_EQ(resumed["n"], y_of(r, twice_n, w));
    EXPECT_EQ(resumed["w"], y_of(r, {}, twice_w));
    EXPECT_EQ(resumed["y"], twice_y);
    std::map<std::string, int64_t> calls;
    for (const auto& p : executor.profile()) calls[p.op_type] = p.calls;
    EXPECT_EQ(calls["Relu"], 1) << "no resumed run computes what comes before its fork";
    EXPECT_EQ(calls["Neg"], 1 + 2);
    EXPECT_EQ(calls["Mul"], 1 + 2 * 3);
    EXPECT_TRUE(executor.can_fork("x"));
    EXPECT_FALSE(executor.can_fork("nothing"));
    EXPECT_THROW(executor.run_forking({{"x", Tensor::from_values<float>({4}, std::span<const float>(x))}}, {"nothing"},
                                      [](const std::string&, const Tensor&, const vaiq::runtime::Resume&) {}),
                 vaiq::InputError);
}

// A rewrite sees each rewritten tensor as it is fed or computed, in the run
// and in every resumed one, before anything reads it: x -> Relu r -> Neg n ->
// Add(n, x) a -> Mul(a, w) y, with x and n rounded to integers (a quantized
// model simulated on the float one) and a fork at r.
TEST(Executor, ARewriteChangesValuesInTheRunAndInItsResumedRuns) {
    const auto model = relu_neg_add_mul();
    Executor executor(model, vaiq::runtime::forking_options(1, {"x", "r", "n"}));
    const std::vector<float> x{-1.4f, 2.6f, -3.2f, 4.4f}, w{1, 2, 3, 4};
    auto values = [](const Tensor& t) { return std::vector<float>(t.data<float>().begin(), t.data<float>().end()); };
    std::vector<std::string> rewritten_order;
    const vaiq::runtime::Rewrite round = [&](const std::string& name, Tensor& value) {
        rewritten_order.push_back(name);
        auto v = values(value);
        for (auto& e : v) e = std::round(e);
        value = Tensor::from_values<float>(value.shape(), std::span<const float>(v));
    };
    std::vector<float> seen_r, resumed;
    const auto y = executor.run_forking(
        {{"x", Tensor::from_values<float>({4}, std::span<const float>(x))}}, {"r"},
        [&](const std::string&, const Tensor& value, const vaiq::runtime::Resume& resume) {
            seen_r = values(value);
            resumed = values(resume(Tensor::from_values<float>({4}, std::vector<float>{0.4f, 0.4f, 0.4f, 0.4f}))[0]);
        },
        {"x", "n"}, round);
    // x fed as {-1, 3, -3, 4}: r = {0, 3, 0, 4}, n = -r, a = n + x.
    EXPECT_EQ(seen_r, (std::vector<float>{0, 3, 0, 4})) << "r is computed from the rewritten x";
    EXPECT_EQ(values(y[0]), (std::vector<float>{-1, 0, -9, 0}));
    // Resumed with r = 0.4: n = round(-0.4) = 0 (rewritten again), a = x.
    EXPECT_EQ(resumed, (std::vector<float>{-1, 6, -9, 16})) << "the resumed run rewrites n too";
    EXPECT_EQ(rewritten_order, (std::vector<std::string>{"x", "n", "n"}));
    EXPECT_THROW(executor.run_forking(
                     {{"x", Tensor::from_values<float>({4}, std::span<const float>(x))}}, {},
                     [](const std::string&, const Tensor&, const vaiq::runtime::Resume&) {}, {"nothing"}, round),
                 vaiq::InputError);
}

// What reads only constants runs once, when the model is compiled: a stored
// weight's DequantizeLinear never shows up in a run, and its value is still tappable.
TEST(Executor, StepsOfConstantsRunOnceAtCompileTime) {
    vaiq::test::GraphBuilder b;
    b.input("x", {4}).output("y", {4});
    b.initializer("wq", Tensor::from_values<int8_t>({4}, std::vector<int8_t>{-2, 0, 3, 100}));
    b.initializer("ws", Tensor::from_values<float>({}, std::vector<float>{0.5f}));
    b.node("DequantizeLinear", {"wq", "ws"}, {"w"});
    b.node("Mul", {"x", "w"}, {"y"});
    const auto model = b.build();
    Executor executor(model, {.threads = 1, .profile = true});
    std::map<std::string, Tensor> seen;
    const auto y = executor.run({{"x", Tensor::from_values<float>({4}, std::vector<float>{1, 2, 3, 4})}}, {"w"},
                                [&](const std::string& name, const Tensor& t) { seen[name] = t; })[0];
    EXPECT_EQ(std::vector<float>(y.data<float>().begin(), y.data<float>().end()),
              (std::vector<float>{-1.0f, 0.0f, 4.5f, 200.0f}));
    ASSERT_EQ(seen.count("w"), 1u);
    EXPECT_EQ(seen["w"].data<float>()[3], 50.0f);
    for (const auto& p : executor.profile()) EXPECT_NE(p.op_type, "DequantizeLinear") << "it ran per run";
}

// A weight whose float value would take 64 MB or more is dequantized in each run
// instead: folded, that float copy would sit beside the quantized weight for the
// executor's life (a language model's weights twice over).
TEST(Executor, ALargeWeightIsDequantizedInEachRunNotHeldInFloat) {
    constexpr int64_t kSide = 4096;  // 16 M values: 64 MB in float
    std::vector<int8_t> codes(static_cast<size_t>(kSide * kSide));
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<int8_t>(static_cast<int>(i % 255) - 127);
    vaiq::test::GraphBuilder b;
    b.input("x", {1, kSide}).output("y", {1, kSide});
    b.initializer("wq", Tensor::from_values<int8_t>({kSide, kSide}, codes));
    b.initializer("ws", Tensor::from_values<float>({}, std::vector<float>{0.25f}));
    b.node("DequantizeLinear", {"wq", "ws"}, {"w"});
    b.node("MatMul", {"x", "w"}, {"y"});
    const auto model = b.build();
    Executor executor(model, {.threads = 1, .profile = true});
    const auto x = vaiq::test::ramp({1, kSide}, -1.0f, 1.0f / kSide);
    const auto y = executor.run({{"x", x}})[0];
    int64_t dequantized = 0;
    for (const auto& p : executor.profile())
        if (p.op_type == "DequantizeLinear") dequantized = p.calls;
    EXPECT_EQ(dequantized, 1) << "the large weight is dequantized by the run, not folded";
    // The same product as with the float weight stored.
    std::vector<float> w(codes.size());
    for (size_t i = 0; i < codes.size(); ++i) w[i] = 0.25f * static_cast<float>(codes[i]);
    vaiq::test::GraphBuilder f;
    f.input("x", {1, kSide}).output("y", {1, kSide});
    f.initializer("w", Tensor::from_values<float>({kSide, kSide}, w));
    f.node("MatMul", {"x", "w"}, {"y"});
    const auto float_model = f.build();
    const auto expected = Executor(float_model, {.threads = 1}).run({{"x", x}})[0];
    EXPECT_TRUE(std::equal(y.bytes().begin(), y.bytes().end(), expected.bytes().begin(), expected.bytes().end()));
}

// Resize at opset 19 (what converting a model to opset 19 for float8 pairs
// gives): half_pixel_symmetric centres the sampling when the output length was
// rounded down (5 values at scale 0.5: 2.5 -> 2 outputs, sampled at 1 and 3,
// where half_pixel samples 0.5 and 2.5); opset 18's antialias is refused.
TEST(Executor, ResizeOfOpset19CentresHalfPixelSymmetric) {
    for (const std::string mode : {"half_pixel_symmetric", "half_pixel"}) {
        vaiq::test::GraphBuilder b(19);
        b.input("x", {1, 1, 1, 5}).output("y", {1, 1, 1, 2});
        b.initializer("scales", Tensor::from_values<float>({4}, std::vector<float>{1, 1, 1, 0.5f}));
        auto& resize = b.node("Resize", {"x", "", "scales"}, {"y"}, "resize");
        vaiq::test::set_attribute(resize, "mode", std::string("linear"));
        vaiq::test::set_attribute(resize, "coordinate_transformation_mode", mode);
        const auto model = b.build();
        const auto y = Executor(model).run({{"x", vaiq::test::ramp({1, 1, 1, 5}, 0.0f, 10.0f)}})[0];
        ASSERT_EQ(y.shape(), (std::vector<int64_t>{1, 1, 1, 2}));
        const std::vector<float> want = mode == "half_pixel" ? std::vector<float>{5, 25} : std::vector<float>{10, 30};
        EXPECT_FLOAT_EQ(y.data<float>()[0], want[0]) << mode;
        EXPECT_FLOAT_EQ(y.data<float>()[1], want[1]) << mode;
        vaiq::test::set_attribute(resize, "antialias", int64_t{1});
        const auto antialiased = b.build();
        EXPECT_NE(error_of([&] {
                      Executor(antialiased).run({{"x", vaiq::test::ramp({1, 1, 1, 5}, 0.0f, 10.0f)}});
                  }).find("antialias"),
                  std::string::npos);
    }
}

// Linear Resize of many planes (N and C kept) on several threads, 4-D (as ONNX
// Runtime computes it) and the same planes as 3-D (the planes' tap tables), and
// of the channels too (which blends planes, the general path), against the
// definition: per axis, the half_pixel coordinate's two neighbours (clamped at
// the borders), weighted by distance, the axes' weights multiplied.
TEST(Executor, LinearResizeOfPlanesAndOfChannelsMatchesTheDefinition) {
    const std::vector<int64_t> in = {2, 3, 4, 5};
    std::vector<float> values(2 * 3 * 4 * 5);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>((i * 37) % 23) - 11.0f;
    auto resized = [&](const std::vector<int64_t>& from, const std::vector<int64_t>& to) {
        vaiq::test::GraphBuilder b;
        b.input("x", from).output("y", to);
        b.initializer("sizes", Tensor::from_values<int64_t>({static_cast<int64_t>(to.size())}, to));
        auto& resize = b.node("Resize", {"x", "", "", "sizes"}, {"y"}, "resize");
        vaiq::test::set_attribute(resize, "mode", std::string("linear"));
        const auto model = b.build();
        return Executor(model, {.threads = 4}).run({{"x", Tensor::from_values<float>(from, values)}})[0];
    };
    for (const auto& out : {std::vector<int64_t>{2, 3, 7, 9}, std::vector<int64_t>{2, 6, 3, 8}}) {
        const auto y = resized(in, out);
        ASSERT_EQ(y.shape(), out);
        const bool planes = out[1] == in[1];
        const auto y3 = planes ? resized({6, 4, 5}, {6, out[2], out[3]}) : y;
        // Per axis and output coordinate: the two input coordinates and their weights.
        std::vector<std::vector<std::array<std::pair<int64_t, double>, 2>>> taps(4);
        for (size_t d = 0; d < 4; ++d)
            for (int64_t o = 0; o < out[d]; ++o) {
                const double scale = static_cast<double>(out[d]) / static_cast<double>(in[d]);
                const double at = (static_cast<double>(o) + 0.5) / scale - 0.5, floor = std::floor(at);
                auto clamp = [&](double i) { return std::clamp<int64_t>(static_cast<int64_t>(i), 0, in[d] - 1); };
                taps[d].push_back({std::pair(clamp(floor), 1 - (at - floor)), std::pair(clamp(floor + 1), at - floor)});
            }
        int64_t i = 0;
        for (int64_t n = 0; n < out[0]; ++n)
            for (int64_t c = 0; c < out[1]; ++c)
                for (int64_t h = 0; h < out[2]; ++h)
                    for (int64_t w = 0; w < out[3]; ++w, ++i) {
                        double want = 0;
                        for (const auto& [tn, wn] : taps[0][n])
                            for (const auto& [tc, wc] : taps[1][c])
                                for (const auto& [th, wh] : taps[2][h])
                                    for (const auto& [tw, ww] : taps[3][w])
                                        want += wn * wc * wh * ww * values[((tn * 3 + tc) * 4 + th) * 5 + tw];
                        ASSERT_NEAR(y.data<float>()[i], want, 1e-5) << "at " << n << "," << c << "," << h << "," << w;
                        ASSERT_NEAR(y3.data<float>()[i], want, 1e-5)
                            << "3-D, at " << n << "," << c << "," << h << "," << w;
                    }
    }
}

TEST(Npy, ReadsTheFormatAsSpecified) {
    // A (2, 3) int16 array as numpy writes it: magic, version 1.0, header, data.
    std::string header = "{'descr': '<i2', 'fortran_order': False, 'shape': (2, 3), }";
    header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');  // data starts 64-byte aligned
    header += '\n';
    std::string bytes = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size()) + '\0' + header;
    for (int16_t v : {1, -2, 3, -4, 5, 300}) bytes.append(reinterpret_cast<const char*>(&v), 2);
    const auto file = vaiq::test::temp_dir() / "a.npy";
    std::ofstream(file, std::ios::binary) << bytes;
    const Tensor t = vaiq::read_npy(file);
    EXPECT_EQ(t.type(), DataType::Int16);
    EXPECT_EQ(t.shape(), (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(t.data<int16_t>()[5], 300);
    // And writes what it reads.
    vaiq::write_npy(file.parent_path() / "b.npy", t);
    const Tensor back = vaiq::read_npy(file.parent_path() / "b.npy");
    EXPECT_EQ(back.shape(), t.shape());
    EXPECT_TRUE(std::equal(back.bytes().begin(), back.bytes().end(), t.bytes().begin()));
}

TEST(Npy, RejectsBadFiles) {
    const auto dir = vaiq::test::temp_dir();
    std::ofstream(dir / "junk.npy") << "not numpy";
    EXPECT_NE(error_of([&] { vaiq::read_npy(dir / "junk.npy"); }).find("not a .npy file"), std::string::npos);
    vaiq::write_npy(dir / "f.npy", vaiq::test::ramp({4, 4}));
    fs::resize_file(dir / "f.npy", fs::file_size(dir / "f.npy") - 8);
    EXPECT_NE(error_of([&] { vaiq::read_npy(dir / "f.npy"); }).find("holds fewer values"), std::string::npos);
    // Fuzzing found it: a dimension past int64 escaped as the C++ library's out_of_range.
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }";
    header += std::string((64 - (10 + header.size() + 1) % 64) % 64, ' ') + '\n';
    std::ofstream(dir / "huge.npy", std::ios::binary)
        << std::string("\x93NUMPY\x01\x00", 8) << static_cast<char>(header.size()) << '\0' << header;
    EXPECT_NE(error_of([&] { vaiq::read_npy(dir / "huge.npy"); }).find("too large"), std::string::npos);
}

TEST(Infer, BindsInputsRunsAndWritesOutputs) {
    const auto dir = vaiq::test::temp_dir();
    vaiq::save_model(vaiq::test::conv_relu_model(), dir / "m.onnx");
    vaiq::write_npy(dir / "x.npy", vaiq::test::ramp({1, 2, 4, 4}, -1.0f, 0.0625f));
    const auto r = vaiq::runtime::infer(dir / "m.onnx", {{(dir / "x.npy").string()}, dir / "out", 3, 1});
    EXPECT_LE(r.min_ms, r.median_ms);
    const Tensor written = vaiq::read_npy(dir / "out" / "output_0.npy");
    EXPECT_TRUE(std::equal(written.bytes().begin(), written.bytes().end(), r.outputs[0].bytes().begin()));
    const auto named = vaiq::runtime::infer(dir / "m.onnx", {{"x=" + (dir / "x.npy").string()}, {}, 1, 1});
    EXPECT_TRUE(
        std::equal(named.outputs[0].bytes().begin(), named.outputs[0].bytes().end(), r.outputs[0].bytes().begin()));
    EXPECT_NE(
        error_of([&] {
            vaiq::runtime::infer(dir / "m.onnx", {{(dir / "x.npy").string(), (dir / "x.npy").string()}, {}, 1, 1});
        }).find("one input too many"),
        std::string::npos);
}

}  // namespace
