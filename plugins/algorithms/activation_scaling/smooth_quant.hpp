// SmoothQuant (extra_options SmoothQuant, SmoothQuantAlpha, SmoothQuantFolding,
// as ONNX Runtime documents them): activations with a few large channels are
// hard to quantize per tensor, weights are easy; dividing each input channel j
// of a MatMul/Gemm by s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) and
// multiplying row j of the weight by s_j moves the difficulty into the weight
// without changing the float function.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "vaiq/algorithm.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/model.hpp"
#include "vaiq/quant.hpp"

namespace vaiq {

/// A reader of an activation X whose constant weight rows follow X's channels:
/// MatMul with B [K, N], or Gemm (transA 0) with B [K, N] or, transB, [N, K].
struct ChannelReader {
    int node = 0;
    bool rows_are_columns = false;  ///< transB: channel j is column j of the stored weight
};

/// Every such X with its readers.
std::map<std::string, std::vector<ChannelReader>> channel_readers(const Model& model, const GraphIndex& index);

/// Divides channel j of X by s_j and multiplies row j of each reader's weight by
/// s_j, which leaves the float function as it is. With `folding`, when only those
/// readers read X, 1/s is folded into X's producer (a LayerNormalization's scale
/// and bias, a Mul or Add by a constant, a MatMul/Gemm's weight and bias);
/// otherwise a Mul (named after `tag`) feeds only them. Returns whether it folded.
bool scale_input_channels(Model& model, const std::string& x, const std::vector<float>& s, bool folding,
                          const std::string& tag);

struct SmoothQuantOptions {
    double alpha = 0.5;
    /// Fold 1/s into the producer of X (a LayerNormalization's scale and bias, a
    /// Mul or Add by a constant, a MatMul/Gemm's constant weight and bias) when X
    /// has no other reader; else a Mul(X, 1/s) is inserted.
    bool folding = true;
    /// Instead of `alpha`: each input's alpha in 0.1, 0.2, ..., 0.9, or none, for
    /// the least error of the quantized product X/s · Q(diag(s) W) on sampled token
    /// rows (X/s per tensor on `activation_spec` over the rows' range, the weights
    /// on `weight_spec`); smoothing is kept only where it beats none on a share of
    /// rows held out of the search.
    bool alpha_search = false;
    int sample_rows = 256;
    QuantSpec activation_spec, weight_spec;
};

struct SmoothQuantResult {
    int activations = 0;  ///< inputs smoothed
    int weights = 0;      ///< weights scaled
    int folded = 0;       ///< of the inputs, how many into their producer
    /// With alpha_search: each searched input's alpha (null: left unsmoothed).
    std::map<std::string, std::optional<double>> alphas;
};

/// Smooths every float activation read by MatMul (constant B) or Gemm
/// (constant B, transA 0) nodes; max|X_j| comes from the context's data run
/// through `model`.
SmoothQuantResult smooth_quant(Model& model, AlgorithmContext& context, const SmoothQuantOptions& options);

}  // namespace vaiq
