#include "runtime/kernels/int8_conv.hpp"

#include <algorithm>
#include <utility>

#include "runtime/kernels/dnnl_util.hpp"

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

struct Int8ConvState {
    std::vector<int64_t> x_shape, padded_shape, y_shape;
    WindowGeometry window;
    dnnl::convolution_forward::primitive_desc pd;
    dnnl::convolution_forward primitive;
    memory::desc user_src, user_weights, user_dst;
    ConstantOperand weights;
    std::vector<int32_t> zero_point_shares;  ///< per output channel: x_zp times the sum of its weights
    int32_t shares_of = 0;                   ///< the x_zp they were made for
    bool padded = false;
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

}  // namespace

std::optional<Int32Sums> int8_conv(KernelContext& ctx, const Tensor& x, int32_t x_zero_point, const Tensor& w,
                                   bool w_constant, std::shared_ptr<void>& opaque, std::vector<int64_t>& shape,
                                   const int32_t* bias, std::vector<int32_t>* channel_offsets) {
    if (!exact_int8_available() || x.shape().size() != 4 || w.type() != DataType::Int8 || w.shape().size() != 4 ||
        (x.type() != DataType::UInt8 && x.type() != DataType::Int8))
        return std::nullopt;
    const bool channels_last = channel_offsets != nullptr;
    // The logical (NCHW) dimensions of x.
    const auto& xs = x.shape();
    const std::vector<int64_t> x_nchw = channels_last ? std::vector<int64_t>{xs[0], xs[3], xs[1], xs[2]} : xs;
    const int64_t group = ctx.attributes.get_int("group", 1);
    const int64_t n = x_nchw[0], c = x_nchw[1], m = w.shape()[0];
    if (group < 1 || c % group != 0 || m % group != 0 || w.shape()[1] != c / group)
        ctx.fail("channels, weights and group disagree");
    auto state = std::static_pointer_cast<Int8ConvState>(opaque);
    if (!state || state->x_shape != x.shape()) {
        state = std::make_shared<Int8ConvState>();
        state->x_shape = x.shape();
        const std::vector<int64_t> in(x_nchw.begin() + 2, x_nchw.end()), kernel(w.shape().begin() + 2, w.shape().end());
        state->window = WindowGeometry::from(ctx, in, kernel, false);
        const auto& g = state->window;
        state->padded = g.pad_begin[0] || g.pad_begin[1] || g.pad_end[0] || g.pad_end[1];
        const int64_t ph = in[0] + g.pad_begin[0] + g.pad_end[0], pw = in[1] + g.pad_begin[1] + g.pad_end[1];
        state->padded_shape = channels_last ? std::vector<int64_t>{n, ph, pw, c} : std::vector<int64_t>{n, c, ph, pw};
        state->y_shape = channels_last ? std::vector<int64_t>{n, g.out[0], g.out[1], m}
                                       : std::vector<int64_t>{n, m, g.out[0], g.out[1]};
        state->user_src = memory::desc({n, c, ph, pw}, dnnl_type(x.type()),
                                       channels_last ? memory::format_tag::nhwc : memory::format_tag::nchw);
        auto w_dims = dims_of(w.shape());
        if (group > 1) {
            w_dims[0] = m / group;
            w_dims.insert(w_dims.begin(), group);
        }
        state->user_weights = memory::desc(w_dims, memory::data_type::s8, plain_tag(w_dims.size(), group > 1));
        // Sums come out channels-last, the layout oneDNN's int8 kernels write, and
        // are transposed to NCHW with the zero point's share taken off on the way.
        state->user_dst = memory::desc({n, m, g.out[0], g.out[1]}, memory::data_type::s32, memory::format_tag::nhwc);
        const memory::dims dilation{g.dilations[0] - 1, g.dilations[1] - 1}, zero{0, 0};
        const auto any = memory::format_tag::any;
        dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                             memory::desc(state->user_src.dims(), dnnl_type(x.type()), any),
                                             memory::desc(w_dims, memory::data_type::s8, any),
                                             memory::desc(state->user_dst.dims(), memory::data_type::s32, any),
                                             dims_of(g.strides), dilation, zero, zero);
        state->pd = dnnl::convolution_forward::primitive_desc(desc, cpu_engine());
        state->primitive = dnnl::convolution_forward(state->pd);
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
    Tensor padded;
    if (state->padded) {
        padded = x.type() == DataType::UInt8 ? pad_with<uint8_t>(x, state->padded_shape, state->window,
                                                                 static_cast<uint8_t>(x_zero_point), channels_last)
                                             : pad_with<int8_t>(x, state->padded_shape, state->window,
                                                                static_cast<int8_t>(x_zero_point), channels_last);
    }
    dnnl::stream stream(cpu_engine());
    const memory src = reordered(stream, wrap(state->user_src, state->padded ? padded : x), state->pd.src_desc());
    const memory weights =
        operand(stream, w, w_constant, state->user_weights, state->pd.weights_desc(), state->weights);
    shape = state->y_shape;
    const auto count = static_cast<size_t>(element_count(shape));
    Int32Sums nhwc(count);  // written in full by oneDNN
    memory user_dst(state->user_dst, cpu_engine(), nhwc.data());
    const bool direct = state->pd.dst_desc() == state->user_dst;
    memory dst = direct ? user_dst : memory(state->pd.dst_desc(), cpu_engine());
    state->primitive.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}});
    if (!direct) dnnl::reorder(dst, user_dst).execute(stream, dst, user_dst);
    stream.wait();
    // Per channel: acc = sum - x_zp * (weights' sum) + bias, all taken off in one.
    const int32_t* minus = x_zero_point != 0 ? state->zero_point_shares.data() : nullptr;
    std::vector<int32_t> less_bias;
    if (bias || channels_last) {
        less_bias.resize(static_cast<size_t>(m));
        for (int64_t oc = 0; oc < m; ++oc)
            less_bias[oc] = static_cast<int32_t>(static_cast<uint32_t>(minus ? minus[oc] : 0) -
                                                 static_cast<uint32_t>(bias ? bias[oc] : 0));
        minus = less_bias.data();
    }
    if (channels_last) {  // the caller takes the offsets off on its own pass
        *channel_offsets = std::move(less_bias);
        return nhwc;
    }
    Int32Sums acc(count);  // written in full by the transpose
    transpose_4_byte(nhwc.data(), acc.data(), n, shape[2] * shape[3], m, minus);
    return acc;
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

