// The blocks of a weight-only MatMul weight W [K, N] quantized in blocks along
// K, one (block, column) at a time, as HQQ and k-quant fit them.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <string_view>
#include <vector>

#include "vaiq/error.hpp"
#include "vaiq/quant.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {

/// Calls `visit(values, param)` for each block's values (the last one may be
/// shorter) with the index of its scale (scales are [blocks, N]). Throws
/// InputError, naming `algorithm`, for a weight or plan of another form.
template <typename Visit>
void for_each_weight_block(const Tensor& weight, const QuantParams& plan, std::string_view algorithm, Visit&& visit) {
    const auto& shape = weight.shape();
    if (shape.size() != 2 || plan.axis != 0 || plan.block_size <= 0 || !is_integer(plan.type) ||
        quant_bits(plan.type) > 8)
        throw InputError(
            fmt::format("{} takes a weight [K, N] quantized in blocks along K at 8 bits or fewer", algorithm));
    const int64_t k = shape[0], n = shape[1], size = plan.block_size, blocks = (k + size - 1) / size;
    if (static_cast<int64_t>(plan.scale.size()) != blocks * n || plan.zero_point.size() != plan.scale.size())
        throw InputError(fmt::format("{}: {} scales and {} zero points for a weight of {} blocks and {} columns",
                                     algorithm, plan.scale.size(), plan.zero_point.size(), blocks, n));
    const auto values = weight.data<float>();
    std::vector<float> w;
    for (int64_t b = 0; b < blocks; ++b)
        for (int64_t col = 0; col < n; ++col) {
            w.clear();
            for (int64_t row = b * size; row < std::min(k, (b + 1) * size); ++row)
                w.push_back(values[static_cast<size_t>(row * n + col)]);
            visit(static_cast<const std::vector<float>&>(w), static_cast<size_t>(b * n + col));
        }
}

}  // namespace vaiq
