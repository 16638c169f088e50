#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <regex>

#include "pipeline/pipeline.hpp"
#include "pipeline/run_settings.hpp"
#include "pipeline/selection.hpp"
#include "recipe/recipe.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"

namespace fs = std::filesystem;

namespace {

using vaiq::InputError;
using vaiq::load_recipe;
using vaiq::Recipe;
using vaiq::test::temp_dir;
using vaiq::test::write_text;

const fs::path kCases = VAIQ_RECIPE_CASES_DIR;
const fs::path kShipped = VAIQ_SHIPPED_RECIPES_DIR;

// Everything `vaiq validate` does: parse, merge, find plugins, check their options.
void validate(const fs::path& file, const std::vector<std::string>& sets = {}) {
    const Recipe recipe = load_recipe(file, sets);
    vaiq::PluginRegistry registry;
    registry.load_default_paths();
    vaiq::resolve_plugins(recipe, registry);
}

std::string error_of(const std::function<void()>& body) {
    try {
        body();
    } catch (const InputError& e) {
        return e.what();
    }
    return "no error";
}

Recipe recipe_from(const std::string& yaml, const std::vector<std::string>& sets = {}) {
    return load_recipe(write_text(temp_dir() / "r.yaml", "recipe_version: 1\n" + yaml), sets);
}

std::vector<fs::path> yaml_files(const fs::path& dir) {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".yaml") out.push_back(e.path());
    std::sort(out.begin(), out.end());
    return out;
}

TEST(Recipes, ShippedRecipesValidate) {
    const auto files = yaml_files(kShipped);
    ASSERT_FALSE(files.empty());
    for (const auto& f : files) EXPECT_NO_THROW(validate(f)) << f << ": " << error_of([&] { validate(f); });
}

TEST(Recipes, GoodCasesValidate) {
    for (const auto& f : yaml_files(kCases / "good")) EXPECT_EQ(error_of([&] { validate(f); }), "no error") << f;
}

// Each bad case says what it expects in "# expect:" and "# expect-line:" comments.
TEST(Recipes, BadCasesFailWithTheirMessageAndLine) {
    const auto files = yaml_files(kCases / "bad");
    ASSERT_GE(files.size(), 20u);
    for (const auto& f : files) {
        std::ifstream in(f);
        std::string line, expect, expect_line;
        while (std::getline(in, line)) {
            if (line.rfind("# expect: ", 0) == 0) expect = line.substr(10);
            if (line.rfind("# expect-line: ", 0) == 0) expect_line = line.substr(15);
        }
        ASSERT_FALSE(expect.empty()) << f << " has no '# expect:' line";
        const std::string error = error_of([&] { validate(f); });
        EXPECT_NE(error.find(expect), std::string::npos) << f << "\n  got: " << error << "\n  expected: " << expect;
        if (!expect_line.empty()) {
            EXPECT_EQ(error.rfind(f.string() + ":" + expect_line + ":", 0), 0u) << f << "\n  got: " << error;
        }
        EXPECT_EQ(error.find('\n'), std::string::npos) << "error is not one line: " << error;
    }
}

TEST(Recipes, DefaultsAreTheDocumentedOnes) {
    const Recipe r = recipe_from("");
    EXPECT_EQ(r.value("quant_format"), "QDQ");
    EXPECT_EQ(r.value("calibrate_method"), "MinMSE");
    EXPECT_EQ(r.value("activation_type"), "QInt8");
    EXPECT_EQ(r.value("weight_type"), "QInt8");
    EXPECT_EQ(r.value("optimize_model"), true);
    EXPECT_EQ(r.value("enable_dpu"), false);
    EXPECT_EQ(r.value("execution_providers"), nlohmann::json::array({"CPUExecutionProvider"}));
    EXPECT_EQ(r.value("extra_options.WeightSymmetric"), true);
    EXPECT_EQ(r.value("extra_options.QuantizeBias"), true);
    EXPECT_TRUE(r.setting("per_channel").is_default());
}

