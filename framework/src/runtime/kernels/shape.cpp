// Data-movement kernels. They copy bytes, so every element type works.
#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>

#include "runtime/cpu_features.hpp"
#include "runtime/kernels/common.hpp"
#include "runtime/kernels/intrinsics.hpp"

namespace vaiq::runtime {
namespace {

// Input 0's values under another shape of the same size: in its own buffer
// when the executor donated it, else copied.
Tensor with_shape(KernelContext& ctx, std::vector<int64_t> shape) {
    Tensor out = ctx.take_input(0);
    out.reshape(std::move(shape));
    return out;
}

Tensor int64_vector(const std::vector<int64_t>& values) {
    return Tensor::from_values<int64_t>({static_cast<int64_t>(values.size())}, values);
}

void reshape(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    auto shape = read_ints(ctx, ctx.input(1));
    const bool allow_zero = ctx.attributes.get_int("allowzero", 0) != 0;
    int64_t known = 1;
    int infer = -1;
    for (size_t i = 0; i < shape.size(); ++i) {
        if (shape[i] == 0 && !allow_zero) {
            if (i >= x.shape().size()) ctx.fail("a 0 in the new shape has no matching input dimension");
            shape[i] = x.shape()[i];
        }
        if (shape[i] == -1) {
            if (infer >= 0) ctx.fail("the new shape has more than one -1");
            infer = static_cast<int>(i);
        } else if (shape[i] < 0) {
            ctx.fail(fmt::format("the new shape has a negative dimension {}", shape[i]));
        } else if (__builtin_mul_overflow(known, shape[i], &known)) {
            ctx.fail("the new shape's element count overflows 64 bits");
        }
    }
    if (infer >= 0) {
        if (known == 0 || x.size() % known != 0) ctx.fail("the -1 in the new shape cannot be inferred");
        shape[infer] = x.size() / known;
    }
    if (element_count(shape) != x.size())
        ctx.fail(fmt::format("cannot reshape {} elements to a shape of {}", x.size(), element_count(shape)));
    out[0] = with_shape(ctx, shape);
}

void flatten(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto rank = static_cast<int64_t>(x.shape().size());
    const int64_t axis = ctx.attributes.get_int("axis", 1);
    const int64_t a = axis < 0 ? axis + rank : axis;
    if (a < 0 || a > rank) ctx.fail(fmt::format("axis {} is out of range for rank {}", axis, rank));
    int64_t outer = 1;
    for (int64_t d = 0; d < a; ++d) outer *= x.shape()[d];
    out[0] = with_shape(ctx, {outer, outer == 0 ? 0 : x.size() / std::max<int64_t>(outer, 1)});
}

std::vector<int64_t> axes_of(KernelContext& ctx, size_t input) {
    // Opset 13 moved axes from an attribute to an optional input.
    if (ctx.opset >= 13) return ctx.has_input(input) ? read_ints(ctx, ctx.input(input)) : std::vector<int64_t>{};
    return ctx.attributes.get_ints("axes");
}

void squeeze(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto rank = static_cast<int64_t>(x.shape().size());
    auto axes = axes_of(ctx, 1);
    for (auto& a : axes) a = normalize_axis(ctx, a, rank);
    std::vector<int64_t> shape;
    for (int64_t d = 0; d < rank; ++d) {
        const bool listed = std::find(axes.begin(), axes.end(), d) != axes.end();
        if (listed && x.shape()[d] != 1)
            ctx.fail(fmt::format("cannot squeeze dimension {} of size {}", d, x.shape()[d]));
        if (listed || (axes.empty() && x.shape()[d] == 1)) continue;
        shape.push_back(x.shape()[d]);
    }
    out[0] = with_shape(ctx, shape);
}

void unsqueeze(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    auto axes = axes_of(ctx, 1);
    const auto rank = static_cast<int64_t>(x.shape().size() + axes.size());
    for (auto& a : axes) a = normalize_axis(ctx, a, rank);
    std::sort(axes.begin(), axes.end());
    if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) ctx.fail("axes repeat");
    std::vector<int64_t> shape;
    size_t next = 0;
    for (int64_t d = 0; d < rank; ++d) {
        if (std::binary_search(axes.begin(), axes.end(), d))
            shape.push_back(1);
        else
            shape.push_back(x.shape()[next++]);
    }
    out[0] = with_shape(ctx, shape);
}

// Copies `count` elements of `elem` bytes with a source stride (in elements).
inline void strided_copy(std::byte* dst, const std::byte* src, int64_t count, int64_t stride, size_t elem) {
    if (stride == 1) {  // one block: memcpy's wide loads, not a loop the compiler keeps general
        vaiq::copy_bytes(dst, src, static_cast<size_t>(count) * elem);
        return;
    }
    switch (elem) {
        case 4: {
            auto* d = reinterpret_cast<uint32_t*>(dst);
            const auto* s = reinterpret_cast<const uint32_t*>(src);
            for (int64_t j = 0; j < count; ++j) d[j] = s[j * stride];
            return;
        }
        case 8: {
            auto* d = reinterpret_cast<uint64_t*>(dst);
            const auto* s = reinterpret_cast<const uint64_t*>(src);
            for (int64_t j = 0; j < count; ++j) d[j] = s[j * stride];
            return;
        }
        default:
            for (int64_t j = 0; j < count; ++j) vaiq::copy_bytes(dst + j * elem, src + j * stride * elem, elem);
    }
}

// Axes of size 1 go, and axes that stay adjacent and in order under `perm`
// move as one: the same copy at a lower rank (NCHW -> NHWC is [N, C, HW] ->
// [N, HW, C]; [S, 1, D] -> [1, S, D] is no move at all: [S * D]).
void merge_axes(std::vector<int64_t>& shape, std::vector<int64_t>& perm) {
    std::vector<int64_t> kept(shape.size(), -1);  // new index of each input axis kept
    std::vector<int64_t> squeezed;
    for (size_t a = 0; a < shape.size(); ++a)
        if (shape[a] != 1) {
            kept[a] = static_cast<int64_t>(squeezed.size());
            squeezed.push_back(shape[a]);
        }
    std::vector<int64_t> squeezed_perm;
    for (auto p : perm)
        if (kept[p] >= 0) squeezed_perm.push_back(kept[p]);
    shape = squeezed;
    perm = squeezed_perm;
    if (perm.empty()) return;
    std::vector<int64_t> groups{perm[0]};  // input axis starting each output group
    for (size_t d = 1; d < perm.size(); ++d)
        if (perm[d] != perm[d - 1] + 1) groups.push_back(perm[d]);
    // Input axes in order, grouped; then each group's size and new index.
    std::vector<int64_t> starts = groups;
    std::sort(starts.begin(), starts.end());
    std::vector<int64_t> merged_shape(starts.size(), 1);
    for (size_t g = 0; g < starts.size(); ++g) {
        const int64_t end = g + 1 < starts.size() ? starts[g + 1] : static_cast<int64_t>(shape.size());
        for (int64_t a = starts[g]; a < end; ++a) merged_shape[g] *= shape[a];
    }
    std::vector<int64_t> merged_perm;
    for (int64_t first : groups)
        merged_perm.push_back(std::lower_bound(starts.begin(), starts.end(), first) - starts.begin());
    shape = merged_shape;
    perm = merged_perm;
}

// A 16x16 block of 4-byte elements transposed in registers: rows of `src`
// (`src_stride` apart) become columns of `dst` (rows `dst_stride` apart), as
// int32 less `minus` (per source column) when given. Each source line is read
// once whole, so source rows that share cache sets (a stride of a multiple of
// 4 KB) cost nothing extra.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"  // the unpack intrinsics' placeholder operand
[[gnu::target("avx512f")]] void transpose_16x16(const uint32_t* src, int64_t src_stride, uint32_t* dst,
                                                int64_t dst_stride, const int32_t* minus) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * src_stride);
    if (minus) {
        const __m512i m = _mm512_loadu_si512(minus);
        for (int i = 0; i < 16; ++i) r[i] = _mm512_castsi512_ps(_mm512_sub_epi32(_mm512_castps_si512(r[i]), m));
    }
    for (int i = 0; i < 16; i += 2) {  // pairs of rows interleaved
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {  // then 64-bit pairs: each 128-bit lane holds a 4x4 block's column
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 16; i += 8)  // then 128-bit lanes across the groups of four rows
        for (int j = 0; j < 4; ++j) {
            t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
            t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xdd);
        }
    for (int j = 0; j < 8; ++j) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
    }
    for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * dst_stride, r[i]);
}
#pragma GCC diagnostic pop

