#include "k_quant.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>
#include <vector>

#include "vaiq/error.hpp"
#include "weight_blocks.hpp"

namespace vaiq {

namespace {

constexpr int kSteps = 20;
constexpr float kFirstOffset = -1.0f, kOffsetStep = 0.1f;

struct Grid {
    float scale = 0;
    int64_t zero_point = 0;
};

// A block's values with their importance, and the written form's error.
struct Block {
    std::vector<float> w, importance;
    int64_t qmin = 0, qmax = 0;

    // The level of each value on `g` less the zero point, as quantize_value computes it.
    double steps(const Grid& g, size_t i) const {
        const double q = std::clamp(static_cast<double>(std::nearbyint(w[i] / g.scale)) + g.zero_point,
                                    static_cast<double>(qmin), static_cast<double>(qmax));
        return q - static_cast<double>(g.zero_point);
    }

    // As DequantizeLinear computes it.
    double error(const Grid& g) const {
        double sum = 0;
        for (size_t i = 0; i < w.size(); ++i) {
            const float back = static_cast<float>(steps(g, i)) * g.scale;
            const double d = static_cast<double>(back) - w[i];
            sum += importance[i] * d * d;
        }
        return sum;
    }

    // The step refitted by weighted least squares to the levels `g` gives, its zero point kept.
    std::optional<Grid> restep(const Grid& g) const {
        double sxd = 0, sdd = 0;
        for (size_t i = 0; i < w.size(); ++i) {
            const double d = steps(g, i);
            sxd += importance[i] * w[i] * d, sdd += importance[i] * d * d;
        }
        const double scale = sxd / sdd;
        if (!(scale > 0) || !std::isfinite(scale)) return std::nullopt;
        return Grid{static_cast<float>(scale), g.zero_point};
    }

    // The grid of inverse step `inverse`: the levels the values round to from the
    // block's minimum, then step and minimum fitted to them by weighted least squares.
    std::optional<Grid> refit(float low, float inverse) const {
        double sw = 0, sx = 0, sl = 0, sl2 = 0, sxl = 0;
        const auto levels = static_cast<float>(qmax - qmin);
        for (size_t i = 0; i < w.size(); ++i) {
            const double l = std::clamp(std::nearbyint(inverse * (w[i] - low)), 0.0f, levels);
            const double a = importance[i];
            sw += a, sx += a * w[i], sl += a * l, sl2 += a * l * l, sxl += a * l * w[i];
        }
        const double det = sw * sl2 - sl * sl;
        if (!(det > 0)) return std::nullopt;  // every value on one level: nothing to fit
        const double scale = (sw * sxl - sx * sl) / det, minimum = (sl2 * sx - sl * sxl) / det;
        if (!(scale > 0) || !std::isfinite(scale) || !std::isfinite(minimum)) return std::nullopt;
        // x ~ scale * l + minimum with l = q - qmin, so x ~ scale * (q - zero point) for
        // zero point = qmin - minimum / scale, rounded into the type's range.
        const double zero = std::clamp(std::nearbyint(static_cast<double>(qmin) - minimum / scale),
                                       static_cast<double>(qmin), static_cast<double>(qmax));
        return Grid{static_cast<float>(scale), static_cast<int64_t>(zero)};
    }
};

Grid fit_block(const Block& block, const Grid& planned) {
    const auto [lo, hi] = std::minmax_element(block.w.begin(), block.w.end());
    Grid best = planned;
    double best_error = block.error(planned);
    const float range = *hi - *lo;
    if (!(range > 0)) return best;  // equal values: the plan's grid (which holds 0 and them)
    const auto levels = static_cast<float>(block.qmax - block.qmin);
    auto keep = [&](const Grid& g) {
        const double e = block.error(g);
        if (e < best_error) best_error = e, best = g;
    };
    auto consider = [&](float inverse) {
        if (const auto g = block.refit(*lo, inverse)) {
            keep(*g);
            // The zero point's rounding moved the grid: the step refitted to it.
            if (const auto again = block.restep(*g)) keep(*again);
        }
    };
    consider(levels / range);  // the extremes' grid
    for (int i = 0; i < kSteps; ++i) consider((levels + kFirstOffset + kOffsetStep * static_cast<float>(i)) / range);
    return best;
}

// Runs `visit(block, param)` over the blocks of W [K, N] blocked along K, with their importance.
template <typename Visit>
void for_each_block(const Tensor& weight, const QuantParams& plan, Visit&& visit) {
    Block block;
    std::tie(block.qmin, block.qmax) = integer_range(plan.type);
    for_each_weight_block(weight, plan, "k-quant", [&](const std::vector<float>& w, size_t param) {
        block.w = w;
        double squares = 0;
        for (float x : w) squares += static_cast<double>(x) * x;
        const auto rms = static_cast<float>(std::sqrt(squares / static_cast<double>(w.size())));
        block.importance.resize(w.size());
        for (size_t i = 0; i < w.size(); ++i) block.importance[i] = rms + std::abs(w[i]);
        visit(block, param);
    });
}

}  // namespace

QuantParams k_quant_params(const Tensor& weight, const QuantParams& plan) {
    QuantParams out = plan;
    out.float_zero_point.clear();
    for_each_block(weight, plan, [&](const Block& block, size_t param) {
        const auto g = fit_block(block, {plan.scale[param], plan.zero_point[param]});
        out.scale[param] = g.scale;
        out.zero_point[param] = g.zero_point;
    });
    return out;
}

double importance_weighted_error(const Tensor& weight, const QuantParams& params, std::string_view name) {
    if (!params.float_zero_point.empty())
        throw InputError(fmt::format("'{}': the importance-weighted error takes integer zero points", name));
    double sum = 0;
    for_each_block(weight, params, [&](const Block& block, size_t param) {
        sum += block.error({params.scale[param], params.zero_point[param]});
    });
    return sum;
}

}  // namespace vaiq
