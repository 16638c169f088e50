// Weights the block-grid tests fit: heavy-tailed values and the plan round to
// nearest gives them.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "vaiq/quant.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq::test {

// [k, n] values of a Student t with 3 degrees of freedom: mostly small, a few large.
inline Tensor heavy_tailed(int64_t k, int64_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::student_t_distribution<float> t(3.0f);
    std::vector<float> v(static_cast<size_t>(k * n));
    for (auto& x : v) x = 0.02f * t(rng);
    return Tensor::from_values<float>({k, n}, v);
}

// Unsigned 4-bit blocks along K, each with its extremes' grid (round to nearest,
// as the plan gives it; the range holds 0, as ONNX Runtime's).
inline QuantParams extremes_plan(const Tensor& w, int64_t block) {
    const int64_t k = w.shape()[0], n = w.shape()[1], blocks = (k + block - 1) / block;
    QuantParams p(QuantType::QUInt4, {}, {}, 0);
    p.block_size = block;
    p.block_shape = {blocks, n};
    for (int64_t b = 0; b < blocks; ++b)
        for (int64_t c = 0; c < n; ++c) {
            float lo = 0, hi = 0;
            for (int64_t r = b * block; r < std::min(k, (b + 1) * block); ++r) {
                lo = std::min(lo, w.data<float>()[static_cast<size_t>(r * n + c)]);
                hi = std::max(hi, w.data<float>()[static_cast<size_t>(r * n + c)]);
            }
            p.scale.push_back((hi - lo) / 15.0f);
            p.zero_point.push_back(static_cast<int64_t>(std::nearbyint(-lo / ((hi - lo) / 15.0f))));
        }
    return p;
}

}  // namespace vaiq::test
