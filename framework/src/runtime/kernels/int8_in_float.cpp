#include "runtime/kernels/int8_in_float.hpp"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <type_traits>

#include "runtime/cpu_features.hpp"
#include "runtime/kernels/dnnl_util.hpp"
#include "runtime/kernels/intrinsics.hpp"
#include "runtime/kernels/window.hpp"
#include "runtime/parallel_for.hpp"

namespace vaiq::runtime {

using dnnl::memory;

namespace {

// Integers up to 2^24 in magnitude are exact in float32 (24-bit significand).
constexpr double kExactSum = 16777216.0;

using Floats = std::vector<float, DefaultInitAllocator<float>>;

// The largest |v - zero_point| an 8-bit tensor of `type` holds.
double centred_bound(DataType type, int32_t zero_point) {
    const int32_t lo = type == DataType::UInt8 ? 0 : -128, hi = type == DataType::UInt8 ? 255 : 127;
    return std::max(std::abs(lo - zero_point), std::abs(hi - zero_point));
}

// Cuts `items` (input channels, or rows of B) into consecutive chunks so that
// in each chunk every column's sum of magnitudes stays within `limit`;
// `magnitudes(i, out)` writes item i's `columns` values. Returns the chunks'
// starts and then `items`; nullopt when one item alone goes beyond the limit.
std::optional<std::vector<int64_t>> chunk_starts(const std::function<void(int64_t, double*)>& magnitudes, int64_t items,
                                                 int64_t columns, double limit) {
    std::vector<int64_t> starts{0};
    std::vector<double> running(static_cast<size_t>(columns), 0.0), row(static_cast<size_t>(columns));
    for (int64_t i = 0; i < items; ++i) {
        magnitudes(i, row.data());
        bool fits = true;
        for (int64_t j = 0; j < columns; ++j) fits &= running[j] + row[j] <= limit;
        if (!fits) {
            starts.push_back(i);
            std::fill(running.begin(), running.end(), 0.0);
        }
        for (int64_t j = 0; j < columns; ++j)
            if ((running[j] += row[j]) > limit) return std::nullopt;
    }
    starts.push_back(items);
    return starts;
}

// Values [i, end) of 8-bit `x`, centred, in float: eight at a time with AVX2.
template <typename T>
[[gnu::target("avx2")]] void centre_avx2(const T* x, float* out, int64_t i, int64_t end, int32_t zero_point) {
    const __m256i zp = _mm256_set1_epi32(zero_point);
    for (; i + 8 <= end; i += 8) {
        const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(x + i));
        const __m256i wide = std::is_signed_v<T> ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes);
        _mm256_storeu_ps(out + i, _mm256_cvtepi32_ps(_mm256_sub_epi32(wide, zp)));
    }
    for (; i < end; ++i) out[i] = static_cast<float>(static_cast<int32_t>(x[i]) - zero_point);
}

// Centred values of 8-bit `x` in float, as they are.
template <typename T>
void centre(const T* x, float* out, int64_t count, int32_t zero_point) {
    static const bool avx2 = cpu_features().avx2;
    parallel_for_pieces(count, kParallelGrain, count > kParallelGrain, [&](int64_t start, int64_t end) {
        if (avx2) {
            centre_avx2(x, out, start, end, zero_point);
        } else {
            for (int64_t i = start; i < end; ++i) out[i] = static_cast<float>(static_cast<int32_t>(x[i]) - zero_point);
        }
    });
}

void centre(const Tensor& x, float* out, int32_t zero_point) {
    if (x.type() == DataType::UInt8)
        centre(x.data<uint8_t>().data(), out, x.size(), zero_point);
    else
        centre(x.data<int8_t>().data(), out, x.size(), zero_point);
}

// Channels [c0, c0 + cc) of NCHW 8-bit `x` ([n, c, plane]), centred, into
// channels-last floats [n, plane, cc]: tiles of pixels, so that the rows a tile
// writes stay in the cache.
template <typename T>
void centre_channels_last(const T* x, float* out, int64_t n, int64_t c, int64_t plane, int64_t c0, int64_t cc,
                          int32_t zero_point) {
    constexpr int64_t kTile = 64;
    const int64_t tiles = (plane + kTile - 1) / kTile;
    parallel_for(n * tiles, n * plane * cc > kParallelGrain, [&](int64_t bt) {
        const int64_t b = bt / tiles, t = bt % tiles;
        const int64_t p0 = t * kTile, p1 = std::min(plane, p0 + kTile);
        for (int64_t ch = 0; ch < cc; ++ch) {
            const T* src = x + (b * c + c0 + ch) * plane;
            float* dst = out + b * plane * cc + ch;
            for (int64_t p = p0; p < p1; ++p)
                dst[p * cc] = static_cast<float>(static_cast<int32_t>(src[p]) - zero_point);
        }
    });
}

