// A plugin that throws from an interface method, returns invalid parameters or
// leaves the graph inconsistent: the run fails naming the plugin and the
// method, and writes nothing.
#include <gtest/gtest.h>

#include <cctype>
#include <ostream>

#include "test_support.hpp"
#include "vaiq/model.hpp"

namespace fs = std::filesystem;
using vaiq::test::run_command;
using vaiq::test::write_text;

namespace {

struct Case {
    std::string recipe_lines;  ///< what the case sets, as recipe YAML
    std::string expected;      ///< in the one error line
};

// The expected message names the case in test listings.
void PrintTo(const Case& c, std::ostream* os) {
    for (char ch : c.expected) *os << (std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_');
}

class HostilePlugin : public ::testing::TestWithParam<Case> {};

TEST_P(HostilePlugin, TheRunFailsNamingThePluginAndWritesNothing) {
    const auto dir = vaiq::test::temp_dir();
    vaiq::save_model(vaiq::test::conv_relu_model(), dir / "model.onnx");
    const auto recipe = write_text(dir / "hostile.yaml", "recipe_version: 1\nplugin_paths: [" VAIQ_HOSTILE_DIR "]\n" +
                                                             GetParam().recipe_lines);
    const auto r = run_command(std::string(VAIQ_CLI) + " -q run " + recipe.string() + " --model " +
                               (dir / "model.onnx").string() + " --output " + (dir / "out.onnx").string());
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find(GetParam().expected), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(dir / "out.onnx"));
    EXPECT_FALSE(fs::exists(dir / "out.report.json"));
}

const std::string kTarget = "target: hostile\n";
const std::string kCalibrator = "target: hostile\ncalibrate_method: hostile\n";

INSTANTIATE_TEST_SUITE_P(
    EveryInterface, HostilePlugin,
    ::testing::Values(
        Case{kTarget + "plugin_options: {target: {fail_in: supports}}\n",
             "target plugin 'hostile' failed in supports(): deliberate failure in supports"},
        Case{kTarget + "plugin_options: {target: {fail_in: default_spec}}\n",
             "target plugin 'hostile' failed in default_spec()"},
        Case{kTarget + "plugin_options: {target: {fail_in: check}}\n", "target plugin 'hostile' failed in check()"},
        Case{kTarget + "plugin_options: {target: {fail_in: refine}}\n", "target plugin 'hostile' failed in refine()"},
        Case{kTarget + "plugin_options: {target: {fail_in: verify}}\n", "target plugin 'hostile' failed in verify()"},
        Case{kTarget + "quant_format: hostile\nplugin_options: {format: {fail_in: emit}}\n",
             "format plugin 'hostile' failed in emit()"},
        Case{kCalibrator + "plugin_options: {calibrator: {fail_in: make_observer}}\n",
             "calibrator plugin 'hostile' failed in make_observer()"},
        Case{kCalibrator + "plugin_options: {calibrator: {fail_in: observe}}\n",
             "calibrator plugin 'hostile' failed in observe()"},
        Case{kCalibrator + "plugin_options: {calibrator: {fail_in: result}}\n",
             "calibrator plugin 'hostile' failed in result()"},
        Case{kCalibrator + "plugin_options: {calibrator: {fail_in: constant_params}}\n",
             "calibrator plugin 'hostile' failed in constant_params()"},
        Case{kCalibrator + "plugin_options: {calibrator: {bad: nan_range}}\n",
             "nan] for tensor 'conv_out'"},
        Case{kCalibrator + "plugin_options: {calibrator: {bad: reversed_range}}\n",
             "calibrator plugin 'hostile' returned the range [1, -1]"},
        Case{kCalibrator + "plugin_options: {calibrator: {bad: zero_scale}}\n",
             "calibrator plugin 'hostile' returned a scale of 0 for a constant"},
        Case{kCalibrator + "plugin_options: {calibrator: {bad: negative_scale}}\n",
             "calibrator plugin 'hostile' returned a scale of -0.5 for a constant"},
        Case{kCalibrator + "plugin_options: {calibrator: {bad: nan_scale}}\n",
             "calibrator plugin 'hostile' returned a scale of nan for a constant"},
        Case{kCalibrator + "plugin_options: {calibrator: {bad: zero_points}}\n",
             "calibrator plugin 'hostile' returned 2 zero points for 1 scales"},
        Case{"passes: [{name: hostile, options: {fail_in: run}}]\n", "pass plugin 'hostile' failed in run()"},
        Case{"passes: [{name: hostile, options: {break_graph: true}}]\n", "pass 'hostile' left an invalid model"}));

}  // namespace
