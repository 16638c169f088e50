#include "runtime/kernels/int8_depthwise.hpp"

#include "runtime/cpu_features.hpp"
#include "runtime/kernels/intrinsics.hpp"
#include "runtime/parallel_for.hpp"

namespace vaiq::runtime {

// Sixty-four channels at a time. VNNI multiplies four unsigned bytes by four
// signed ones and adds them into each int32 lane, so each lane takes four taps
// of one channel: the taps' vectors are interleaved bytewise by two rounds of
// unpacking, which works within 128-bit lanes. After it, vector k's dword
// 4L + i holds channel 16L + 4k + i (L the 128-bit lane), and packing the four
// vectors of sums back to bytes (also within lanes) restores the channels'
// order. The weights, offsets and multipliers are laid out in that order.
namespace {

constexpr int64_t kBlock = 64;
constexpr int kTaps = 9, kGroups = 3;  // taps 4g..4g+3; the last group has tap 8 alone

// The channel that vector k's dword d holds.
int64_t lane_channel(int k, int d) { return 16 * (d / 4) + 4 * k + d % 4; }

int64_t blocks_of(int64_t c) { return (c + kBlock - 1) / kBlock; }

}  // namespace

bool int8_depthwise_available() { return cpu_features().avx512vnni; }

DepthwiseParameters depthwise_parameters(const int8_t* w, int64_t c, const int32_t* bias,
                                         const std::vector<float>& multiplier, int32_t x_zero_point, bool x_signed) {
    DepthwiseParameters p;
    const int64_t blocks = blocks_of(c);
    // Signed inputs are read with their sign bit flipped (x + 128 as unsigned), their zero point with them.
    const int32_t zero = x_signed ? x_zero_point + 128 : x_zero_point;
    p.weights.assign(static_cast<size_t>(blocks * kGroups * 4 * 64), 0);
    p.offsets.assign(static_cast<size_t>(blocks * 4 * 16), 0);
    p.multipliers.assign(p.offsets.size(), 0.0f);
    for (int64_t b = 0; b < blocks; ++b)
        for (int k = 0; k < 4; ++k)
            for (int d = 0; d < 16; ++d) {
                const int64_t ch = b * kBlock + lane_channel(k, d);
                if (ch >= c) continue;
                int32_t sum = 0;
                for (int t = 0; t < kTaps; ++t) {
                    const int8_t v = w[ch * kTaps + t];
                    sum += v;
                    p.weights[static_cast<size_t>(((b * kGroups + t / 4) * 4 + k) * 64 + 4 * d + t % 4)] = v;
                }
                const auto at = static_cast<size_t>((b * 4 + k) * 16 + d);
                // acc - offset = the sum of (x - zp) * w, plus the bias (wrapping, as int32 sums do).
                p.offsets[at] = static_cast<int32_t>(static_cast<uint32_t>(zero) * static_cast<uint32_t>(sum) -
                                                     static_cast<uint32_t>(bias ? bias[ch] : 0));
                p.multipliers[at] = multiplier[multiplier.size() > 1 ? static_cast<size_t>(ch) : 0];
            }
    p.zero_input.assign(static_cast<size_t>(blocks * kBlock), static_cast<uint8_t>(x_zero_point));
    return p;
}

namespace {

// The sums of one 64-channel block of one output pixel; `taps` point at each
// tap's input pixel (the zero-point row where the window leaves the image).
[[gnu::target("avx512f,avx512bw,avx512vnni")]] inline void block_sums(const uint8_t* const* taps, int64_t offset,
                                                                      __mmask64 mask, __m512i flip,
                                                                      const int8_t* weights, __m512i sums[4]) {
    for (int k = 0; k < 4; ++k) sums[k] = _mm512_setzero_si512();
    for (int g = 0; g < kGroups; ++g) {
        __m512i x[4];
        for (int j = 0; j < 4; ++j) {
            const int t = 4 * g + j;
            x[j] = t < kTaps ? _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, taps[t] + offset), flip)
                             : _mm512_setzero_si512();
        }
        const __m512i a = _mm512_unpacklo_epi8(x[0], x[1]), b = _mm512_unpackhi_epi8(x[0], x[1]);
        const __m512i c = _mm512_unpacklo_epi8(x[2], x[3]), d = _mm512_unpackhi_epi8(x[2], x[3]);
        const __m512i interleaved[4] = {_mm512_unpacklo_epi16(a, c), _mm512_unpackhi_epi16(a, c),
                                        _mm512_unpacklo_epi16(b, d), _mm512_unpackhi_epi16(b, d)};
        for (int k = 0; k < 4; ++k)
            sums[k] = _mm512_dpbusd_epi32(sums[k], interleaved[k], _mm512_loadu_si512(weights + (g * 4 + k) * 64));
    }
}