// Channels [c0, c0 + cc) of channels-last 8-bit pixels ([pixels, c]), centred, into [pixels, cc].
template <typename T>
void centre_pixels(const T* x, float* out, int64_t pixels, int64_t c, int64_t c0, int64_t cc, int32_t zero_point) {
    if (cc == c) return centre(x, out, pixels * c, zero_point);  // every channel: the values as they are
    parallel_for(pixels, pixels * cc > kParallelGrain, [&](int64_t p) {
        const T* src = x + p * c + c0;
        float* dst = out + p * cc;
        for (int64_t ch = 0; ch < cc; ++ch) dst[ch] = static_cast<float>(static_cast<int32_t>(src[ch]) - zero_point);
    });
}

// A chunk's float sums (exact integers) into the int32 sums: written by the first chunk, added by the rest.
void gather_sums(const float* sums, int32_t* into, int64_t count, bool first) {
    if (first) {
        parallel_for(count, count > kParallelGrain, [&](int64_t i) { into[i] = static_cast<int32_t>(sums[i]); });
    } else {
        parallel_for(count, count > kParallelGrain, [&](int64_t i) { into[i] += static_cast<int32_t>(sums[i]); });
    }
}

// A convolution over input channels [c0, c1): its primitive and its centred
// weights in the primitive's layout.
struct FloatConvChunk {
    int64_t c0 = 0, c1 = 0;
    memory::desc src;
    dnnl::convolution_forward primitive;
    memory weights;
};

struct FloatConvState {
    std::vector<int64_t> x_shape, y_shape;  ///< y_shape: logical NCHW
    bool channels_last = false;             ///< x is NHWC
    DataType x_type = DataType::UInt8;
    int32_t x_zero_point = 0;
    const Tensor* weights_of = nullptr;  ///< the constant weights the chunks hold
    memory::desc dst;
    std::vector<FloatConvChunk> chunks;
};

// The chunks of input channels for weights `w` [M, C/group, kh, kw] (int8, zero
// point 0) and inputs whose centred values reach `x_bound`.
std::optional<std::vector<int64_t>> conv_chunks(const Tensor& w, int64_t c, int64_t group, double x_bound) {
    const auto wv = w.data<int8_t>();
    const int64_t m = w.shape()[0], cg = w.shape()[1], plane = w.shape()[2] * w.shape()[3];
    const double limit = kExactSum / x_bound;
    if (group > 1) {  // grouped (depthwise, mostly): whole, when each output's sum fits
        for (int64_t oc = 0; oc < m; ++oc) {
            double sum = 0;
            for (int64_t i = 0; i < cg * plane; ++i) sum += std::abs(static_cast<int32_t>(wv[oc * cg * plane + i]));
            if (sum > limit) return std::nullopt;
        }
        return std::vector<int64_t>{0, c};
    }
    auto magnitudes = [&](int64_t ic, double* out) {  // per output channel, |w| over the kernel
        for (int64_t oc = 0; oc < m; ++oc) {
            int32_t sum = 0;
            const int8_t* k = wv.data() + (oc * c + ic) * plane;
            for (int64_t t = 0; t < plane; ++t) sum += std::abs(static_cast<int32_t>(k[t]));
            out[oc] = sum;
        }
    };
    return chunk_starts(magnitudes, c, m, limit);
}

