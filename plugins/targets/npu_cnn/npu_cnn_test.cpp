#include <gtest/gtest.h>

#include <cmath>

#include "recipe/recipe.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/target.hpp"

namespace {

using vaiq::test::GraphBuilder;

const char* kDocumented =
    "activation_type: QUInt8\nweight_type: QInt8\nenable_dpu: true\n"
    "extra_options: {ActivationSymmetric: true}\n";

// The run request a recipe with `yaml` makes.
vaiq::QuantRequest config(const std::string& yaml) {
    const auto file = vaiq::test::write_text(vaiq::test::temp_dir() / "r.yaml", "recipe_version: 1\n" + yaml);
    return vaiq::quant_request(vaiq::load_recipe(file).quantize_config());
}

onnx::NodeProto node(const std::string& op) {
    onnx::NodeProto n;
    n.set_op_type(op);
    return n;
}

// Parameters at position p (scale 2^-p), symmetric int8.
vaiq::TensorQuant at(const std::string& tensor, int p, vaiq::TensorRole role = vaiq::TensorRole::Activation) {
    vaiq::TensorQuant t;
    t.tensor = tensor;
    t.role = role;
    t.params.type = vaiq::QuantType::QInt8;
    t.params.scale = {static_cast<float>(std::ldexp(1.0, -p))};
    t.params.zero_point = {0};
    return t;
}

int position(const vaiq::QuantPlan& plan, const std::string& tensor) {
    return *vaiq::exact_position(plan.find(tensor)->params);
}

const vaiq::ConstraintCount& count(const std::vector<vaiq::ConstraintCount>& counts, const std::string& name) {
    for (const auto& c : counts)
        if (c.name == name) return c;
    throw std::runtime_error("no constraint " + name);
}

class NpuCnn : public ::testing::Test {
  protected:
    void SetUp() override { target_ = make({}); }
    // The target as a recipe with enable_dpu (the default here) and these options configures it.
    vaiq::PluginInstance<vaiq::Target> make(nlohmann::json options, bool enable_dpu = true) {
        const auto& info = registry_.require(vaiq::PluginKind::Target, "npu_cnn");
        options["enable_dpu"] = enable_dpu;
        return registry_.create<vaiq::Target>("npu_cnn", registry_.resolve_options(info, options));
    }
    std::string refusal(const std::string& yaml) {
        try {
            target_->check(config(yaml));
        } catch (const vaiq::InputError& e) {
            return e.what();
        }
        return "accepted";
    }
    vaiq::PluginRegistry registry_ = vaiq::test::registry_with_test_plugin();
    vaiq::PluginInstance<vaiq::Target> target_;
};

TEST_F(NpuCnn, QuantizesCnnOps) {
    for (const char* op : {"Conv", "Add", "Concat", "MaxPool", "GlobalAveragePool", "HardSigmoid", "Mul", "Resize"})
        EXPECT_TRUE(target_->supports(node(op))) << op;
    for (const char* op : {"LSTM", "Shape", "Gather", "LayerNormalization"})
        EXPECT_FALSE(target_->supports(node(op))) << op;
}

TEST_F(NpuCnn, AcceptsTheDocumentedConfigurationAndRefusesWhatTheNpuCannotDo) {
    EXPECT_EQ(refusal(kDocumented), "accepted");
    const std::string base = "extra_options: {ActivationSymmetric: true}\n";
    EXPECT_NE(refusal(base + "per_channel: true\n").find("per tensor"), std::string::npos);
    EXPECT_NE(refusal(base + "reduce_range: true\n").find("reduce_range"), std::string::npos);
    EXPECT_NE(refusal(base + "weight_type: QUInt8\n").find("int8 weights"), std::string::npos);
    EXPECT_NE(refusal(base + "activation_type: QInt16\n").find("8-bit activations"), std::string::npos);
    EXPECT_NE(refusal("enable_dpu: true\n").find("ActivationSymmetric"), std::string::npos);
    EXPECT_NE(refusal("extra_options: {ActivationSymmetric: true, QuantizeBias: false}\n").find("QuantizeBias"),
              std::string::npos);
}

TEST_F(NpuCnn, PowerOfTwoPerTensorSymmetricWithInt8OrInt32Bias) {
    const auto c = config(kDocumented);
    for (auto role : {vaiq::TensorRole::Activation, vaiq::TensorRole::Weight, vaiq::TensorRole::Bias}) {
        const auto spec = target_->default_spec(role, c);
        EXPECT_TRUE(spec.power_of_two);
        EXPECT_TRUE(spec.symmetric);
        EXPECT_FALSE(spec.per_channel);
    }
    EXPECT_EQ(target_->default_spec(vaiq::TensorRole::Activation, c).type, vaiq::QuantType::QUInt8);
    EXPECT_EQ(target_->default_spec(vaiq::TensorRole::Bias, c).type, vaiq::QuantType::QInt8);
    const auto int32 = make({{"int32_bias", true}});
    EXPECT_EQ(int32->default_spec(vaiq::TensorRole::Bias, c).type, vaiq::QuantType::QInt32);
}

TEST_F(NpuCnn, LegalisationsFollowTheirDocumentedSwitches) {
    const auto all = target_->legalization_passes(config(kDocumented));
    EXPECT_EQ(all.front(), "convert_bn_to_conv");
    EXPECT_NE(std::find(all.begin(), all.end(), "convert_sigmoid_to_hard_sigmoid"), all.end());
    EXPECT_EQ(std::find(all.begin(), all.end(), "fuse_instance_norm"), all.end());  // off by default
    // The switches are the target's own options (documented extra_options).
    const auto fewer = make({{"SimulateDPU", false}, {"ConvertBNToConv", false}, {"FuseL2Norm", true}})
                           ->legalization_passes(config(kDocumented));
    EXPECT_EQ(fewer, (std::vector<std::string>{"convert_reduce_mean_to_global_avg_pool", "split_large_kernel_pool",
                                               "convert_split_to_slice", "fuse_l2_norm"}));
    EXPECT_TRUE(make({}, false)->legalization_passes(config(kDocumented)).empty());
}

TEST_F(NpuCnn, FusesReluAfterComputeAndLeakyReluOnlyWhenAsked) {
    GraphBuilder b;
    b.input("x", {1, 1, 2, 2}).output("y", {1, 1, 2, 2});
    b.initializer("lo", vaiq::test::ramp({}, 0.0f)).initializer("hi", vaiq::test::ramp({}, 6.0f));
    b.node("Clip", {"x", "lo", "hi"}, {"y"});
    const auto model = b.build();
    const vaiq::GraphIndex index(model.graph());
    const auto c = config(kDocumented);
    EXPECT_TRUE(target_->fuses(node("Conv"), node("Relu"), index, c));
    EXPECT_TRUE(target_->fuses(node("Add"), model.graph().node(0), index, c));  // Clip(0, 6)
    EXPECT_FALSE(target_->fuses(node("Concat"), node("Relu"), index, c));
    EXPECT_FALSE(target_->fuses(node("Conv"), node("LeakyRelu"), index, c));
    EXPECT_TRUE(make({{"RemoveQDQConvLeakyRelu", true}})->fuses(node("Conv"), node("LeakyRelu"), index, c));
    auto rescale = node("Mul");
    rescale.add_input("a");
    rescale.add_input("k");
    rescale.add_output("r");
    EXPECT_FALSE(target_->fuses(node("GlobalAveragePool"), rescale, index, c)) << "an unmarked Mul";
    auto marked = model;
    marked.mark(rescale, vaiq::kDeviceRescale);
    const vaiq::GraphIndex marked_index(marked);
    EXPECT_TRUE(target_->fuses(node("GlobalAveragePool"), rescale, marked_index, c));
    EXPECT_FALSE(target_->fuses(node("Conv"), rescale, marked_index, c));
}

TEST_F(NpuCnn, AZeroPadBeforeAnAveragePoolIsThePoolsOwnPadding) {
    GraphBuilder b;
    b.input("x", {1, 1, 2, 2}).output("y", {1, 1, 4, 4}).output("z", {1, 1, 4, 4});
    b.initializer("pads", vaiq::Tensor::from_values<int64_t>({8}, std::vector<int64_t>{0, 0, 1, 1, 0, 0, 1, 1}));
    b.initializer("zero", vaiq::test::ramp({}, 0.0f)).initializer("one", vaiq::test::ramp({}, 1.0f));
    b.node("Pad", {"x", "pads", "zero"}, {"y"});
    b.node("Pad", {"x", "pads", "one"}, {"z"});
    auto& reflect = b.node("Pad", {"x", "pads"}, {"w"});
    auto* mode = reflect.add_attribute();
    mode->set_name("mode");
    mode->set_type(onnx::AttributeProto::STRING);
    mode->set_s("reflect");
    const auto model = b.build();
    const vaiq::GraphIndex index(model.graph());
    const auto c = config(kDocumented);
    const auto& g = model.graph();
    EXPECT_TRUE(target_->fuses(g.node(0), node("AveragePool"), index, c));
    EXPECT_FALSE(target_->fuses(g.node(1), node("AveragePool"), index, c)) << "pads with ones";
    EXPECT_FALSE(target_->fuses(g.node(2), node("AveragePool"), index, c)) << "reflects";
    EXPECT_FALSE(target_->fuses(g.node(0), node("MaxPool"), index, c)) << "a max pool pads with -inf";
    EXPECT_TRUE(target_->fuses(node("Pad"), node("AveragePool"), index, c)) << "no constant input: zeros";
}

// x -> Conv(w, b) -> Relu -> r ; r, x2 -> Concat -> c ; c -> MaxPool -> p ; p, x3 -> Add -> s
vaiq::Model chain() {
    GraphBuilder b;
    b.input("x", {1, 1, 4, 4}).input("x2", {1, 1, 4, 4}).input("x3", {1, 2, 4, 4}).output("s", {1, 2, 4, 4});
    b.initializer("w", vaiq::test::ramp({1, 1, 1, 1}, 0.5f)).initializer("b", vaiq::test::ramp({1}, 0.1f));
    b.node("Conv", {"x", "w", "b"}, {"conv"});
    b.node("Relu", {"conv"}, {"r"});
    b.node("Concat", {"r", "x2"}, {"c"}).add_attribute()->CopyFrom([] {
        onnx::AttributeProto a;
        a.set_name("axis");
        a.set_type(onnx::AttributeProto::INT);
        a.set_i(1);
        return a;
    }());
    auto& pool = b.node("MaxPool", {"c"}, {"p"});
    vaiq::test::set_ints_attribute(pool, "kernel_shape", {1, 1});
    b.node("Add", {"p", "x3"}, {"s"});
    return b.build();
}

TEST_F(NpuCnn, RefinementReachesAFixedPointWhereEveryLimitHolds) {
    const auto model = chain();
    vaiq::QuantPlan plan;
    // Shift cut 4 + 20 - 2 = 22 > 16; Concat 2 vs 6 vs 5; pool out 9 vs in; Add reads 9 and 1 (shift read 8 > 7).
    for (auto t : {at("x", 4), at("w", 20, vaiq::TensorRole::Weight), at("b", 8, vaiq::TensorRole::Bias), at("r", 2),
                   at("x2", 6), at("c", 5), at("p", 9), at("x3", 1), at("s", 1)})
        plan.tensors.push_back(t);
    const auto c = config(kDocumented);
    const auto counts = target_->refine(model, plan, c);
    EXPECT_EQ(count(counts, "AdjustShiftCut").checked, 1);
    EXPECT_EQ(count(counts, "AdjustShiftCut").adjusted, 1);
    EXPECT_EQ(position(plan, "w"), 14);  // shift cut 16 = 14 + 4 - 2
    EXPECT_EQ(count(counts, "AlignConcat").adjusted, 1);
    for (const char* t : {"r", "x2", "c", "p"}) EXPECT_EQ(position(plan, t), 2) << t;
    EXPECT_EQ(count(counts, "AlignPool").checked, 1);
    for (const auto& k : counts) EXPECT_EQ(k.violated, 0) << k.name;
    // A second refinement finds nothing to do.
    for (const auto& k : target_->refine(model, plan, c)) EXPECT_EQ(k.adjusted, 0) << k.name;
    // The switches turn checks off.
    const auto off = make({{"AdjustShiftCut", false}})->refine(model, plan, c);
    EXPECT_THROW(count(off, "AdjustShiftCut"), std::runtime_error);
    EXPECT_TRUE(make({}, false)->refine(model, plan, c).empty());
}

TEST_F(NpuCnn, ShiftBiasAndHardSigmoidLimits) {
    GraphBuilder b;
    b.input("x", {1, 1, 2, 2}).output("y", {1, 1, 2, 2}).output("h", {1, 1, 2, 2});
    b.initializer("w", vaiq::test::ramp({1, 1, 1, 1}, 0.5f)).initializer("b", vaiq::test::ramp({1}, 0.1f));
    b.node("Conv", {"x", "w", "b"}, {"y"});
    auto& hs = b.node("HardSigmoid", {"x"}, {"h"});
    for (auto [name, v] : {std::pair{"alpha", 1.0f / 6.0f}, std::pair{"beta", 0.5f}}) {
        auto* a = hs.add_attribute();
        a->set_name(name);
        a->set_type(onnx::AttributeProto::FLOAT);
        a->set_f(v);
    }
    const auto model = b.build();
    vaiq::QuantPlan plan;
    // shift bias 6 + 7 - 30 = -23 < min(0, 6 + 7 - 5 - 16) = -8; HardSigmoid input 7 is fine, output 3 < 7.
    for (auto t : {at("x", 7), at("w", 6, vaiq::TensorRole::Weight), at("b", 30, vaiq::TensorRole::Bias), at("y", 5),
                   at("h", 3)})
        plan.tensors.push_back(t);
    const auto counts = target_->refine(model, plan, config(kDocumented));
    EXPECT_EQ(position(plan, "b"), 21);  // 6 + 7 - (-8)
    EXPECT_EQ(position(plan, "h"), 7);
    EXPECT_EQ(count(counts, "AdjustHardSigmoid").adjusted, 1);
    EXPECT_EQ(count(counts, "AdjustShiftBias").adjusted, 1);
}

TEST_F(NpuCnn, VerifyReadsTheWrittenQdqModel) {
    // x -Q/DQ-> Conv(DQ(w), DQ(b)) -> y -Q/DQ-> out, written by hand with positions 4, 20, 8, 2:
    // shift cut 22 breaks the limit, and the output scale 0.3 is not a power of two.
    GraphBuilder b;
    b.input("x", {1, 1, 2, 2}).output("out", {1, 1, 2, 2});
    auto scalar = [&](const std::string& name, float v) { b.initializer(name, vaiq::test::ramp({}, v)); };
    scalar("sx", 1.0f / 16), scalar("sw", std::ldexp(1.0f, -20)), scalar("sb", 1.0f / 256), scalar("sy", 0.3f);
    const int8_t zero = 0, one = 1;
    b.initializer("zp", vaiq::Tensor::from_values<int8_t>({}, {&zero, 1}));
    b.initializer("wq", vaiq::Tensor::from_values<int8_t>({1, 1, 1, 1}, {&one, 1}));
    b.initializer("bq", vaiq::Tensor::from_values<int8_t>({1}, {&one, 1}));
    b.node("QuantizeLinear", {"x", "sx", "zp"}, {"xq"});
    b.node("DequantizeLinear", {"xq", "sx", "zp"}, {"xd"});
    b.node("DequantizeLinear", {"wq", "sw", "zp"}, {"wd"});
    b.node("DequantizeLinear", {"bq", "sb", "zp"}, {"bd"});
    b.node("Conv", {"xd", "wd", "bd"}, {"y"});
    b.node("QuantizeLinear", {"y", "sy", "zp"}, {"yq"});
    b.node("DequantizeLinear", {"yq", "sy", "zp"}, {"out"});
    const auto counts = target_->verify(b.build(), config(kDocumented));
    EXPECT_EQ(count(counts, "PowerOfTwoScale").checked, 4);
    EXPECT_EQ(count(counts, "PowerOfTwoScale").violated, 1);
    EXPECT_EQ(count(counts, "AdjustShiftCut").checked, 0);  // the output has no position to cut to
}

}  // namespace