std::optional<Int32Sums> int8_matmul(KernelContext& ctx, const Tensor& a, int32_t a_zero_point, const Tensor& b,
                                     int32_t b_zero_point, bool b_constant, std::shared_ptr<void>& opaque,
                                     std::vector<int64_t>& shape, bool b_transposed) {
    auto is_8_bit = [](DataType t) { return t == DataType::UInt8 || t == DataType::Int8; };
    if (!exact_int8_available() || !is_8_bit(a.type()) || !is_8_bit(b.type()) || a.shape().size() < 2 ||
        b.shape().size() < 2 || (b_transposed && (a.shape().size() != 2 || b.shape().size() != 2)))
        return std::nullopt;
    const size_t rank = std::max(a.shape().size(), b.shape().size());
    auto pad = [&](std::vector<int64_t> s) {
        s.insert(s.begin(), rank - s.size(), 1);
        return s;
    };
    auto as = pad(a.shape());
    const auto bs = b_transposed ? std::vector<int64_t>{b.shape()[1], b.shape()[0]} : pad(b.shape());
    if (bs[rank - 2] != as[rank - 1]) ctx.fail("inner dimensions differ");
    const std::vector<int64_t> b_batch(bs.begin(), bs.end() - 2);
    const auto result_batch = broadcast_shapes(ctx, std::vector<int64_t>(as.begin(), as.end() - 2), b_batch);
    // A stack of A matrices times one B is one taller A: one matrix product instead
    // of a thin one per matrix of the stack (the sums are laid out the same).
    const int64_t a_rows = as[rank - 2];
    if (std::all_of(b_batch.begin(), b_batch.end(), [](int64_t d) { return d == 1; }))
        for (size_t d = 0; d + 2 < rank; ++d) as[rank - 2] *= std::exchange(as[d], 1);
    const int64_t m = as[rank - 2], k = as[rank - 1], n = bs[rank - 1];
    const std::vector<int64_t> a_batch(as.begin(), as.end() - 2);
    const auto batch = broadcast_shapes(ctx, a_batch, b_batch);
    auto state = std::static_pointer_cast<Int8MatMulState>(opaque);
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
        opaque = state;
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
        for (int64_t p = 0; p < b_batches; ++p)
            for (int64_t q = 0; q < k; ++q)
                for (int64_t j = 0; j < n; ++j)
                    state->column_sums[p * n + j] += bv[b_transposed ? j * k + q : (p * k + q) * n + j];
        state->weights = {};  // a new B: lay it out again
    }
    const Tensor& b_int8 = shift ? state->b_int8 : b;
    dnnl::stream stream(cpu_engine());
    const memory weights = operand(stream, b_int8, b_constant, state->b, state->pd.weights_desc(), state->weights);
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
    std::vector<int32_t> row_sums(static_cast<size_t>(m), 0), column_shares(static_cast<size_t>(n));
    const bool a_unsigned = a.type() == DataType::UInt8;
    const auto* a_bytes = a.bytes().data();
    const int32_t constant = static_cast<int32_t>(k) * a_zero_point * b_zp;
    for (size_t p = 0; p < ia.size(); ++p) {
        if (b_zp != 0)  // a symmetric B (weights, mostly) needs no sums of A
            for (int64_t i = 0; i < m; ++i) {
                int32_t sum = 0;
                const int64_t row = (ia[p] * m + i) * k;
                if (a_unsigned)
                    for (int64_t q = 0; q < k; ++q) sum += std::to_integer<uint8_t>(a_bytes[row + q]);
                else
                    for (int64_t q = 0; q < k; ++q)
                        sum += static_cast<int8_t>(std::to_integer<uint8_t>(a_bytes[row + q]));
                row_sums[i] = b_zp * sum;
            }
        const int32_t* columns = state->column_sums.data() + ib[p] * n;
        for (int64_t j = 0; j < n; ++j) column_shares[j] = a_zero_point * columns[j] - constant;
        for (int64_t i = 0; i < m; ++i) {
            int32_t* out = acc.data() + (static_cast<int64_t>(p) * m + i) * n;
            const int32_t row_share = row_sums[i];
            for (int64_t j = 0; j < n; ++j) out[j] -= column_shares[j] + row_share;
        }
    }
    shape = result_batch;
    shape.push_back(a_rows);
    shape.push_back(n);
    return acc;
}

}  // namespace vaiq::runtime