FloatConvState* prepared_conv(KernelContext& ctx, const Tensor& x, int32_t x_zero_point, const Tensor& w,
                              bool w_constant, std::shared_ptr<void>& opaque, bool channels_last) {
    if (x.shape().size() != 4 || w.shape().size() != 4 || w.type() != DataType::Int8 ||
        (x.type() != DataType::UInt8 && x.type() != DataType::Int8))
        return nullptr;
    auto state = std::static_pointer_cast<FloatConvState>(opaque);
    if (state && state->x_shape == x.shape() && state->channels_last == channels_last && state->x_type == x.type() &&
        state->x_zero_point == x_zero_point && w_constant && state->weights_of == &w)
        return state.get();
    // The logical (NCHW) dimensions of x.
    const auto xs =
        channels_last ? std::vector<int64_t>{x.shape()[0], x.shape()[3], x.shape()[1], x.shape()[2]} : x.shape();
    const int64_t n = xs[0], c = xs[1], m = w.shape()[0], group = ctx.attributes.get_int("group", 1);
    if (group < 1 || c % group != 0 || m % group != 0 || w.shape()[1] != c / group)
        ctx.fail("channels, weights and group disagree");
    const auto starts = conv_chunks(w, c, group, centred_bound(x.type(), x_zero_point));
    if (!starts) return nullptr;
    state = std::make_shared<FloatConvState>();
    state->x_shape = x.shape();
    state->channels_last = channels_last;
    state->x_type = x.type();
    state->x_zero_point = x_zero_point;
    state->weights_of = w_constant ? &w : nullptr;
    const std::vector<int64_t> in(xs.begin() + 2, xs.end()), kernel(w.shape().begin() + 2, w.shape().end());
    const auto g = WindowGeometry::from(ctx, in, kernel, false);
    state->y_shape = {n, m, g.out[0], g.out[1]};
    state->dst = memory::desc({n, m, g.out[0], g.out[1]}, memory::data_type::f32, memory::format_tag::nhwc);
    const memory::dims dilation{g.dilations[0] - 1, g.dilations[1] - 1};
    const auto wv = w.data<int8_t>();
    const int64_t plane = kernel[0] * kernel[1];
    dnnl::stream stream(cpu_engine());
    for (size_t i = 0; i + 1 < starts->size(); ++i) {
        FloatConvChunk chunk;
        chunk.c0 = (*starts)[i];
        chunk.c1 = (*starts)[i + 1];
        const int64_t cc = chunk.c1 - chunk.c0;
        // Grouped weights are whole ([g, M/g, C/g, kh, kw]); a chunk's are [M, cc, kh, kw].
        memory::dims w_dims{m, group > 1 ? c / group : cc, kernel[0], kernel[1]};
        if (group > 1) {
            w_dims[0] = m / group;
            w_dims.insert(w_dims.begin(), group);
        }
        chunk.src = memory::desc({n, cc, in[0], in[1]}, memory::data_type::f32, memory::format_tag::nhwc);
        const memory::desc w_any(w_dims, memory::data_type::f32, memory::format_tag::any);
        const dnnl::convolution_forward::desc desc(
            dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, chunk.src, w_any, state->dst,
            dims_of(g.strides), dilation, dims_of(g.pad_begin), dims_of(g.pad_end));
        const dnnl::convolution_forward::primitive_desc pd(desc, cpu_engine());
        chunk.primitive = dnnl::convolution_forward(pd);
        Floats weights(static_cast<size_t>(m * (group > 1 ? c / group : cc) * plane));
        if (group > 1) {
            std::transform(wv.begin(), wv.end(), weights.begin(), [](int8_t v) { return static_cast<float>(v); });
        } else {
            for (int64_t oc = 0; oc < m; ++oc)
                for (int64_t i2 = 0; i2 < cc * plane; ++i2)
                    weights[oc * cc * plane + i2] = static_cast<float>(wv[(oc * c + chunk.c0) * plane + i2]);
        }
        memory user(memory::desc(w_dims, memory::data_type::f32, plain_tag(w_dims.size(), group > 1)), cpu_engine(),
                    weights.data());
        chunk.weights = memory(pd.weights_desc(), cpu_engine());
        dnnl::reorder(user, chunk.weights).execute(stream, user, chunk.weights);
        state->chunks.push_back(std::move(chunk));
    }
    stream.wait();
    opaque = state;
    return state.get();
}

}  // namespace

namespace {

// The convolution's sums without the bias, channels-last [N, out..., M], of the
// prepared state's x (NCHW or NHWC as prepared): the last chunk's in float
// (exact integers), the earlier chunks' added up in int32 (empty for one chunk),
// so that the caller converts the last chunk where it reads it.
struct ConvSums {
    Floats last;
    Int32Sums earlier;

