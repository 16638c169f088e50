#include "runtime/kernels/int8_conv.hpp"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "runtime/kernels/dnnl_util.hpp"
#include "runtime/kernels/int8_in_float.hpp"
#include "runtime/parallel_for.hpp"
#include "runtime/thread_count.hpp"

namespace vaiq::runtime {

using dnnl::memory;

bool exact_int8_available() {
    static const bool available = [] {
        const auto isa = dnnl::get_effective_cpu_isa();
        return isa == dnnl::cpu_isa::avx512_core_vnni || isa == dnnl::cpu_isa::avx512_core_bf16 ||
               isa == dnnl::cpu_isa::avx512_core_amx || isa == dnnl::cpu_isa::avx2_vnni;
    }();
    return available;
}

namespace {

// Before VNNI, the int8 kernels add each pair of u8 x s8 products in int16
// (vpmaddubsw), which saturates. With x in [0, 255] and |w| <= 64 a pair stays
// within 2 * 255 * 64 = 32640 < 32767, so weights that fit 7 bits
// (reduce_range) keep those kernels exact on every x86 CPU.
constexpr int32_t kPairSafeMagnitude = 64;

// The largest magnitude among `w`'s values as the int8 kernels take them (a
// uint8 tensor shifted by 128).
int32_t largest_magnitude(const Tensor& w) {
    int32_t largest = 0;
    if (w.type() == DataType::UInt8) {
        for (uint8_t v : w.data<uint8_t>()) largest = std::max(largest, std::abs(static_cast<int32_t>(v) - 128));
    } else if (w.type() == DataType::Int8) {
        for (int8_t v : w.data<int8_t>()) largest = std::max(largest, std::abs(static_cast<int32_t>(v)));
    }
    return largest;
}

// Which kernels a node's 8-bit products take, and their state: oneDNN's int8
// kernels where their sums are exact, int8_in_float.hpp's elsewhere.
struct Int8Route {
    const Tensor* weights_of = nullptr;  ///< the constant weights the choice was made for
    bool x_unsigned = false;
    bool native = false;  ///< oneDNN's int8 kernels
    std::shared_ptr<void> state;
};

// The route for these operands, chosen again only for other weights or another
// x type (a constant's magnitudes are read once).
Int8Route& route(std::shared_ptr<void>& opaque, const Tensor& x, const Tensor& w, bool w_constant) {
    auto r = std::static_pointer_cast<Int8Route>(opaque);
    if (!r) opaque = r = std::make_shared<Int8Route>();
    const bool x_unsigned = x.type() == DataType::UInt8;
    if (w_constant && r->weights_of == &w && r->x_unsigned == x_unsigned) return *r;
    const bool native = exact_int8_available() || (x_unsigned && largest_magnitude(w) <= kPairSafeMagnitude);
    if (native != r->native) r->state.reset();
    r->weights_of = w_constant ? &w : nullptr;
    r->x_unsigned = x_unsigned;
    r->native = native;
    return *r;
}

// A band's convolution: `images` images of `rows_out` output rows read from
// `rows_in` input rows, padded by `pad_top`/`pad_bottom` where the band meets
// the image's edge.
struct Int8ConvBand {
    int64_t images = 0, rows_out = 0, rows_in = 0, pad_top = 0, pad_bottom = 0;
    bool alone = false;  ///< the only band: run on all threads (else on one)
    dnnl::convolution_forward::primitive_desc pd;
    dnnl::convolution_forward primitive;
    ConstantOperand weights;  ///< used when its weights layout differs from the first band's
    memory run_weights;       ///< the weights this run passes
    Tensor run_weights_storage;                ///< their bytes, where they are not constants
    std::vector<memory> src, dst, scratchpad;  ///< per worker, pointed at each band's data
};

// What a thread needs to run bands: their sums and oneDNN's scratchpad.
struct BandWorker {
    Int32Sums sums;
    std::vector<std::byte> scratchpad;
    dnnl::stream stream;
};

struct Int8ConvState {
    std::vector<int64_t> x_shape, padded_shape, y_shape;
    WindowGeometry window;
    int32_t x_zero_point = 0;
    int64_t group = 1;
    dnnl::convolution_forward::primitive_desc pd;
    dnnl::convolution_forward primitive;
    memory::desc user_src, user_weights, user_dst;
    ConstantOperand weights;
    std::vector<int32_t> zero_point_shares;  ///< per output channel: x_zp times the sum of its weights
    int32_t shares_of = 0;                   ///< the x_zp they were made for
    bool padded = false;  ///< x is padded here with its zero point (oneDNN pads with 0)
    std::vector<Int8ConvBand> bands;         ///< channels-last: the band shapes met so far
    std::vector<BandWorker> workers;         ///< channels-last: one a thread
};

memory::data_type dnnl_type(DataType t) { return t == DataType::UInt8 ? memory::data_type::u8 : memory::data_type::s8; }

// x padded with its zero point, so that oneDNN (which pads with 0) sees the
// values ONNX defines: a padded position contributes (zp - zp) * w = 0. The
// shapes are NCHW, or NHWC when `channels_last`.
template <typename T>
Tensor pad_with(const Tensor& x, const std::vector<int64_t>& padded_shape, const WindowGeometry& g, T zp,
                bool channels_last) {
    Tensor out = Tensor::uninitialized(x.type(), padded_shape);
    auto o = out.mutable_data<T>();
    const auto in = x.data<T>();
    // Rows of `row` values placed `left` values into padded rows of `prow`, the
    // border filled with the zero point (only the border: the rest is copied over).
    auto place = [&](int64_t planes, int64_t h, int64_t row, int64_t ph, int64_t prow, int64_t left) {
        const int64_t top = g.pad_begin[0];
        for (int64_t p = 0; p < planes; ++p) {
            T* plane = o.data() + p * ph * prow;
            std::fill(plane, plane + top * prow, zp);
            std::fill(plane + (top + h) * prow, plane + ph * prow, zp);
            for (int64_t r = 0; r < h; ++r) {
                T* dst = plane + (r + top) * prow;
                std::fill(dst, dst + left, zp);
                std::copy_n(in.data() + (p * h + r) * row, row, dst + left);
                std::fill(dst + left + row, dst + prow, zp);
            }
        }
    };
    if (channels_last)  // rows of w * c values
        place(x.shape()[0], x.shape()[1], x.shape()[2] * x.shape()[3], padded_shape[1],
              padded_shape[2] * padded_shape[3], g.pad_begin[1] * x.shape()[3]);
    else
        place(x.shape()[0] * x.shape()[1], x.shape()[2], x.shape()[3], padded_shape[2], padded_shape[3],
              g.pad_begin[1]);
    return out;
}

// The weights' layout: [M, C/g, kh, kw], or [g, M/g, C/g, kh, kw] when grouped.
memory::dims weight_dims(const Tensor& w, int64_t group) {
    auto dims = dims_of(w.shape());
    if (group > 1) {
        dims[0] = w.shape()[0] / group;
        dims.insert(dims.begin(), group);
    }
    return dims;
}

// The state for `x`, made (or remade, for another shape) and with the weight
// sums for this zero point; nullptr when the fast path does not apply.
Int8ConvState* prepared(KernelContext& ctx, const Tensor& x, int32_t x_zero_point, const Tensor& w, bool w_constant,
                        std::shared_ptr<void>& opaque, bool channels_last) {
    if (x.shape().size() != 4 || w.type() != DataType::Int8 || w.shape().size() != 4 ||
        (x.type() != DataType::UInt8 && x.type() != DataType::Int8))
        return nullptr;
    // The logical (NCHW) dimensions of x.
    const auto& xs = x.shape();
    const std::vector<int64_t> x_nchw = channels_last ? std::vector<int64_t>{xs[0], xs[3], xs[1], xs[2]} : xs;
    const int64_t group = ctx.attributes.get_int("group", 1);
    const int64_t n = x_nchw[0], c = x_nchw[1], m = w.shape()[0];
    if (group < 1 || c % group != 0 || m % group != 0 || w.shape()[1] != c / group)
        ctx.fail("channels, weights and group disagree");
    auto state = std::static_pointer_cast<Int8ConvState>(opaque);
    if (!state || state->x_shape != x.shape() || (state->x_zero_point == 0) != (x_zero_point == 0)) {
        state = std::make_shared<Int8ConvState>();
        state->x_shape = x.shape();
        state->x_zero_point = x_zero_point;
        state->group = group;
        const std::vector<int64_t> in(x_nchw.begin() + 2, x_nchw.end()), kernel(w.shape().begin() + 2, w.shape().end());
        state->window = WindowGeometry::from(ctx, in, kernel, false);
        const auto& g = state->window;
        // A zero point of 0 is oneDNN's own padding: no padded copy of x.
        state->padded = x_zero_point != 0 && (g.pad_begin[0] || g.pad_begin[1] || g.pad_end[0] || g.pad_end[1]);
        const int64_t ph = in[0] + (state->padded ? g.pad_begin[0] + g.pad_end[0] : 0),
                      pw = in[1] + (state->padded ? g.pad_begin[1] + g.pad_end[1] : 0);
        state->padded_shape = channels_last ? std::vector<int64_t>{n, ph, pw, c} : std::vector<int64_t>{n, c, ph, pw};
        state->y_shape = channels_last ? std::vector<int64_t>{n, g.out[0], g.out[1], m}
                                       : std::vector<int64_t>{n, m, g.out[0], g.out[1]};
        state->user_src = memory::desc({n, c, ph, pw}, dnnl_type(x.type()),
                                       channels_last ? memory::format_tag::nhwc : memory::format_tag::nchw);
        const auto w_dims = weight_dims(w, group);
        state->user_weights = memory::desc(w_dims, memory::data_type::s8, plain_tag(w_dims.size(), group > 1));
        opaque = state;
    }
    if (state->zero_point_shares.empty() || !w_constant || state->shares_of != x_zero_point) {
        const auto wv = w.data<int8_t>();
        const int64_t per_channel = w.size() / m;
        state->zero_point_shares.assign(static_cast<size_t>(m), 0);
        for (int64_t oc = 0; oc < m; ++oc) {
            int32_t sum = 0;
            for (int64_t i = 0; i < per_channel; ++i) sum += wv[oc * per_channel + i];
            state->zero_point_shares[oc] = x_zero_point * sum;
        }
        state->shares_of = x_zero_point;
    }
    return state.get();
}

// The convolution over `src` (logical NCHW dims, user layout) into `dst`, the
// pads given; weights in whatever layout oneDNN picks, or `weights` when given.
// With `own_scratchpad` the caller passes each execution's scratchpad (so that
// several threads can run it at once).
dnnl::convolution_forward::primitive_desc convolution(const Int8ConvState& s, const memory::desc& src,
                                                      const memory::desc& dst, const memory::dims& pad_begin,
                                                      const memory::dims& pad_end, const memory::desc* weights,
                                                      bool own_scratchpad = false) {
    const auto& g = s.window;
    const memory::dims dilation{g.dilations[0] - 1, g.dilations[1] - 1};
    const auto w = weights ? *weights
                           : memory::desc(s.user_weights.dims(), memory::data_type::s8, memory::format_tag::any);
    dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src,
                                         w, dst, dims_of(g.strides), dilation, pad_begin, pad_end);
    dnnl::primitive_attr attributes;
    if (own_scratchpad) attributes.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return {desc, attributes, cpu_engine()};
}

// The offsets taken off each channel's sums: x_zp times its weights' sum, less the bias.
std::vector<int32_t> channel_offsets(const Int8ConvState& s, int32_t x_zero_point, const int32_t* bias) {
    std::vector<int32_t> out(s.zero_point_shares.size());
    for (size_t oc = 0; oc < out.size(); ++oc)
        out[oc] = static_cast<int32_t>(static_cast<uint32_t>(x_zero_point != 0 ? s.zero_point_shares[oc] : 0) -
                                       static_cast<uint32_t>(bias ? bias[oc] : 0));
    return out;
}

Tensor padded_input(const Int8ConvState& s, const Tensor& x, int32_t x_zero_point, bool channels_last) {
    return x.type() == DataType::UInt8
               ? pad_with<uint8_t>(x, s.padded_shape, s.window, static_cast<uint8_t>(x_zero_point), channels_last)
               : pad_with<int8_t>(x, s.padded_shape, s.window, static_cast<int8_t>(x_zero_point), channels_last);
}

}  // namespace

