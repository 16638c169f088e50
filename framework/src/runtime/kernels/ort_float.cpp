#include "runtime/kernels/ort_float.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "runtime/cpu_features.hpp"
#include "runtime/kernels/intrinsics.hpp"
#include "runtime/parallel_for.hpp"

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

// std::fma is exact either way; the FMA instruction only makes it fast.
bool has_fma() { return cpu_features().fma; }

// MLAS's erf constants.
constexpr float kErfUpperAbsRange = 3.725f;
constexpr float kErfSplitBoundary = 0.921875f;
constexpr float kErfSmall[] = {-5.99104969e-4f, 4.99339588e-3f,  -2.67667342e-2f,
                               1.12818025e-1f,  -3.76124859e-1f, 1.28379151e-1f};
constexpr float kErfBig[] = {1.72948930e-5f, -3.83208680e-4f, 3.88393435e-3f, -2.42545605e-2f,
                             1.06777847e-1f, 6.34846687e-1f,  1.28717512e-1f};
constexpr float kErfExpLowerRange = -88.3762626647949f;
constexpr float kErfExpC = 1.25829120e+7f;
constexpr float kErfExp[] = {1.38319808e-3f, 8.37550033e-3f, 4.16689515e-2f, 1.66664466e-1f,
                             4.99999851e-1f, 1.00000000e+0f, 1.00000000e+0f};

// One lane of MLAS's FMA3 erf kernel: both branches, merged by bits as it does.
[[gnu::always_inline]] inline float erf_lane(float x) {
    const uint32_t sign = std::bit_cast<uint32_t>(x) & 0x80000000u;
    const float a = std::min(std::bit_cast<float>(std::bit_cast<uint32_t>(x) & 0x7fffffffu), kErfUpperAbsRange);
    const float s = a * a;
    float small = kErfSmall[0];
    for (int i = 1; i < 6; ++i) small = std::fma(small, s, kErfSmall[i]);
    small = std::fma(small, a, a);
    const bool big_lane = kErfSplitBoundary <= a;
    const float b = big_lane ? a : 0.0f;
    float big = kErfBig[0];
    for (int i = 1; i < 7; ++i) big = std::fma(big, b, kErfBig[i]);
    big = std::fma(big, b, b);
    const float e = std::max(-big, kErfExpLowerRange);
    const float r = std::fma(kLog2Reciprocal, e, kErfExpC) - kErfExpC;
    float f = std::fma(kLog2High, r, e);
    f = std::fma(r, kLog2Low, f);
    float y = kErfExp[0];
    for (int i = 1; i < 7; ++i) y = std::fma(y, f, kErfExp[i]);
    y *= std::bit_cast<float>(static_cast<uint32_t>(static_cast<int32_t>(r) + 127) << 23);
    y = 1.0f - y;
    const uint32_t merged = std::bit_cast<uint32_t>(y) | (big_lane ? 0u : std::bit_cast<uint32_t>(small));
    return std::bit_cast<float>(merged | sign);
}

// One lane of MLAS's AVX-512 erf (its Erf and GELU kernels): the FMA3 kernel's
// polynomials with a wider clamp (3.925), a strict split and the exponent
// applied by scaling.
[[gnu::always_inline]] inline float erf_lane_avx512(float x) {
    // Branch-free, both halves computed, so that the loops around it vectorize.
    const uint32_t sign = std::bit_cast<uint32_t>(x) & 0x80000000u;
    const float a = std::min(3.925f, std::bit_cast<float>(std::bit_cast<uint32_t>(x) & 0x7fffffffu));
    const float s = a * a;
    float small = kErfSmall[0];
#pragma GCC unroll 8
    for (int i = 1; i < 6; ++i) small = std::fma(small, s, kErfSmall[i]);
    small = std::fma(small, a, a);
    float big = kErfBig[0];
#pragma GCC unroll 8
    for (int i = 1; i < 7; ++i) big = std::fma(big, a, kErfBig[i]);
    big = std::fma(big, a, a);
    const float e = std::max(kErfExpLowerRange, -big);
    const float r = std::fma(kLog2Reciprocal, e, kErfExpC) - kErfExpC;
    float f = std::fma(r, kLog2High, e);
    f = std::fma(r, kLog2Low, f);
    float y = kErfExp[0];
#pragma GCC unroll 8
    for (int i = 1; i < 7; ++i) y = std::fma(y, f, kErfExp[i]);
    // y * 2^r as MLAS's scalef computes it: r is a whole number in [-128, 0]; where 2^r
    // is below float's normal range y * 2^r is far below 2^-24, which 1 - y rounds away.
    const auto exponent = static_cast<int32_t>(r) + 127;
    y *= std::bit_cast<float>(static_cast<uint32_t>(std::max(exponent, 0)) << 23);
    const float complement = 1.0f - y;  // computed in every lane, so the select needs no branch
    const float result = a > kErfSplitBoundary ? complement : small;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(result) | sign);
}

[[gnu::always_inline]] inline void erf_rows(const float* in, float* out, int64_t n) {
    for (int64_t j = 0; j < n; ++j) out[j] = erf_lane(in[j]);
}

