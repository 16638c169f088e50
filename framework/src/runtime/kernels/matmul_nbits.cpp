// com.microsoft MatMulNBits: A [..., K] times B stored as `bits`-bit blocks
// along K, column by column (see the matmul_nbits format). B stays packed (a
// decoder's weights must, for memory) and is expanded where it is used:
// - up to 16 rows (decoding token by token and short prompts, bound by
//   memory): each column's blocks are expanded in registers and multiplied
//   into the rows as they are read, four columns and four rows at a time;
// - more rows (prompts, bound by arithmetic): panels of 64 columns are
//   expanded k-major into a buffer per thread and multiplied from the cache,
//   six rows at a time (through oneDNN's sgemm on CPUs without AVX-512).
// Both sum in float, as ONNX Runtime does for accuracy levels 0 to 3.
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <memory>

#include "runtime/cpu_features.hpp"
#include "runtime/kernels/common.hpp"
#include "runtime/kernels/intrinsics.hpp"

namespace vaiq::runtime {
namespace {

// B's layout and data for one run. Weight (k, col) is
// q * scale[col, k / block] + offset[col, k / block], q the unsigned integer
// stored at bit (k % block) * bits of the column's block.
struct PackedB {
    int64_t k = 0, n = 0, block = 0, blocks = 0, blob = 0;
    int bits = 4;
    const uint8_t* data = nullptr;
    const float* scales = nullptr;
    const float* offsets = nullptr;  // -zero_point * scale
    // The same two per block and column ([blocks, N]), for vectors across columns.
    const float* scales_by_block = nullptr;
    const float* offsets_by_block = nullptr;

    const uint8_t* block_bytes(int64_t col, int64_t blk) const { return data + (col * blocks + blk) * blob; }
    size_t param(int64_t col, int64_t blk) const { return static_cast<size_t>(col * blocks + blk); }
};

// -zero_point * scale per column and block. Zero points: packed uint8
// [N, ceil(blocks / per_byte)], float [N, blocks], or the default 2^(bits - 1).
std::vector<float> block_offsets(const KernelContext& ctx, int64_t n, int64_t blocks, int bits, const float* scales) {
    const int per_byte = 8 / bits;
    const auto mask = static_cast<uint8_t>((1 << bits) - 1);
    const int64_t row_bytes = (blocks + per_byte - 1) / per_byte;
    const Tensor* z = ctx.has_input(3) ? &ctx.input(3) : nullptr;
    if (z && z->type() == DataType::Float && z->size() != n * blocks) ctx.fail("float zero_points must be [N, blocks]");
    if (z && z->type() != DataType::Float && (z->type() != DataType::UInt8 || z->size() != n * row_bytes))
        ctx.fail("zero_points do not match B");
    std::vector<float> out(static_cast<size_t>(n * blocks));
    for (int64_t col = 0; col < n; ++col)
        for (int64_t blk = 0; blk < blocks; ++blk) {
            float zp = static_cast<float>(1 << (bits - 1));
            if (z && z->type() == DataType::Float) {
                zp = z->data<float>()[static_cast<size_t>(col * blocks + blk)];
            } else if (z) {
                const uint8_t byte = z->data<uint8_t>()[static_cast<size_t>(col * row_bytes + blk / per_byte)];
                zp = static_cast<float>((byte >> (bits * (blk % per_byte))) & mask);
            }
            const auto i = static_cast<size_t>(col * blocks + blk);
            out[i] = -zp * scales[i];
        }
    return out;
}

// Column `col` of B as K floats.
void expand_column_scalar(const PackedB& b, int64_t col, float* out) {
    const int per_byte = 8 / b.bits;
    const auto mask = static_cast<uint8_t>((1 << b.bits) - 1);
    for (int64_t blk = 0; blk < b.blocks; ++blk) {
        const uint8_t* bytes = b.block_bytes(col, blk);
        const float scale = b.scales[b.param(col, blk)], offset = b.offsets[b.param(col, blk)];
        for (int64_t r = 0; r < b.block && blk * b.block + r < b.k; ++r) {
            const auto q = static_cast<float>((bytes[r / per_byte] >> (b.bits * (r % per_byte))) & mask);
            out[blk * b.block + r] = q * scale + offset;
        }
    }
}

// 16 consecutive weights of a block (block sizes are multiples of 16), from
// 8 bytes (4 bits, low nibble first) or 16 bytes (8 bits).
template <int Bits>
[[gnu::target("avx512f,fma"), gnu::always_inline]] inline __m512 expand_16(const uint8_t* p, __m512 scale,
                                                                            __m512 offset) {
    __m128i q;
    if constexpr (Bits == 4) {
        const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
        const __m128i low = _mm_set1_epi8(0x0F);
        q = _mm_unpacklo_epi8(_mm_and_si128(bytes, low), _mm_and_si128(_mm_srli_epi16(bytes, 4), low));
    } else {
        q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    }
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)), scale, offset);
}

