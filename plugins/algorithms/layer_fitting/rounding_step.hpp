// The per-weight work of a fast finetune step (AdaRound's rectified sigmoid
// and regulariser, AdaQuant's straight-through rounding, Adam's update), in
// plain loops compiled for AVX-512, AVX2 and the baseline and chosen by the
// CPU at run time. exp and log are polynomials of their own, so that the loops
// vectorise (libm's are scalar calls): a step's elementwise work had cost as
// much as its products.
#pragma once

#include <cstdint>

#include "vaiq/adam.hpp"

namespace vaiq {

/// AdaRound's stretch of the sigmoid: h = sigmoid(v) * (zeta - gamma) + gamma, clipped to [0, 1].
constexpr float kAdaRoundZeta = 1.1f, kAdaRoundGamma = -0.1f;

/// One layer's weights, row-major [rows, k], a row per output channel.
struct RoundingStep {
    int64_t k = 0;
    const float* scale = nullptr;  ///< per row
    const float* zero = nullptr;   ///< per row, as a float
    float qmin = 0, qmax = 0;      ///< the integer range
    bool adaround = true;
    float* param = nullptr;       ///< AdaRound: the rounding's logits v; AdaQuant: the weights
    const float* base = nullptr;  ///< AdaRound: floor(w / scale)
    float* q = nullptr;           ///< this step's grid values, before the zero point
    float* sig = nullptr;         ///< AdaRound: sigmoid(v)
    float* h = nullptr;           ///< AdaRound: the stretched sigmoid, before clipping

    /// This step's grid values and the weights they stand for (into `w`), rows [first, last).
    void weights(int64_t first, int64_t last, float* w) const;
    /// The weights as they would be written now, all `rows` (into `w`):
    /// AdaRound's rounding decided (up where h >= 0.5, that is v >= 0), AdaQuant's on the grid.
    void decided(int64_t rows, float* w) const;
    /// `grad` (by the weights, rows [first, last)) becomes the gradient by the
    /// parameters (AdaRound's regulariser with `beta` > 0 weighted by `reg`), and
    /// Adam, after its next(), updates them.
    void update(int64_t first, int64_t last, float* grad, float beta, float reg, Adam& adam) const;
};

/// e^x and ln x as the step computes them (relative error below 2e-7 where
/// they are finite; exp_approx flushes below e^-87 to 0), for the tests.
float exp_approx(float x);
float log_approx(float x);

}  // namespace vaiq