[[gnu::target("fma")]] void erf_fma(const float* in, float* out, int64_t n) { erf_rows(in, out, n); }
// Eight lanes of erf_lane, in the same operations (the kernel is elementwise,
// so the width changes no bit); min/max take their operands in the order that
// keeps a NaN as std::min/max do.
[[gnu::target("avx2,fma")]] inline __m256 erf8_avx2(__m256 x) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 sign = _mm256_andnot_ps(magnitude, x);
    const __m256 a = _mm256_min_ps(_mm256_set1_ps(kErfUpperAbsRange), _mm256_and_ps(x, magnitude));
    const __m256 s = _mm256_mul_ps(a, a);
    __m256 small = _mm256_set1_ps(kErfSmall[0]);
    for (int i = 1; i < 6; ++i) small = _mm256_fmadd_ps(small, s, _mm256_set1_ps(kErfSmall[i]));
    small = _mm256_fmadd_ps(small, a, a);
    const __m256 big_lane = _mm256_cmp_ps(_mm256_set1_ps(kErfSplitBoundary), a, _CMP_LE_OQ);
    const __m256 b = _mm256_and_ps(big_lane, a);
    __m256 big = _mm256_set1_ps(kErfBig[0]);
    for (int i = 1; i < 7; ++i) big = _mm256_fmadd_ps(big, b, _mm256_set1_ps(kErfBig[i]));
    big = _mm256_fmadd_ps(big, b, b);
    const __m256 e = _mm256_max_ps(_mm256_set1_ps(kErfExpLowerRange), _mm256_sub_ps(_mm256_setzero_ps(), big));
    const __m256 c = _mm256_set1_ps(kErfExpC);
    const __m256 r = _mm256_sub_ps(_mm256_fmadd_ps(_mm256_set1_ps(kLog2Reciprocal), e, c), c);
    __m256 f = _mm256_fmadd_ps(_mm256_set1_ps(kLog2High), r, e);
    f = _mm256_fmadd_ps(r, _mm256_set1_ps(kLog2Low), f);
    __m256 y = _mm256_set1_ps(kErfExp[0]);
    for (int i = 1; i < 7; ++i) y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(kErfExp[i]));
    const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(r), _mm256_set1_epi32(127)), 23);
    y = _mm256_sub_ps(_mm256_set1_ps(1.0f), _mm256_mul_ps(y, _mm256_castsi256_ps(exponent)));
    return _mm256_or_ps(_mm256_or_ps(y, _mm256_andnot_ps(big_lane, small)), sign);
}

[[gnu::target("avx2,fma")]] void erf_avx2(const float* in, float* out, int64_t n) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(out + j, erf8_avx2(_mm256_loadu_ps(in + j)));
    for (; j < n; ++j) out[j] = erf_lane(in[j]);
}
void erf_generic(const float* in, float* out, int64_t n) { erf_rows(in, out, n); }

constexpr float kInvSqrt2 = 0.70710678118654752440f;

// Sixteen lanes of erf_lane_avx512 with the AVX-512 instructions MLAS's kernel uses
// (min, FMA chains, scalef, a masked blend), so whole blocks run at vector speed.
[[gnu::target("avx512f")]] inline __m512 erf16_avx512(__m512 x) {
    const __m512i sign_bit = _mm512_set1_epi32(static_cast<int>(0x80000000u));
    const __m512i sign = _mm512_and_epi32(_mm512_castps_si512(x), sign_bit);
    const __m512i magnitude = _mm512_and_epi32(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
    const __m512 a = _mm512_min_ps(_mm512_castsi512_ps(magnitude), _mm512_set1_ps(3.925f));
    const __m512 s = _mm512_mul_ps(a, a);
    __m512 small = _mm512_set1_ps(kErfSmall[0]);
    for (int i = 1; i < 6; ++i) small = _mm512_fmadd_ps(small, s, _mm512_set1_ps(kErfSmall[i]));
    small = _mm512_fmadd_ps(small, a, a);
    __m512 big = _mm512_set1_ps(kErfBig[0]);
    for (int i = 1; i < 7; ++i) big = _mm512_fmadd_ps(big, a, _mm512_set1_ps(kErfBig[i]));
    big = _mm512_fmadd_ps(big, a, a);
    const __m512 e = _mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), big), _mm512_set1_ps(kErfExpLowerRange));
    const __m512 c = _mm512_set1_ps(kErfExpC);
    const __m512 r = _mm512_sub_ps(_mm512_fmadd_ps(_mm512_set1_ps(kLog2Reciprocal), e, c), c);
    __m512 f = _mm512_fmadd_ps(r, _mm512_set1_ps(kLog2High), e);
    f = _mm512_fmadd_ps(r, _mm512_set1_ps(kLog2Low), f);
    __m512 y = _mm512_set1_ps(kErfExp[0]);
    for (int i = 1; i < 7; ++i) y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(kErfExp[i]));
    y = _mm512_sub_ps(_mm512_set1_ps(1.0f), _mm512_scalef_ps(y, r));
    const __mmask16 big_lanes = _mm512_cmp_ps_mask(a, _mm512_set1_ps(kErfSplitBoundary), _CMP_GT_OQ);
    const __m512 result = _mm512_mask_blend_ps(big_lanes, small, y);
    return _mm512_castsi512_ps(_mm512_or_epi32(_mm512_castps_si512(result), sign));
}

