#include "runtime/kernels/int8_pointwise.hpp"

#include <algorithm>

#include "runtime/cpu_features.hpp"
#include "runtime/kernels/intrinsics.hpp"
#include "runtime/parallel_for.hpp"

namespace vaiq::runtime {

// A tile of six output pixels by a group of up to 64 output channels: 24 int32
// accumulators in registers. VNNI multiplies four unsigned bytes by four signed
// ones and adds them into each int32 lane, so each step broadcasts four input
// channels of a pixel to every lane and multiplies them by the four weights of
// each lane's output channel. The sums start at the bias less the input zero
// point's share, so that they come out as the centred sums, and are requantized
// as they leave the registers.
//
// A group of 64 channels is packed back to bytes by two rounds of saturating
// packs, which work within 128-bit lanes: after them, byte 16L + 4j + i holds
// vector j's dword 4L + i. The weights put channel 16L + 4j + i there, so the
// bytes come out in channel order. A last group of fewer channels keeps one
// vector per 16 channels in order and narrows each on its own.
namespace {

constexpr int64_t kGroup = 64, kTile = 6;

// The channel of a group that vector j's dword d holds, for a group of J vectors.
int64_t lane_of(int J, int j, int d) { return J == 4 ? 16 * (d / 4) + 4 * j + d % 4 : 16 * j + d; }

int vectors_of(int64_t channels) { return static_cast<int>((std::min(channels, kGroup) + 15) / 16); }

struct Requantization {
    __m512 hi;       ///< the upper bound less the zero point
    __m512i zp, lo;  ///< the zero point; the lower bound (every lane for J < 4, bytes for J = 4)
    bool y_signed;
};

// requantize()'s float32 product, rounded to nearest even, plus the zero point.
// Bounds that are integers clamp the same before rounding as after: the upper
// one here (so that no value overflows the conversion), the lower one after.
[[gnu::target("avx512f"), gnu::always_inline]] inline __m512i requantized(__m512i sum, __m512 multiplier,
                                                                          const Requantization& r) {
    const __m512 v = _mm512_min_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), multiplier), r.hi);
    return _mm512_add_epi32(_mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), r.zp);
}

template <int J, bool XSigned>
[[gnu::target("avx512f,avx512bw,avx512vl,avx512vnni")]] void tile(const uint8_t* const x[kTile], int64_t quads,
                                                                  const int8_t* weights, const int32_t* starts,
                                                                  const float* multipliers, const Requantization& r,
                                                                  int64_t pixels, int64_t channels,
                                                                  uint8_t* const y[kTile]) {
    // Every loop over the tile's pixels or vectors is unrolled: GCC keeps an
    // array indexed in a loop in memory, and these must stay in registers.
    __m512i acc[kTile][J];
#pragma GCC unroll 6
    for (int j = 0; j < J; ++j) {
        const __m512i start = _mm512_loadu_si512(starts + 16 * j);
#pragma GCC unroll 6
        for (int p = 0; p < kTile; ++p) acc[p][j] = start;
    }
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int64_t q = 0; q < quads; ++q) {
        __m512i w[J];
#pragma GCC unroll 6
        for (int j = 0; j < J; ++j) w[j] = _mm512_loadu_si512(weights + (q * J + j) * 64);
#pragma GCC unroll 6
        for (int p = 0; p < kTile; ++p) {
            int32_t four;
            std::memcpy(&four, x[p] + 4 * q, 4);
            __m512i a = _mm512_set1_epi32(four);
            if constexpr (XSigned) a = _mm512_xor_si512(a, flip);  // x + 128, unsigned
#pragma GCC unroll 6
            for (int j = 0; j < J; ++j) acc[p][j] = _mm512_dpbusd_epi32(acc[p][j], a, w[j]);
        }
    }
    __m512 mul[J];
#pragma GCC unroll 6
    for (int j = 0; j < J; ++j) mul[j] = _mm512_loadu_ps(multipliers + 16 * j);
#pragma GCC unroll 6
    for (int p = 0; p < kTile; ++p) {
        if (p >= pixels) break;
        if constexpr (J == 4) {
            // Saturation keeps the values already in range and takes those below it to the type's least.
            const __m512i low =
                _mm512_packs_epi32(requantized(acc[p][0], mul[0], r), requantized(acc[p][1], mul[1], r));
            const __m512i high =
                _mm512_packs_epi32(requantized(acc[p][2], mul[2], r), requantized(acc[p][3], mul[3], r));
            const __m512i bytes = r.y_signed ? _mm512_max_epi8(_mm512_packs_epi16(low, high), r.lo)
                                             : _mm512_max_epu8(_mm512_packus_epi16(low, high), r.lo);
            const __mmask64 mask = channels >= 64 ? ~__mmask64{0} : (__mmask64{1} << channels) - 1;
            _mm512_mask_storeu_epi8(y[p], mask, bytes);
        } else {
#pragma GCC unroll 6
            for (int j = 0; j < J; ++j) {
                const int64_t left = channels - 16 * j;
                const __mmask16 mask = left >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << left) - 1);
                // Narrowed in a register, then stored: vpmovdb's store form is slow on some CPUs.
                const __m128i bytes = _mm512_cvtepi32_epi8(_mm512_max_epi32(requantized(acc[p][j], mul[j], r), r.lo));
                _mm_mask_storeu_epi8(y[p] + 16 * j, mask, bytes);
            }
        }
    }
}

using Tile = void (*)(const uint8_t* const[kTile], int64_t, const int8_t*, const int32_t*, const float*,
                      const Requantization&, int64_t, int64_t, uint8_t* const[kTile]);

