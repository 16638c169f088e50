#include "k_quant.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>
#include <vector>

#include "vaiq/error.hpp"

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

// Runs `visit(block, param)` over the blocks of W [K, N] blocked along K.
template <typename Visit>
void for_each_block(const Tensor& weight, const QuantParams& plan, Visit&& visit) {
    const auto& shape = weight.shape();
    if (shape.size() != 2 || plan.axis != 0 || plan.block_size <= 0 || !is_integer(plan.type) ||
        quant_bits(plan.type) > 8)
        throw InputError("k-quant takes a weight [K, N] quantized in blocks along K at 8 bits or fewer");
    const int64_t k = shape[0], n = shape[1], size = plan.block_size, blocks = (k + size - 1) / size;
    if (static_cast<int64_t>(plan.scale.size()) != blocks * n || plan.zero_point.size() != plan.scale.size())
        throw InputError(fmt::format("k-quant: {} scales and {} zero points for a weight of {} blocks and {} columns",
                                     plan.scale.size(), plan.zero_point.size(), blocks, n));
    const auto values = weight.data<float>();
    Block block;
    std::tie(block.qmin, block.qmax) = integer_range(plan.type);
    for (int64_t b = 0; b < blocks; ++b)
        for (int64_t col = 0; col < n; ++col) {
            block.w.clear();
            for (int64_t row = b * size; row < std::min(k, (b + 1) * size); ++row)
                block.w.push_back(values[static_cast<size_t>(row * n + col)]);
            double squares = 0;
            for (float x : block.w) squares += static_cast<double>(x) * x;
            const auto rms = static_cast<float>(std::sqrt(squares / static_cast<double>(block.w.size())));
            block.importance.resize(block.w.size());
            for (size_t i = 0; i < block.w.size(); ++i) block.importance[i] = rms + std::abs(block.w[i]);
            visit(block, static_cast<size_t>(b * n + col));  // scales are [blocks, N]
        }
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