// MLAS's GELU on AVX-512: 16-lane blocks with its own erf, the rest with the C library's erff.
[[gnu::target("avx512f,fma")]] void gelu_avx512(const float* in, float* out, int64_t n) {
    const int64_t blocks = n / 16 * 16;
    const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f), inv_sqrt2 = _mm512_set1_ps(kInvSqrt2);
    for (int64_t j = 0; j < blocks; j += 16) {
        const __m512 x = _mm512_loadu_ps(in + j);
        const __m512 erf = erf16_avx512(_mm512_mul_ps(x, inv_sqrt2));
        _mm512_storeu_ps(out + j, _mm512_mul_ps(_mm512_mul_ps(half, x), _mm512_add_ps(erf, one)));
    }
    for (int64_t j = blocks; j < n; ++j) out[j] = 0.5f * in[j] * (std::erf(in[j] * kInvSqrt2) + 1.0f);
}

// exp_lane on sixteen lanes: vscalefps itself does the final scaling.
[[gnu::target("avx512f")]] inline __m512 exp16_avx512(__m512 v, __m512 negative_maximum) {
    const __m512 bias = _mm512_set1_ps(kRoundingBias);
    __m512 x = _mm512_max_ps(_mm512_set1_ps(kLowerRange), _mm512_add_ps(v, negative_maximum));
    const __m512 m = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(kLog2Reciprocal), bias), bias);
    x = _mm512_fmadd_ps(m, _mm512_set1_ps(kLog2High), x);
    x = _mm512_fmadd_ps(m, _mm512_set1_ps(kLog2Low), x);
    __m512 p = _mm512_set1_ps(kPoly0);
    for (const float c : {kPoly1, kPoly2, kPoly3, kPoly4, kPoly56, kPoly56})
        p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(c));
    return _mm512_scalef_ps(p, m);
}

// sum_exp with whole vectors; the last partial block is masked (its missing
// lanes add nothing), so each lane sums the same elements in the same order.
[[gnu::target("avx512f")]] float sum_exp_avx512(const float* in, float* out, int64_t n, float negative_maximum) {
    const __m512 shift = _mm512_set1_ps(negative_maximum);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 live = n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1);
        const __m512 e = exp16_avx512(_mm512_maskz_loadu_ps(live, in + j), shift);
        _mm512_mask_storeu_ps(out + j, live, e);
        acc = _mm512_mask_add_ps(acc, live, acc, e);
    }
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc);
    float a[8];
    for (int i = 0; i < 8; ++i) a[i] = lanes[i + 8] + lanes[i];
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

[[gnu::target("avx512f,fma")]] void erf_avx512(const float* in, float* out, int64_t n) {
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) _mm512_storeu_ps(out + j, erf16_avx512(_mm512_loadu_ps(in + j)));
    for (; j < n; ++j) out[j] = erf_lane_avx512(in[j]);  // the same arithmetic, one lane at a time
}

// MLAS's logistic (its FMA3 kernel, on CPUs with AVX2 and up): x clamped to
// [-18, 18], x p(x^2) / q(x^2) + 1/2 with Eigen's coefficients, no less than 0.
constexpr float kLogisticAlpha[] = {4.37031012579801e-11f, 1.15627324459942e-07f, 6.08574864600143e-05f,
                                    8.51377133304701e-03f, 2.48287947061529e-01f};
constexpr float kLogisticBeta[] = {6.10247389755681e-13f, 5.76102136993427e-09f, 6.29106785017040e-06f,
                                   1.70198817374094e-03f, 1.16817656904453e-01f, 9.93151921023180e-01f};

// The comparisons keep a NaN, as the kernel's max/min instructions return their second operand then.
[[gnu::always_inline]] inline float logistic_lane(float x, bool fused) {
    const float low = x < -18.0f ? -18.0f : x;
    const float v = low > 18.0f ? 18.0f : low;
    const float v2 = v * v;
    auto multiply_add = [fused](float a, float b, float c) { return fused ? std::fma(a, b, c) : a * b + c; };
    float p = multiply_add(v2, kLogisticAlpha[0], kLogisticAlpha[1]);
#pragma GCC unroll 4
    for (int i = 2; i < 5; ++i) p = multiply_add(p, v2, kLogisticAlpha[i]);
    p = v * p;
    float q = multiply_add(v2, kLogisticBeta[0], kLogisticBeta[1]);
#pragma GCC unroll 4
    for (int i = 2; i < 6; ++i) q = multiply_add(q, v2, kLogisticBeta[i]);
    const float r = p / q + 0.5f;
    if (fused) return r < 0.0f ? 0.0f : r;
    return r < 0.0f ? 0.0f : (r > 1.0f ? 1.0f : r);  // the SSE2 kernel clamps to [0, 1]
}

