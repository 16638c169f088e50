// vaiq/format.hpp - the format plugin interface.
#pragma once

#include "vaiq/model.hpp"
#include "vaiq/plugin.hpp"
#include "vaiq/quant.hpp"

namespace vaiq {

/// Writes a quantization plan into a model (QDQ, QOperator, custom ops, ...).
class VAIQ_API Format : public Plugin {
  public:
    using Interface = Format;
    static constexpr PluginKind kKind = PluginKind::Format;

    /// Rewrites `model` so that every tensor of `plan` is quantized as planned.
    /// Throws InputError when the plan names a tensor the model lacks or asks for
    /// a type this format cannot write.
    virtual void emit(Model& model, const QuantPlan& plan) const = 0;
};

}  // namespace vaiq
