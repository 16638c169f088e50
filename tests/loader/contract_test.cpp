// Every built-in plugin keeps the contract: a complete descriptor, documented
// options, and an instance that creates and configures with its defaults.
#include <gtest/gtest.h>

#include "plugin/registry.hpp"
#include "test_support.hpp"

namespace {

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
        EXPECT_NO_THROW(registry.check_configuration(*p, registry.resolve_options(*p, nullptr)));
    }
    EXPECT_EQ(kinds.size(), 7u) << "built-in plugins of all seven kinds";
}

}  // namespace
