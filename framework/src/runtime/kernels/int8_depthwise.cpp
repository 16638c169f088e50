#include "runtime/kernels/int8_depthwise.hpp"

#include "runtime/cpu_features.hpp"
#include "runtime/kernels/intrinsics.hpp"
#include "runtime/parallel_for.hpp"

namespace vaiq::runtime {

// Sixty-four lanes at a time. VNNI multiplies four unsigned bytes by four
// signed ones and adds them into each int32 lane, so each lane takes the three
// taps of one window column (and a zero): the rows' vectors are interleaved
// bytewise by two rounds of unpacking, which works within 128-bit lanes. After
// it, vector k's dword 4L + i holds lane 16L + 4k + i (L the 128-bit lane), and
// packing the four vectors of sums back to bytes (also within lanes) restores
// the lanes' order. The weights, offsets and multipliers are laid out in that
// order. Neighbouring output pixels share window columns (two of three at
// stride 1), so a column is loaded and interleaved once for all of them.
//
// A lane is a channel of one pixel; with few channels (32, 16, ...) the 64
// lanes hold several neighbouring pixels' channels instead, which lie next to
// each other in memory, so that no lane idles (mobilenet_v2's first depthwise
// layer has 32 channels).
namespace {

constexpr int64_t kBlock = 64;
constexpr int kTaps = 9, kColumns = 3;

// The lane that vector k's dword d holds.
int64_t lane_of(int k, int d) { return 16 * (d / 4) + 4 * k + d % 4; }

int64_t blocks_of(int64_t c) { return (c + kBlock - 1) / kBlock; }

// `blocks` blocks of lanes, lane i of block b holding channel channel_of(b, i) (none when c or more).
template <typename ChannelOf>
DepthwiseLanes lanes(const int8_t* w, int64_t c, const int32_t* bias, const std::vector<float>& multiplier,
                     int32_t zero, int64_t blocks, ChannelOf channel_of) {
    DepthwiseLanes l;
    l.weights.assign(static_cast<size_t>(blocks * kColumns * 4 * 64), 0);
    l.offsets.assign(static_cast<size_t>(blocks * 4 * 16), 0);
    l.multipliers.assign(l.offsets.size(), 0.0f);
    for (int64_t b = 0; b < blocks; ++b)
        for (int k = 0; k < 4; ++k)
            for (int d = 0; d < 16; ++d) {
                const int64_t ch = channel_of(b, lane_of(k, d));
                if (ch >= c) continue;
                int32_t sum = 0;
                for (int t = 0; t < kTaps; ++t) {
                    const int8_t v = w[ch * kTaps + t];
                    sum += v;
                    const int dy = t / 3, dx = t % 3;
                    l.weights[static_cast<size_t>(((b * kColumns + dx) * 4 + k) * 64 + 4 * d + dy)] = v;
                }
                const auto at = static_cast<size_t>((b * 4 + k) * 16 + d);
                // acc - offset = the sum of (x - zp) * w, plus the bias (wrapping, as int32 sums do).
                l.offsets[at] = static_cast<int32_t>(static_cast<uint32_t>(zero) * static_cast<uint32_t>(sum) -
                                                     static_cast<uint32_t>(bias ? bias[ch] : 0));
                l.multipliers[at] = multiplier[multiplier.size() > 1 ? static_cast<size_t>(ch) : 0];
            }
    return l;
}

}  // namespace

bool int8_depthwise_available() { return cpu_features().avx512vnni; }

DepthwiseParameters depthwise_parameters(const int8_t* w, int64_t c, const int32_t* bias,
                                         const std::vector<float>& multiplier, int32_t x_zero_point, bool x_signed) {
    DepthwiseParameters p;
    // Signed inputs are read with their sign bit flipped (x + 128 as unsigned), their zero point with them.
    const int32_t zero = x_signed ? x_zero_point + 128 : x_zero_point;
    p.channels = lanes(w, c, bias, multiplier, zero, blocks_of(c), [](int64_t b, int64_t i) { return b * kBlock + i; });
    if (c < kBlock && kBlock % c == 0)
        p.pixels = lanes(w, c, bias, multiplier, zero, 1, [c](int64_t, int64_t i) { return i % c; });
    p.zero_input.assign(static_cast<size_t>(blocks_of(c) * kBlock), static_cast<uint8_t>(x_zero_point));
    return p;
}

namespace {

// What every pixel of a row needs: the input rows under the window (null where
// it leaves the image), the zero-point lanes padding reads, and the output's
// requantization constants.
struct Row {
    const uint8_t* rows[3];
    const uint8_t* zero;
    int64_t w, c, stride, pad_left;
    __m512i flip, zp;
    __m512 lo, hi;
    bool y_signed;
};

// The four interleaved vectors of the window column at input column ix, 64
// lanes from byte `offset` of its pixels (`group` pixels when a vector holds
// several: then the column is inside the image).
[[gnu::target("avx512f,avx512bw,avx512vnni")]] inline void window_column(const Row& r, int64_t ix, int64_t offset,
                                                                         __mmask64 mask, __m512i out[4]) {
    const bool inside = ix >= 0 && ix < r.w;
    __m512i x[3];
    for (int dy = 0; dy < 3; ++dy) {
        const uint8_t* at = inside && r.rows[dy] ? r.rows[dy] + ix * r.c : r.zero;
        x[dy] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, at + offset), r.flip);
    }
    const __m512i none = _mm512_setzero_si512();
    const __m512i a = _mm512_unpacklo_epi8(x[0], x[1]), b = _mm512_unpackhi_epi8(x[0], x[1]);
    const __m512i c = _mm512_unpacklo_epi8(x[2], none), d = _mm512_unpackhi_epi8(x[2], none);
    out[0] = _mm512_unpacklo_epi16(a, c);
    out[1] = _mm512_unpackhi_epi16(a, c);
    out[2] = _mm512_unpacklo_epi16(b, d);
    out[3] = _mm512_unpackhi_epi16(b, d);
}

