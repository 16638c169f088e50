// vaiq/pass.hpp - the pass plugin interface.
#pragma once

#include "vaiq/model.hpp"
#include "vaiq/plugin.hpp"

namespace vaiq {

/// A named graph rewrite.
class VAIQ_API Pass : public Plugin {
  public:
    using Interface = Pass;
    static constexpr PluginKind kKind = PluginKind::Pass;

    /// Rewrites the model in place; returns whether anything changed.
    virtual bool run(Model& model) = 0;
};

/// A pass without options that runs one function (returning whether it changed
/// the model): a library of such rewrites declares one per function.
template <bool (*Run)(Model&)>
class FunctionPass final : public Pass {
  public:
    bool run(Model& model) override { return Run(model); }
};

}  // namespace vaiq
