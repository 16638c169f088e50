// Bias correction (extra_options.BiasCorrection): quantizing a layer's weight
// moves the mean of its output; the move, measured on the calibration data
// with the layer's inputs as the quantized model computes them, is added to
// the layer's bias.
#pragma once

#include <map>
#include <string>

#include "vaiq/algorithm.hpp"

namespace vaiq {

/// For every Conv and Gemm of context.model() with a constant float bias whose
/// weight context.plan() quantizes: delta[c] = sum over the weights w of
/// output channel c of (w - fake_quantize(w)) * mean of the input value w
/// multiplies, the means over the context's data run through `quantized` (the
/// model as written: upstream error included). The mean
/// output of the layer is then the float layer's on the same input; borders a
/// padded convolution sees are counted as the mean, an approximation of a few
/// percent at most on 3x3 convolutions of small maps.
/// `rounded` holds the weights fast finetune wrote. A layer whose grid values
/// it changed is left as it is: its fit already matched the float layer's
/// output, the mean included, on inputs that carry the upstream error, and
/// adding its rounding's mean shift back undoes part of that (on PP-OCRv4's
/// recognizer this cost 11.7 points of exact lines).
struct BiasCorrections {
    std::map<std::string, Tensor> biases;  ///< the corrected bias values by initializer name
    int64_t fitted_left = 0;               ///< layers left as fast finetune fitted them
};
BiasCorrections corrected_biases(AlgorithmContext& context, const Model& quantized,
                                 const std::map<std::string, Tensor>& rounded);

}  // namespace vaiq