// Sixteen lanes of logistic_lane(x, true), each max/min with the operand order
// that keeps a NaN as its comparisons do.
[[gnu::target("avx512f,fma")]] void logistic_avx512(const float* in, float* out, int64_t n) {
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        const __m512 v =
            _mm512_min_ps(_mm512_set1_ps(18.0f), _mm512_max_ps(_mm512_set1_ps(-18.0f), _mm512_loadu_ps(in + j)));
        const __m512 v2 = _mm512_mul_ps(v, v);
        __m512 p = _mm512_fmadd_ps(v2, _mm512_set1_ps(kLogisticAlpha[0]), _mm512_set1_ps(kLogisticAlpha[1]));
        for (int i = 2; i < 5; ++i) p = _mm512_fmadd_ps(p, v2, _mm512_set1_ps(kLogisticAlpha[i]));
        p = _mm512_mul_ps(v, p);
        __m512 q = _mm512_fmadd_ps(v2, _mm512_set1_ps(kLogisticBeta[0]), _mm512_set1_ps(kLogisticBeta[1]));
        for (int i = 2; i < 6; ++i) q = _mm512_fmadd_ps(q, v2, _mm512_set1_ps(kLogisticBeta[i]));
        const __m512 r = _mm512_add_ps(_mm512_div_ps(p, q), _mm512_set1_ps(0.5f));
        _mm512_storeu_ps(out + j, _mm512_max_ps(_mm512_setzero_ps(), r));
    }
    for (; j < n; ++j) out[j] = logistic_lane(in[j], true);
}
// Eight lanes of logistic_lane(x, true), each max/min with the operand order
// that keeps a NaN as its comparisons do.
[[gnu::target("avx2,fma")]] void logistic_avx2(const float* in, float* out, int64_t n) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 v =
            _mm256_min_ps(_mm256_set1_ps(18.0f), _mm256_max_ps(_mm256_set1_ps(-18.0f), _mm256_loadu_ps(in + j)));
        const __m256 v2 = _mm256_mul_ps(v, v);
        __m256 p = _mm256_fmadd_ps(v2, _mm256_set1_ps(kLogisticAlpha[0]), _mm256_set1_ps(kLogisticAlpha[1]));
        for (int i = 2; i < 5; ++i) p = _mm256_fmadd_ps(p, v2, _mm256_set1_ps(kLogisticAlpha[i]));
        p = _mm256_mul_ps(v, p);
        __m256 q = _mm256_fmadd_ps(v2, _mm256_set1_ps(kLogisticBeta[0]), _mm256_set1_ps(kLogisticBeta[1]));
        for (int i = 2; i < 6; ++i) q = _mm256_fmadd_ps(q, v2, _mm256_set1_ps(kLogisticBeta[i]));
        const __m256 r = _mm256_add_ps(_mm256_div_ps(p, q), _mm256_set1_ps(0.5f));
        _mm256_storeu_ps(out + j, _mm256_max_ps(_mm256_setzero_ps(), r));
    }
    for (; j < n; ++j) out[j] = logistic_lane(in[j], true);
}
[[gnu::target("fma")]] void logistic_fma(const float* in, float* out, int64_t n) {
    for (int64_t j = 0; j < n; ++j) out[j] = logistic_lane(in[j], true);
}
// Without FMA: separate multiplies and adds (the SSE2 kernel's arithmetic).
void logistic_generic(const float* in, float* out, int64_t n) {
    for (int64_t j = 0; j < n; ++j) out[j] = logistic_lane(in[j], false);
}

// MLAS's tanh: x clamped to [-9, 9], x p(x^2) / q(x^2) with Eigen's coefficients.
constexpr float kTanhAlpha[] = {-2.76076847742355e-16f, 2.00018790482477e-13f, -8.60467152213735e-11f,
                                5.12229709037114e-08f,  1.48572235717979e-05f, 6.37261928875436e-04f,
                                4.89352455891786e-03f};
constexpr float kTanhBeta[] = {1.19825839466702e-06f, 1.18534705686654e-04f, 2.26843463243900e-03f,
                               4.89352518554385e-03f};

// The comparisons keep a NaN, as the scalar kernel's do.
[[gnu::always_inline]] inline float tanh_lane(float x, bool fused) {
    const float low = x < -9.0f ? -9.0f : x;
    const float v = low > 9.0f ? 9.0f : low;
    const float v2 = v * v;
    auto multiply_add = [fused](float a, float b, float c) { return fused ? std::fma(a, b, c) : a * b + c; };
    float p = multiply_add(v2, kTanhAlpha[0], kTanhAlpha[1]);
#pragma GCC unroll 6
    for (int i = 2; i < 7; ++i) p = multiply_add(p, v2, kTanhAlpha[i]);
    p = p * v;
    float q = multiply_add(v2, kTanhBeta[0], kTanhBeta[1]);
#pragma GCC unroll 3
    for (int i = 2; i < 4; ++i) q = multiply_add(q, v2, kTanhBeta[i]);
    return p / q;
}

