// A third party's path: install vaiq, build a plugin out of tree with
// find_package(vaiq) + vaiq_add_plugin(), see it in `vaiq plugins`, use it in a recipe.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <fstream>

#include "test_support.hpp"

namespace fs = std::filesystem;

namespace {

int shell(const std::string& command, const fs::path& log) {
    const int status = std::system((command + " > " + log.string() + " 2>&1").c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

using vaiq::test::slurp;

TEST(ExternalPlugin, BuildsAgainstTheInstalledSdkAndRunsInARecipe) {
    const auto work = vaiq::test::temp_dir();
    const auto prefix = work / "prefix";
    const auto log = work / "log.txt";
    ASSERT_EQ(shell("cmake --install " VAIQ_BINARY_DIR " --prefix " + prefix.string(), log), 0) << slurp(log);
    const fs::path vaiq = prefix / "bin" / "vaiq";
    ASSERT_TRUE(fs::exists(vaiq));
    ASSERT_TRUE(fs::exists(prefix / "include" / "vaiq" / "vaiq.hpp"));

    const auto build = work / "plugin-build";
    ASSERT_EQ(shell("cmake -S " VAIQ_EXTERNAL_PLUGIN_DIR " -B " + build.string() + " -G Ninja -DCMAKE_PREFIX_PATH=" +
                        prefix.string() + " -DCMAKE_CXX_FLAGS='" VAIQ_CXX_FLAGS "'",
                    log),
              0)
        << slurp(log);
    ASSERT_EQ(shell("cmake --build " + build.string(), log), 0) << slurp(log);
    const auto plugin = build / "vaiq-pass-strip_doc_strings.so";
    ASSERT_TRUE(fs::exists(plugin)) << slurp(log);

    // The installed vaiq lists its built-in plugins and, through VAIQ_PLUGIN_PATH, the new one.
    ASSERT_EQ(shell("VAIQ_PLUGIN_PATH=" + build.string() + " " + vaiq.string() + " plugins --json", log), 0) << slurp(log);
    const auto plugins = nlohmann::json::parse(slurp(log));
    bool found = false, builtin = false;
    for (const auto& p : plugins) {
        found |= p["name"] == "strip_doc_strings" && p["kind"] == "pass" && p["version"] == "1.0.0";
        builtin |= p["name"] == "minmax" && p["library"].get<std::string>().find(prefix.string()) == 0;
    }
    EXPECT_TRUE(found) << slurp(log);
    EXPECT_TRUE(builtin) << "built-in plugins come from the installation: " << slurp(log);

    // A recipe names the plugin's folder and runs the pass; it extends a shipped, installed recipe.
    auto model = vaiq::test::conv_relu_model();
    model.proto().set_doc_string("exported by a training script");
    model.graph().mutable_node(0)->set_doc_string("conv from layer1");
    vaiq::save_model(model, work / "model.onnx");
    vaiq::test::write_text(work / "recipe.yaml",
                           "recipe_version: 1\n"
                           "extends: cpu.yaml\n"
                           "plugin_paths: [plugin-build]\n"
                           "passes:\n"
                           "  - name: strip_doc_strings\n"
                           "    options: {keep_model_doc: true}\n");
    ASSERT_EQ(shell("cd " + work.string() + " && VAIQ_RECIPE_PATH= " + vaiq.string() +
                        " run recipe.yaml --stop-after prepare --model model.onnx --output out.onnx",
                    log),
              0)
        << slurp(log);
    const auto out = vaiq::load_model(work / "out.onnx");
    EXPECT_EQ(out.graph().node(0).doc_string(), "");
    EXPECT_EQ(out.proto().doc_string(), "exported by a training script") << "keep_model_doc was honoured";
    const auto report = nlohmann::json::parse(slurp(work / "out.report.json"));
    EXPECT_EQ(report["passes"].back()["name"], "strip_doc_strings") << "after the documented optimize_model";
    EXPECT_EQ(report["passes"].back()["changed"], true);
    EXPECT_NE(report["recipe"]["files"].back().get<std::string>().find(prefix.string()), std::string::npos)
        << "cpu.yaml is found among the installed recipes";
}

}  // namespace