TEST(Recipes, EveryDocumentedArgumentAndExtraOptionIsAccepted) {
    // quantize_static's arguments and the extra_options table of the reference.
    const char* documented[] = {"quant_format",         "calibrate_method",
                                "input_nodes",          "output_nodes",
                                "op_types_to_quantize", "random_data_reader_input_shape",
                                "per_channel",          "reduce_range",
                                "activation_type",      "weight_type",
                                "nodes_to_quantize",    "nodes_to_exclude",
                                "optimize_model",       "use_external_data_format",
                                "execution_providers",  "enable_dpu",
                                "convert_fp16_to_fp32", "convert_nchw_to_nhwc",
                                "include_cle",          "model_input",
                                "model_output",         "calibration_data_reader"};
    for (const char* key : documented) EXPECT_NE(vaiq::find_key(key), nullptr) << key;
    const char* extra[] = {"ActivationSymmetric",
                           "WeightSymmetric",
                           "UseUnsignedReLU",
                           "QuantizeBias",
                           "RemoveInputInit",
                           "EnableSubgraph",
                           "ForceQuantizeNoInputCheck",
                           "MatMulConstBOnly",
                           "AddQDQPairToWeight",
                           "OpTypesToExcludeOutputQuantization",
                           "DedicatedQDQPair",
                           "QDQOpTypePerChannelSupportToAxis",
                           "UseQDQVitisCustomOps",
                           "CalibTensorRangeSymmetric",
                           "CalibMovingAverage",
                           "CalibMovingAverageConstant",
                           "RandomDataReaderInputDataRange",
                           "Int16Scale",
                           "MinMSEMode",
                           "ConvertBNToConv",
                           "ConvertReduceMeanToGlobalAvgPool",
                           "SplitLargeKernelPool",
                           "ConvertSplitToSlice",
                           "FuseInstanceNorm",
                           "FuseL2Norm",
                           "ConvertClipToRelu",
                           "SimulateDPU",
                           "ConvertLeakyReluToDPUVersion",
                           "ConvertSigmoidToHardSigmoid",
                           "ConvertHardSigmoidToDPUVersion",
                           "ConvertAvgPoolToDPUVersion",
                           "ConvertReduceMeanToDPUVersion",
                           "ConvertSoftmaxToDPUVersion",
                           "IPULimitationCheck",
                           "AdjustShiftCut",
                           "AdjustShiftBias",
                           "AdjustShiftRead",
                           "AdjustShiftWrite",
                           "AdjustHardSigmoid",
                           "AdjustShiftSwish",
                           "AlignConcat",
                           "AlignPool",
                           "ReplaceClip6Relu",
                           "CLESteps",
                           "CLETotalLayerDiffThreshold",
                           "CLEScaleAppendBias",
                           "RemoveQDQConvLeakyRelu",
                           "RemoveQDQConvPRelu"};
    // The device's own switches are options of the target that reads them (npu_cnn).
    vaiq::PluginRegistry registry;
    registry.load_default_paths();
    auto declared = [&](const std::string& key) {
        for (const auto* info : registry.list())
            for (const auto& o : info->options)
                if (o.name == key) return true;
        return false;
    };
    for (const char* key : extra)
        EXPECT_TRUE(vaiq::find_key(std::string("extra_options.") + key) != nullptr || declared(key)) << key;
    EXPECT_FALSE(vaiq::find_key("extra_options.AlignConcat")) << "the NPU target owns it";
    EXPECT_TRUE(declared("AlignConcat"));
    // Those a plugin reads are its options only: the plugin's table has their defaults and docs.
    for (const char* key : {"AddQDQPairToWeight", "DedicatedQDQPair", "UseQDQVitisCustomOps",
                            "CalibTensorRangeSymmetric", "CalibMovingAverage", "CalibMovingAverageConstant",
                            "MinMSEMode", "CLESteps", "CLETotalLayerDiffThreshold", "CLEScaleAppendBias"}) {
        EXPECT_FALSE(vaiq::find_key(std::string("extra_options.") + key)) << key;
        EXPECT_TRUE(declared(key)) << key;
    }
}

