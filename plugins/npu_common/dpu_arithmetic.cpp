#include "dpu_arithmetic.hpp"

#include <cmath>
#include <limits>

namespace dpu {

using vaiq::float_attribute;

float leaky_relu_alpha(float alpha) { return static_cast<float>(std::nearbyint(alpha * 256.0) / 256.0); }

bool is_dpu_hard_sigmoid(const onnx::NodeProto& node) {
    return node.op_type() == "HardSigmoid" && std::abs(float_attribute(node, "alpha", 0.2f) - 1.0f / 6.0f) < 1e-5f &&
           std::abs(float_attribute(node, "beta", 0.5f) - 0.5f) < 1e-5f;
}

double mean_factor(int64_t count) {
    if (count <= 0) return 1.0;
    // The DPU multiplies the sum by round(2^n / count) / 2^n for the n that
    // comes closest to 1 / count.
    const int n_max = 7 + static_cast<int>(std::ceil(std::log2(static_cast<double>(count))));
    double best_factor = 1.0, best_diff = std::numeric_limits<double>::infinity();
    for (int n = 0; n < n_max; ++n) {
        const double p = std::ldexp(1.0, n);
        const double k = std::nearbyint(p / static_cast<double>(count));  // halves to even
        const double diff = std::abs(k / p - 1.0 / static_cast<double>(count));
        if (diff < best_diff) {
            best_diff = diff;
            best_factor = k / p * static_cast<double>(count);
        }
    }
    return best_factor;
}

double average_pool_factor(int64_t kh, int64_t kw) {
    if (kh > 255 || kw > 255) return 1.0;
    if (kh == kw) {
        switch (kh) {
            case 3: return 9.0 * 7.0 / 64.0;
            case 5: return 25.0 * 10.0 / 256.0;
            case 6: return 36.0 * 7.0 / 256.0;
            case 7: return 49.0 * 21.0 / 1024.0;
            case 14: return 196.0 * 21.0 / 4096.0;
            default: break;
        }
    }
    return mean_factor(kh * kw);
}

}  // namespace dpu