    // Values [first, first + count) as int32.
    void to_int32(int64_t first, int64_t count, int32_t* out) const {
        const float* f = last.data() + first;
        if (earlier.empty())
            for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(f[i]);
        else
            for (int64_t i = 0; i < count; ++i) out[i] = earlier[first + i] + static_cast<int32_t>(f[i]);
    }
};

ConvSums channels_last_sums(FloatConvState& state, const Tensor& x, int32_t x_zero_point) {
    const auto& ys = state.y_shape;
    const int64_t n = ys[0], count = n * ys[1] * ys[2] * ys[3];
    const int64_t c = state.channels_last ? state.x_shape[3] : state.x_shape[1];
    const int64_t plane =
        state.channels_last ? state.x_shape[1] * state.x_shape[2] : state.x_shape[2] * state.x_shape[3];
    Floats src;
    ConvSums sums;
    sums.last.resize(static_cast<size_t>(count));
    dnnl::stream stream(cpu_engine());
    for (size_t i = 0; i < state.chunks.size(); ++i) {
        auto& chunk = state.chunks[i];
        const int64_t cc = chunk.c1 - chunk.c0;
        src.resize(static_cast<size_t>(n * plane * cc));
        auto gather = [&](const auto* v) {
            if (state.channels_last)  // pixels of c values: each pixel's cc of them
                centre_pixels(v, src.data(), n * plane, c, chunk.c0, cc, x_zero_point);
            else
                centre_channels_last(v, src.data(), n, c, plane, chunk.c0, cc, x_zero_point);
        };
        if (x.type() == DataType::UInt8)
            gather(x.data<uint8_t>().data());
        else
            gather(x.data<int8_t>().data());
        if (i > 0) {  // the previous chunk's sums into the int32 ones
            if (sums.earlier.empty()) sums.earlier.resize(static_cast<size_t>(count));
            gather_sums(sums.last.data(), sums.earlier.data(), count, i == 1);
        }
        memory src_memory(chunk.src, cpu_engine(), src.data()), dst_memory(state.dst, cpu_engine(), sums.last.data());
        chunk.primitive.execute(
            stream, {{DNNL_ARG_SRC, src_memory}, {DNNL_ARG_WEIGHTS, chunk.weights}, {DNNL_ARG_DST, dst_memory}});
        stream.wait();
    }
    return sums;
}

// Per output channel, the bias negated (what ChannelsLastSums' offsets take off), or zeros.
std::vector<int32_t> minus(const int32_t* bias, int64_t m) {
    std::vector<int32_t> out(static_cast<size_t>(m), 0);
    if (bias)
        for (int64_t oc = 0; oc < m; ++oc) out[oc] = static_cast<int32_t>(0u - static_cast<uint32_t>(bias[oc]));
    return out;
}

}  // namespace

std::optional<Int32Sums> int8_conv_in_float(KernelContext& ctx, const Tensor& x, int32_t x_zero_point, const Tensor& w,
                                            bool w_constant, std::shared_ptr<void>& opaque, std::vector<int64_t>& shape,
                                            const int32_t* bias) {
    FloatConvState* state = prepared_conv(ctx, x, x_zero_point, w, w_constant, opaque, false);
    if (!state) return std::nullopt;
    shape = state->y_shape;
    const int64_t n = shape[0], m = shape[1], out_plane = shape[2] * shape[3];
    const ConvSums sums = channels_last_sums(*state, x, x_zero_point);
    const int64_t count = n * m * out_plane;
    Int32Sums channels_last(static_cast<size_t>(count));
    parallel_for_pieces(count, kParallelGrain, count > kParallelGrain, [&](int64_t first, int64_t end) {
        sums.to_int32(first, end - first, channels_last.data() + first);
    });
    const auto offsets = minus(bias, m);
    Int32Sums acc(channels_last.size());  // written in full by the transpose
    transpose_4_byte(channels_last.data(), acc.data(), n, out_plane, m, offsets.data());
    return acc;
}

bool int8_conv_channels_last_in_float(KernelContext& ctx, const Tensor& x, int32_t x_zero_point, const Tensor& w,
                                      bool w_constant, std::shared_ptr<void>& opaque, const int32_t* bias,
                                      const ChannelsLastSums& sink) {
    FloatConvState* state = prepared_conv(ctx, x, x_zero_point, w, w_constant, opaque, true);
    if (!state) return false;
    const auto& ys = state->y_shape;
    const int64_t m = ys[1], pixels = ys[0] * ys[2] * ys[3];
    const ConvSums sums = channels_last_sums(*state, x, x_zero_point);
    sink.start({ys[0], ys[2], ys[3], m}, minus(bias, m));
    // Bands of whole pixels, one a thread at a time, each made int32 in a
    // buffer of its thread's that the sink reads while it is in cache.
    constexpr int64_t kBandValues = int64_t{1} << 14;
    const int64_t per_band = std::max<int64_t>(1, kBandValues / m), bands = (pixels + per_band - 1) / per_band;
    parallel_team(bands > 1 && pixels * m > kParallelGrain, [&](int64_t thread, int64_t threads) {
        Int32Sums band(static_cast<size_t>(per_band * m));
        for (int64_t b = bands * thread / threads; b < bands * (thread + 1) / threads; ++b) {
            const int64_t first = b * per_band * m, count = std::min(per_band, pixels - b * per_band) * m;
            sums.to_int32(first, count, band.data());
            sink.band(band.data(), static_cast<size_t>(first), static_cast<size_t>(count));
        }
    });
    return true;
}

