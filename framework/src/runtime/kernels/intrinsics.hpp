// <immintrin.h> for the kernels' vector paths, and the AVX2 stand-ins for
// AVX-512's 8-bit narrowing that several kernels share.
#pragma once

#include <cstdint>
#include <cstring>

#include "sdk/vector_intrinsics.hpp"

namespace vaiq::runtime {

/// Eight int32 lanes, each within a byte's range, stored as their low bytes:
/// AVX-512's vpmovdb truncation, for CPUs with AVX2 only.
[[gnu::target("avx2")]] inline void store_low_bytes_avx2(__m256i v, void* out) {
    const __m256i low_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12,
                                               -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i bytes = _mm256_shuffle_epi8(v, low_bytes);
    const auto first = static_cast<uint32_t>(_mm256_extract_epi32(bytes, 0)),
               second = static_cast<uint32_t>(_mm256_extract_epi32(bytes, 4));
    std::memcpy(out, &first, 4);
    std::memcpy(static_cast<unsigned char*>(out) + 4, &second, 4);
}

/// quantize_8_bit (common.hpp) on eight values already scaled: clamped to
/// +-2^21 (a NaN becomes the lower bound, as max returns its second operand),
/// rounded half to even by adding and taking off 1.5 * 2^23, plus the zero
/// point, saturated to [q_min, q_max] and stored as bytes.
[[gnu::target("avx2")]] inline void quantize_8_avx2(__m256 scaled, __m256i zero_point, __m256i q_min, __m256i q_max,
                                                    void* out) {
    const __m256 lo = _mm256_set1_ps(-2097152.0f), hi = _mm256_set1_ps(2097152.0f);
    const __m256 round = _mm256_set1_ps(12582912.0f);
    const __m256 v = _mm256_min_ps(_mm256_max_ps(scaled, lo), hi);
    const __m256i q = _mm256_add_epi32(_mm256_cvttps_epi32(_mm256_sub_ps(_mm256_add_ps(v, round), round)), zero_point);
    store_low_bytes_avx2(_mm256_min_epi32(_mm256_max_epi32(q, q_min), q_max), out);
}

}  // namespace vaiq::runtime