// Sixteen, then eight lanes of tanh_lane(x, true); max/min keep a NaN as its comparisons do.
[[gnu::target("avx512f,fma")]] void tanh_avx512(const float* in, float* out, int64_t n) {
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        const __m512 v =
            _mm512_min_ps(_mm512_set1_ps(9.0f), _mm512_max_ps(_mm512_set1_ps(-9.0f), _mm512_loadu_ps(in + j)));
        const __m512 v2 = _mm512_mul_ps(v, v);
        __m512 p = _mm512_fmadd_ps(v2, _mm512_set1_ps(kTanhAlpha[0]), _mm512_set1_ps(kTanhAlpha[1]));
        for (int i = 2; i < 7; ++i) p = _mm512_fmadd_ps(p, v2, _mm512_set1_ps(kTanhAlpha[i]));
        p = _mm512_mul_ps(p, v);
        __m512 q = _mm512_fmadd_ps(v2, _mm512_set1_ps(kTanhBeta[0]), _mm512_set1_ps(kTanhBeta[1]));
        for (int i = 2; i < 4; ++i) q = _mm512_fmadd_ps(q, v2, _mm512_set1_ps(kTanhBeta[i]));
        _mm512_storeu_ps(out + j, _mm512_div_ps(p, q));
    }
    for (; j < n; ++j) out[j] = tanh_lane(in[j], true);
}
[[gnu::target("avx2,fma")]] void tanh_avx2(const float* in, float* out, int64_t n) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 v =
            _mm256_min_ps(_mm256_set1_ps(9.0f), _mm256_max_ps(_mm256_set1_ps(-9.0f), _mm256_loadu_ps(in + j)));
        const __m256 v2 = _mm256_mul_ps(v, v);
        __m256 p = _mm256_fmadd_ps(v2, _mm256_set1_ps(kTanhAlpha[0]), _mm256_set1_ps(kTanhAlpha[1]));
        for (int i = 2; i < 7; ++i) p = _mm256_fmadd_ps(p, v2, _mm256_set1_ps(kTanhAlpha[i]));
        p = _mm256_mul_ps(p, v);
        __m256 q = _mm256_fmadd_ps(v2, _mm256_set1_ps(kTanhBeta[0]), _mm256_set1_ps(kTanhBeta[1]));
        for (int i = 2; i < 4; ++i) q = _mm256_fmadd_ps(q, v2, _mm256_set1_ps(kTanhBeta[i]));
        _mm256_storeu_ps(out + j, _mm256_div_ps(p, q));
    }
    for (; j < n; ++j) out[j] = tanh_lane(in[j], true);
}
void tanh_generic(const float* in, float* out, int64_t n) {
    for (int64_t j = 0; j < n; ++j) out[j] = tanh_lane(in[j], false);
}

// ONNX Runtime picks its AVX-512 erf and GELU kernels where the CPU has AVX-512.
bool has_avx512f() { return cpu_features().avx512f; }

[[gnu::always_inline]] inline void layer_norm_row(const float* x, const float* scale, const float* bias, float* y,
                                                  int64_t n, float epsilon, float* mean_out, float* inv_std_out) {
    double lanes[4] = {0, 0, 0, 0};
    const int64_t whole4 = n / 4 * 4, whole8 = n / 8 * 8;
    for (int64_t i = 0; i < whole4; i += 4)
        for (int l = 0; l < 4; ++l) lanes[l] += x[i + l];
    double sum = (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]);
    for (int64_t i = whole4; i < n; ++i) sum += x[i];
    const auto mean = static_cast<float>(sum / static_cast<double>(n));
    float squares[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t i = 0; i < whole8; i += 8)
        for (int l = 0; l < 8; ++l) {
            const float d = x[i + l] - mean;
            squares[l] = std::fma(d, d, squares[l]);
        }
    float four[4];
    for (int l = 0; l < 4; ++l) four[l] = squares[l] + squares[l + 4];
    float sum_squares = (four[0] + four[2]) + (four[1] + four[3]);
    for (int64_t i = whole8; i < n; ++i) {  // the scalar tail rounds the square first
        const float d = x[i] - mean;
        sum_squares += d * d;
    }
    const float inv_std = 1.0f / std::sqrt(sum_squares / static_cast<float>(n) + epsilon);
    for (int64_t i = 0; i < n; ++i) {
        const float normalized = (x[i] - mean) * inv_std;
        y[i] = bias ? std::fma(normalized, scale[i], bias[i]) : normalized * scale[i];
    }
    *mean_out = mean;
    *inv_std_out = inv_std;
}

[[gnu::target("fma")]] void layer_norm_fma(const float* x, const float* scale, const float* bias, float* y, int64_t n,
                                           float epsilon, float* mean_out, float* inv_std_out) {
    layer_norm_row(x, scale, bias, y, n, epsilon, mean_out, inv_std_out);
}
void layer_norm_generic(const float* x, const float* scale, const float* bias, float* y, int64_t n, float epsilon,
                        float* mean_out, float* inv_std_out) {
    layer_norm_row(x, scale, bias, y, n, epsilon, mean_out, inv_std_out);
}

// The number of k values MLAS's SGEMM sums into one panel before adding it to
// C: 128, doubled (up to three times) when B is narrower than it is deep, as it
// widens its K stride for an untransposed A whose N is small.
int64_t sgemm_panel(int64_t k, int64_t n) {
    int64_t panel = 128;
    if (n < k)
        for (int64_t stride_n = 128; stride_n > 16 && stride_n / 2 >= n; stride_n /= 2) panel *= 2;
    return panel;
}