// transpose_16x16 for CPUs with AVX2 but not AVX-512: an 8x8 block, its rows
// interleaved in pairs, then in 64-bit pairs, then 128-bit halves swapped.
[[gnu::target("avx2")]] void transpose_8x8(const uint32_t* src, int64_t src_stride, uint32_t* dst, int64_t dst_stride,
                                           const int32_t* minus) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(reinterpret_cast<const float*>(src + i * src_stride));
    if (minus) {
        const __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(minus));
        for (int i = 0; i < 8; ++i) r[i] = _mm256_castsi256_ps(_mm256_sub_epi32(_mm256_castps_si256(r[i]), m));
    }
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {  // each 128-bit lane: one column of four rows
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int j = 0; j < 4; ++j) {  // columns j and j + 4: the low halves, then the high ones
        _mm256_storeu_ps(reinterpret_cast<float*>(dst + j * dst_stride), _mm256_permute2f128_ps(r[j], r[j + 4], 0x20));
        _mm256_storeu_ps(reinterpret_cast<float*>(dst + (j + 4) * dst_stride),
                         _mm256_permute2f128_ps(r[j], r[j + 4], 0x31));
    }
}

// `batches` row-major [rows, cols] matrices of T, each written transposed, in
// tiles that stay in cache on both sides (4-byte elements in registers: 16x16
// blocks with AVX-512, 8x8 with AVX2); 4-byte elements as int32 less minus[column] when given.
// A 16 x 16 block of bytes transposed in registers (SSE2): four rounds of
// interleaving, bytes, then pairs, quads and halves, each column ending in one register.
void transpose_16x16_bytes(const uint8_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride) {
    __m128i a[16], b[16];
    for (int i = 0; i < 16; ++i) a[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * src_stride));
    for (int i = 0; i < 8; ++i) {  // row pairs, columns 0-7 and 8-15
        b[2 * i] = _mm_unpacklo_epi8(a[2 * i], a[2 * i + 1]);
        b[2 * i + 1] = _mm_unpackhi_epi8(a[2 * i], a[2 * i + 1]);
    }
    for (int j = 0; j < 4; ++j) {  // rows 4j..4j+3, columns in fours
        a[4 * j] = _mm_unpacklo_epi16(b[4 * j], b[4 * j + 2]);
        a[4 * j + 1] = _mm_unpackhi_epi16(b[4 * j], b[4 * j + 2]);
        a[4 * j + 2] = _mm_unpacklo_epi16(b[4 * j + 1], b[4 * j + 3]);
        a[4 * j + 3] = _mm_unpackhi_epi16(b[4 * j + 1], b[4 * j + 3]);
    }
    for (int j = 0; j < 2; ++j)  // rows 8j..8j+7, columns in pairs
        for (int q = 0; q < 4; ++q) {
            b[8 * j + 2 * q] = _mm_unpacklo_epi32(a[8 * j + q], a[8 * j + 4 + q]);
            b[8 * j + 2 * q + 1] = _mm_unpackhi_epi32(a[8 * j + q], a[8 * j + 4 + q]);
        }
    for (int c = 0; c < 8; ++c) {  // all sixteen rows of columns 2c and 2c + 1
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * c * dst_stride), _mm_unpacklo_epi64(b[c], b[8 + c]));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (2 * c + 1) * dst_stride),
                         _mm_unpackhi_epi64(b[c], b[8 + c]));
    }
}