// The documented defaults of the options the plugins own reach them when the
// recipe does not set them, and a recipe's extra_options value when it does.
TEST(Recipes, PluginOwnedExtraOptionsTakeThePluginDefaultsOrTheRecipeValue) {
    vaiq::PluginRegistry registry;
    registry.load_default_paths();
    auto plugins = vaiq::resolve_plugins(recipe_from("quant_format: VitisQuantFormat.QDQ\n"), registry);
    EXPECT_EQ(plugins.format.options.get_bool("UseQDQVitisCustomOps"), true);
    EXPECT_EQ(plugins.format.options.get_bool("DedicatedQDQPair"), false);
    EXPECT_EQ(plugins.calibrator.options.get_string("MinMSEMode"), "All");
    EXPECT_EQ(plugins.calibrator.options.get_bool("CalibTensorRangeSymmetric"), true) << "power of two: symmetric";
    EXPECT_FALSE(plugins.equalization) << "include_cle is off";

    plugins = vaiq::resolve_plugins(
        recipe_from("calibrate_method: MinMax\ninclude_cle: true\n"
                    "extra_options: {CalibMovingAverage: true, CLESteps: -1, CLEScaleAppendBias: false}\n"),
        registry);
    EXPECT_EQ(plugins.calibrator.options.get_bool("CalibMovingAverage"), true);
    EXPECT_DOUBLE_EQ(plugins.calibrator.options.get_float("CalibMovingAverageConstant"), 0.01);
    EXPECT_EQ(plugins.calibrator.options.get_bool("CalibTensorRangeSymmetric"), false);
    ASSERT_TRUE(plugins.equalization);
    EXPECT_EQ(plugins.equalization->info->name, "cross_layer_equalization");
    EXPECT_EQ(plugins.equalization->options.get_int("CLESteps"), -1);
    EXPECT_EQ(plugins.equalization->options.get_bool("CLEScaleAppendBias"), false);
    EXPECT_DOUBLE_EQ(plugins.equalization->options.get_float("CLETotalLayerDiffThreshold"), 2e-7);
    EXPECT_NE(plugins.equalization->set_by.at("CLESteps").find("r.yaml:4:"), std::string::npos)
        << plugins.equalization->set_by.at("CLESteps");
    EXPECT_FALSE(plugins.equalization->set_by.count("CLETotalLayerDiffThreshold")) << "the default";
}

// enable_dpu is the CNN NPU target's option: that target takes the recipe's
// value, and a recipe whose plugins have no DPU transforms is refused at its line.
TEST(Recipes, EnableDpuIsReadByTheTargetThatHasTheTransforms) {
    vaiq::PluginRegistry registry;
    registry.load_default_paths();
    auto npu = vaiq::resolve_plugins(recipe_from("target: npu_cnn\nenable_dpu: true\n"), registry);
    EXPECT_TRUE(npu.target.options.get_bool("enable_dpu"));
    EXPECT_NE(npu.target.set_by.at("enable_dpu").find("r.yaml:3:"), std::string::npos);
    EXPECT_FALSE(
        vaiq::resolve_plugins(recipe_from("target: npu_cnn\n"), registry).target.options.get_bool("enable_dpu"));
    EXPECT_NO_THROW(vaiq::resolve_plugins(recipe_from("target: cpu\nenable_dpu: false\n"), registry));
    for (const std::string target : {"cpu", "npu_transformer"}) {
        try {
            vaiq::resolve_plugins(recipe_from("target: " + target + "\nenable_dpu: true\n"), registry);
            ADD_FAILURE() << target << " took enable_dpu";
        } catch (const vaiq::InputError& e) {
            const std::string what = e.what();
            EXPECT_NE(what.find("r.yaml:3:"), std::string::npos) << what;
            EXPECT_NE(what.find("target 'npu_cnn'"), std::string::npos) << what;
        }
    }
}