namespace {

// Constant B of up to this many values is kept in float (4x its bytes), laid
// out for oneDNN; a bigger one is converted a chunk at a time on each run, so
// that a model's weights are not held twice over (an 8192 x 8192 MatMul's
// float copy would be 268 MB).
constexpr int64_t kKeptFloatValues = int64_t{1} << 22;

// A product over rows [k0, k1) of B: its primitive, and a kept B's rows in the
// primitive's layout.
struct FloatMatMulChunk {
    int64_t k0 = 0, k1 = 0;
    memory::desc a, b;  ///< b: the chunk's rows, plain
    dnnl::matmul primitive;
    memory weights;  ///< a kept B's chunk, laid out once
};

struct FloatMatMulState {
    std::vector<int64_t> a_shape, b_shape;
    DataType a_type = DataType::UInt8, b_type = DataType::UInt8;
    int32_t a_zero_point = 0, b_zero_point = 0;
    bool b_constant = false, kept = false;
    const Tensor* b_of = nullptr;  ///< the constant B the chunks were cut for
    memory::desc c;
    std::vector<FloatMatMulChunk> chunks;
};

// Row-major strides of `dims`.
memory::dims strides_of_dims(const memory::dims& dims) {
    memory::dims strides(dims.size(), 1);
    for (size_t d = dims.size() - 1; d-- > 0;) strides[d] = strides[d + 1] * dims[d + 1];
    return strides;
}

// 8-bit B ([batches, k, n], or [n, k] when transposed) read as centred values.
struct CentredB {
    const Tensor& b;
    int32_t zero_point;
    bool transposed;
    int64_t k, n;

    template <typename T>
    float at(const T* v, int64_t p, int64_t q, int64_t j) const {
        return static_cast<float>(static_cast<int32_t>(v[transposed ? j * k + q : (p * k + q) * n + j]) - zero_point);
    }
    // Rows [k0, k1) of every batch into `out`, plain ([batches, k1 - k0, n]).
    void rows(int64_t k0, int64_t k1, float* out) const {
        const int64_t batches = b.size() / (k * n), kc = k1 - k0;
        auto copy = [&](const auto* v) {
            parallel_for(batches * kc, batches * kc * n > kParallelGrain, [&](int64_t row) {
                const int64_t p = row / kc, q = k0 + row % kc;
                for (int64_t j = 0; j < n; ++j) out[row * n + j] = at(v, p, q, j);
            });
        };
        if (b.type() == DataType::UInt8)
            copy(b.data<uint8_t>().data());
        else
            copy(b.data<int8_t>().data());
    }
};

}  // namespace