// Each output sums its products panel by panel (`panel` values of k at a
// time), as MLAS does. Blocks of B's columns stay in cache across the rows;
// neither that nor splitting the rows among threads (ort_sgemm) changes any
// output's order of additions.
[[gnu::always_inline]] inline void sgemm_rows(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n,
                                              int64_t panel) {
    constexpr int64_t kColumns = 256;
    float acc[kColumns];
    for (int64_t j0 = 0; j0 < n; j0 += kColumns) {
        const int64_t w = std::min(kColumns, n - j0);
        for (int64_t i = 0; i < m; ++i) {
            float* ci = c + i * n + j0;
            for (int64_t k0 = 0; k0 < k; k0 += panel) {
                std::fill(acc, acc + w, 0.0f);
                const int64_t k1 = std::min(k, k0 + panel);
                for (int64_t p = k0; p < k1; ++p) {
                    const float av = a[i * k + p];
                    const float* bp = b + p * n + j0;
                    for (int64_t j = 0; j < w; ++j) acc[j] = std::fma(av, bp[j], acc[j]);
                }
                if (k0 == 0)
                    std::copy(acc, acc + w, ci);
                else
                    for (int64_t j = 0; j < w; ++j) ci[j] += acc[j];
            }
        }
    }
}

// An R x (16 J) tile of sgemm_rows at (i0, j0), its sums held in registers
// (R and J fixed, so they stay there), each lane summing in the same order. Two
// dimensions of registers: each B vector loaded serves R rows and each A value
// J vectors. `tail`: the lanes of its last vector inside the matrix.
template <int R, int J>
[[gnu::target("avx512f")]] void sgemm_tile_avx512(const float* a, const float* b, float* c, int64_t i0, int64_t j0,
                                                  int64_t k, int64_t n, int64_t panel, int tail) {
    const auto last = static_cast<__mmask16>(tail == 16 ? 0xFFFF : (1u << tail) - 1);
    for (int64_t k0 = 0; k0 < k; k0 += panel) {
        const int64_t k1 = std::min(k, k0 + panel);
        __m512 acc[R][J];
        for (int r = 0; r < R; ++r)
            for (int j = 0; j < J; ++j) acc[r][j] = _mm512_setzero_ps();
        for (int64_t p = k0; p < k1; ++p) {
            __m512 bv[J];
            for (int j = 0; j < J; ++j)
                bv[j] = _mm512_maskz_loadu_ps(j == J - 1 ? last : __mmask16(0xFFFF), b + p * n + j0 + j * 16);
            for (int r = 0; r < R; ++r) {
                const __m512 av = _mm512_set1_ps(a[(i0 + r) * k + p]);
                for (int j = 0; j < J; ++j) acc[r][j] = _mm512_fmadd_ps(av, bv[j], acc[r][j]);
            }
        }
        for (int r = 0; r < R; ++r)
            for (int j = 0; j < J; ++j) {
                const __mmask16 mask = j == J - 1 ? last : __mmask16(0xFFFF);
                float* cr = c + (i0 + r) * n + j0 + j * 16;
                const __m512 sum = k0 == 0 ? acc[r][j] : _mm512_add_ps(_mm512_maskz_loadu_ps(mask, cr), acc[r][j]);
                _mm512_mask_storeu_ps(cr, mask, sum);
            }
    }
}

constexpr int kTileRows = 6, kTileVectors = 4;  // 24 sums in registers

// Tile::run<R, J>(args...) with a tile's row count R (1 to kTileRows) as a constant.
template <typename Tile, int J, typename... Args>
void run_tile(int64_t rows, Args... args) {
    switch (rows) {
        case 6: return Tile::template run<6, J>(args...);
        case 5: return Tile::template run<5, J>(args...);
        case 4: return Tile::template run<4, J>(args...);
        case 3: return Tile::template run<3, J>(args...);
        case 2: return Tile::template run<2, J>(args...);
        default: return Tile::template run<1, J>(args...);
    }
}

struct Avx512Tile {
    static constexpr int kLanes = 16, kVectors = kTileVectors;
    template <int R, int J, typename... Args>
    static void run(Args... args) {
        sgemm_tile_avx512<R, J>(args...);
    }
};

// sgemm_tile_avx512 eight lanes wide, for CPUs with AVX2 but not AVX-512: R x
// (8 J) sums in registers, the same order of additions in each lane.
template <int R, int J>
[[gnu::target("avx2,fma")]] void sgemm_tile_avx2(const float* a, const float* b, float* c, int64_t i0, int64_t j0,
                                                 int64_t k, int64_t n, int64_t panel, int tail) {
    const __m256i all = _mm256_set1_epi32(-1);
    const __m256i last = _mm256_cmpgt_epi32(_mm256_set1_epi32(tail), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int64_t k0 = 0; k0 < k; k0 += panel) {
        const int64_t k1 = std::min(k, k0 + panel);
        __m256 acc[R][J];
        for (int r = 0; r < R; ++r)
            for (int j = 0; j < J; ++j) acc[r][j] = _mm256_setzero_ps();
        for (int64_t p = k0; p < k1; ++p) {
            __m256 bv[J];
            for (int j = 0; j < J; ++j) bv[j] = _mm256_maskload_ps(b + p * n + j0 + j * 8, j == J - 1 ? last : all);
            for (int r = 0; r < R; ++r) {
                const __m256 av = _mm256_broadcast_ss(a + (i0 + r) * k + p);
                for (int j = 0; j < J; ++j) acc[r][j] = _mm256_fmadd_ps(av, bv[j], acc[r][j]);
            }
        }
        for (int r = 0; r < R; ++r)
            for (int j = 0; j < J; ++j) {
                const __m256i mask = j == J - 1 ? last : all;
                float* cr = c + (i0 + r) * n + j0 + j * 8;
                const __m256 sum = k0 == 0 ? acc[r][j] : _mm256_add_ps(_mm256_maskload_ps(cr, mask), acc[r][j]);
                _mm256_maskstore_ps(cr, mask, sum);
            }
    }
}