// The run reads its settings once, typed; what only makes sense together is
// checked then, at the recipe line.
TEST(Recipes, RunSettingsAreReadOnceAndTyped) {
    const auto s =
        vaiq::RunSettings::of(recipe_from("model_input: m.onnx\nevaluation_batches: 3\n"
                                          "extra_options: {RemoveInputInit: false}\n"));
    ASSERT_TRUE(s.model_input);
    EXPECT_EQ(fs::path(*s.model_input).filename(), "m.onnx");
    EXPECT_FALSE(s.model_output);
    EXPECT_EQ(s.evaluation_batches, 3);
    EXPECT_FALSE(s.remove_input_init);
    EXPECT_TRUE(s.given_params.empty());
    EXPECT_EQ(s.request.weight_type, vaiq::QuantType::QInt8) << "what the defaults ask of the target";

    const auto planning = vaiq::RunSettings::of(recipe_from(
        "static: false\nactivation_type: QUInt8\noutput_quantization_params: {y: [3, 0.5]}\nextra_options:\n"
        "  OpTypesToExcludeOutputQuantization: [Conv]\n  QDQOpTypePerChannelSupportToAxis: {MatMul: 1}\n"));
    EXPECT_FALSE(planning.static_quantization);
    EXPECT_EQ(planning.request.activation_type, vaiq::QuantType::QUInt8);
    EXPECT_EQ(planning.ops_without_output_quantization, std::set<std::string>{"Conv"});
    EXPECT_EQ(planning.per_channel_axes.at("MatMul"), 1);
    ASSERT_EQ(planning.given_params.size(), 1u);
    const auto& given = planning.given_params.at("y");
    EXPECT_EQ(given.zero_point, 3);
    EXPECT_FLOAT_EQ(given.scale, 0.5f);
    EXPECT_EQ(given.key, "output_quantization_params");
    EXPECT_NE(given.origin.find("r.yaml:4:"), std::string::npos) << given.origin;
    const auto error = error_of([] { vaiq::RunSettings::of(recipe_from("external_data_size_threshold: -1\n")); });
    EXPECT_NE(error.find("r.yaml:2:"), std::string::npos) << error;
    EXPECT_NE(error.find("external_data_size_threshold must not be negative"), std::string::npos) << error;
}

// A device's documented switches are its target's options: set under
// extra_options, they reach the target typed; with another target they have no
// effect and say so.
TEST(Recipes, ATargetsOwnExtraOptionsReachIt) {
    vaiq::PluginRegistry registry;
    registry.load_default_paths();
    const auto npu =
        vaiq::resolve_plugins(recipe_from("extends: cnn_npu.yaml\nextra_options: {AlignConcat: false}\n"), registry);
    EXPECT_FALSE(npu.target.options.get_bool("AlignConcat"));
    EXPECT_TRUE(npu.target.options.get_bool("AlignPool")) << "its default";
    const auto spread = recipe_from("extends: cnn_npu.yaml\nextra_options:\n  AlignConcat: false\n");
    const auto explained = vaiq::explain(spread, vaiq::resolve_plugins(spread, registry), registry, nullptr);
    EXPECT_NE(explained.find("r.yaml:4:3"), std::string::npos) << "explain says where the target's option is set\n"
                                                               << explained;
    const auto set =
        vaiq::resolve_plugins(recipe_from("extends: cnn_npu.yaml\n", {"extra_options.AlignPool=false"}), registry);
    EXPECT_FALSE(set.target.options.get_bool("AlignPool")) << "--set reaches it too";
    EXPECT_NO_THROW(vaiq::resolve_plugins(recipe_from("target: cpu\nextra_options: {AlignConcat: false}\n"), registry))
        << "an option of a plugin the recipe does not use warns";
    EXPECT_NE(error_of([&] {
                  vaiq::resolve_plugins(recipe_from("extends: cnn_npu.yaml\nextra_options: {AlignConcat: 3}\n"),
                                        registry);
              }).find("AlignConcat"),
              std::string::npos)
        << "its type is checked";
}

