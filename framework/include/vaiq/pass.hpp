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

}  // namespace vaiq