// The lanes of the 16 weights from k on that lie inside K.
[[gnu::target("avx512f")]] inline __mmask16 lanes_inside(int64_t k, int64_t size) {
    return size - k >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (size - k)) - 1);
}

template <int Bits>
[[gnu::target("avx512f,fma")]] void expand_column_avx512(const PackedB& b, int64_t col, float* out) {
    for (int64_t blk = 0; blk < b.blocks; ++blk) {
        const uint8_t* bytes = b.block_bytes(col, blk);
        const __m512 scale = _mm512_set1_ps(b.scales[b.param(col, blk)]);
        const __m512 offset = _mm512_set1_ps(b.offsets[b.param(col, blk)]);
        for (int64_t j = 0, k = blk * b.block; j < b.block && k < b.k; j += 16, k += 16)
            _mm512_mask_storeu_ps(out + k, lanes_inside(k, b.k), expand_16<Bits>(bytes + j * Bits / 8, scale, offset));
    }
}

// acc[r][c] += one 4-bit block of C columns times `length` values of R rows
// from k0. 32 weights a step: their 16 bytes widened to 16 lanes, the low
// nibbles (even k) and the high ones (odd k) looked up in a table of the
// block's 16 values; the rows come de-interleaved to match (see
// deinterleaved_rows), so no nibble is shuffled back into order.
constexpr int64_t kPrefetchBytes = 1024;  // how far ahead each column's bytes are asked for

template <int R, int C>
[[gnu::target("avx512f,fma"), gnu::always_inline]] inline void multiply_block_4bit(
    const uint8_t* const bytes[C], const __m512 scale[C], const __m512 offset[C], const float* a, int64_t lda,
    int64_t k0, int64_t length, __m512 acc[R][C]) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i nibble = _mm512_set1_epi32(0x0F);
    __m512 table[C];
    for (int c = 0; c < C; ++c) table[c] = _mm512_fmadd_ps(iota, scale[c], offset[c]);
    for (int64_t j = 0; j < length; j += 32) {
        __m512 even[C], odd[C];
        for (int c = 0; c < C; ++c) {
            _mm_prefetch(reinterpret_cast<const char*>(bytes[c] + j / 2) + kPrefetchBytes, _MM_HINT_T0);
            const __m512i wide = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes[c] + j / 2)));
            even[c] = _mm512_permutexvar_ps(_mm512_and_si512(wide, nibble), table[c]);
            odd[c] = _mm512_permutexvar_ps(_mm512_srli_epi32(wide, 4), table[c]);
        }
        for (int r = 0; r < R; ++r) {
            const __m512 x0 = _mm512_loadu_ps(a + r * lda + k0 + j);
            const __m512 x1 = _mm512_loadu_ps(a + r * lda + k0 + j + 16);
            for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(odd[c], x1, _mm512_fmadd_ps(even[c], x0, acc[r][c]));
        }
    }
}

// Rows of A [rows, K] laid out for multiply_block_4bit: each run of 32 values
// as its 16 even then its 16 odd ones, zeros past K up to whole blocks.
std::vector<float> deinterleaved_rows(const float* a, int64_t rows, int64_t k, int64_t padded_k) {
    std::vector<float> out(static_cast<size_t>(rows * padded_k), 0.0f);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < k; ++i) {
            const int64_t run = i / 32 * 32, at = i % 32;
            out[static_cast<size_t>(r * padded_k + run + (at % 2) * 16 + at / 2)] = a[r * k + i];
        }
    return out;
}