std::optional<Int32Sums> int8_conv(KernelContext& ctx, const Tensor& x, int32_t x_zero_point, const Tensor& w,
                                   bool w_constant, std::shared_ptr<void>& opaque, std::vector<int64_t>& shape,
                                   const int32_t* bias) {
    auto& path = route(opaque, x, w, w_constant);
    if (!path.native) return int8_conv_in_float(ctx, x, x_zero_point, w, w_constant, path.state, shape, bias);
    Int8ConvState* state = prepared(ctx, x, x_zero_point, w, w_constant, path.state, false);
    if (!state) return std::nullopt;
    const int64_t n = state->y_shape[0], m = state->y_shape[1];
    const auto& g = state->window;
    if (!state->primitive) {
        // Sums come out channels-last, the layout oneDNN's int8 kernels write, and
        // are transposed to NCHW with the zero point's share taken off on the way.
        state->user_dst = memory::desc({n, m, g.out[0], g.out[1]}, memory::data_type::s32, memory::format_tag::nhwc);
        const memory::dims zero{0, 0};
        const auto any = memory::format_tag::any;
        state->pd = convolution(*state, memory::desc(state->user_src.dims(), dnnl_type(x.type()), any),
                                memory::desc(state->user_dst.dims(), memory::data_type::s32, any),
                                state->padded ? zero : dims_of(g.pad_begin), state->padded ? zero : dims_of(g.pad_end),
                                nullptr);
        state->primitive = dnnl::convolution_forward(state->pd);
    }
    const Tensor padded = state->padded ? padded_input(*state, x, x_zero_point, false) : Tensor();
    dnnl::stream stream(cpu_engine());
    Tensor src_storage, weights_storage, dst_storage;  // this call's reordered copies
    const memory src =
        reordered(stream, wrap(state->user_src, state->padded ? padded : x), state->pd.src_desc(), &src_storage);
    const memory weights =
        operand(stream, w, w_constant, state->user_weights, state->pd.weights_desc(), state->weights, weights_storage);
    shape = state->y_shape;
    const auto count = static_cast<size_t>(element_count(shape));
    Int32Sums nhwc(count);  // written in full by oneDNN
    memory user_dst(state->user_dst, cpu_engine(), nhwc.data());
    const bool direct = state->pd.dst_desc() == state->user_dst;
    memory dst = direct ? user_dst : call_memory(state->pd.dst_desc(), dst_storage);
    state->primitive.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}});
    if (!direct) dnnl::reorder(dst, user_dst).execute(stream, dst, user_dst);
    stream.wait();
    // Per channel: acc = sum - x_zp * (weights' sum) + bias, all taken off in one.
    const bool offset = x_zero_point != 0 || bias;
    const auto offsets = offset ? channel_offsets(*state, x_zero_point, bias) : std::vector<int32_t>();
    Int32Sums acc(count);  // written in full by the transpose
    transpose_4_byte(nhwc.data(), acc.data(), n, shape[2] * shape[3], m, offset ? offsets.data() : nullptr);
    return acc;
}

