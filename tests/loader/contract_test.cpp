// Every built-in plugin keeps the contract: a complete descriptor, documented
// options, and an instance that creates and configures with its defaults.
#include <gtest/gtest.h>

#include "plugin/registry.hpp"
#include "test_support.hpp"
#include "vaiq/algorithm.hpp"
#include "vaiq/calibrator.hpp"
#include "vaiq/format.hpp"
#include "vaiq/pass.hpp"
#include "vaiq/target.hpp"

namespace {

void create_and_configure(const vaiq::PluginRegistry& registry, const vaiq::PluginInfo& info) {
    const auto options = registry.resolve_options(info, nullptr);
    switch (info.kind) {
        case vaiq::PluginKind::Calibrator: registry.create<vaiq::Calibrator>(info.name, options); break;
        case vaiq::PluginKind::Format: registry.create<vaiq::Format>(info.name, options); break;
        case vaiq::PluginKind::Target: registry.create<vaiq::Target>(info.name, options); break;
        case vaiq::PluginKind::Pass: registry.create<vaiq::Pass>(info.name, options); break;
        case vaiq::PluginKind::Algorithm: registry.create<vaiq::Algorithm>(info.name, options); break;
    }
}

TEST(PluginContract, EveryBuiltinPluginKeepsIt) {
    vaiq::PluginRegistry registry;
    registry.load_directory(vaiq::builtin_plugin_dir());
    const auto plugins = registry.list();
    std::set<vaiq::PluginKind> kinds;
    for (const auto* p : plugins) {
        SCOPED_TRACE(p->name);
        kinds.insert(p->kind);
        EXPECT_FALSE(p->summary.empty());
        // Named after its plugin, or after the family of plugins of one kind it holds (vaiq-pass-dpu.so).
        const std::string file = p->library.filename().string(),
                          prefix = "vaiq-" + std::string(vaiq::kind_name(p->kind)) + "-";
        EXPECT_EQ(file.rfind(prefix, 0), 0u) << file;
        EXPECT_EQ(file.substr(file.size() - 3), ".so") << file;
        for (const auto& o : p->options) EXPECT_FALSE(o.doc.empty()) << o.name;
        EXPECT_NO_THROW(create_and_configure(registry, *p));
    }
    EXPECT_EQ(kinds.size(), 5u) << "built-in plugins of all five kinds";
}

}  // namespace