[[gnu::target("avx512f,avx512bw,avx512vnni")]] void depthwise_rows(const uint8_t* x, bool x_signed,
                                                                   const DepthwiseParameters& p,
                                                                   const DepthwiseGeometry& g, float y_zero_point,
                                                                   bool y_signed, uint8_t* y, int64_t first_row,
                                                                   int64_t end_row) {
    const int64_t blocks = blocks_of(g.c);
    const __m512i flip = _mm512_set1_epi8(x_signed ? static_cast<char>(0x80) : 0);
    const float q_min = y_signed ? -128.0f : 0.0f, q_max = y_signed ? 127.0f : 255.0f;
    const __m512 lo = _mm512_set1_ps(q_min - y_zero_point), hi = _mm512_set1_ps(q_max - y_zero_point);
    const __m512i zp = _mm512_set1_epi32(static_cast<int32_t>(y_zero_point));
    for (int64_t row = first_row; row < end_row; ++row) {
        const int64_t image = row / g.out_h, oy = row % g.out_h;
        for (int64_t ox = 0; ox < g.out_w; ++ox) {
            const uint8_t* taps[kTaps];
            for (int t = 0; t < kTaps; ++t) {
                const int64_t iy = oy * g.stride - g.pad_top + t / 3, ix = ox * g.stride - g.pad_left + t % 3;
                taps[t] = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w ? x + ((image * g.h + iy) * g.w + ix) * g.c
                                                                     : p.zero_input.data();
            }
            uint8_t* out = y + ((image * g.out_h + oy) * g.out_w + ox) * g.c;
            for (int64_t b = 0; b < blocks; ++b) {
                const int64_t left = g.c - b * kBlock;
                const __mmask64 mask = left >= kBlock ? ~__mmask64{0} : (__mmask64{1} << left) - 1;
                __m512i sums[4];
                block_sums(taps, b * kBlock, mask, flip, p.weights.data() + b * kGroups * 4 * 64, sums);
                __m512i q[4];
                for (int k = 0; k < 4; ++k) {
                    const auto at = static_cast<size_t>((b * 4 + k) * 16);
                    const __m512i a = _mm512_sub_epi32(sums[k], _mm512_loadu_si512(p.offsets.data() + at));
                    const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(a), _mm512_loadu_ps(p.multipliers.data() + at));
                    const __m512 r = _mm512_min_ps(_mm512_max_ps(v, lo), hi);  // integer bounds: clamp, then round
                    q[k] = _mm512_add_epi32(_mm512_cvt_roundps_epi32(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                            zp);
                }
                // In range already, so the saturating packs keep every value; they also undo the lane order.
                const __m512i low = _mm512_packs_epi32(q[0], q[1]), high = _mm512_packs_epi32(q[2], q[3]);
                const __m512i bytes = y_signed ? _mm512_packs_epi16(low, high) : _mm512_packus_epi16(low, high);
                _mm512_mask_storeu_epi8(out + b * kBlock, mask, bytes);
            }
        }
    }
}

}  // namespace

void int8_depthwise_3x3(const uint8_t* x, bool x_signed, const DepthwiseParameters& p, const DepthwiseGeometry& g,
                        float y_zero_point, bool y_signed, uint8_t* y) {
    const int64_t rows = g.n * g.out_h;
    const int64_t work = rows * g.out_w * g.c;
    // Row by row as threads come free: cores of one machine can run at
    // different speeds (a VM's vCPUs differed by 45 %).
    parallel_for_dynamic(rows, work > (int64_t{1} << 15),
                         [&](int64_t r) { depthwise_rows(x, x_signed, p, g, y_zero_point, y_signed, y, r, r + 1); });
}

}  // namespace vaiq::runtime