bool int8_conv_channels_last(KernelContext& ctx, const Tensor& x, int32_t x_zero_point, const Tensor& w,
                             bool w_constant, std::shared_ptr<void>& opaque, const int32_t* bias,
                             const ChannelsLastSums& sink) {
    auto& path = route(opaque, x, w, w_constant);
    if (!path.native)
        return int8_conv_channels_last_in_float(ctx, x, x_zero_point, w, w_constant, path.state, bias, sink);
    Int8ConvState* state = prepared(ctx, x, x_zero_point, w, w_constant, path.state, true);
    if (!state) return false;
    const auto& g = state->window;
    const auto& ps = state->padded_shape;  // NHWC, padded when state->padded
    const int64_t n = ps[0], in_rows = ps[1], in_width = ps[2], c = ps[3];
    const int64_t out_rows = g.out[0], out_width = g.out[1], m = state->y_shape[3];
    const int64_t pad_top = state->padded ? 0 : g.pad_begin[0];  // a band's bottom pad follows from it
    const int64_t pad_left = state->padded ? 0 : g.pad_begin[1], pad_right = state->padded ? 0 : g.pad_end[1];
    const int64_t kernel_rows = (w.shape()[2] - 1) * g.dilations[0] + 1, stride = g.strides[0];
    const int threads = team_threads();
    // A band's sums stay in the cache of the core that computed them until
    // they are consumed. 256 KB of int32: on mobilenet_v2 bands of 128-256 KB
    // ran fastest, 512 KB 5-10 % slower, whole tensors 40 % slower.
    constexpr int64_t kBandValues = int64_t{1} << 16;
    const int64_t row_values = out_width * m, image_values = out_rows * row_values;
    // Whole images a band when an image is small and reads all of its rows (a
    // band's images are then one dense block), else rows of one image, in a
    // number of bands the threads share evenly.
    const bool reads_all_rows = (out_rows - 1) * stride + kernel_rows - pad_top >= in_rows;
    // In a session oneDNN runs on one thread: there the threads share rows
    // even of a small image rather than leave one band to oneDNN's threads.
    const bool shared_by_rows = TeamSession::leading() && n < threads;
    int64_t images = 1, rows = out_rows, bands_per_image = 1;
    if (image_values < kBandValues && reads_all_rows && !shared_by_rows) {
        images = std::max<int64_t>(1, kBandValues / image_values);
        if (n > 1) images = std::min(images, (n + threads - 1) / threads);
    } else {
        int64_t per_image = (image_values + kBandValues - 1) / kBandValues;
        if (per_image * n < threads) per_image = (threads + n - 1) / n;
        // One image: as many bands a thread, so that each takes the same rows
        // of every layer (3 bands on 2 threads gave one 2 of them).
        if (n == 1) per_image = (per_image + threads - 1) / threads * threads;
        bands_per_image = std::min(per_image, out_rows);
        rows = (out_rows + bands_per_image - 1) / bands_per_image;  // the longest band's
    }
    struct Span {
        int64_t image, count, r0, r1;
        Int8ConvBand* kind;
    };
    // An image's bands differ by at most one row: a last band of a single row
    // (56 rows in bands of 5) had oneDNN fall back to its reference loops.
    std::vector<Span> spans;
    for (int64_t i = 0; i < n; i += images)
        for (int64_t b = 0; b < bands_per_image; ++b) {
            // Split as parallel_for splits rows (the longer bands first), so that
            // a thread's bands hold the rows its loops take in the next layer.
            const auto [r0, r1] = share_of(out_rows, b, bands_per_image);
            spans.push_back({i, std::min(images, n - i), r0, r1, nullptr});
        }
    // One band runs on every thread; several run one a thread, each convolution
    // then made for one thread (oneDNN runs single-threaded inside a parallel region).
    const bool alone = spans.size() == 1;
    auto kind_of = [&](const Span& span) -> Int8ConvBand* {
        // Input rows [i0, i1) of the padded image make output rows [r0, r1).
        const int64_t i0 = span.r0 * stride - pad_top, i1 = (span.r1 - 1) * stride + kernel_rows - pad_top;
        const int64_t top = std::max<int64_t>(0, -i0), bottom = std::max<int64_t>(0, i1 - in_rows);
        const int64_t rows_in = std::min(i1, in_rows) - std::max<int64_t>(i0, 0);
        for (auto& b : state->bands)
            if (b.images == span.count && b.rows_out == span.r1 - span.r0 && b.rows_in == rows_in &&
                b.pad_top == top && b.pad_bottom == bottom && b.alone == alone)
                return &b;
        Int8ConvBand b;
        b.images = span.count, b.rows_out = span.r1 - span.r0, b.rows_in = rows_in;
        b.pad_top = top, b.pad_bottom = bottom, b.alone = alone;
        const memory::desc src({span.count, c, rows_in, in_width}, dnnl_type(x.type()), memory::format_tag::nhwc);
        const memory::desc dst({span.count, m, span.r1 - span.r0, out_width}, memory::data_type::s32,
                               memory::format_tag::nhwc);
        const memory::dims begin{top, pad_left}, end{bottom, pad_right};
        // What oneDNN divides the work for: one thread inside a region (a band of
        // several, or any band in a session, where oneDNN runs on one).
        const ThreadCount team(alone && !TeamSession::leading() ? threads : 1);
        // Every band in the first band's weight layout when oneDNN takes it (one copy of the weights).
        const auto first = state->bands.empty() ? memory::desc() : state->bands.front().pd.weights_desc();
        // ... unless that layout leaves oneDNN only its reference loops (brgconv's
        // 1x1 kernels refuse some band shapes in another band's layout): 40 ms
        // for one band of resnet50 where its own layout takes 0.04.
        try {
            b.pd = convolution(*state, src, dst, begin, end, state->bands.empty() ? nullptr : &first, true);
            if (!state->bands.empty() && is_reference(b.pd))
                b.pd = convolution(*state, src, dst, begin, end, nullptr, true);
        } catch (const dnnl::error&) {
            b.pd = convolution(*state, src, dst, begin, end, nullptr, true);
        }
        b.primitive = dnnl::convolution_forward(b.pd);
        state->bands.push_back(std::move(b));
        return &state->bands.back();
    };
    state->bands.reserve(state->bands.size() + spans.size());  // kinds are pointed at below
    size_t scratchpad = 0;
    for (auto& span : spans) {
        span.kind = kind_of(span);
        scratchpad = std::max(scratchpad, span.kind->pd.scratchpad_desc().get_size());
    }
    // Everything a band's run needs is made here, once, so that running it makes nothing.
    const int workers = alone ? 1 : std::min<int>(threads, static_cast<int>(spans.size()));
    const auto band_capacity = static_cast<size_t>(images * rows * row_values);
    if (state->workers.size() < static_cast<size_t>(workers)) state->workers.resize(static_cast<size_t>(workers));
    for (int t = 0; t < workers; ++t) {
        auto& worker = state->workers[t];
        if (worker.sums.size() < band_capacity) worker.sums = Int32Sums(band_capacity);
        if (worker.scratchpad.size() < scratchpad) worker.scratchpad.resize(scratchpad);
        if (!worker.stream) worker.stream = dnnl::stream(cpu_engine());
    }
    for (auto& kind : state->bands) {
        const bool own = kind.pd.weights_desc() != state->bands.front().pd.weights_desc();
        kind.run_weights = operand(state->workers[0].stream, w, w_constant, state->user_weights, kind.pd.weights_desc(),
                                   own ? kind.weights : state->bands.front().weights, kind.run_weights_storage);
        for (int t = static_cast<int>(kind.src.size()); t < workers; ++t) {
            kind.src.emplace_back(kind.pd.src_desc(), cpu_engine(), nullptr);
            kind.dst.emplace_back(kind.pd.dst_desc(), cpu_engine(), nullptr);
            kind.scratchpad.emplace_back(kind.pd.scratchpad_desc(), cpu_engine(), nullptr);
        }
    }
    state->workers[0].stream.wait();  // the weights' reorders

    sink.start(state->y_shape, channel_offsets(*state, x_zero_point, bias));
    const Tensor padded = state->padded ? padded_input(*state, x, x_zero_point, true) : Tensor();
    const auto* input = (state->padded ? padded : x).bytes().data();
    auto run = [&](size_t k, int t) {
        const auto& span = spans[k];
        auto& kind = *span.kind;
        auto& worker = state->workers[t];
        const int64_t first_row = std::max<int64_t>(span.r0 * stride - pad_top, 0);
        kind.src[t].set_data_handle(
            const_cast<std::byte*>(input + ((span.image * in_rows + first_row) * in_width * c)));
        kind.dst[t].set_data_handle(worker.sums.data());
        kind.scratchpad[t].set_data_handle(worker.scratchpad.data());
        kind.primitive.execute(worker.stream, {{DNNL_ARG_SRC, kind.src[t]},
                                               {DNNL_ARG_WEIGHTS, kind.run_weights},
                                               {DNNL_ARG_DST, kind.dst[t]},
                                               {DNNL_ARG_SCRATCHPAD, kind.scratchpad[t]}});
        worker.stream.wait();
        sink.band(worker.sums.data(), static_cast<size_t>(span.image * image_values + span.r0 * row_values),
                  static_cast<size_t>(span.count * (span.r1 - span.r0) * row_values));
    };
    // A band a worker at a time, in contiguous shares as parallel_for's: the
    // next layer's bands read what this thread wrote.
    const auto count = static_cast<int64_t>(spans.size());
    parallel_team(
        workers > 1,
        [&](int64_t t, int64_t team) {
            for (int64_t k = count * t / team; k < count * (t + 1) / team; ++k)
                run(static_cast<size_t>(k), static_cast<int>(t));
        },
        workers);
    return true;
}

