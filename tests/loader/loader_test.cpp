#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include <fmt/format.h>

#include "plugin/registry.hpp"
#include "test_support.hpp"
#include "vaiq/error.hpp"
#include "vaiq/pass.hpp"

namespace fs = std::filesystem;

namespace {

using vaiq::PluginKind;
using vaiq::PluginRegistry;

fs::path fixture(const std::string& variant) {
    return fs::path(VAIQ_FIXTURE_DIR) / ("vaiq-pass-fixture_" + variant + ".so");
}

std::string load_error(PluginRegistry& registry, const fs::path& file) {
    try {
        registry.load_library(file);
    } catch (const vaiq::InputError& e) {
        return e.what();
    }
    return "no error";
}

TEST(Loader, LoadsEveryPluginOfALibrary) {
    PluginRegistry registry;
    registry.load_library(fixture("good"));
    const auto* pass = registry.find(PluginKind::Pass, "fixture_pass");
    ASSERT_NE(pass, nullptr);
    EXPECT_EQ(pass->version, "1.2.3");
    EXPECT_EQ(pass->summary, "Reports a change on graphs over a node limit");
    ASSERT_EQ(pass->options.size(), 1u);
    EXPECT_EQ(pass->options[0].name, "limit");
    EXPECT_EQ(pass->options[0].default_value, 3);
    EXPECT_NE(registry.find(PluginKind::Calibrator, "fixture_calibrator"), nullptr);
    EXPECT_EQ(registry.list().size(), 2u);
}

TEST(Loader, RejectsAnotherAbiNamingBothVersions) {
    PluginRegistry registry;
    EXPECT_EQ(
        load_error(registry, fixture("wrong_abi")),
        fmt::format("plugin 'fixture_odd' (vaiq-pass-fixture_wrong_abi.so) was built for ABI {}; this vaiq is ABI {}",
                    VAIQ_ABI_VERSION + 2, VAIQ_ABI_VERSION));
    EXPECT_TRUE(registry.list().empty());
}

TEST(Loader, RejectsAnotherToolchain) {
    PluginRegistry registry;
    EXPECT_EQ(
        load_error(registry, fixture("wrong_toolchain")),
        "plugin 'fixture_odd' (vaiq-pass-fixture_wrong_toolchain.so) was built with toolchain 'msvc-1930/msvcrt'; "
        "this vaiq was built with '" VAIQ_TOOLCHAIN_TAG "'");
}

TEST(Loader, RejectsAMissingEntry) {
    PluginRegistry registry;
    const auto error = load_error(registry, fixture("no_entry"));
    EXPECT_NE(error.find("is not a vaiq plugin: it exports no vaiq_plugin_entry function"), std::string::npos) << error;
}

TEST(Loader, RejectsAFileThatIsNotALibrary) {
    const auto path = vaiq::test::write_text(vaiq::test::temp_dir() / "fake.so", "not an ELF file\n");
    PluginRegistry registry;
    const auto error = load_error(registry, path);
    EXPECT_NE(error.find("fake.so is not a loadable plugin library"), std::string::npos) << error;
}

TEST(Loader, RejectsADuplicateNameNamingBothLibraries) {
    PluginRegistry registry;
    registry.load_library(fixture("good"));
    const auto error = load_error(registry, fixture("duplicate"));
    EXPECT_NE(error.find("pass 'fixture_pass' in"), std::string::npos) << error;
    EXPECT_NE(error.find("vaiq-pass-fixture_duplicate.so is already provided by"), std::string::npos) << error;
    EXPECT_NE(error.find("vaiq-pass-fixture_good.so"), std::string::npos) << error;
    EXPECT_EQ(registry.find(PluginKind::Pass, "fixture_pass")->version, "1.2.3");
}

TEST(Loader, LoadingTheSameFileTwiceIsNotADuplicate) {
    PluginRegistry registry;
    registry.load_library(fixture("good"));
    EXPECT_NO_THROW(registry.load_library(fs::path(VAIQ_FIXTURE_DIR) / "." / fixture("good").filename()));
    EXPECT_EQ(registry.list().size(), 2u);
}

TEST(Loader, RejectsAnUnknownKind) {
    PluginRegistry registry;
    EXPECT_NE(load_error(registry, fixture("bad_kind")).find("declares kind 9; this vaiq knows calibrator (1)"),
              std::string::npos);
}

TEST(Loader, RejectsAVersionThatIsNotSemVer) {
    PluginRegistry registry;
    EXPECT_NE(
        load_error(registry, fixture("bad_version")).find("has the version 'one'; this vaiq needs MAJOR.MINOR.PATCH"),
        std::string::npos);
}

TEST(Loader, RejectsAnOptionDefaultOfTheWrongType) {
    PluginRegistry registry;
    EXPECT_NE(load_error(registry, fixture("bad_default"))
                  .find("declares option 'ratio' with the default 'abc', which is not a float"),
              std::string::npos);
}

// An algorithm declares the settings that run it and what it may try; only algorithms do.
TEST(Loader, AnAlgorithmsSwitchesAreReadAndCheckedWhereDeclared) {
    PluginRegistry registry;
    registry.load_library(fixture("switched"));
    const auto* info = registry.find(vaiq::PluginKind::Algorithm, "fixture_algorithm");
    ASSERT_NE(info, nullptr);
    ASSERT_EQ(info->enabled_by.size(), 2u);
    EXPECT_EQ(info->enabled_by[0].setting, "extra_options.FixtureSearch");
    EXPECT_TRUE(info->enabled_by[0].values.empty());
    EXPECT_EQ(info->enabled_by[1].setting, "weight_only_algorithm");
    EXPECT_EQ(info->enabled_by[1].values, (std::vector<std::string>{"fixture", "fixture_full"}));
    EXPECT_EQ(info->enabled_by[1].describe(), "weight_only_algorithm=fixture|fixture_full");
    EXPECT_EQ(info->may_try, std::vector<std::string>{"fast_finetune"});
    EXPECT_NE(load_error(registry, fixture("switched_pass")).find("is a pass but declares enabled_by or may_try"),
              std::string::npos);
    EXPECT_NE(load_error(registry, fixture("bad_switch"))
                  .find("is enabled by 'weight_only_algorithm=', which is neither a setting nor setting=value|value"),
              std::string::npos);
}

TEST(Loader, ACreateThatThrowsIsReported) {
    PluginRegistry registry;
    registry.load_library(fixture("throwing"));
    try {
        registry.create<vaiq::Pass>("fixture_throwing", {});
        FAIL() << "create succeeded";
    } catch (const vaiq::InputError& e) {
        EXPECT_EQ(std::string(e.what()),
                  "pass 'fixture_throwing' (vaiq-pass-fixture_throwing.so) failed to create an instance: no licence "
                  "file found");
    }
}

TEST(Loader, OptionsAreCheckedAgainstTheSchema) {
    PluginRegistry registry;
    registry.load_library(fixture("good"));
    const auto& info = registry.require(PluginKind::Pass, "fixture_pass");
    EXPECT_EQ(registry.resolve_options(info, nullptr).get_int("limit"), 3);
    EXPECT_EQ(registry.resolve_options(info, {{"limit", 7}}).get_int("limit"), 7);
    try {
        registry.resolve_options(info, {{"limt", 7}}, [](const std::string&) { return std::string("r.yaml:4:7"); });
        FAIL();
    } catch (const vaiq::InputError& e) {
        EXPECT_EQ(std::string(e.what()),
                  "r.yaml:4:7: pass 'fixture_pass' has no option 'limt'; did you mean 'limit'? (options: limit)");
    }
    try {
        registry.resolve_options(info, {{"limit", "many"}});
        FAIL();
    } catch (const vaiq::InputError& e) {
        EXPECT_EQ(std::string(e.what()), "option 'limit' of pass 'fixture_pass' must be a int, not \"many\"");
    }
}

TEST(Loader, RequireListsWhatIsInstalled) {
    PluginRegistry registry;
    registry.load_library(fixture("good"));
    try {
        registry.require(PluginKind::Pass, "fixture_pas");
        FAIL();
    } catch (const vaiq::InputError& e) {
        EXPECT_EQ(std::string(e.what()),
                  "no pass plugin named 'fixture_pas' is installed; did you mean 'fixture_pass'? (installed passes: "
                  "fixture_pass)");
    }
}

TEST(Loader, InstancesOutliveTheRegistry) {
    vaiq::PluginInstance<vaiq::Pass> pass;
    {
        PluginRegistry registry;
        registry.load_library(fixture("good"));
        pass = registry.create<vaiq::Pass>(
            "fixture_pass",
            registry.resolve_options(registry.require(PluginKind::Pass, "fixture_pass"), {{"limit", 0}}));
    }
    auto model = vaiq::test::conv_relu_model();
    EXPECT_TRUE(pass->run(model));  // the library is still loaded
}

TEST(Loader, DefaultPathsIncludeBuiltinsAndThePluginPathVariable) {
    ::setenv("VAIQ_PLUGIN_PATH", (std::string(VAIQ_FIXTURE_DIR) + "/vaiq-pass-fixture_good.so").c_str(), 1);
    PluginRegistry registry;
    registry.load_default_paths();
    ::unsetenv("VAIQ_PLUGIN_PATH");
    EXPECT_NE(registry.find(PluginKind::Pass, "eliminate_identity"), nullptr) << vaiq::builtin_plugin_dir();
    EXPECT_NE(registry.find(PluginKind::Pass, "fixture_pass"), nullptr);
}

TEST(Loader, AMissingPluginPathIsAnError) {
    ::setenv("VAIQ_PLUGIN_PATH", "/no/such/folder", 1);
    PluginRegistry registry;
    EXPECT_THROW(registry.load_default_paths(), vaiq::InputError);
    ::unsetenv("VAIQ_PLUGIN_PATH");
}

// Plugins link the SDK alone: no built-in plugin needs the runtime or the host
// library, so a third party's never has to either.
TEST(Loader, BuiltinPluginsNeedOnlyTheSdkLibrary) {
    int checked = 0;
    for (const auto& entry : fs::directory_iterator(vaiq::builtin_plugin_dir())) {
        if (entry.path().extension() != ".so") continue;
        const auto r = vaiq::test::run_command("readelf -d " + entry.path().string());
        ASSERT_EQ(r.exit_code, 0) << r.err;
        EXPECT_NE(r.out.find("[libvaiq.so."), std::string::npos) << entry.path();
        EXPECT_EQ(r.out.find("libvaiq_runtime"), std::string::npos) << entry.path();
        EXPECT_EQ(r.out.find("libvaiq_host"), std::string::npos) << entry.path();
        ++checked;
    }
    EXPECT_GE(checked, 10);
}

}  // namespace
