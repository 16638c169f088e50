#include "runtime/kernels/ort_softmax.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>

namespace vaiq::runtime {

namespace {

// MLAS's exp constants (range reduction by ln 2 in two parts, degree-6 polynomial).
constexpr float kLowerRange = -103.9720840454f;
constexpr float kRoundingBias = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
constexpr float kLog2Reciprocal = 1.44269504088896341f;
constexpr float kLog2High = -6.93145752e-1f;
constexpr float kLog2Low = -1.42860677e-6f;
constexpr float kPoly0 = 0x1.694000p-10f;
constexpr float kPoly1 = 0x1.125edcp-7f;
constexpr float kPoly2 = 0x1.555b5ap-5f;
constexpr float kPoly3 = 0x1.555450p-3f;
constexpr float kPoly4 = 0x1.fffff6p-2f;
constexpr float kPoly56 = 0x1.000000p+0f;

// One lane of MLAS's AVX-512 sum-exp kernel: every step a fused multiply-add.
[[gnu::always_inline]] inline float exp_lane(float v, float negative_maximum) {
    float x = std::max(kLowerRange, v + negative_maximum);
    const float m = std::fma(x, kLog2Reciprocal, kRoundingBias) - kRoundingBias;
    x = std::fma(m, kLog2High, x);
    x = std::fma(m, kLog2Low, x);
    float p = kPoly0;
    p = std::fma(p, x, kPoly1);
    p = std::fma(p, x, kPoly2);
    p = std::fma(p, x, kPoly3);
    p = std::fma(p, x, kPoly4);
    p = std::fma(p, x, kPoly56);
    p = std::fma(p, x, kPoly56);
    // vscalefps: p * 2^m with one rounding. m is in [-150, 0]; scaling by 2^(m + 64)
    // is exact, and the final 2^-64 rounds once if the result is subnormal.
    const auto biased = static_cast<uint32_t>(static_cast<int32_t>(m) + 64 + 127) << 23;
    return (p * std::bit_cast<float>(biased)) * 0x1p-64f;
}

[[gnu::always_inline]] inline float sum_exp(const float* in, float* out, int64_t n, float negative_maximum) {
    // Element j adds into lane j % 16, in order; then the lanes fold as the kernel's
    // reduction does: halves, then pairs within 128-bit lanes, then the two quads.
    for (int64_t j = 0; j < n; ++j) out[j] = exp_lane(in[j], negative_maximum);
    float acc[16] = {};
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
        for (int l = 0; l < 16; ++l) acc[l] += out[j + l];
    for (int l = 0; j + l < n; ++l) acc[l] += out[j + l];
    float a[8];
    for (int i = 0; i < 8; ++i) a[i] = acc[i + 8] + acc[i];
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

[[gnu::target("fma")]] float sum_exp_fma(const float* in, float* out, int64_t n, float negative_maximum) {
    return sum_exp(in, out, n, negative_maximum);
}

float sum_exp_generic(const float* in, float* out, int64_t n, float negative_maximum) {
    return sum_exp(in, out, n, negative_maximum);
}

}  // namespace

float ort_sum_exp(const float* in, float* out, int64_t n, float negative_maximum) {
    // std::fma is exact either way; the FMA instruction only makes it fast.
    static const bool has_fma = __builtin_cpu_supports("fma");
    return has_fma ? sum_exp_fma(in, out, n, negative_maximum) : sum_exp_generic(in, out, n, negative_maximum);
}

}  // namespace vaiq::runtime
