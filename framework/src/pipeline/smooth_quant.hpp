// SmoothQuant (extra_options SmoothQuant, SmoothQuantAlpha, SmoothQuantFolding,
// as ONNX Runtime documents them): activations with a few large channels are
// hard to quantize per tensor, weights are easy; dividing each input channel j
// of a MatMul/Gemm by s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) and
// multiplying row j of the weight by s_j moves the difficulty into the weight
// without changing the float function.
#pragma once

#include "pipeline/data_reader.hpp"
#include "vaiq/model.hpp"

namespace vaiq {

struct SmoothQuantOptions {
    double alpha = 0.5;
    /// Fold 1/s into the producer of X (a LayerNormalization's scale and bias, a
    /// Mul or Add by a constant, a MatMul/Gemm's constant weight and bias) when X
    /// has no other reader; else a Mul(X, 1/s) is inserted.
    bool folding = true;
};

struct SmoothQuantResult {
    int activations = 0;  ///< inputs smoothed
    int weights = 0;      ///< weights scaled
    int folded = 0;       ///< of the inputs, how many into their producer
};

/// Smooths every float activation read by MatMul (constant B) or Gemm
/// (constant B, transA 0) nodes; max|X_j| comes from `data` run through `model`.
SmoothQuantResult smooth_quant(Model& model, DataReader& data, const SmoothQuantOptions& options, int threads);

}  // namespace vaiq