// out[r, col..col+C) for R rows of A (row stride lda), the columns expanded
// block by block in registers.
template <int Bits, int R, int C>
[[gnu::target("avx512f,fma")]] void rows_times_columns(const PackedB& b, const float* a, int64_t lda, int64_t col,
                                                       float* out, int64_t ldo) {
    __m512 acc[R][C];
    for (auto& row : acc)
        for (auto& v : row) v = _mm512_setzero_ps();
    for (int64_t blk = 0; blk < b.blocks; ++blk) {
        __m512 scale[C], offset[C];
        const uint8_t* bytes[C];
        for (int c = 0; c < C; ++c) {
            scale[c] = _mm512_set1_ps(b.scales[b.param(col + c, blk)]);
            offset[c] = _mm512_set1_ps(b.offsets[b.param(col + c, blk)]);
            bytes[c] = b.block_bytes(col + c, blk);
        }
        if constexpr (Bits == 4) {
            if (b.block >= 32) {
                multiply_block_4bit<R, C>(bytes, scale, offset, a, lda, blk * b.block, b.block, acc);
                continue;
            }
        }
        for (int64_t j = 0, k = blk * b.block; j < b.block && k < b.k; j += 16, k += 16) {
            __m512 w[C];
            for (int c = 0; c < C; ++c) w[c] = expand_16<Bits>(bytes[c] + j * Bits / 8, scale[c], offset[c]);
            const __mmask16 inside = lanes_inside(k, b.k);
            for (int r = 0; r < R; ++r) {
                const __m512 x = _mm512_maskz_loadu_ps(inside, a + r * lda + k);
                for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(w[c], x, acc[r][c]);
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) out[r * ldo + col + c] = _mm512_reduce_add_ps(acc[r][c]);
}

template <int Bits, int R>
void rows_times_b(const PackedB& b, const float* a, int64_t lda, float* out) {
    constexpr int kColumns = 4;
    const int64_t groups = (b.n + kColumns - 1) / kColumns;
    parallel_for(groups, true, [&](int64_t g) {
        const int64_t col = g * kColumns;
        if (col + kColumns <= b.n) {
            rows_times_columns<Bits, R, kColumns>(b, a, lda, col, out, b.n);
        } else {
            for (int64_t c = col; c < b.n; ++c) rows_times_columns<Bits, R, 1>(b, a, lda, c, out, b.n);
        }
    });
}

// Rows up to which expanding in registers beats expanding panels once (measured:
// the two meet near 24 rows of a 2048 x 5632 block); four rows at a time share
// each expanded block.
constexpr int64_t kFusedRows = 16;

template <int Bits>
void few_rows_times_b(const PackedB& b, const float* a, int64_t rows, float* out) {
    // 4-bit blocks of 32 and more read the rows de-interleaved (multiply_block_4bit).
    std::vector<float> deinterleaved;
    int64_t lda = b.k;
    if (Bits == 4 && b.block >= 32) {
        lda = b.blocks * b.block;
        deinterleaved = deinterleaved_rows(a, rows, b.k, lda);
        a = deinterleaved.data();
    }
    for (int64_t r = 0; r < rows; r += 4) {
        const float* group = a + r * lda;
        float* group_out = out + r * b.n;
        switch (std::min<int64_t>(rows - r, 4)) {
            case 1: rows_times_b<Bits, 1>(b, group, lda, group_out); break;
            case 2: rows_times_b<Bits, 2>(b, group, lda, group_out); break;
            case 3: rows_times_b<Bits, 3>(b, group, lda, group_out); break;
            default: rows_times_b<Bits, 4>(b, group, lda, group_out); break;
        }
    }
}

// Columns per panel of the many-rows path: four vectors.
constexpr int64_t kPanelColumns = 64;
constexpr int kPanelVectors = kPanelColumns / 16;

// out[r, 0..width) (+)= R rows of A times a panel packed [K][64] (k-major):
// each k broadcasts one value per row against the panel's four vectors.
template <int R>
[[gnu::target("avx512f,fma")]] void rows_times_panel(const float* panel, int64_t k_size, const float* a, int64_t lda,
                                                     float* out, int64_t ldo, int64_t width, bool accumulate) {
    __mmask16 lanes[kPanelVectors];
    for (int v = 0; v < kPanelVectors; ++v) lanes[v] = width > 16 * v ? lanes_inside(16 * v, width) : __mmask16(0);
    __m512 acc[R][kPanelVectors];
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < kPanelVectors; ++v)
            acc[r][v] = accumulate ? _mm512_maskz_loadu_ps(lanes[v], out + r * ldo + 16 * v) : _mm512_setzero_ps();
    for (int64_t k = 0; k < k_size; ++k) {
        __m512 w[kPanelVectors];
        for (int v = 0; v < kPanelVectors; ++v) w[v] = _mm512_loadu_ps(panel + k * kPanelColumns + 16 * v);
        for (int r = 0; r < R; ++r) {
            const __m512 x = _mm512_set1_ps(a[r * lda + k]);
            for (int v = 0; v < kPanelVectors; ++v) acc[r][v] = _mm512_fmadd_ps(w[v], x, acc[r][v]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < kPanelVectors; ++v) _mm512_mask_storeu_ps(out + r * ldo + 16 * v, lanes[v], acc[r][v]);
}

// Expands 16 columns (from `col`, `width` of them valid) of 4-bit B, blocks
// [first_block, end_block), into the k-major panel (rows of kPanelColumns
// floats, `panel` pointing at the first of the 16): each 8-byte run of the 16
// columns is gathered, transposed bytewise (the byte j of every column side by
// side) and split into its low (k = 2j) and high (k = 2j + 1) nibbles.
[[gnu::target("avx512f,avx512bw,avx512vbmi,fma")]] void expand_16_columns_4bit(const PackedB& b, int64_t col,
                                                                              int64_t width, int64_t first_block,
                                                                              int64_t end_block, float* panel) {
    const int64_t stride = b.blocks * b.blob;
    const __mmask8 first = static_cast<__mmask8>(width >= 8 ? 0xFF : (1u << width) - 1);
    const __mmask8 second = static_cast<__mmask8>(width >= 16 ? 0xFF : width > 8 ? (1u << (width - 8)) - 1 : 0);
    const __mmask16 valid = lanes_inside(0, width);
    const __m512i offsets_low = _mm512_set_epi64(7 * stride, 6 * stride, 5 * stride, 4 * stride, 3 * stride,
                                                 2 * stride, stride, 0);
    const __m512i offsets_high = _mm512_add_epi64(offsets_low, _mm512_set1_epi64(8 * stride));
    // Byte j of column c is byte c * 8 + j of the gathered pair (columns 8-15 from 64 on).
    alignas(64) uint8_t order[2][64];
    for (int half = 0; half < 2; ++half)
        for (int j = 0; j < 4; ++j)
            for (int c = 0; c < 16; ++c) order[half][j * 16 + c] = static_cast<uint8_t>(c * 8 + half * 4 + j);
    const __m512i order_low = _mm512_load_si512(order[0]), order_high = _mm512_load_si512(order[1]);
    const __m128i nibble = _mm_set1_epi8(0x0F);
    for (int64_t blk = first_block; blk < end_block; ++blk) {
        const size_t at = static_cast<size_t>(blk * b.n + col);
        const __m512 scale = _mm512_maskz_loadu_ps(valid, b.scales_by_block + at);
        const __m512 offset = _mm512_maskz_loadu_ps(valid, b.offsets_by_block + at);
        const uint8_t* base = b.block_bytes(col, blk);
        for (int64_t j = 0; j < b.blob; j += 8) {
            const __m512i low = _mm512_mask_i64gather_epi64(_mm512_setzero_si512(), first, offsets_low, base + j, 1);
            const __m512i high = _mm512_mask_i64gather_epi64(_mm512_setzero_si512(), second, offsets_high, base + j, 1);
            const __m512i rows[2] = {_mm512_permutex2var_epi8(low, order_low, high),
                                     _mm512_permutex2var_epi8(low, order_high, high)};
            float* out = panel + ((blk - first_block) * b.block + j * 2) * kPanelColumns;
            for (int r = 0; r < 8; ++r) {
                __m128i bytes;
                switch (r % 4) {  // the lane index must be a constant
                    case 0: bytes = _mm512_extracti32x4_epi32(rows[r / 4], 0); break;
                    case 1: bytes = _mm512_extracti32x4_epi32(rows[r / 4], 1); break;
                    case 2: bytes = _mm512_extracti32x4_epi32(rows[r / 4], 2); break;
                    default: bytes = _mm512_extracti32x4_epi32(rows[r / 4], 3); break;
                }
                const __m128i even = _mm_and_si128(bytes, nibble), odd = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
                _mm512_storeu_ps(out + (2 * r) * kPanelColumns,
                                 _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(even)), scale, offset));
                _mm512_storeu_ps(out + (2 * r + 1) * kPanelColumns,
                                 _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(odd)), scale, offset));
            }
        }
    }
}

