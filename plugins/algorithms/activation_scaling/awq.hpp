// AWQ-lite, activation-aware weight quantization as ModelOpt's default INT4
// method computes it: for each activation X read by weight-only MatMuls, the
// per-channel scale s = x̄^α / w̄^(1-α) (x̄ the mean |X_j| over tokens, w̄ the
// mean over outputs of |W_jn| normalised within its block), normalised by
// sqrt(max s · min s), with α searched over 0, 0.1, ..., 1 for the least
// output error of the quantized weights diag(s) W on (X / s). X is divided by
// s and the weight rows multiplied, so the float function is unchanged while
// the channels that carry large activations get finer weights. Every fourth
// sampled token row is held out of the search, and an activation keeps its
// scales only when they beat s = 1 on those rows.
#pragma once

#include <set>
#include <string>

#include "vaiq/algorithm.hpp"
#include "vaiq/model.hpp"
#include "vaiq/quant.hpp"

namespace vaiq {

struct AwqOptions {
    QuantSpec spec;         ///< how the weights will be quantized (type, symmetry, block_size along K)
    int sample_rows = 256;  ///< token rows per activation kept for the search (reservoir-sampled)
};

struct AwqResult {
    int activations = 0;   ///< activations whose readers were searched
    int scaled = 0;        ///< of them, scaled (the others kept s = 1, round to nearest)
    int folded = 0;        ///< of the scaled, with 1/s folded into their producer
    double error_rtn = 0;  ///< summed mean squared output error with s = 1, on the held-out rows
    double error_awq = 0;  ///< the same with the scales kept (never above error_rtn)
};

/// Searches and applies the scales for the activations read by the MatMuls
/// named in `nodes` (constant B [K, N]); statistics from the context's data
/// through `model`.
AwqResult awq_lite(Model& model, AlgorithmContext& context, const AwqOptions& options,
                   const std::set<std::string>& nodes);

struct AwqClipResult {
    int weights = 0;      ///< blocked symmetric MatMul weights searched
    int64_t clipped = 0;  ///< (block, column) pairs whose range was clipped
    int64_t blocks = 0;   ///< (block, column) pairs searched
    int rejected = 0;     ///< weights whose clipping did not beat the plan's scales on the held-out rows
};

/// AWQ-clip: for each block and output column of every symmetric block-wise
/// MatMul weight of `plan`, the clip ratio α in 1, 0.95, ..., 0.5 of the block's
/// max |w| whose scale (α max|w| / qmax) gives the least output error on the
/// block's inputs over three of every four of up to `sample_rows` sampled
/// tokens; the context's plan takes a weight's chosen scales (set_parameters)
/// when they beat the plan's on the fourth.
AwqClipResult awq_clip(AlgorithmContext& context, int sample_rows);

}  // namespace vaiq