// Three rows of bytes (an image's colours) into channels-last pixels, 16
// columns at a time: each of the 48 bytes out is picked from one of the rows
// by a byte shuffle. Returns the columns done (a multiple of 16).
[[gnu::target("ssse3")]] int64_t interleave_3_bytes(const uint8_t* r0, const uint8_t* r1, const uint8_t* r2,
                                                    uint8_t* out, int64_t cols) {
    alignas(16) static const auto masks = [] {
        std::array<std::array<std::array<uint8_t, 16>, 3>, 3> m{};  // [block out][row][byte]
        for (int p = 0; p < 48; ++p)
            for (int row = 0; row < 3; ++row)
                m[p / 16][row][p % 16] = p % 3 == row ? static_cast<uint8_t>(p / 3) : uint8_t{0x80};
        return m;
    }();
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16) {
        const __m128i rows[3] = {_mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + c)),
                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(r1 + c)),
                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(r2 + c))};
        for (int k = 0; k < 3; ++k) {
            __m128i o = _mm_setzero_si128();
            for (int row = 0; row < 3; ++row)
                o = _mm_or_si128(
                    o, _mm_shuffle_epi8(rows[row],
                                        _mm_load_si128(reinterpret_cast<const __m128i*>(masks[k][row].data()))));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 3 * c + 16 * k), o);
        }
    }
    return c;
}

// Matrices of kRows rows transposed: each output row interleaves the kRows
// input rows (an image's three colours into channels-last pixels), a loop the
// compiler vectorises with the row count known (bytes of three rows by
// shuffles), in column pieces over the threads.
template <int64_t kRows, typename T>
void interleave_rows(const T* src, T* dst, int64_t batches, int64_t cols) {
    static const bool shuffles = cpu_features().ssse3;
    auto columns = [&](int64_t b, int64_t c0, int64_t c1) {
        const T* from = src + b * kRows * cols;
        T* to = dst + b * kRows * cols;
        int64_t c = c0;
        if constexpr (kRows == 3 && sizeof(T) == 1)
            if (shuffles)
                c += interleave_3_bytes(reinterpret_cast<const uint8_t*>(from + c0),
                                        reinterpret_cast<const uint8_t*>(from + cols + c0),
                                        reinterpret_cast<const uint8_t*>(from + 2 * cols + c0),
                                        reinterpret_cast<uint8_t*>(to + kRows * c0), c1 - c0);
        for (; c < c1; ++c)
            for (int64_t r = 0; r < kRows; ++r) to[c * kRows + r] = from[r * cols + c];
    };
    // Small matrices a thread each; big ones (an image) in column pieces.
    if (kRows * cols <= kParallelGrain) {
        parallel_for(batches, batches * kRows * cols > kParallelGrain, [&](int64_t b) { columns(b, 0, cols); });
        return;
    }
    for (int64_t b = 0; b < batches; ++b)
        parallel_for_pieces(cols, int64_t{1} << 14, true, [&](int64_t c0, int64_t c1) { columns(b, c0, c1); });
}