// Rows of A against one panel in groups of kGroupRows (24 accumulators), then the rest.
constexpr int64_t kGroupRows = 6;

template <int R = kGroupRows>
void rows_times_panel_tail(const float* panel, int64_t k_size, const float* a, int64_t lda, float* out, int64_t ldo,
                           int64_t width, int64_t rows, bool accumulate) {
    if constexpr (R > 0) {
        if (rows == R) return rows_times_panel<R>(panel, k_size, a, lda, out, ldo, width, accumulate);
        rows_times_panel_tail<R - 1>(panel, k_size, a, lda, out, ldo, width, rows, accumulate);
    }
}

// A [rows, K] times B through panels of 64 expanded columns, shared among
// threads: each panel is expanded k-major once (4 bits with AVX512-VBMI:
// gathered, in chunks of K that stay in the cache; else column by column, then
// transposed) and read by every group of 6 rows. On CPUs without AVX-512 the
// expanded columns go to oneDNN's sgemm.
void panels_times_b(const PackedB& b, const float* a, int64_t rows, float* out, bool vector) {
    const int64_t panels = (b.n + kPanelColumns - 1) / kPanelColumns;
    const int64_t padded_k = b.blocks * b.block;
    const bool gathered = vector && b.bits == 4 && cpu_features().avx512vbmi;
    constexpr int64_t kChunk = 512;  // k values per panel chunk: 128 KB
    const int64_t chunk_blocks = std::max<int64_t>(1, kChunk / b.block);
    // out[:, col..col+width) += A[:, k0..k0+k_size) x the panel, 6 rows at a time.
    auto for_row_groups = [&](const float* panel, int64_t k0, int64_t k_size, int64_t col, int64_t width,
                              bool accumulate) {
        int64_t r = 0;
        for (; r + kGroupRows <= rows; r += kGroupRows)
            rows_times_panel<kGroupRows>(panel, k_size, a + r * b.k + k0, b.k, out + r * b.n + col, b.n, width,
                                         accumulate);
        rows_times_panel_tail(panel, k_size, a + r * b.k + k0, b.k, out + r * b.n + col, b.n, width, rows - r,
                              accumulate);
    };
    bool failed = false;
#pragma omp parallel
    {
        std::vector<float> columns(gathered ? 0 : static_cast<size_t>(kPanelColumns * padded_k), 0.0f);
        std::vector<float> panel(!vector ? 0 : static_cast<size_t>(kPanelColumns * (gathered ? chunk_blocks * b.block : padded_k)));
#pragma omp for schedule(dynamic)
        for (int64_t p = 0; p < panels; ++p) {
            const int64_t col = p * kPanelColumns, width = std::min(kPanelColumns, b.n - col);
            if (gathered) {
                // K in chunks whose panel stays in the core's cache.
                for (int64_t blk = 0; blk < b.blocks; blk += chunk_blocks) {
                    const int64_t end = std::min(b.blocks, blk + chunk_blocks), k0 = blk * b.block;
                    const int64_t k_size = std::min(b.k, end * b.block) - k0;
                    for (int64_t c = 0; c < width; c += 16)
                        expand_16_columns_4bit(b, col + c, width - c, blk, end, panel.data() + c);
                    for_row_groups(panel.data(), k0, k_size, col, width, blk > 0);
                }
                continue;
            }
            for (int64_t c = 0; c < width; ++c) {
                float* column = columns.data() + c * padded_k;
                if (vector && b.bits == 4) expand_column_avx512<4>(b, col + c, column);
                else if (vector) expand_column_avx512<8>(b, col + c, column);
                else expand_column_scalar(b, col + c, column);
            }
            if (!vector) {
                // out[:, col..col+width) = A [rows, K] x columns^T ([width, K] row-major).
                if (dnnl_sgemm('N', 'T', rows, width, b.k, 1.0f, a, b.k, columns.data(), padded_k, 0.0f, out + col,
                               b.n) != dnnl_success) {
#pragma omp atomic write
                    failed = true;
                }
                continue;
            }
            transpose_4_byte(columns.data(), panel.data(), 1, kPanelColumns, padded_k);
            for_row_groups(panel.data(), 0, b.k, col, width, false);
        }
    }
    if (failed) throw InternalError("MatMulNBits: oneDNN's sgemm failed");
}