namespace {

struct Int8MatMulState {
    std::vector<int64_t> a_shape, b_shape;
    dnnl::matmul::primitive_desc pd;
    dnnl::matmul primitive;
    memory::desc a, b, c;
    Tensor b_int8;  ///< a uint8 B shifted to int8 (kept when B is constant)
    const Tensor* b_of = nullptr;
    std::vector<int32_t> column_sums;  ///< per batch of B and column: the sum over k of B as int8
    ConstantOperand weights;
};

}  // namespace

std::optional<MatMulGeometry> matmul_geometry(KernelContext& ctx, const Tensor& a, const Tensor& b, bool b_transposed) {
    auto is_8_bit = [](DataType t) { return t == DataType::UInt8 || t == DataType::Int8; };
    if (!is_8_bit(a.type()) || !is_8_bit(b.type()) || a.shape().size() < 2 || b.shape().size() < 2 ||
        (b_transposed && (a.shape().size() != 2 || b.shape().size() != 2)))
        return std::nullopt;
    const size_t rank = std::max(a.shape().size(), b.shape().size());
    auto pad = [&](std::vector<int64_t> s) {
        s.insert(s.begin(), rank - s.size(), 1);
        return s;
    };
    MatMulGeometry g;
    g.a = pad(a.shape());
    g.b = b_transposed ? std::vector<int64_t>{b.shape()[1], b.shape()[0]} : pad(b.shape());
    if (g.b[rank - 2] != g.a[rank - 1]) ctx.fail("inner dimensions differ");
    g.b_batch.assign(g.b.begin(), g.b.end() - 2);
    g.result_shape = broadcast_shapes(ctx, std::vector<int64_t>(g.a.begin(), g.a.end() - 2), g.b_batch);
    g.result_shape.push_back(g.a[rank - 2]);
    g.result_shape.push_back(g.b[rank - 1]);
    // A stack of A matrices times one B is one taller A: one matrix product instead
    // of a thin one per matrix of the stack (the sums are laid out the same).
    if (std::all_of(g.b_batch.begin(), g.b_batch.end(), [](int64_t d) { return d == 1; }))
        for (size_t d = 0; d + 2 < rank; ++d) g.a[rank - 2] *= std::exchange(g.a[d], 1);
    g.a_batch.assign(g.a.begin(), g.a.end() - 2);
    g.batch = broadcast_shapes(ctx, g.a_batch, g.b_batch);
    return g;
}