template <typename T>
void transpose_matrices(const T* src, T* dst, int64_t batches, int64_t rows, int64_t cols,
                        const int32_t* minus = nullptr) {
    if (!minus && rows == 3) return interleave_rows<3>(src, dst, batches, cols);
    if (!minus && rows == 4) return interleave_rows<4>(src, dst, batches, cols);
    constexpr int64_t kTile = 32;
    const bool avx512 = cpu_features().avx512f, avx2 = cpu_features().avx2;
    const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
    parallel_for(batches * row_tiles * col_tiles, batches * rows * cols > kParallelGrain, [&](int64_t t) {
        const int64_t b = t / (row_tiles * col_tiles);
        const int64_t r0 = (t / col_tiles) % row_tiles * kTile, c0 = t % col_tiles * kTile;
        const T* from = src + b * rows * cols;
        T* to = dst + b * rows * cols;
        const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
        int64_t rb = r0, cb = c0;  // the 16x16 blocks end here
        if constexpr (sizeof(T) == 1) {
            if (!minus) {
                rb = r0 + (r1 - r0) / 16 * 16;
                cb = c0 + (c1 - c0) / 16 * 16;
                for (int64_t r = r0; r < rb; r += 16)
                    for (int64_t c = c0; c < cb; c += 16)
                        transpose_16x16_bytes(reinterpret_cast<const uint8_t*>(from + r * cols + c), cols,
                                              reinterpret_cast<uint8_t*>(to + c * rows + r), rows);
            }
        }
        if constexpr (sizeof(T) == 4) {
            // Blocks in registers: 16x16 with AVX-512, 8x8 with AVX2.
            const int64_t block = avx512 ? 16 : avx2 ? 8 : 0;
            auto* transpose_block = avx512 ? transpose_16x16 : transpose_8x8;
            if (block > 0) {
                rb = r0 + (r1 - r0) / block * block;
                cb = c0 + (c1 - c0) / block * block;
                for (int64_t r = r0; r < rb; r += block)
                    for (int64_t c = c0; c < cb; c += block)
                        transpose_block(reinterpret_cast<const uint32_t*>(from + r * cols + c), cols,
                                        reinterpret_cast<uint32_t*>(to + c * rows + r), rows,
                                        minus ? minus + c : nullptr);
            }
        }
        // What the blocks left: columns past cb, then rows past rb (unsigned
        // arithmetic: the same bits as int32's).
        auto less = [&](int64_t c) { return minus ? static_cast<T>(minus[c]) : T{0}; };
        for (int64_t c = cb; c < c1; ++c)
            for (int64_t r = r0; r < r1; ++r) to[c * rows + r] = static_cast<T>(from[r * cols + c] - less(c));
        for (int64_t c = c0; c < cb; ++c)
            for (int64_t r = rb; r < r1; ++r) to[c * rows + r] = static_cast<T>(from[r * cols + c] - less(c));
    });
}

}  // namespace

void transpose_4_byte(const void* src, void* dst, int64_t batches, int64_t rows, int64_t cols,
                      const int32_t* column_minus) {
    transpose_matrices(static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), batches, rows, cols,
                       column_minus);
}