struct NBitsState {
    std::vector<float> offsets, scales_by_block, offsets_by_block;
};

// [N, blocks] as [blocks, N].
std::vector<float> by_block(const float* v, int64_t n, int64_t blocks) {
    std::vector<float> out(static_cast<size_t>(n * blocks));
    for (int64_t col = 0; col < n; ++col)
        for (int64_t blk = 0; blk < blocks; ++blk)
            out[static_cast<size_t>(blk * n + col)] = v[static_cast<size_t>(col * blocks + blk)];
    return out;
}

void matmul_nbits(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& a = ctx.input(0);
    if (a.type() != DataType::Float) ctx.fail("A must be float");
    PackedB b;
    b.k = ctx.attributes.get_int("K", 0);
    b.n = ctx.attributes.get_int("N", 0);
    b.bits = static_cast<int>(ctx.attributes.get_int("bits", 4));
    b.block = ctx.attributes.get_int("block_size", 0);
    if (b.k <= 0 || b.n <= 0 || (b.bits != 4 && b.bits != 8) || b.block < 16 || (b.block & (b.block - 1)) != 0)
        ctx.fail("K, N, bits (4 or 8) and block_size (a power of two from 16) are required");
    if (a.shape().empty() || a.shape().back() != b.k) ctx.fail("A's last dimension must be K");
    if (ctx.has_input(4)) ctx.fail("g_idx is not supported");
    b.blocks = (b.k + b.block - 1) / b.block;
    b.blob = b.block * b.bits / 8;
    const auto& packed = ctx.input(1);
    if (packed.type() != DataType::UInt8 || packed.size() != b.n * b.blocks * b.blob)
        ctx.fail("B must be uint8 [N, blocks, blob]");
    const auto& scales = ctx.input(2);
    if (scales.type() != DataType::Float || scales.size() != b.n * b.blocks) ctx.fail("scales must be float [N, blocks]");
    b.data = packed.data<uint8_t>().data();
    b.scales = scales.data<float>().data();
    // The offsets, kept across runs while scales and zero points are constants.
    const bool constant = ctx.is_constant(2) && (!ctx.has_input(3) || ctx.is_constant(3));
    std::shared_ptr<NBitsState> state;
    if (constant && ctx.state) state = std::static_pointer_cast<NBitsState>(ctx.state);
    if (!state) {
        state = std::make_shared<NBitsState>();
        state->offsets = block_offsets(ctx, b.n, b.blocks, b.bits, b.scales);
        state->scales_by_block = by_block(b.scales, b.n, b.blocks);
        state->offsets_by_block = by_block(state->offsets.data(), b.n, b.blocks);
        if (constant) ctx.state = state;
    }
    b.offsets = state->offsets.data();
    b.scales_by_block = state->scales_by_block.data();
    b.offsets_by_block = state->offsets_by_block.data();

    auto shape = a.shape();
    shape.back() = b.n;
    const int64_t rows = a.size() / b.k;
    out[0] = make_tensor<float>(shape);
    float* y = out[0].mutable_data<float>().data();
    const float* x = a.data<float>().data();
    const bool vector = cpu_features().avx512f && cpu_features().fma;
    if (rows > 0 && rows <= kFusedRows && vector) {
        if (b.bits == 4) few_rows_times_b<4>(b, x, rows, y);
        else few_rows_times_b<8>(b, x, rows, y);
    } else if (rows > 0) {
        panels_times_b(b, x, rows, y, vector);
    }
    if (ctx.has_input(5)) {
        const auto& bias = ctx.input(5);
        if (bias.type() != DataType::Float || bias.size() != b.n) ctx.fail("bias must be float [N]");
        const float* bv = bias.data<float>().data();
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < b.n; ++c) y[r * b.n + c] += bv[c];
    }
}

const KernelRegistration kKernels[] = {
    {"com.microsoft", "MatMulNBits", 1, 1, matmul_nbits},
};

}  // namespace
}  // namespace vaiq::runtime
