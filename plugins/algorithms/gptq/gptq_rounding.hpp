// GPTQ for weight-only MatMuls: each weight's values are rounded one input
// channel (row of B [K, N]) at a time, in K order, and the rounding error of a
// row is pushed into the rows not yet rounded through the inverse Hessian of
// the layer's reconstruction loss, H = 2/n Σ xᵀx over the calibration tokens
// at the MatMul's input but a quarter held out (damped by `damping` x mean(diag
// H); channels that are never non-zero are dropped). A weight keeps round to
// nearest when GPTQ's output error is not lower on the held-out tokens, and is
// rounded again with every token's H when it is. Rows are processed in lazy batches of 128. The
// scales and zero points are the plan's (computed from the float weights
// beforehand, GPTQ's static groups), so the result is a grid value for each
// weight that the format stores exactly. With act_order the rows are rounded
// in order of falling H diagonal instead.
#pragma once

#include <map>
#include <string>

#include "vaiq/algorithm.hpp"
#include "vaiq/model.hpp"
#include "vaiq/quant.hpp"

namespace vaiq {

struct GptqOptions {
    double damping = 0.01;   ///< percdamp
    int batch_rows = 128;    ///< rows rounded before the error reaches the later ones
    bool act_order = false;  ///< rows in order of falling H diagonal (desc_act), each with its own block's scale
};

struct GptqLayer {
    std::string weight;
    double error_rtn = 0;   ///< mean squared output error of round to nearest, over the held-out tokens' H
    double error_gptq = 0;  ///< the same for GPTQ's rounding
    int64_t fitted_rows = 0, held_out_rows = 0;  ///< token rows H was fitted on, and held out (a quarter)
    bool kept = false;                           ///< GPTQ's rounding kept (its error the lower), else round to nearest
};

struct GptqResult {
    std::map<std::string, Tensor> rounded;  ///< weight -> its grid values (float)
    std::vector<GptqLayer> layers;
};

/// Rounds the constant B of every MatMul of the context's model that its plan
/// quantizes, H measured on the context's data.
GptqResult gptq(AlgorithmContext& context, const GptqOptions& options);

/// The GPTQ rounding of one weight W [K, N] given H [K, K] (row-major doubles): exposed for tests.
Tensor gptq_round(const Tensor& weight, const QuantParams& params, std::vector<double> hessian,
                  const GptqOptions& options);

}  // namespace vaiq