TEST(Recipes, PythonSpellingsAreNormalised) {
    const Recipe r = load_recipe(kCases / "good" / "python_spellings.yaml");
    EXPECT_EQ(r.value("activation_type"), "QUInt8");
    EXPECT_EQ(r.value("calibrate_method"), "MinMax");
    EXPECT_EQ(r.calibrator_plugin(), "minmax");
    EXPECT_EQ(r.format_plugin(), "qdq");
    EXPECT_EQ(r.value("per_channel"), false);
    EXPECT_EQ(r.value("nodes_to_quantize"), nlohmann::json::array());
    EXPECT_EQ(r.value("random_data_reader_input_shape"), nlohmann::json({{"input", {1, 3, 224, 224}}}));
    EXPECT_EQ(recipe_from("quant_format: VitisQuantFormat.FixNeuron\n").format_plugin(), "fixneuron");
    EXPECT_EQ(recipe_from("calibrate_method: PowerOfTwoMethod.NonOverflow\n").calibrator_plugin(), "nonoverflow");
    // The original ONNX Runtime tool's names.
    EXPECT_EQ(recipe_from("calibrate_method: naive\n").calibrator_plugin(), "minmax");
    EXPECT_EQ(recipe_from("quant_format: QuantizationMode.IntegerOps\n").format_plugin(), "integer_ops");
    EXPECT_EQ(recipe_from("quant_format: QLinearOps\n").format_plugin(), "qoperator");
    EXPECT_EQ(recipe_from("random_data_reader_input_shape: [[1, 2], [3, 4]]\n").value("random_data_reader_input_shape"),
              nlohmann::json({{1, 2}, {3, 4}}));
}

// A map under extra_options is a plugin's section, in a file and on the command
// line: its keys are flattened and checked later against the plugins' options;
// --set takes one key of it, not the whole map.
TEST(Recipes, AMapUnderExtraOptionsIsAPluginsSection) {
    const auto r = recipe_from("extra_options:\n  MySearch: {Enable: true, Steps: 4}\n",
                               {"extra_options.AutoMixprecision.SQNRTarget=30"});
    EXPECT_EQ(r.settings.at("extra_options.MySearch.Enable").value, true);
    EXPECT_EQ(r.settings.at("extra_options.MySearch.Steps").value, 4);
    EXPECT_EQ(r.settings.at("extra_options.AutoMixprecision.SQNRTarget").value, 30);
    EXPECT_EQ(r.settings.at("extra_options.AutoMixprecision.SQNRTarget").origin, "--set");
    EXPECT_NE(error_of([] {
                  recipe_from("", {"extra_options.AutoMixprecision={SQNRTarget: 30}"});
              }).find("extra_options.AutoMixprecision is a section; set one key in it"),
              std::string::npos);
    EXPECT_EQ(error_of([] { recipe_from("", {"extra_options.RandomDataReaderInputDataRange={x: [0, 1]}"}); }),
              "no error")
        << "a host key whose value is a map";
}

TEST(Recipes, ExtendsDeepMergesMapsAndReplacesLists) {
    const auto dir = temp_dir();
    write_text(dir / "base" / "parent.yaml",
               "recipe_version: 1\nmodel_input: model.onnx\nnodes_to_exclude: [a, b]\n"
               "extra_options: {ActivationSymmetric: true, WeightSymmetric: false}\n");
    const auto child = write_text(dir / "child.yaml",
                                  "recipe_version: 1\nextends: base/parent.yaml\nnodes_to_exclude: [c]\n"
                                  "extra_options: {WeightSymmetric: true}\n");
    const Recipe r = load_recipe(child);
    EXPECT_EQ(r.value("extra_options.ActivationSymmetric"), true);  // kept from the parent
    EXPECT_EQ(r.value("extra_options.WeightSymmetric"), true);      // the child wins
    EXPECT_EQ(r.value("nodes_to_exclude"), nlohmann::json::array({"c"}));
    // A path resolves against the file that names it, not the child.
    EXPECT_EQ(r.value("model_input"), (dir / "base" / "model.onnx").string());
    EXPECT_NE(r.setting("extra_options.ActivationSymmetric").origin.find("parent.yaml:4:"), std::string::npos);
    ASSERT_EQ(r.files.size(), 2u);
    EXPECT_EQ(r.files[0], child);
}

