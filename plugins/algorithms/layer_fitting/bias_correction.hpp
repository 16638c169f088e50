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
/// Returns the corrected bias values by initializer name.
/// `rounded` holds weights whose grid values were chosen otherwise (fast finetune).
std::map<std::string, Tensor> corrected_biases(AlgorithmContext& context, const Model& quantized,
                                               const std::map<std::string, Tensor>& rounded);

}  // namespace vaiq
