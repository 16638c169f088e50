// The step's own exp and log agree with the C library's, and one AdaRound step
// computes what its formulas say.
#include "rounding_step.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace {

TEST(RoundingStep, ExpAndLogAgreeWithTheLibrary) {
    for (float x = -87.0f; x <= 88.0f; x += 0.01f)
        EXPECT_NEAR(vaiq::exp_approx(x), std::exp(x), 3e-7f * std::exp(x)) << x;
    EXPECT_LE(vaiq::exp_approx(-1000.0f), 2e-38f) << "clamped at e^-87";
    for (float x = 1e-30f; x < 1e30f; x *= 1.37f)
        EXPECT_NEAR(vaiq::log_approx(x), std::log(x), 3e-7f * std::max(1.0f, std::abs(std::log(x)))) << x;
    EXPECT_LT(vaiq::exp_approx(2.0f * vaiq::log_approx(0.0f)), 1e-37f) << "|0|^beta comes out 0";
}

// One row of four weights: the weights from the logits, then the gradient by
// the logits (with the regulariser) and Adam's first step, as written out here.
TEST(RoundingStep, OneAdaRoundStepFollowsItsFormulas) {
    const float scale = 0.5f, zero = 1.0f;
    std::vector<float> param{-3.0f, 0.0f, 0.7f, 4.0f}, base{0.0f, 2.0f, -1.0f, 6.0f};
    std::vector<float> q(4), sig(4), h(4), w(4);
    const vaiq::RoundingStep step{.k = 4,
                                  .scale = &scale,
                                  .zero = &zero,
                                  .qmin = -8,
                                  .qmax = 7,
                                  .adaround = true,
                                  .param = param.data(),
                                  .base = base.data(),
                                  .q = q.data(),
                                  .sig = sig.data(),
                                  .h = h.data()};
    step.weights(0, 1, w.data());
    const std::vector<float> logits = param;
    for (size_t i = 0; i < 4; ++i) {
        const float s = 1.0f / (1.0f + std::exp(-logits[i]));
        const float hh = s * 1.2f - 0.1f, hc = std::clamp(hh, 0.0f, 1.0f);
        EXPECT_NEAR(sig[i], s, 1e-6f) << i;
        EXPECT_NEAR(q[i], base[i] + hc, 1e-6f) << i;
        // the grid values plus the zero point lie in [-8, 7]: the last (6 + 1 + 1) is clipped to 7
        EXPECT_NEAR(w[i], (std::clamp(base[i] + hc + zero, -8.0f, 7.0f) - zero) * scale, 1e-6f) << i;
    }
    // Decided: rounded up where the logit is not negative (h >= 0.5), clipped like the rest.
    std::vector<float> decided(4);
    step.decided(1, decided.data());
    for (size_t i = 0; i < 4; ++i)
        EXPECT_FLOAT_EQ(decided[i],
                        (std::clamp(base[i] + (logits[i] >= 0 ? 1.0f : 0.0f) + zero, -8.0f, 7.0f) - zero) * scale)
            << i;
    std::vector<float> grad{1.0f, -2.0f, 0.5f, 3.0f};
    const std::vector<float> by_weight = grad;
    vaiq::Adam adam(4, 0.1);
    adam.next();
    const float beta = 4.0f, reg = 0.01f;
    step.update(0, 1, grad.data(), beta, reg, adam);
    for (size_t i = 0; i < 4; ++i) {
        const float s = sig[i], hh = h[i], hc = std::clamp(hh, 0.0f, 1.0f), t = 2 * hc - 1;
        const bool inside = q[i] + zero >= -8 && q[i] + zero <= 7;
        float d = inside ? by_weight[i] * scale : 0.0f;
        d -= reg * beta * 2 * std::pow(std::abs(t), beta - 1) * (t < 0 ? -1.0f : 1.0f);
        const float expected = hh > 0 && hh < 1 ? d * 1.2f * s * (1 - s) : 0.0f;
        EXPECT_NEAR(grad[i], expected, 1e-6f + 1e-5f * std::abs(expected)) << i;
        // Adam's first step moves each parameter by the learning rate against its gradient's sign.
        if (expected != 0) {
            EXPECT_NEAR(param[i], logits[i] - 0.1f * (expected > 0 ? 1 : -1), 1e-4f) << i;
        }
    }
}

}  // namespace