struct Avx2Tile {
    // 6 x 2 sums in registers, two B vectors and one A value beside them.
    static constexpr int kLanes = 8, kVectors = 2;
    template <int R, int J, typename... Args>
    static void run(Args... args) {
        sgemm_tile_avx2<R, J>(args...);
    }
};

// One or two rows (a matrix-vector product, a recurrent step) in tiles of
// eight vectors: twice the independent sums of the square tiles, which one row
// leaves waiting on each fused multiply-add's latency. Each lane sums in the
// same order as in the square tiles.
void sgemm_wide_avx512(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n, int64_t panel) {
    constexpr int64_t lanes = 16;
    const int64_t wide = m == 1 ? 16 : 8;  // a row of B read whole for one row
    for (int64_t j0 = 0; j0 < n; j0 += lanes * wide) {
        const int64_t columns = std::min<int64_t>(lanes * wide, n - j0);
        const int64_t vectors = (columns + lanes - 1) / lanes;
        const auto tail = static_cast<int>(columns - lanes * (vectors - 1));
        auto run = [&]<int R>() {
            switch (vectors) {
                case 16: return sgemm_tile_avx512<1, 16>(a, b, c, 0, j0, k, n, panel, tail);
                case 15: return sgemm_tile_avx512<1, 15>(a, b, c, 0, j0, k, n, panel, tail);
                case 14: return sgemm_tile_avx512<1, 14>(a, b, c, 0, j0, k, n, panel, tail);
                case 13: return sgemm_tile_avx512<1, 13>(a, b, c, 0, j0, k, n, panel, tail);
                case 12: return sgemm_tile_avx512<1, 12>(a, b, c, 0, j0, k, n, panel, tail);
                case 11: return sgemm_tile_avx512<1, 11>(a, b, c, 0, j0, k, n, panel, tail);
                case 10: return sgemm_tile_avx512<1, 10>(a, b, c, 0, j0, k, n, panel, tail);
                case 9: return sgemm_tile_avx512<1, 9>(a, b, c, 0, j0, k, n, panel, tail);
                case 8: return sgemm_tile_avx512<R, 8>(a, b, c, 0, j0, k, n, panel, tail);
                case 7: return sgemm_tile_avx512<R, 7>(a, b, c, 0, j0, k, n, panel, tail);
                case 6: return sgemm_tile_avx512<R, 6>(a, b, c, 0, j0, k, n, panel, tail);
                case 5: return sgemm_tile_avx512<R, 5>(a, b, c, 0, j0, k, n, panel, tail);
                case 4: return sgemm_tile_avx512<R, 4>(a, b, c, 0, j0, k, n, panel, tail);
                case 3: return sgemm_tile_avx512<R, 3>(a, b, c, 0, j0, k, n, panel, tail);
                case 2: return sgemm_tile_avx512<R, 2>(a, b, c, 0, j0, k, n, panel, tail);
                default: return sgemm_tile_avx512<R, 1>(a, b, c, 0, j0, k, n, panel, tail);
            }
        };
        m == 2 ? run.template operator()<2>() : run.template operator()<1>();
    }
}

// sgemm_rows in Tile's register tiles: kTileRows rows by Tile::kVectors vectors
// of Tile::kLanes columns, the right edge's last vector `tail` lanes wide.
template <typename Tile>
void sgemm_tiles(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n, int64_t panel) {
    if constexpr (Tile::kLanes == 16)
        if (m <= 2) return sgemm_wide_avx512(a, b, c, m, k, n, panel);
    constexpr int64_t lanes = Tile::kLanes;
    for (int64_t j0 = 0; j0 < n; j0 += lanes * Tile::kVectors) {
        const int64_t columns = std::min<int64_t>(lanes * Tile::kVectors, n - j0);
        const int64_t vectors = (columns + lanes - 1) / lanes;
        const auto tail = static_cast<int>(columns - lanes * (vectors - 1));
        for (int64_t i0 = 0; i0 < m; i0 += kTileRows) {
            const int64_t rows = std::min<int64_t>(kTileRows, m - i0);
            switch (vectors) {
                case 4:
                    if constexpr (Tile::kVectors >= 4) run_tile<Tile, 4>(rows, a, b, c, i0, j0, k, n, panel, tail);
                    break;
                case 3:
                    if constexpr (Tile::kVectors >= 3) run_tile<Tile, 3>(rows, a, b, c, i0, j0, k, n, panel, tail);
                    break;
                case 2:
                    if constexpr (Tile::kVectors >= 2) run_tile<Tile, 2>(rows, a, b, c, i0, j0, k, n, panel, tail);
                    break;
                default: run_tile<Tile, 1>(rows, a, b, c, i0, j0, k, n, panel, tail); break;
            }
        }
    }
}

[[gnu::target("fma")]] void sgemm_fma(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n,
                                      int64_t panel) {
    sgemm_rows(a, b, c, m, k, n, panel);
}
void sgemm_generic(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n, int64_t panel) {
    sgemm_rows(a, b, c, m, k, n, panel);
}