template <bool XSigned>
Tile tile_of(int J) {
    switch (J) {
        case 1: return tile<1, XSigned>;
        case 2: return tile<2, XSigned>;
        case 3: return tile<3, XSigned>;
        default: return tile<4, XSigned>;
    }
}

}  // namespace

bool int8_pointwise_available() { return cpu_features().avx512vnni && cpu_features().avx512vl; }

// Measured on resnet50 and mobilenet_v2 (AVX-512 VNNI, one and two threads):
// faster than oneDNN's 1x1 kernels up to 1M weights, 5-9 % slower for 2048
// input channels (the weights stream from L2 for every six pixels).
bool int8_pointwise_preferred(int64_t k, int64_t m) { return k % 4 == 0 && k <= 1024 && k * m <= (int64_t{1} << 20); }

PointwiseParameters pointwise_parameters(const int8_t* w, int64_t m, int64_t k, const int32_t* bias,
                                         const std::vector<float>& multiplier, int32_t x_zero_point, bool x_signed) {
    PointwiseParameters p;
    p.k = k, p.m = m;
    const int64_t quads = k / 4, groups = (m + kGroup - 1) / kGroup;
    p.weights.assign(static_cast<size_t>(groups * quads * 4 * 64), 0);
    p.starts.assign(static_cast<size_t>(groups * kGroup), 0);
    p.multipliers.assign(p.starts.size(), 0.0f);
    // Signed inputs are read with their sign bit flipped (x + 128 as unsigned), their zero point with them.
    const auto zero = static_cast<uint32_t>(x_signed ? x_zero_point + 128 : x_zero_point);
    for (int64_t g = 0; g < groups; ++g) {
        const int J = vectors_of(m - g * kGroup);
        int8_t* weights = p.weights.data() + g * quads * 4 * 64;
        for (int j = 0; j < J; ++j)
            for (int d = 0; d < 16; ++d) {
                const int64_t ch = g * kGroup + lane_of(J, j, d);
                if (ch >= m) continue;
                int32_t sum = 0;
                for (int64_t q = 0; q < quads; ++q)
                    for (int i = 0; i < 4; ++i) {
                        const int8_t v = w[ch * k + 4 * q + i];
                        sum += v;
                        weights[(q * J + j) * 64 + 4 * d + i] = v;
                    }
                const auto at = static_cast<size_t>(g * kGroup + 16 * j + d);
                // The centred sum plus the bias, wrapping as int32 sums do.
                p.starts[at] = static_cast<int32_t>(static_cast<uint32_t>(bias ? bias[ch] : 0) -
                                                    zero * static_cast<uint32_t>(sum));
                p.multipliers[at] = multiplier[multiplier.size() > 1 ? static_cast<size_t>(ch) : 0];
            }
    }
    return p;
}

namespace {

[[gnu::target("avx512f,avx512bw")]] Requantization requantization(const PointwiseOutput& out, int J) {
    Requantization r;
    r.hi = _mm512_set1_ps(static_cast<float>(out.hi) - out.zero_point);
    r.zp = _mm512_set1_epi32(static_cast<int32_t>(out.zero_point));
    r.lo = J == 4 ? _mm512_set1_epi8(static_cast<char>(out.lo)) : _mm512_set1_epi32(out.lo);
    r.y_signed = out.is_signed;
    return r;
}

}  // namespace

void int8_pointwise(const uint8_t* x, bool x_signed, const PointwiseParameters& p, const PointwiseGeometry& g,
                    const PointwiseOutput& out, uint8_t* y) {
    const int64_t k = p.k, m = p.m, quads = k / 4, groups = (m + kGroup - 1) / kGroup;
    const int64_t plane = g.out_h * g.out_w, pixels = g.n * plane;
    // The input pixel under output pixel i.
    auto strided_input_of = [&](int64_t i) {
        const int64_t image = i / plane, oy = i % plane / g.out_w, ox = i % g.out_w;
        return x + ((image * g.h + oy * g.stride) * g.w + ox * g.stride) * k;
    };
    const Requantization full = requantization(out, 4), last = requantization(out, vectors_of(m % kGroup));
    // Contiguous shares of the pixels, a thread each: the next layer's rows split alike.
    parallel_team(pixels * m * k > (int64_t{1} << 18), [&](int64_t t, int64_t team) {
        const auto [begin, end] = share_of(pixels, t, team);
        for (int64_t first = begin; first < end; first += kTile) {
            const int64_t count = std::min(kTile, end - first);
            const uint8_t* xs[kTile];
            uint8_t* ys[kTile];
            for (int64_t i = 0; i < kTile; ++i) {
                const int64_t pixel = first + std::min(i, count - 1);  // past the end: the last one again
                ys[i] = y + pixel * m;
                xs[i] = x + pixel * k;
            }
            if (g.stride != 1)
                for (int64_t i = 0; i < kTile; ++i) xs[i] = strided_input_of(first + std::min(i, count - 1));
            for (int64_t group = 0; group < groups; ++group) {
                const int64_t channels = std::min(kGroup, m - group * kGroup);
                const int J = vectors_of(channels);
                uint8_t* yg[kTile];
                for (int64_t i = 0; i < kTile; ++i) yg[i] = ys[i] + group * kGroup;
                (x_signed ? tile_of<true>(J) : tile_of<false>(J))(
                    xs, quads, p.weights.data() + group * quads * 4 * 64, p.starts.data() + group * kGroup,
                    p.multipliers.data() + group * kGroup, J == 4 ? full : last, count, channels, yg);
            }
        }
    });
}

}  // namespace vaiq::runtime
