#include "rounding_step.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <span>
#include <utility>

namespace vaiq {

namespace {

// e^x: x = n ln 2 + r with |r| <= ln 2 / 2, e^r by Cephes' expf polynomial, 2^n
// in the exponent bits. x is clamped to [-87, 88]: e^-87 (1.6e-38) stands for
// anything smaller, which the step only adds to 1 or multiplies by small factors.
[[gnu::always_inline]] inline float exp_of(float x) {
    constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and taking it away rounds to an integer
    const float clamped = std::min(std::max(x, -87.0f), 88.0f);
    const float n = (clamped * 1.44269504088896341f + kRound) - kRound;
    const float r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

// ln x for x > 0: x = m 2^e with m in [sqrt(1/2), sqrt(2)), ln m by Cephes'
// logf polynomial. ln 0 comes out near -88 (the exponent field's -127), which
// exp_of takes to e^-87 after the step's factor of at least 1.
[[gnu::always_inline]] inline float log_of(float x) {
    const auto bits = std::bit_cast<int32_t>(x);
    float e = static_cast<float>(((bits >> 23) & 0xff) - 127);
    float m = std::bit_cast<float>((bits & 0x007fffff) | 0x3f800000);  // [1, 2)
    const bool high = m > 1.41421356f;
    m = high ? m * 0.5f : m;
    e = high ? e + 1.0f : e;
    const float f = m - 1.0f, z = f * f;
    float y = 7.0376836292e-2f;
    y = y * f - 1.1514610310e-1f;
    y = y * f + 1.1676998740e-1f;
    y = y * f - 1.2420140846e-1f;
    y = y * f + 1.4249322787e-1f;
    y = y * f - 1.6668057665e-1f;
    y = y * f + 2.0000714765e-1f;
    y = y * f - 2.4999993993e-1f;
    y = y * f + 3.3333331174e-1f;
    y = y * f * z - 2.12194440e-4f * e - 0.5f * z;
    return f + y + 0.693359375f * e;
}

// (The arrays are read into restrict locals first: through `s`, each store
// could have changed the pointers as far as the compiler knows.)
[[gnu::always_inline]] inline void weights_rows(const RoundingStep& s, int64_t first, int64_t last,
                                                float* __restrict w) {
    constexpr float kStretch = kAdaRoundZeta - kAdaRoundGamma;
    const float* __restrict param = s.param;
    const float* __restrict base = s.base;
    float* __restrict sigs = s.sig;
    float* __restrict hs = s.h;
    float* __restrict qs = s.q;
    for (int64_t r = first; r < last; ++r) {
        const float scale = s.scale[r], zero = s.zero[r], lo = s.qmin - zero, hi = s.qmax - zero;
        const int64_t begin = r * s.k, end = begin + s.k;
        if (s.adaround) {
            for (int64_t i = begin; i < end; ++i) {
                const float sig = 1.0f / (1.0f + exp_of(-param[i]));
                const float h = sig * kStretch + kAdaRoundGamma;
                const float q = base[i] + std::min(std::max(h, 0.0f), 1.0f);
                sigs[i] = sig, hs[i] = h, qs[i] = q;
                w[i] = std::min(std::max(q, lo), hi) * scale;
            }
        } else {
            for (int64_t i = begin; i < end; ++i) {
                const float q = std::nearbyint(param[i] / scale);
                qs[i] = q;
                w[i] = std::min(std::max(q, lo), hi) * scale;
            }
        }
    }
}

[[gnu::always_inline]] inline void update_rows(const RoundingStep& s, int64_t first, int64_t last,
                                               float* __restrict grad, float beta, float reg, Adam& adam) {
    constexpr float kStretch = kAdaRoundZeta - kAdaRoundGamma;
    const float pull = reg * beta * 2.0f;
    const float* __restrict qs = s.q;
    const float* __restrict hs = s.h;
    const float* __restrict sigs = s.sig;
    for (int64_t r = first; r < last; ++r) {
        const float scale = s.scale[r], zero = s.zero[r], lo = s.qmin - zero, hi = s.qmax - zero;
        const int64_t begin = r * s.k, end = begin + s.k;
        if (!s.adaround) {  // straight through the rounding, not through the clipping
            for (int64_t i = begin; i < end; ++i) grad[i] = (qs[i] >= lo) & (qs[i] <= hi) ? grad[i] : 0.0f;
            continue;
        }
        // d/dh of the loss, through the grid where the value lies inside the range ...
        auto through = [&](int64_t i) {
            const float h = hs[i], sig = sigs[i];
            const float d = (qs[i] >= lo) & (qs[i] <= hi) ? grad[i] * scale : 0.0f;
            return std::pair(d, (h > 0.0f) & (h < 1.0f) ? kStretch * sig * (1.0f - sig) : 0.0f);
        };
        if (beta <= 0) {
            for (int64_t i = begin; i < end; ++i) {
                const auto [d, dh] = through(i);
                grad[i] = d * dh;
            }
            continue;
        }
        // ... and of reg * (1 - |2h - 1|^beta): |t|^(beta - 1) as exp((beta - 1) ln |t|)
        for (int64_t i = begin; i < end; ++i) {
            const auto [d, dh] = through(i);
            const float t = 2.0f * std::min(std::max(hs[i], 0.0f), 1.0f) - 1.0f;
            const float power = exp_of((beta - 1.0f) * log_of(std::abs(t)));
            grad[i] = (d - pull * (t < 0.0f ? -power : power)) * dh;
        }
    }
    const auto begin = static_cast<size_t>(first * s.k), count = static_cast<size_t>((last - first) * s.k);
    adam.update(std::span<float>(s.param + begin, count), std::span<const float>(grad + begin, count), begin);
}

// One copy of each loop per instruction set: `flatten` inlines the whole body,
// Adam's loop too, into each, which then vectorises for its registers.
[[gnu::target("avx512f,avx512dq,avx512vl,fma"), gnu::flatten]] void weights_avx512(const RoundingStep& s, int64_t first,
                                                                                   int64_t last, float* w) {
    weights_rows(s, first, last, w);
}
[[gnu::target("avx2,fma"), gnu::flatten]] void weights_avx2(const RoundingStep& s, int64_t first, int64_t last,
                                                            float* w) {
    weights_rows(s, first, last, w);
}
[[gnu::flatten]] void weights_baseline(const RoundingStep& s, int64_t first, int64_t last, float* w) {
    weights_rows(s, first, last, w);
}
[[gnu::target("avx512f,avx512dq,avx512vl,fma"), gnu::flatten]] void update_avx512(const RoundingStep& s, int64_t first,
                                                                                  int64_t last, float* grad, float beta,
                                                                                  float reg, Adam& adam) {
    update_rows(s, first, last, grad, beta, reg, adam);
}
[[gnu::target("avx2,fma"), gnu::flatten]] void update_avx2(const RoundingStep& s, int64_t first, int64_t last,
                                                           float* grad, float beta, float reg, Adam& adam) {
    update_rows(s, first, last, grad, beta, reg, adam);
}
[[gnu::flatten]] void update_baseline(const RoundingStep& s, int64_t first, int64_t last, float* grad, float beta,
                                      float reg, Adam& adam) {
    update_rows(s, first, last, grad, beta, reg, adam);
}

enum class Isa { Baseline, Avx2, Avx512 };
Isa best_isa() {
    static const Isa isa =
        __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")
            ? Isa::Avx512
        : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? Isa::Avx2
                                                                          : Isa::Baseline;
    return isa;
}

}  // namespace

void RoundingStep::weights(int64_t first, int64_t last, float* w) const {
    switch (best_isa()) {
        case Isa::Avx512: return weights_avx512(*this, first, last, w);
        case Isa::Avx2: return weights_avx2(*this, first, last, w);
        case Isa::Baseline: return weights_baseline(*this, first, last, w);
    }
}

void RoundingStep::update(int64_t first, int64_t last, float* grad, float beta, float reg, Adam& adam) const {
    switch (best_isa()) {
        case Isa::Avx512: return update_avx512(*this, first, last, grad, beta, reg, adam);
        case Isa::Avx2: return update_avx2(*this, first, last, grad, beta, reg, adam);
        case Isa::Baseline: return update_baseline(*this, first, last, grad, beta, reg, adam);
    }
}

void RoundingStep::decided(int64_t rows, float* w) const {
    for (int64_t r = 0; r < rows; ++r) {
        const float lo = qmin - zero[r], hi = qmax - zero[r];
        for (int64_t i = r * k; i < (r + 1) * k; ++i) {
            const float q = adaround ? base[i] + (param[i] >= 0.0f ? 1.0f : 0.0f) : std::nearbyint(param[i] / scale[r]);
            w[i] = std::min(std::max(q, lo), hi) * scale[r];
        }
    }
}

float exp_approx(float x) { return exp_of(x); }
float log_approx(float x) { return log_of(x); }

}  // namespace vaiq
