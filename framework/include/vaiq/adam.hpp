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
        : lr_(learning_rate), b1_(beta1), b2_(beta2), eps_(epsilon), m_(parameters, 0.0), v_(parameters, 0.0) {}

    /// One step: params -= lr * m_hat / (sqrt(v_hat) + eps), from this step's gradient.
    void step(std::span<float> params, std::span<const float> gradient) {
        ++t_;
        const double c1 = 1.0 - std::pow(b1_, static_cast<double>(t_));
        const double c2 = 1.0 - std::pow(b2_, static_cast<double>(t_));
        for (size_t i = 0; i < params.size(); ++i) {
            const double g = gradient[i];
            m_[i] = b1_ * m_[i] + (1.0 - b1_) * g;
            v_[i] = b2_ * v_[i] + (1.0 - b2_) * g * g;
            params[i] -= static_cast<float>(lr_ * (m_[i] / c1) / (std::sqrt(v_[i] / c2) + eps_));
        }
    }

  private:
    double lr_, b1_, b2_, eps_;
    std::vector<double> m_, v_;
    long t_ = 0;
};

}  // namespace vaiq