namespace {

void transpose(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto rank = x.shape().size();
    std::vector<int64_t> perm(rank);
    std::iota(perm.rbegin(), perm.rend(), 0);
    perm = ctx.attributes.get_ints("perm", perm);
    if (perm.size() != rank) ctx.fail("perm does not match the input's rank");
    std::vector<bool> seen(rank, false);
    for (auto p : perm) {
        const auto axis = static_cast<size_t>(normalize_axis(ctx, p, static_cast<int64_t>(rank)));
        if (seen[axis]) ctx.fail(fmt::format("perm names axis {} twice", axis));
        seen[axis] = true;
    }
    std::vector<int64_t> shape(rank);
    for (size_t d = 0; d < rank; ++d) shape[d] = x.shape()[normalize_axis(ctx, perm[d], static_cast<int64_t>(rank))];
    // Size-1 axes dropped and axes that move together merged, most transposes
    // keep the data's order (a copy, or none when the input is donated) or swap
    // two blocks of axes (the layout transposes: tiled, not row by row).
    auto merged_shape = x.shape();
    auto merged_perm = perm;
    for (auto& p : merged_perm) p = normalize_axis(ctx, p, static_cast<int64_t>(rank));
    merge_axes(merged_shape, merged_perm);
    if (merged_perm.size() <= 1) {
        out[0] = ctx.take_input(0);
        out[0].reshape(shape);
        return;
    }
    Tensor y = Tensor::uninitialized(x.type(), shape);
    if (y.size() == 0) {
        out[0] = std::move(y);
        return;
    }
    const bool swap = merged_perm == std::vector<int64_t>{1, 0} || merged_perm == std::vector<int64_t>{0, 2, 1};
    if (swap && (element_size(x.type()) == 4 || element_size(x.type()) == 1)) {
        const size_t k = merged_shape.size();
        const int64_t batches = k == 3 ? merged_shape[0] : 1;
        const auto* from = x.bytes().data();
        auto* to = y.mutable_bytes().data();
        if (element_size(x.type()) == 4)
            transpose_matrices(reinterpret_cast<const uint32_t*>(from), reinterpret_cast<uint32_t*>(to), batches,
                               merged_shape[k - 2], merged_shape[k - 1]);
        else
            transpose_matrices(reinterpret_cast<const uint8_t*>(from), reinterpret_cast<uint8_t*>(to), batches,
                               merged_shape[k - 2], merged_shape[k - 1]);
        out[0] = std::move(y);
        return;
    }
    const auto in_strides = strides_of(x.shape());
    std::vector<int64_t> stride(rank);
    for (size_t d = 0; d < rank; ++d) stride[d] = in_strides[perm[d]];
    const size_t elem = element_size(x.type());
    const int64_t inner = shape.back(), rows = y.size() / inner;
    const auto* src = x.bytes().data();
    auto* dst = y.mutable_bytes().data();
    parallel_for(rows, y.size() > kParallelGrain, [&](int64_t r) {
        int64_t at = 0, rest = r;
        for (int d = static_cast<int>(rank) - 2; d >= 0; --d) {
            at += (rest % shape[d]) * stride[d];
            rest /= shape[d];
        }
        strided_copy(dst + r * inner * elem, src + at * elem, inner, stride[rank - 1], elem);
    });
    out[0] = std::move(y);
}

void concat(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& first = ctx.input(0);
    const auto rank = static_cast<int64_t>(first.shape().size());
    const int64_t axis = normalize_axis(ctx, ctx.attributes.get_int("axis", 0), rank);
    auto shape = first.shape();
    shape[axis] = 0;
    for (size_t i = 0; i < ctx.input_count(); ++i) {
        const auto& t = ctx.input(i);
        if (t.type() != first.type() || static_cast<int64_t>(t.shape().size()) != rank)
            ctx.fail("inputs differ in element type or rank");
        for (int64_t d = 0; d < rank; ++d)
            if (d != axis && t.shape()[d] != first.shape()[d])
                ctx.fail(fmt::format("inputs differ in dimension {}", d));
        shape[axis] += t.shape()[axis];
    }
    Tensor y = Tensor::uninitialized(first.type(), shape);
    const size_t elem = element_size(first.type());
    int64_t outer = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= shape[d];
    int64_t inner = 1;
    for (int64_t d = axis + 1; d < rank; ++d) inner *= shape[d];
    // Each input's block of an output row, and where it goes in the row. The
    // rows are shared over the threads: a channels-last join copies a few
    // channels a pixel, hundreds of thousands of small blocks.
    std::vector<size_t> chunk(ctx.input_count()), at(ctx.input_count());
    size_t row = 0;
    for (size_t i = 0; i < ctx.input_count(); ++i) {
        chunk[i] = static_cast<size_t>(ctx.input(i).shape()[axis] * inner) * elem;
        at[i] = row;
        row += chunk[i];
    }
    auto* dst = y.mutable_bytes().data();
    parallel_for(outer, y.bytes().size() > kParallelGrain * elem, [&](int64_t o) {
        for (size_t i = 0; i < ctx.input_count(); ++i)
            vaiq::copy_bytes(dst + static_cast<size_t>(o) * row + at[i],
                             ctx.input(i).bytes().data() + static_cast<size_t>(o) * chunk[i], chunk[i]);
    });
    out[0] = std::move(y);
}

void shape_kernel(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& dims = ctx.input(0).shape();
    const auto rank = static_cast<int64_t>(dims.size());
    auto clamp = [&](int64_t v) { return std::clamp(v < 0 ? v + rank : v, int64_t{0}, rank); };
    const int64_t start = clamp(ctx.attributes.get_int("start", 0));
    const int64_t end = clamp(ctx.attributes.get_int("end", rank));
    out[0] = int64_vector(std::vector<int64_t>(dims.begin() + start, dims.begin() + std::max(start, end)));
}

void size_kernel(KernelContext& ctx, std::vector<Tensor>& out) {
    const int64_t n = ctx.input(0).size();
    out[0] = Tensor::from_values<int64_t>({}, std::span<const int64_t>(&n, 1));
}

void gather(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& data = ctx.input(0);
    const auto indices = read_ints(ctx, ctx.input(1));
    const auto rank = static_cast<int64_t>(data.shape().size());
    const int64_t axis = normalize_axis(ctx, ctx.attributes.get_int("axis", 0), rank);
    const int64_t n = data.shape()[axis];
    std::vector<int64_t> shape(data.shape().begin(), data.shape().begin() + axis);
    shape.insert(shape.end(), ctx.input(1).shape().begin(), ctx.input(1).shape().end());
    shape.insert(shape.end(), data.shape().begin() + axis + 1, data.shape().end());
    Tensor y(data.type(), shape);
    int64_t outer = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= data.shape()[d];
    int64_t inner = 1;
    for (int64_t d = axis + 1; d < rank; ++d) inner *= data.shape()[d];
    const size_t chunk = static_cast<size_t>(inner) * element_size(data.type());
    auto* dst = y.mutable_bytes().data();
    for (int64_t o = 0; o < outer; ++o) {
        for (int64_t idx : indices) {
            const int64_t k = idx < 0 ? idx + n : idx;
            if (k < 0 || k >= n) ctx.fail(fmt::format("index {} is out of range for a dimension of {}", idx, n));
            vaiq::copy_bytes(dst, data.bytes().data() + (o * n + k) * chunk, chunk);
            dst += chunk;
        }
    }
    out[0] = std::move(y);
}

void gather_elements(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& data = ctx.input(0);
    const auto& idx_t = ctx.input(1);
    const auto indices = read_ints(ctx, idx_t);
    const auto rank = static_cast<int64_t>(data.shape().size());
    if (static_cast<int64_t>(idx_t.shape().size()) != rank) ctx.fail("indices must have the data's rank");
    const int64_t axis = normalize_axis(ctx, ctx.attributes.get_int("axis", 0), rank);
    const auto& shape = idx_t.shape();
    const auto data_strides = strides_of(data.shape());
    const int64_t n = data.shape()[axis];
    Tensor y = Tensor::uninitialized(data.type(), shape);
    const size_t elem = element_size(data.type());
    std::vector<int64_t> counter(rank, 0);
    for (int64_t i = 0; i < y.size(); ++i) {
        int64_t k = indices[i];
        if (k < -n || k >= n) ctx.fail(fmt::format("index {} is out of range for a dimension of {}", k, n));
        if (k < 0) k += n;
        int64_t src = 0;
        for (int64_t d = 0; d < rank; ++d) {
            if (d != axis && counter[d] >= data.shape()[d]) ctx.fail("indices exceed the data's shape");
            src += (d == axis ? k : counter[d]) * data_strides[d];
        }
        copy_bytes(y.mutable_bytes().data() + i * elem, data.bytes().data() + src * elem, elem);
        for (int64_t d = rank - 1; d >= 0; --d) {
            if (++counter[d] < shape[d]) break;
            counter[d] = 0;
        }
    }
    out[0] = std::move(y);
}

void constant(KernelContext& ctx, std::vector<Tensor>& out) {
    if (const auto* t = ctx.attributes.get_tensor("value")) {
        out[0] = Tensor::from_proto(*t);
    } else if (ctx.attributes.has("value_float")) {
        const float v = ctx.attributes.get_float("value_float", 0);
        out[0] = Tensor::from_values<float>({}, std::span<const float>(&v, 1));
    } else if (ctx.attributes.has("value_floats")) {
        const auto v = ctx.attributes.get_floats("value_floats");
        out[0] = Tensor::from_values<float>({static_cast<int64_t>(v.size())}, v);
    } else if (ctx.attributes.has("value_int")) {
        const int64_t v = ctx.attributes.get_int("value_int", 0);
        out[0] = Tensor::from_values<int64_t>({}, std::span<const int64_t>(&v, 1));
    } else if (ctx.attributes.has("value_ints")) {
        out[0] = int64_vector(ctx.attributes.get_ints("value_ints"));
    } else {
        ctx.fail("has no value attribute vaiq can read (sparse and string values are not supported)");
    }
}

void constant_of_shape(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto shape = read_ints(ctx, ctx.input(0));
    const auto* value = ctx.attributes.get_tensor("value");
    const Tensor fill = value ? Tensor::from_proto(*value) : Tensor(DataType::Float, {1});
    Tensor y(fill.type(), shape);
    const size_t elem = element_size(fill.type());
    for (int64_t i = 0; i < y.size(); ++i)
        vaiq::copy_bytes(y.mutable_bytes().data() + i * elem, fill.bytes().data(), elem);
    out[0] = std::move(y);
}

void expand(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto shape = broadcast_shapes(ctx, x.shape(), read_ints(ctx, ctx.input(1)));
    const auto index = broadcast_index(x.shape(), shape);
    Tensor y = Tensor::uninitialized(x.type(), shape);
    const size_t elem = element_size(x.type());
    for (size_t i = 0; i < index.size(); ++i)
        vaiq::copy_bytes(y.mutable_bytes().data() + i * elem, x.bytes().data() + index[i] * elem, elem);
    out[0] = std::move(y);
}

void tile(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto repeats = read_ints(ctx, ctx.input(1));
    if (repeats.size() != x.shape().size()) ctx.fail("repeats does not match the input's rank");
    std::vector<int64_t> shape(x.shape().size());
    for (size_t d = 0; d < shape.size(); ++d) shape[d] = x.shape()[d] * repeats[d];
    Tensor y = Tensor::uninitialized(x.type(), shape);
    const auto in_strides = strides_of(x.shape());
    const size_t elem = element_size(x.type());
    std::vector<int64_t> counter(shape.size(), 0);
    for (int64_t i = 0; i < y.size(); ++i) {
        int64_t src = 0;
        for (size_t d = 0; d < shape.size(); ++d) src += (counter[d] % x.shape()[d]) * in_strides[d];
        vaiq::copy_bytes(y.mutable_bytes().data() + i * elem, x.bytes().data() + src * elem, elem);
        for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
            if (++counter[d] < shape[d]) break;
            counter[d] = 0;
        }
    }
    out[0] = std::move(y);
}

