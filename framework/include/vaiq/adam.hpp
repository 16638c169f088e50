// vaiq/adam.hpp - the Adam optimizer (Kingma and Ba), for the algorithms that
// fit parameters by gradient descent (AdaRound, AdaQuant). Header-only: no ABI.
#pragma once

#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

namespace vaiq {

class Adam {
  public:
    explicit Adam(size_t parameters, double learning_rate, double beta1 = 0.9, double beta2 = 0.999,
                  double epsilon = 1e-8)
        : lr_(learning_rate), b1_(beta1), b2_(beta2), eps_(epsilon), m_(parameters, 0.0f), v_(parameters, 0.0f) {}

    /// One step: params -= lr * m_hat / (sqrt(v_hat) + eps), from this step's
    /// gradient. In float, one pass over the parameters: compiled with
    /// -fno-math-errno, the loop runs on vector registers.
    void step(std::span<float> params, std::span<const float> gradient) {
        next();
        update(params, gradient, 0);
    }

    /// The same step in parts, which may run in parallel: next() once, then
    /// update() for disjoint ranges of the parameters, `first` the offset of
    /// `params` and `gradient` in the whole.
    void next() {
        ++t_;
        rate_ = static_cast<float>(lr_ / (1.0 - std::pow(b1_, static_cast<double>(t_))));
        second_ = static_cast<float>(1.0 / (1.0 - std::pow(b2_, static_cast<double>(t_))));
    }
    void update(std::span<float> params, std::span<const float> gradient, size_t first) {
        const auto b1 = static_cast<float>(b1_), b2 = static_cast<float>(b2_), eps = static_cast<float>(eps_);
        const float rate = rate_, second = second_;
        float* __restrict p = params.data();
        const float* __restrict g = gradient.data();
        float* __restrict m = m_.data() + first;
        float* __restrict v = v_.data() + first;
        for (size_t i = 0; i < params.size(); ++i) {
            m[i] = b1 * m[i] + (1.0f - b1) * g[i];
            v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
            p[i] -= rate * m[i] / (std::sqrt(v[i] * second) + eps);
        }
    }

  private:
    double lr_, b1_, b2_, eps_;
    std::vector<float> m_, v_;
    long t_ = 0;
    float rate_ = 0, second_ = 0;
};

}  // namespace vaiq