TEST(Recipes, ExtendsFindsShippedRecipesByName) {
    const auto file = write_text(temp_dir() / "mine.yaml", "recipe_version: 1\nextends: cpu.yaml\nper_channel: true\n");
    const Recipe r = load_recipe(file);
    EXPECT_EQ(r.value("activation_type"), "QUInt8");
    EXPECT_EQ(r.value("per_channel"), true);
    EXPECT_EQ(r.files.back().filename(), "cpu.yaml");
}

TEST(Recipes, ABareNameOutsideItsFolderIsTheShippedRecipe) {
    const auto dir = temp_dir();
    const auto previous = std::filesystem::current_path();
    std::filesystem::current_path(dir);
    const Recipe shipped = load_recipe("cpu.yaml");
    write_text(dir / "cpu.yaml", "recipe_version: 1\nextends: cnn_npu.yaml\n");
    const Recipe own = load_recipe("cpu.yaml");  // one in the current folder comes first
    EXPECT_THROW(load_recipe("no_such_recipe.yaml"), vaiq::InputError);
    std::filesystem::current_path(previous);
    EXPECT_EQ(shipped.value("activation_type"), "QUInt8");
    EXPECT_NE(shipped.files.front().parent_path(), dir);
    EXPECT_EQ(own.files.front().filename(), "cpu.yaml");
    EXPECT_EQ(own.files.back().filename(), "cnn_npu.yaml");
}

TEST(Recipes, SetOverridesAnyField) {
    const Recipe r = recipe_from(
        "per_channel: false\n", {"per_channel=true", "extra_options.ActivationSymmetric=True",
                                 "op_types_to_quantize=[Conv, MatMul]", "plugin_options.format.DedicatedQDQPair=true"});
    EXPECT_EQ(r.value("per_channel"), true);
    EXPECT_EQ(r.setting("per_channel").origin, "--set");
    EXPECT_EQ(r.value("extra_options.ActivationSymmetric"), true);
    EXPECT_EQ(r.value("op_types_to_quantize"), nlohmann::json::array({"Conv", "MatMul"}));
    EXPECT_EQ(r.plugin_options("format"), nlohmann::json({{"DedicatedQDQPair", true}}));
    EXPECT_EQ(error_of([] { recipe_from("", {"per_chanel=true"}); }),
              "--set per_chanel=true: unknown key 'per_chanel'; did you mean 'per_channel'?");
    EXPECT_EQ(error_of([] { recipe_from("", {"per_channel=perhaps"}); }),
              "--set per_channel=perhaps: per_channel must be true or false, not 'perhaps'");
    EXPECT_EQ(error_of([] { recipe_from("", {"per_channel"}); }), "--set per_channel: expected key.path=value");
}

TEST(Recipes, VariablesExpandInStrings) {
    ::setenv("VAIQ_TEST_MODELS", "/data/models", 1);
    const Recipe r = recipe_from("model_input: ${VAIQ_TEST_MODELS}/resnet.onnx\nname: run-${VAIQ_TEST_MODELS}\n");
    ::unsetenv("VAIQ_TEST_MODELS");
    EXPECT_EQ(r.value("model_input"), "/data/models/resnet.onnx");
    EXPECT_EQ(r.value("name"), "run-/data/models");
    const auto dir = temp_dir();
    const Recipe here = load_recipe(write_text(dir / "r.yaml", "recipe_version: 1\nreport: ${RECIPE_DIR}/out.json\n"));
    EXPECT_EQ(here.value("report"), (dir / "out.json").string());
}

TEST(Recipes, SwitchesDecideWhetherDependentKeysTakeEffect) {
    EXPECT_FALSE(recipe_from("").in_effect("cle_guard"));
    EXPECT_TRUE(recipe_from("include_cle: true\n").in_effect("cle_guard"));
    EXPECT_TRUE(recipe_from("").in_effect("include_cle"));
}

