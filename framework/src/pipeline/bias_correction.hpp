// Bias correction (extra_options.BiasCorrection): quantizing a layer's weight
// moves the mean of its output; the move, measured on the calibration data
// with the layer's inputs as the quantized model computes them, is added to
// the layer's bias.
#pragma once

#include <map>
#include <string>

#include "pipeline/data_reader.hpp"
#include "vaiq/model.hpp"
#include "vaiq/quant.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {

/// For every Conv and Gemm with a constant float bias whose weight `plan`
/// quantizes: delta[c] = sum over the weights w of output channel c of
/// (w - fake_quantize(w)) * mean of the input value w multiplies, the means
/// over the first `max_batches` batches of `data` (0: all) run through
/// `quantized` (the model as written: upstream error included). The mean
/// output of the layer is then the float layer's on the same input; borders a
/// padded convolution sees are counted as the mean, an approximation of a few
/// percent at most on 3x3 convolutions of small maps.
/// Returns the corrected bias values by initializer name.
/// `rounded` holds weights whose grid values were chosen otherwise (fast finetune).
std::map<std::string, Tensor> corrected_biases(const Model& float_model, const Model& quantized, const QuantPlan& plan,
                                               const std::map<std::string, Tensor>& rounded, DataReader& data,
                                               int max_batches, int threads);

}  // namespace vaiq
