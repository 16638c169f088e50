// vaiq/format.hpp - the format plugin interface.
#pragma once

#include "vaiq/model.hpp"
#include "vaiq/plugin.hpp"
#include "vaiq/quant.hpp"

#include <string>
#include <vector>

namespace vaiq {

/// What converting a model to ONNX Runtime's native form did.
struct NativeConversion {
    int converted = 0;                  ///< nodes rewritten
    std::vector<std::string> warnings;  ///< where the native form computes something slightly different
};

/// Writes a quantization plan into a model (QDQ, QOperator, custom ops, ...).
class VAIQ_API Format : public Plugin {
  public:
    using Interface = Format;
    static constexpr PluginKind kKind = PluginKind::Format;

    /// Rewrites `model` so that every tensor of `plan` is quantized as planned.
    /// Throws InputError when the plan names a tensor the model lacks or asks for
    /// a type this format cannot write.
    virtual void emit(Model& model, const QuantPlan& plan) const = 0;

    /// Whether `model` holds this format's own ops (a model it wrote), so that
    /// `vaiq convert-format` knows whom to ask. The default is false.
    virtual bool wrote(const Model& model) const;
    /// Rewrites a model this format wrote in the form ONNX Runtime runs
    /// natively. Throws InputError listing every tensor that has none, and
    /// leaves `model` as it was then. The default has no conversion.
    virtual NativeConversion to_native(Model& model) const;
};

}  // namespace vaiq
