#include <gtest/gtest.h>

#include "test_support.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/pass.hpp"

namespace {

using vaiq::test::GraphBuilder;

bool run_pass(const std::string& name, vaiq::Model& model, const nlohmann::json& options = nullptr) {
    static auto registry = vaiq::test::registry_with_test_plugin();
    const auto& info = registry.require(vaiq::PluginKind::Pass, name);
    auto pass = registry.create<vaiq::Pass>(name, registry.resolve_options(info, options));
    const bool changed = pass->run(model);
    vaiq::check_model(model);
    return changed;
}

bool run_pass(vaiq::Model& model) { return run_pass("eliminate_identity", model); }

std::vector<std::string> op_types(const vaiq::Model& m) {
    std::vector<std::string> out;
    for (const auto& n : m.graph().node()) out.push_back(n.op_type());
    return out;
}

TEST(EliminateIdentity, RemovesIdentityBetweenNodes) {
    GraphBuilder b;
    b.input("x", {4}).output("y", {4});
    b.node("Relu", {"x"}, {"a"});
    b.node("Identity", {"a"}, {"b"});
    b.node("Sigmoid", {"b"}, {"y"});
    auto model = b.build();
    EXPECT_TRUE(run_pass(model));
    EXPECT_EQ(op_types(model), (std::vector<std::string>{"Relu", "Sigmoid"}));
    EXPECT_EQ(model.graph().node(1).input(0), "a");
    EXPECT_NO_THROW(vaiq::check_model(model));
}

TEST(EliminateIdentity, KeepsTheGraphOutputName) {
    GraphBuilder b;
    b.input("x", {4}).output("y", {4});
    b.node("Relu", {"x"}, {"a"});
    b.node("Identity", {"a"}, {"y"});
    auto model = b.build();
    EXPECT_TRUE(run_pass(model));
    EXPECT_EQ(op_types(model), (std::vector<std::string>{"Relu"}));
    EXPECT_EQ(model.graph().node(0).output(0), "y");
    EXPECT_EQ(model.graph().output(0).name(), "y");
}

TEST(EliminateIdentity, KeepsAnIdentityFromInputToOutput) {
    GraphBuilder b;
    b.input("x", {4}).output("y", {4});
    b.node("Identity", {"x"}, {"y"});
    auto model = b.build();
    EXPECT_FALSE(run_pass(model));
    EXPECT_EQ(op_types(model), (std::vector<std::string>{"Identity"}));
}

TEST(EliminateIdentity, RemovesChainsAndInferenceDropout) {
    GraphBuilder b;
    b.input("x", {4}).output("y", {4});
    b.node("Identity", {"x"}, {"a"});
    b.node("Dropout", {"a"}, {"b"});
    b.node("Identity", {"b"}, {"c"});
    b.node("Relu", {"c"}, {"y"});
    auto model = b.build();
    EXPECT_TRUE(run_pass(model));
    EXPECT_EQ(op_types(model), (std::vector<std::string>{"Relu"}));
    EXPECT_EQ(model.graph().node(0).input(0), "x");
}

TEST(EliminateIdentity, KeepsDropoutWhoseMaskIsRead) {
    GraphBuilder b;
    b.input("x", {4}).output("y", {4}).output("m", {4}, vaiq::DataType::Bool);
    b.node("Dropout", {"x"}, {"d", "m"});
    b.node("Relu", {"d"}, {"y"});
    auto model = b.build();
    EXPECT_FALSE(run_pass(model));
}

}  // namespace