void slice(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto rank = static_cast<int64_t>(x.shape().size());
    // Before opset 10, starts, ends and axes are attributes and there are no steps.
    const bool attrs = ctx.opset < 10;
    const auto starts = attrs ? ctx.attributes.get_ints("starts") : read_ints(ctx, ctx.input(1));
    const auto ends = attrs ? ctx.attributes.get_ints("ends") : read_ints(ctx, ctx.input(2));
    std::vector<int64_t> axes(starts.size());
    std::iota(axes.begin(), axes.end(), 0);
    if (attrs)
        axes = ctx.attributes.get_ints("axes", axes);
    else if (ctx.has_input(3))
        axes = read_ints(ctx, ctx.input(3));
    std::vector<int64_t> steps(starts.size(), 1);
    if (!attrs && ctx.has_input(4)) steps = read_ints(ctx, ctx.input(4));
    if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
        ctx.fail("starts, ends, axes and steps differ in length");
    std::vector<int64_t> begin(rank, 0), step(rank, 1), shape = x.shape();
    for (size_t i = 0; i < starts.size(); ++i) {
        const int64_t a = normalize_axis(ctx, axes[i], rank);
        const int64_t dim = x.shape()[a];
        if (steps[i] == 0) ctx.fail("a step is 0");
        int64_t s = starts[i] < 0 ? starts[i] + dim : starts[i];
        int64_t e = ends[i] < 0 ? ends[i] + dim : ends[i];
        if (steps[i] > 0) {
            s = std::clamp<int64_t>(s, 0, dim);
            e = std::clamp<int64_t>(e, 0, dim);  // INT_MAX ends mean "to the end"
            shape[a] = e > s ? (e - s + steps[i] - 1) / steps[i] : 0;
        } else {
            s = std::clamp<int64_t>(s, 0, dim - 1);
            e = std::clamp<int64_t>(e, -1, dim - 1);
            shape[a] = s > e ? (s - e - steps[i] - 1) / -steps[i] : 0;
        }
        begin[a] = s;
        step[a] = steps[i];
    }
    Tensor y = Tensor::uninitialized(x.type(), shape);
    if (rank == 0 || y.size() == 0) {
        if (rank == 0) vaiq::copy_bytes(y.mutable_bytes().data(), x.bytes().data(), x.bytes().size());
        out[0] = std::move(y);
        return;
    }
    // Row by row along the last dimension.
    const auto in_strides = strides_of(x.shape());
    const size_t elem = element_size(x.type());
    const int64_t inner = shape.back(), rows = y.size() / inner;
    parallel_for(rows, y.size() > kParallelGrain, [&](int64_t r) {
        int64_t src = begin[rank - 1] * in_strides[rank - 1], rest = r;
        for (int64_t d = rank - 2; d >= 0; --d) {
            src += (begin[d] + (rest % shape[d]) * step[d]) * in_strides[d];
            rest /= shape[d];
        }
        strided_copy(y.mutable_bytes().data() + r * inner * elem, x.bytes().data() + src * elem, inner,
                     step[rank - 1] * in_strides[rank - 1], elem);
    });
    out[0] = std::move(y);
}

