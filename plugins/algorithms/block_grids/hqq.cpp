#include "hqq.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "vaiq/error.hpp"
#include "weight_blocks.hpp"

namespace vaiq {

namespace {

struct BlockResult {
    float scale;
    float zero;
};

// One block's values; ONNX Runtime's arithmetic (in float, with the inverse scale).
BlockResult solve_block(const std::vector<float>& w, int64_t qmin, int64_t qmax, const HqqOptions& o) {
    const auto [low, high] = std::minmax_element(w.begin(), w.end());
    const float levels = static_cast<float>(qmax - qmin);
    const float range = *high - *low;
    const float inverse = std::min(levels / (range == 0.0f ? levels : range), 2e4f);
    float zero = std::nearbyint(static_cast<float>(qmin) - *low * inverse);
    const auto lo = static_cast<float>(qmin), hi = static_cast<float>(qmax);
    const double p = o.lp_norm;
    double beta = o.beta;
    float best_zero = zero;
    double best_error = std::numeric_limits<double>::infinity();
    std::vector<float> q(w.size()), error(w.size());
    for (int it = 0; it < o.iterations; ++it) {
        double absolute = 0;
        for (size_t i = 0; i < w.size(); ++i) {
            q[i] = std::clamp(std::nearbyint(w[i] * inverse + zero), lo, hi);
            error[i] = w[i] - (q[i] - zero) / inverse;
            absolute += std::abs(error[i]);
        }
        absolute /= static_cast<double>(w.size());
        if (absolute < best_error) best_error = absolute, best_zero = zero;
        // The lp norm's shrinkage: sign(e) max(|e| - |e|^(p - 1) / beta, 0).
        double sum = 0;
        for (size_t i = 0; i < w.size(); ++i) {
            const double e = error[i], magnitude = std::abs(e);
            const double kept = std::max(magnitude - std::pow(magnitude + 1e-8, p - 1) / beta, 0.0);
            sum += q[i] - (w[i] - std::copysign(kept, e)) * inverse;
        }
        zero = static_cast<float>(sum / static_cast<double>(w.size()));
        beta *= o.kappa;
    }
    return {1.0f / inverse, best_zero};
}

}  // namespace

QuantParams hqq_params(const Tensor& weight, const QuantParams& plan, const HqqOptions& options) {
    const auto [qmin, qmax] = integer_range(plan.type);
    QuantParams out = plan;
    out.float_zero_point.assign(plan.scale.size(), 0.0f);
    for_each_weight_block(weight, plan, "HQQ", [&](const std::vector<float>& w, size_t param) {
        const auto r = solve_block(w, qmin, qmax, options);
        out.scale[param] = r.scale;
        out.float_zero_point[param] = r.zero;
        out.zero_point[param] = std::clamp(static_cast<int64_t>(std::nearbyint(r.zero)), int64_t{qmin}, int64_t{qmax});
    });
    return out;
}

double mean_absolute_error(const Tensor& weight, const QuantParams& params, const std::string& name) {
    const auto back = fake_quantize(weight, params, name);
    const auto a = weight.data<float>(), b = back.data<float>();
    double sum = 0;
    for (size_t i = 0; i < a.size(); ++i) sum += std::abs(static_cast<double>(a[i]) - b[i]);
    return a.empty() ? 0.0 : sum / static_cast<double>(a.size());
}

}  // namespace vaiq