std::optional<Int32Sums> int8_matmul(KernelContext& ctx, const Tensor& a, int32_t a_zero_point, const Tensor& b,
                                     int32_t b_zero_point, bool b_constant, std::shared_ptr<void>& opaque,
                                     std::vector<int64_t>& shape, bool b_transposed) {
    auto& path = route(opaque, a, b, b_constant);
    if (!path.native)
        return int8_matmul_in_float(ctx, a, a_zero_point, b, b_zero_point, b_constant, path.state, shape, b_transposed);
    const auto geometry = matmul_geometry(ctx, a, b, b_transposed);
    if (!geometry) return std::nullopt;
    const auto& as = geometry->a;
    const auto& bs = geometry->b;
    const auto& a_batch = geometry->a_batch;
    const auto& b_batch = geometry->b_batch;
    const auto& batch = geometry->batch;
    const size_t rank = as.size();
    const int64_t m = as[rank - 2], k = as[rank - 1], n = bs[rank - 1];
    auto state = std::static_pointer_cast<Int8MatMulState>(path.state);
    if (!state || state->a_shape != a.shape() || state->b_shape != b.shape()) {
        state = std::make_shared<Int8MatMulState>();
        state->a_shape = a.shape();
        state->b_shape = b.shape();
        auto cs = batch;
        cs.push_back(m);
        cs.push_back(n);
        state->a = memory::desc(dims_of(as), dnnl_type(a.type()), plain_tag(rank));
        state->b = b_transposed ? memory::desc(dims_of(bs), memory::data_type::s8, memory::dims{1, k})
                                : memory::desc(dims_of(bs), memory::data_type::s8, plain_tag(rank));
        state->c = memory::desc(dims_of(cs), memory::data_type::s32, plain_tag(rank));
        const memory::desc b_any(dims_of(bs), memory::data_type::s8, memory::format_tag::any);
        state->pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(state->a, b_constant ? b_any : state->b, state->c),
                                                 cpu_engine());
        state->primitive = dnnl::matmul(state->pd);
        path.state = state;
    }
    // B as int8 (uint8 shifted by 128, its zero point with it) and its column sums, once for a constant B.
    const bool shift = b.type() == DataType::UInt8;
    const int32_t b_zp = shift ? b_zero_point - 128 : b_zero_point;
    if (!b_constant || state->b_of != &b || state->column_sums.empty()) {
        state->b_of = &b;
        if (shift) {
            state->b_int8 = Tensor::uninitialized(DataType::Int8, b.shape());
            const auto in = b.data<uint8_t>();
            auto out = state->b_int8.mutable_data<int8_t>();
            for (size_t i = 0; i < in.size(); ++i) out[i] = static_cast<int8_t>(static_cast<int32_t>(in[i]) - 128);
        }
        const auto bv = (shift ? state->b_int8 : b).data<int8_t>();
        const int64_t b_batches = static_cast<int64_t>(bv.size()) / (k * n);
        state->column_sums.assign(static_cast<size_t>(b_batches * n), 0);
        parallel_for(b_batches, b_batches * k * n > kParallelGrain, [&](int64_t p) {
            for (int64_t q = 0; q < k; ++q)
                for (int64_t j = 0; j < n; ++j)
                    state->column_sums[p * n + j] += bv[b_transposed ? j * k + q : (p * k + q) * n + j];
        });
        state->weights = {};  // a new B: lay it out again
    }
    const Tensor& b_int8 = shift ? state->b_int8 : b;
    dnnl::stream stream(cpu_engine());
    Tensor weights_storage;  // this call's reordered B, where it is not a constant
    const memory weights =
        operand(stream, b_int8, b_constant, state->b, state->pd.weights_desc(), state->weights, weights_storage);
    shape = batch;
    shape.push_back(m);
    shape.push_back(n);
    Int32Sums acc(static_cast<size_t>(element_count(shape)));
    memory c(state->c, cpu_engine(), acc.data());
    state->primitive.execute(stream,
                             {{DNNL_ARG_SRC, wrap(state->a, a)}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, c}});
    stream.wait();
    // Σ (a - za)(b - zb) = Σ a b - za Σ_k b - zb Σ_k a + k za zb.
    const auto ia = broadcast_index(a_batch, batch), ib = broadcast_index(b_batch, batch);
    const bool a_unsigned = a.type() == DataType::UInt8;
    const auto* a_bytes = a.bytes().data();
    const int32_t constant = static_cast<int32_t>(k) * a_zero_point * b_zp;
    // Row by row over the threads (integer sums: the order does not matter).
    const auto rows = static_cast<int64_t>(ia.size()) * m;
    parallel_for(rows, rows * n > kParallelGrain, [&](int64_t r) {
        const auto p = static_cast<size_t>(r / m);
        int32_t row_share = 0;
        if (b_zp != 0) {  // a symmetric B (weights, mostly) needs no sums of A
            int32_t sum = 0;
            const int64_t row = (ia[p] * m + r % m) * k;
            if (a_unsigned)
                for (int64_t q = 0; q < k; ++q) sum += std::to_integer<uint8_t>(a_bytes[row + q]);
            else
                for (int64_t q = 0; q < k; ++q) sum += static_cast<int8_t>(std::to_integer<uint8_t>(a_bytes[row + q]));
            row_share = b_zp * sum;
        }
        const int32_t* columns = state->column_sums.data() + ib[p] * n;
        int32_t* out = acc.data() + r * n;
        for (int64_t j = 0; j < n; ++j) out[j] -= (a_zero_point * columns[j] - constant) + row_share;
    });
    shape = geometry->result_shape;
    return acc;
}

}  // namespace vaiq::runtime