void split(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto rank = static_cast<int64_t>(x.shape().size());
    const int64_t axis = normalize_axis(ctx, ctx.attributes.get_int("axis", 0), rank);
    const int64_t dim = x.shape()[axis];
    std::vector<int64_t> sizes;
    if (ctx.opset >= 13) {
        if (ctx.has_input(1)) sizes = read_ints(ctx, ctx.input(1));
    } else {
        sizes = ctx.attributes.get_ints("split");
    }
    const auto parts = static_cast<int64_t>(out.size());
    if (sizes.empty()) {
        // Equal parts; with num_outputs (opset 18) the last may be smaller.
        const int64_t each = (dim + parts - 1) / parts;
        for (int64_t p = 0; p < parts; ++p) sizes.push_back(std::min(each, dim - p * each));
        if (ctx.opset < 18 && dim % parts != 0)
            ctx.fail(fmt::format("cannot split {} into {} equal parts", dim, parts));
    }
    if (static_cast<int64_t>(sizes.size()) != parts || std::accumulate(sizes.begin(), sizes.end(), int64_t{0}) != dim)
        ctx.fail("the split sizes do not add up to the dimension");
    int64_t outer = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= x.shape()[d];
    int64_t inner = 1;
    for (int64_t d = axis + 1; d < rank; ++d) inner *= x.shape()[d];
    const size_t elem = element_size(x.type());
    int64_t offset = 0;
    for (int64_t p = 0; p < parts; ++p) {
        auto shape = x.shape();
        shape[axis] = sizes[p];
        Tensor y = Tensor::uninitialized(x.type(), shape);
        const size_t chunk = static_cast<size_t>(sizes[p] * inner) * elem;
        for (int64_t o = 0; o < outer; ++o)
            vaiq::copy_bytes(y.mutable_bytes().data() + o * chunk, x.bytes().data() + (o * dim + offset) * inner * elem,
                             chunk);
        offset += sizes[p];
        out[p] = std::move(y);
    }
}

void range(KernelContext& ctx, std::vector<Tensor>& out) {
    for (size_t i = 0; i < 3; ++i)
        if (ctx.input(i).size() != 1) ctx.fail("start, limit and delta must be scalars");
    dispatch_numeric(ctx.input(0).type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const T start = view<T>(ctx.input(0))[0];
        const T limit = view<T>(ctx.input(1))[0];
        const T delta = view<T>(ctx.input(2))[0];
        if (delta == 0) ctx.fail("delta is 0");
        const double count = std::max(
            0.0, std::ceil((static_cast<double>(limit) - static_cast<double>(start)) / static_cast<double>(delta)));
        if (!(count < 9.0e15))  // beyond what any tensor can hold (a NaN bound counts 0 above)
            ctx.fail(fmt::format("the range would hold {} values", count));
        const auto n = static_cast<int64_t>(count);
        out[0] = make_tensor<T>({n});
        auto o = mutable_view<T>(out[0]);
        for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(start + static_cast<T>(i) * delta);
    });
}