TEST(Recipes, EveryDocumentedSettingIsSupported) {
    const Recipe r = recipe_from(
        "extra_options: {EnableSubgraph: true, Int16Scale: true}\nper_channel: true\n"
        "use_external_data_format: true\ninclude_cle: true\n");
    for (const auto phase : {vaiq::Phase::Prepare, vaiq::Phase::Plan, vaiq::Phase::Save})
        EXPECT_TRUE(vaiq::unsupported_settings(r, phase).empty()) << vaiq::phase_name(phase);
    for (const auto& spec : vaiq::recipe_keys()) EXPECT_TRUE(spec.implemented) << spec.path;
}

// Conv -> Relu -> Sigmoid on the decisions `explain --model` prints.
class NodeDecisions : public ::testing::Test {
  protected:
    void SetUp() override {
        vaiq::test::GraphBuilder b;
        b.input("x", {1, 2, 4, 4}).output("y", {1, 3, 4, 4}).initializer("w", vaiq::test::ramp({3, 2, 1, 1}));
        b.node("Conv", {"x", "w"}, {"c"}, "conv1");
        b.node("Relu", {"c"}, {"r"}, "relu1");
        b.node("Erf", {"r"}, {"e"}, "erf1");
        b.node("Sigmoid", {"e"}, {"y"}, "sigmoid1");
        model_ = b.build();
        registry_.load_default_paths();
        target_ = registry_.create<vaiq::Target>("cpu", {});
    }
    std::vector<vaiq::NodeDecision> decide(const std::string& yaml) {
        return vaiq::decide_nodes(recipe_from("calibrate_method: MinMax\n" + yaml), model_, *target_);
    }
    vaiq::Model model_;
    vaiq::PluginRegistry registry_;
    vaiq::PluginInstance<vaiq::Target> target_;
};

TEST_F(NodeDecisions, TargetAndListsDecide) {
    auto d = decide("activation_type: QUInt8\nnodes_to_exclude: [relu1]\n");
    ASSERT_EQ(d.size(), 4u);
    EXPECT_TRUE(d[0].quantized);
    EXPECT_EQ(d[0].settings.at("activation_type").value, "QUInt8");
    EXPECT_FALSE(d[1].quantized);
    EXPECT_EQ(d[1].reason, "in nodes_to_exclude");
    EXPECT_FALSE(d[2].quantized);
    EXPECT_EQ(d[2].reason, "the target does not quantize Erf");
    EXPECT_TRUE(d[3].quantized);
}

TEST_F(NodeDecisions, OverridesApplyInOrderAndExclusionWins) {
    auto d = decide(
        "overrides:\n"
        "  - match: {op_type: [Conv, Sigmoid]}\n    set: {activation_type: QInt16}\n"
        "  - match: {name: \"re:sig.*\"}\n    set: {activation_type: QUInt16}\n"
        "  - match: {name: conv1}\n    exclude: true\n");
    EXPECT_FALSE(d[0].quantized);
    EXPECT_NE(d[0].reason.find("excluded by overrides[2]"), std::string::npos) << d[0].reason;
    EXPECT_TRUE(d[3].quantized);
    EXPECT_EQ(d[3].settings.at("activation_type").value, "QUInt16");  // the last match wins
    EXPECT_NE(d[3].settings.at("activation_type").origin.find("overrides[1]"), std::string::npos);
}

TEST_F(NodeDecisions, InputAndOutputNodesBoundTheRegion) {
    auto d = decide("input_nodes: [relu1]\noutput_nodes: [relu1]\n");
    EXPECT_EQ(d[0].reason, "before input_nodes");
    EXPECT_TRUE(d[1].quantized);
    EXPECT_EQ(d[3].reason, "after output_nodes");
}

TEST_F(NodeDecisions, SelectorsThatMatchNothingAreErrors) {
    EXPECT_NE(error_of([&] {
                  decide("nodes_to_exclude: [relu2]\n");
              }).find("nodes_to_exclude names 'relu2', which is not a node of the model; did you mean 'relu1'?"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  decide("overrides:\n  - match: {name: conv9}\n    exclude: true\n");
              }).find("overrides[0] matches no node of the model; did you mean 'conv1'?"),
              std::string::npos);
    EXPECT_EQ(error_of([&] { decide("overrides:\n  - match: {name: conv9, optional: true}\n    exclude: true\n"); }),
              "no error");
}

}  // namespace