[[gnu::target("avx512f")]] float row_max_avx512(const float* x, int64_t n) {
    __m512 best = _mm512_set1_ps(std::numeric_limits<float>::lowest());
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) best = _mm512_max_ps(best, _mm512_loadu_ps(x + j));
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - j)) - 1);
    best = _mm512_mask_max_ps(best, tail, best, _mm512_maskz_loadu_ps(tail, x + j));
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, best);
    return *std::max_element(lanes, lanes + 16);
}

}  // namespace

float ort_row_max(const float* x, int64_t n) {
    if (has_avx512f()) return row_max_avx512(x, n);
    float best = std::numeric_limits<float>::lowest();
    for (int64_t j = 0; j < n; ++j) best = std::max(best, x[j]);
    return best;
}

float ort_sum_exp(const float* in, float* out, int64_t n, float negative_maximum) {
    if (has_avx512f()) return sum_exp_avx512(in, out, n, negative_maximum);
    return has_fma() ? sum_exp_fma(in, out, n, negative_maximum) : sum_exp_generic(in, out, n, negative_maximum);
}

void ort_erf(const float* in, float* out, int64_t n) {
    if (has_avx512f()) return erf_avx512(in, out, n);
    if (has_fma() && cpu_features().avx2) return erf_avx2(in, out, n);
    has_fma() ? erf_fma(in, out, n) : erf_generic(in, out, n);
}

void ort_logistic(const float* in, float* out, int64_t n) {
    if (has_avx512f()) return logistic_avx512(in, out, n);
    if (has_fma() && cpu_features().avx2) return logistic_avx2(in, out, n);
    has_fma() ? logistic_fma(in, out, n) : logistic_generic(in, out, n);
}

void ort_tanh(const float* in, float* out, int64_t n) {
    if (has_avx512f()) return tanh_avx512(in, out, n);
    has_fma() && cpu_features().avx2 ? tanh_avx2(in, out, n) : tanh_generic(in, out, n);
}

void ort_gelu(const float* in, float* out, int64_t n) {
    if (has_avx512f()) return gelu_avx512(in, out, n);
    // Elsewhere: x / sqrt 2, the FMA3 erf, then 0.5 x (erf + 1), a block at a
    // time through a buffer, so that `out` may be `in`.
    constexpr int64_t kBlock = 256;
    float erf[kBlock];
    for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
        const int64_t len = std::min(kBlock, n - j0);
        for (int64_t j = 0; j < len; ++j) erf[j] = in[j0 + j] * kInvSqrt2;
        ort_erf(erf, erf, len);
        for (int64_t j = 0; j < len; ++j) out[j0 + j] = 0.5f * in[j0 + j] * (erf[j] + 1.0f);
    }
}

// Eigen's vectorised sum on a 16-byte aligned row: two packet accumulators over
// blocks of 8, a last packet, the lanes folded as (a0 + a2) + (a1 + a3), then the
// leftover elements one by one.
float ort_row_sum(const float* x, int64_t n) {
    if (n <= 0) return 0.0f;
    if (n < 4) {
        float r = x[0];
        for (int64_t i = 1; i < n; ++i) r += x[i];
        return r;
    }
    const int64_t whole8 = n / 8 * 8, whole4 = n / 4 * 4;
    float p0[4] = {x[0], x[1], x[2], x[3]};
    if (whole4 > 4) {
        float p1[4] = {x[4], x[5], x[6], x[7]};
        for (int64_t i = 8; i < whole8; i += 8)
            for (int l = 0; l < 4; ++l) {
                p0[l] += x[i + l];
                p1[l] += x[i + 4 + l];
            }
        for (int l = 0; l < 4; ++l) p0[l] += p1[l];
        if (whole4 > whole8)
            for (int l = 0; l < 4; ++l) p0[l] += x[whole8 + l];
    }
    float r = (p0[0] + p0[2]) + (p0[1] + p0[3]);
    for (int64_t i = whole4; i < n; ++i) r += x[i];
    return r;
}

void ort_layer_norm_row(const float* x, const float* scale, const float* bias, float* y, int64_t n, float epsilon,
                        float* mean_out, float* inv_std_out) {
    has_fma() ? layer_norm_fma(x, scale, bias, y, n, epsilon, mean_out, inv_std_out)
              : layer_norm_generic(x, scale, bias, y, n, epsilon, mean_out, inv_std_out);
}

void ort_sgemm(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n) {
    if (k == 0) return std::fill(c, c + m * n, 0.0f);  // empty sums: the panels never write
    auto* kernel = has_avx512f()                      ? sgemm_tiles<Avx512Tile>
                   : has_fma() && cpu_features().avx2 ? sgemm_tiles<Avx2Tile>
                   : has_fma()                        ? sgemm_fma
                                                      : sgemm_generic;
    const int64_t panel = sgemm_panel(k, n);
    constexpr int64_t kRows = 16;  // rows per task
    const int64_t tasks = (m + kRows - 1) / kRows;
    parallel_for(tasks, m * k * n > (int64_t{1} << 18), [&](int64_t t) {
        kernel(a + t * kRows * k, b, c + t * kRows * n, std::min(kRows, m - t * kRows), k, n, panel);
    });
}

}  // namespace vaiq::runtime