// Pads with a constant, or reflect/edge/wrap; negative pads crop.
void pad(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto rank = static_cast<int64_t>(x.shape().size());
    const std::string mode = ctx.attributes.get_string("mode", "constant");
    std::vector<int64_t> pads;
    if (ctx.opset < 11) {
        pads = ctx.attributes.get_ints("pads");
    } else {
        const auto given = read_ints(ctx, ctx.input(1));
        std::vector<int64_t> axes(given.size() / 2);
        std::iota(axes.begin(), axes.end(), 0);
        if (ctx.has_input(3)) axes = read_ints(ctx, ctx.input(3));
        if (given.size() != 2 * axes.size()) ctx.fail("pads must hold two values per axis");
        pads.assign(2 * rank, 0);
        for (size_t i = 0; i < axes.size(); ++i) {
            const int64_t a = normalize_axis(ctx, axes[i], rank);
            pads[a] = given[i];
            pads[a + rank] = given[i + axes.size()];
        }
    }
    if (static_cast<int64_t>(pads.size()) != 2 * rank) ctx.fail("pads must hold two values per axis");
    std::vector<int64_t> shape(rank);
    for (int64_t d = 0; d < rank; ++d) {
        shape[d] = x.shape()[d] + pads[d] + pads[d + rank];
        if (shape[d] < 0) ctx.fail("negative pads remove more than the dimension holds");
        if (mode != "constant" && x.shape()[d] == 0 && shape[d] > 0)
            ctx.fail("cannot " + mode + "-pad an empty dimension");
    }
    if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap")
        ctx.fail("mode '" + mode + "' is not constant, reflect, edge or wrap");
    Tensor y(x.type(), shape);
    const size_t elem = element_size(x.type());
    // The fill value, as the input's element type.
    Tensor fill(x.type(), {1});
    if (ctx.opset < 11) {
        const float v = ctx.attributes.get_float("value", 0.0f);
        dispatch(x.type(), ctx, [&](auto tag) {
            using T = typename decltype(tag)::type;
            mutable_view<T>(fill)[0] = static_cast<T>(v);
        });
    } else if (ctx.has_input(2) && ctx.input(2).size() > 0) {
        vaiq::copy_bytes(fill.mutable_bytes().data(), ctx.input(2).bytes().data(), elem);
    }
    const auto in_strides = strides_of(x.shape());
    if (mode == "constant" && rank > 0 && x.size() > 0 &&
        std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p >= 0; })) {
        // Growing with a constant: the fill everywhere, then x's rows copied whole into place.
        auto* out_bytes = y.mutable_bytes().data();
        const auto* fill_bytes = fill.bytes().data();
        if (std::any_of(fill_bytes, fill_bytes + elem, [](std::byte b) { return b != std::byte{0}; }))
            for (int64_t i = 0; i < y.size(); ++i) vaiq::copy_bytes(out_bytes + i * elem, fill_bytes, elem);
        const auto out_strides = strides_of(shape);
        const int64_t row = x.shape()[rank - 1], rows = x.size() / row;
        const auto row_bytes = static_cast<size_t>(row) * elem;
        for (int64_t r = 0; r < rows; ++r) {
            int64_t rest = r, dst = pads[rank - 1];
            for (int64_t d = rank - 2; d >= 0; --d) {
                dst += (rest % x.shape()[d] + pads[d]) * out_strides[d];
                rest /= x.shape()[d];
            }
            vaiq::copy_bytes(out_bytes + dst * elem, x.bytes().data() + r * row * elem, row_bytes);
        }
        out[0] = std::move(y);
        return;
    }
    std::vector<int64_t> counter(rank, 0);
    for (int64_t i = 0; i < y.size(); ++i) {
        int64_t src = 0;
        bool outside = false;
        for (int64_t d = 0; d < rank; ++d) {
            int64_t at = counter[d] - pads[d];
            const int64_t n = x.shape()[d];
            if (at < 0 || at >= n) {
                if (mode == "constant")
                    outside = true;
                else if (mode == "edge")
                    at = std::clamp<int64_t>(at, 0, n - 1);
                else if (mode == "wrap")
                    at = ((at % n) + n) % n;
                else {
                    // reflect without repeating the edge; period 2(n-1)
                    const int64_t period = std::max<int64_t>(2 * (n - 1), 1);
                    at = ((at % period) + period) % period;
                    if (at >= n) at = period - at;
                }
            }
            src += at * in_strides[d];
        }
        vaiq::copy_bytes(y.mutable_bytes().data() + i * elem,
                         outside ? fill.bytes().data() : x.bytes().data() + src * elem, elem);
        for (int64_t d = rank - 1; d >= 0; --d) {
            if (++counter[d] < shape[d]) break;
            counter[d] = 0;
        }
    }
    out[0] = std::move(y);
}

const KernelRegistration kKernels[] = {
    {"", "Pad", 2, kLatest, pad},
    {"", "Reshape", 5, kLatest, reshape, always_in_team},
    {"", "Flatten", 9, kLatest, flatten, always_in_team},
    {"", "Squeeze", 1, kLatest, squeeze},
    {"", "Unsqueeze", 1, kLatest, unsqueeze},
    {"", "Transpose", 1, kLatest, transpose, always_in_team},
    {"", "Concat", 4, kLatest, concat},
    {"", "Shape", 1, kLatest, shape_kernel},
    {"", "Size", 1, kLatest, size_kernel},
    {"", "Gather", 1, kLatest, gather},
    {"", "GatherElements", 11, kLatest, gather_elements},
    {"", "Constant", 9, kLatest, constant},
    {"", "ConstantOfShape", 9, kLatest, constant_of_shape},
    {"", "Expand", 8, kLatest, expand},
    {"", "Tile", 6, kLatest, tile},
    {"", "Slice", 1, kLatest, slice},
    {"", "Split", 2, kLatest, split},
    {"", "Range", 11, kLatest, range},
};

}  // namespace
}  // namespace vaiq::runtime