std::optional<Int32Sums> int8_matmul_in_float(KernelContext& ctx, const Tensor& a, int32_t a_zero_point,
                                              const Tensor& b, int32_t b_zero_point, bool b_constant,
                                              std::shared_ptr<void>& opaque, std::vector<int64_t>& shape,
                                              bool b_transposed) {
    const auto geometry = matmul_geometry(ctx, a, b, b_transposed);
    if (!geometry) return std::nullopt;
    const auto& gm = *geometry;
    const size_t rank = gm.a.size();
    const int64_t m = gm.a[rank - 2], k = gm.a[rank - 1], n = gm.b[rank - 1];
    const CentredB centred{b, b_zero_point, b_transposed, k, n};
    auto state = std::static_pointer_cast<FloatMatMulState>(opaque);
    // A varying B's chunks follow from the types alone, so they outlive its values.
    const bool same = state && state->a_shape == a.shape() && state->b_shape == b.shape() &&
                      state->a_type == a.type() && state->b_type == b.type() && state->a_zero_point == a_zero_point &&
                      state->b_zero_point == b_zero_point && state->b_constant == b_constant &&
                      (!b_constant || state->b_of == &b);
    if (!same) {
        state = std::make_shared<FloatMatMulState>();
        state->a_shape = a.shape();
        state->b_shape = b.shape();
        state->a_type = a.type();
        state->b_type = b.type();
        state->a_zero_point = a_zero_point;
        state->b_zero_point = b_zero_point;
        state->b_constant = b_constant;
        state->kept = b_constant && b.size() <= kKeptFloatValues;
        state->b_of = b_constant ? &b : nullptr;
        const double limit = kExactSum / centred_bound(a.type(), a_zero_point);
        std::optional<std::vector<int64_t>> starts;
        if (b_constant) {  // chunks from B's values: per row of B, every column's |b|
            const int64_t batches = b.size() / (k * n);
            Floats row(static_cast<size_t>(batches * n));
            auto magnitudes = [&](int64_t q, double* out) {
                centred.rows(q, q + 1, row.data());
                for (size_t j = 0; j < row.size(); ++j) out[j] = std::abs(row[j]);
            };
            starts = chunk_starts(magnitudes, k, batches * n, limit);
        } else {  // chunks from B's type: rows of the largest value each
            const auto rows = static_cast<int64_t>(limit / centred_bound(b.type(), b_zero_point));
            if (rows < 1) return std::nullopt;
            starts = std::vector<int64_t>{};
            for (int64_t q = 0; q < k; q += rows) starts->push_back(q);
            starts->push_back(k);
        }
        if (!starts) return std::nullopt;
        auto c_dims = gm.batch;
        c_dims.push_back(m);
        c_dims.push_back(n);
        state->c = memory::desc(dims_of(c_dims), memory::data_type::f32, plain_tag(rank));
        const auto a_strides = strides_of_dims(dims_of(gm.a));
        dnnl::stream stream(cpu_engine());
        for (size_t i = 0; i + 1 < starts->size(); ++i) {
            FloatMatMulChunk chunk;
            chunk.k0 = (*starts)[i];
            chunk.k1 = (*starts)[i + 1];
            auto a_dims = dims_of(gm.a), b_dims = dims_of(gm.b);
            a_dims[rank - 1] = b_dims[rank - 2] = chunk.k1 - chunk.k0;
            chunk.a = memory::desc(a_dims, memory::data_type::f32, a_strides);
            chunk.b = memory::desc(b_dims, memory::data_type::f32, plain_tag(rank));
            const dnnl::matmul::primitive_desc pd(
                dnnl::matmul::desc(chunk.a, state->kept ? constant_weights_desc(chunk.b) : chunk.b, state->c),
                cpu_engine());
            chunk.primitive = dnnl::matmul(pd);
            if (state->kept) {
                Floats rows(chunk.b.get_size() / sizeof(float));
                centred.rows(chunk.k0, chunk.k1, rows.data());
                memory user(chunk.b, cpu_engine(), rows.data());
                chunk.weights = memory(pd.weights_desc(), cpu_engine());
                dnnl::reorder(user, chunk.weights).execute(stream, user, chunk.weights);
                stream.wait();
            }
            state->chunks.push_back(std::move(chunk));
        }
        opaque = state;
    }
    Floats a_float(static_cast<size_t>(a.size()));
    centre(a, a_float.data(), a_zero_point);
    shape = gm.batch;
    shape.push_back(m);
    shape.push_back(n);
    const int64_t count = element_count(shape);
    Floats c(static_cast<size_t>(count)), b_rows;
    Int32Sums acc(static_cast<size_t>(count));
    dnnl::stream stream(cpu_engine());
    for (size_t i = 0; i < state->chunks.size(); ++i) {
        auto& chunk = state->chunks[i];
        memory b_memory = chunk.weights;
        if (!state->kept) {  // this chunk's rows of B, converted now
            b_rows.resize(chunk.b.get_size() / sizeof(float));
            centred.rows(chunk.k0, chunk.k1, b_rows.data());
            b_memory = memory(chunk.b, cpu_engine(), b_rows.data());
        }
        memory a_memory(chunk.a, cpu_engine(), a_float.data() + chunk.k0);
        memory c_memory(state->c, cpu_engine(), c.data());
        chunk.primitive.execute(stream,
                                {{DNNL_ARG_SRC, a_memory}, {DNNL_ARG_WEIGHTS, b_memory}, {DNNL_ARG_DST, c_memory}});
        stream.wait();
        gather_sums(c.data(), acc.data(), count, i == 0);
    }
    shape = gm.result_shape;
    return acc;
}

}  // namespace vaiq::runtime
