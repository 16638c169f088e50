#include "runtime/kernels/int8_conv.hpp"

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
    std::vector<int32_t> weight_sums;  ///< per output channel: the zero point's share is x_zp * this
    bool padded = false;
};

memory::data_type dnnl_type(DataType t) { return t == DataType::UInt8 ? memory::data_type::u8 : memory::data_type::s8; }

// x padded with its zero point, so that oneDNN (which pads with 0) sees the
// values ONNX defines: a padded position contributes (zp - zp) * w = 0.
template <typename T>
Tensor pad_with(const Tensor& x, const std::vector<int64_t>& padded_shape, const WindowGeometry& g, T zp) {
    Tensor out = Tensor::uninitialized(x.type(), padded_shape);
    auto o = out.mutable_data<T>();
    std::fill(o.begin(), o.end(), zp);
    const auto in = x.data<T>();
    const int64_t planes = x.shape()[0] * x.shape()[1];
    const int64_t h = x.shape()[2], w = x.shape()[3], ph = padded_shape[2], pw = padded_shape[3];
    for (int64_t p = 0; p < planes; ++p)
        for (int64_t r = 0; r < h; ++r)
            std::copy_n(in.data() + (p * h + r) * w, w, o.data() + (p * ph + r + g.pad_begin[0]) * pw + g.pad_begin[1]);
    return out;
}

}  // namespace

std::optional<std::vector<int32_t>> int8_conv(KernelContext& ctx, const Tensor& x, int32_t x_zero_point, const Tensor& w,
                                              bool w_constant, std::shared_ptr<void>& opaque, std::vector<int64_t>& shape) {
    if (!exact_int8_available() || x.shape().size() != 4 || w.type() != DataType::Int8 ||
        (x.type() != DataType::UInt8 && x.type() != DataType::Int8))
        return std::nullopt;
    const int64_t group = ctx.attributes.get_int("group", 1);
    const int64_t n = x.shape()[0], c = x.shape()[1], m = w.shape()[0];
    if (group < 1 || c % group != 0 || m % group != 0 || w.shape()[1] != c / group) ctx.fail("channels, weights and group disagree");
    auto state = std::static_pointer_cast<Int8ConvState>(opaque);
    if (!state || state->x_shape != x.shape()) {
        state = std::make_shared<Int8ConvState>();
        state->x_shape = x.shape();
        const std::vector<int64_t> in(x.shape().begin() + 2, x.shape().end()), kernel(w.shape().begin() + 2, w.shape().end());
        state->window = WindowGeometry::from(ctx, in, kernel, false);
        const auto& g = state->window;
        state->padded = g.pad_begin[0] || g.pad_begin[1] || g.pad_end[0] || g.pad_end[1];
        state->padded_shape = {n, c, in[0] + g.pad_begin[0] + g.pad_end[0], in[1] + g.pad_begin[1] + g.pad_end[1]};
        state->y_shape = {n, m, g.out[0], g.out[1]};
        state->user_src = memory::desc(dims_of(state->padded_shape), dnnl_type(x.type()), memory::format_tag::nchw);
        auto w_dims = dims_of(w.shape());
        if (group > 1) {
            w_dims[0] = m / group;
            w_dims.insert(w_dims.begin(), group);
        }
        state->user_weights = memory::desc(w_dims, memory::data_type::s8, plain_tag(w_dims.size(), group > 1));
        state->user_dst = memory::desc(dims_of(state->y_shape), memory::data_type::s32, memory::format_tag::nchw);
        const memory::dims dilation{g.dilations[0] - 1, g.dilations[1] - 1}, zero{0, 0};
        const auto any = memory::format_tag::any;
        dnnl::convolution_forward::desc desc(
            dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
            memory::desc(state->user_src.dims(), dnnl_type(x.type()), any),
            memory::desc(w_dims, memory::data_type::s8, any),
            memory::desc(state->user_dst.dims(), memory::data_type::s32, any), dims_of(g.strides), dilation, zero, zero);
        state->pd = dnnl::convolution_forward::primitive_desc(desc, cpu_engine());
        state->primitive = dnnl::convolution_forward(state->pd);
        opaque = state;
    }
    if (state->weight_sums.empty() || !w_constant) {
        const auto wv = w.data<int8_t>();
        const int64_t per_channel = w.size() / m;
        state->weight_sums.assign(static_cast<size_t>(m), 0);
        for (int64_t oc = 0; oc < m; ++oc)
            for (int64_t i = 0; i < per_channel; ++i) state->weight_sums[oc] += wv[oc * per_channel + i];
    }
    Tensor padded;
    if (state->padded) {
        padded = x.type() == DataType::UInt8
                     ? pad_with<uint8_t>(x, state->padded_shape, state->window, static_cast<uint8_t>(x_zero_point))
                     : pad_with<int8_t>(x, state->padded_shape, state->window, static_cast<int8_t>(x_zero_point));
    }
    dnnl::stream stream(cpu_engine());
    const memory src = reordered(stream, wrap(state->user_src, state->padded ? padded : x), state->pd.src_desc());
    const memory weights = operand(stream, w, w_constant, state->user_weights, state->pd.weights_desc(), state->weights);
    shape = state->y_shape;
    std::vector<int32_t> acc(static_cast<size_t>(element_count(shape)));
    memory user_dst(state->user_dst, cpu_engine(), acc.data());
    const bool direct = state->pd.dst_desc() == state->user_dst;
    memory dst = direct ? user_dst : memory(state->pd.dst_desc(), cpu_engine());
    state->primitive.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}});
    if (!direct) dnnl::reorder(dst, user_dst).execute(stream, dst, user_dst);
    stream.wait();
    if (x_zero_point != 0) {
        const int64_t plane = shape[2] * shape[3];
        for (int64_t b = 0; b < n; ++b)
            for (int64_t oc = 0; oc < m; ++oc) {
                const int32_t share = x_zero_point * state->weight_sums[oc];
                int32_t* row = acc.data() + (b * m + oc) * plane;
                for (int64_t i = 0; i < plane; ++i) row[i] -= share;
            }
    }
    return acc;
}

}  // namespace vaiq::runtime