// The 64 output bytes of three window columns times a block's weights.
[[gnu::target("avx512f,avx512bw,avx512vnni")]] inline __m512i output_bytes(const Row& r, const __m512i columns[3][4],
                                                                           const int8_t* weights,
                                                                           const int32_t* offsets,
                                                                           const float* multipliers) {
    __m512i q[4];
    for (int k = 0; k < 4; ++k) {
        __m512i sums = _mm512_setzero_si512();
        for (int dx = 0; dx < kColumns; ++dx)
            sums = _mm512_dpbusd_epi32(sums, columns[dx][k], _mm512_loadu_si512(weights + (dx * 4 + k) * 64));
        const __m512i a = _mm512_sub_epi32(sums, _mm512_loadu_si512(offsets + 16 * k));
        const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(a), _mm512_loadu_ps(multipliers + 16 * k));
        const __m512 clamped = _mm512_min_ps(_mm512_max_ps(v, r.lo), r.hi);  // integer bounds: clamp, then round
        q[k] = _mm512_add_epi32(_mm512_cvt_roundps_epi32(clamped, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), r.zp);
    }
    // In range already, so the saturating packs keep every value; they also undo the lane order.
    const __m512i low = _mm512_packs_epi32(q[0], q[1]), high = _mm512_packs_epi32(q[2], q[3]);
    return r.y_signed ? _mm512_packs_epi16(low, high) : _mm512_packus_epi16(low, high);
}

// Output pixels [first, end) of a row, `group` pixels a vector of lanes `l`
// (blocks of 64 channels of one pixel when `group` is 1), block by block. The
// next pixels' window starts `advance` columns on; Shared = 3 - min(advance, 3)
// of its columns are the previous pixels', kept in registers.
template <int Shared>
[[gnu::target("avx512f,avx512bw,avx512vnni")]] void row_pixels(const Row& r, const DepthwiseLanes& l, int64_t blocks,
                                                               int64_t group, int64_t first, int64_t end,
                                                               uint8_t* y_row) {
    const int64_t advance = r.stride * group, lanes = group == 1 ? r.c : group * r.c;
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t offset = b * kBlock, left = lanes - offset;
        const __mmask64 mask = left >= kBlock ? ~__mmask64{0} : (__mmask64{1} << left) - 1;
        const int8_t* weights = l.weights.data() + b * kColumns * 4 * 64;
        const int32_t* offsets = l.offsets.data() + b * 64;
        const float* multipliers = l.multipliers.data() + b * 64;
        __m512i columns[3][4];
        int64_t ix = first * r.stride - r.pad_left;
        for (int dx = 0; dx < Shared; ++dx) window_column(r, ix + dx, offset, mask, columns[dx]);
        for (int64_t ox = first; ox < end; ox += group, ix += advance) {
            for (int dx = Shared; dx < kColumns; ++dx) window_column(r, ix + dx, offset, mask, columns[dx]);
            _mm512_mask_storeu_epi8(y_row + ox * r.c + offset, mask,
                                    output_bytes(r, columns, weights, offsets, multipliers));
            for (int dx = 0; dx < Shared; ++dx)
                for (int k = 0; k < 4; ++k) columns[dx][k] = columns[dx + kColumns - Shared][k];
        }
    }
}

void pixels_of(const Row& r, const DepthwiseLanes& l, int64_t blocks, int64_t group, int64_t first, int64_t end,
               uint8_t* y_row) {
    if (first >= end) return;
    switch (r.stride * group) {
        case 1: return row_pixels<2>(r, l, blocks, group, first, end, y_row);
        case 2: return row_pixels<1>(r, l, blocks, group, first, end, y_row);
        default: return row_pixels<0>(r, l, blocks, group, first, end, y_row);
    }
}

[[gnu::target("avx512f,avx512bw,avx512vnni")]] void depthwise_row(const uint8_t* x, bool x_signed,
                                                                  const DepthwiseParameters& p,
                                                                  const DepthwiseGeometry& g, float y_zero_point,
                                                                  bool y_signed, uint8_t* y, int64_t row) {
    const float q_min = y_signed ? -128.0f : 0.0f, q_max = y_signed ? 127.0f : 255.0f;
    Row r{};
    const int64_t image = row / g.out_h, oy = row % g.out_h;
    for (int dy = 0; dy < 3; ++dy) {
        const int64_t iy = oy * g.stride - g.pad_top + dy;
        r.rows[dy] = iy >= 0 && iy < g.h ? x + (image * g.h + iy) * g.w * g.c : nullptr;
    }
    r.zero = p.zero_input.data();
    r.w = g.w, r.c = g.c, r.stride = g.stride, r.pad_left = g.pad_left;
    r.flip = _mm512_set1_epi8(x_signed ? static_cast<char>(0x80) : 0);
    r.zp = _mm512_set1_epi32(static_cast<int32_t>(y_zero_point));
    r.lo = _mm512_set1_ps(q_min - y_zero_point), r.hi = _mm512_set1_ps(q_max - y_zero_point);
    r.y_signed = y_signed;
    uint8_t* y_row = y + row * g.out_w * g.c;
    const int64_t blocks = blocks_of(g.c);
    if (p.pixels.weights.empty() || g.stride != 1) return pixels_of(r, p.channels, blocks, 1, 0, g.out_w, y_row);
    // Several pixels a vector where all of their window columns are inside the
    // image (a vector's load reads them all); one at a time at the edges.
    const int64_t group = kBlock / g.c;
    const int64_t inside_begin = std::min(g.out_w, g.pad_left);
    const int64_t inside_end = std::max(inside_begin, std::min(g.out_w, g.w + g.pad_left - 2));
    const int64_t grouped_end = inside_begin + (inside_end - inside_begin) / group * group;
    pixels_of(r, p.channels, blocks, 1, 0, inside_begin, y_row);
    pixels_of(r, p.pixels, 1, group, inside_begin, grouped_end, y_row);
    pixels_of(r, p.channels, blocks, 1, grouped_end, g.out_w, y_row);
}

}  // namespace

void int8_depthwise_3x3(const uint8_t* x, bool x_signed, const DepthwiseParameters& p, const DepthwiseGeometry& g,
                        float y_zero_point, bool y_signed, uint8_t* y) {
    const int64_t rows = g.n * g.out_h;
    const int64_t work = rows * g.out_w * g.c;
    parallel_for(rows, work > (int64_t{1} << 15),
                 [&](int64_t r) { depthwise_row(x, x_signed, p, g, y_zero_point, y_signed, y, r); });
}

}  // namespace vaiq::runtime
