// Convolution through oneDNN, which picks AVX2/AVX-512/VNNI code at run time.
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstring>

#include "runtime/kernels/common.hpp"
#include "runtime/kernels/window.hpp"

namespace vaiq::runtime {
namespace {

using dnnl::memory;

dnnl::engine& cpu_engine() {
    static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    return engine;
}

memory::format_tag plain_tag(size_t rank, bool grouped) {
    using t = memory::format_tag;
    if (grouped) {
        switch (rank) {
            case 4: return t::goiw;
            case 5: return t::goihw;
            case 6: return t::goidhw;
        }
    }
    switch (rank) {
        case 1: return t::a;
        case 3: return t::abc;
        case 4: return t::abcd;
        case 5: return t::abcde;
    }
    return t::undef;
}

memory::dims dims_of(const std::vector<int64_t>& shape) {
    return memory::dims(shape.begin(), shape.end());
}

// The primitive for one input shape, kept across runs.
struct ConvState {
    std::vector<int64_t> x_shape;
    dnnl::convolution_forward::primitive_desc pd;
    dnnl::convolution_forward primitive;
    memory::desc user_src, user_weights, user_dst;
};

void conv(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto& w = ctx.input(1);
    if (x.type() != DataType::Float || w.type() != DataType::Float) ctx.fail("only float convolution is supported");
    const size_t spatial = x.shape().size() - 2;
    if (x.shape().size() < 3 || x.shape().size() > 5 || w.shape().size() != x.shape().size())
        ctx.fail("input and weight must be 3-D, 4-D or 5-D of the same rank");
    const int64_t group = ctx.attributes.get_int("group", 1);
    const int64_t n = x.shape()[0], c = x.shape()[1], m = w.shape()[0];
    if (group < 1 || c % group != 0 || m % group != 0 || w.shape()[1] != c / group)
        ctx.fail("channels, weight shape and group do not agree");
    const std::vector<int64_t> in(x.shape().begin() + 2, x.shape().end());
    const std::vector<int64_t> kernel(w.shape().begin() + 2, w.shape().end());
    const auto window = WindowGeometry::from(ctx, in, kernel, false);

    std::vector<int64_t> y_shape{n, m};
    y_shape.insert(y_shape.end(), window.out.begin(), window.out.end());
    auto state = std::static_pointer_cast<ConvState>(ctx.state);
    if (!state || state->x_shape != x.shape()) {
        state = std::make_shared<ConvState>();
        state->x_shape = x.shape();
        state->user_src = memory::desc(dims_of(x.shape()), memory::data_type::f32, plain_tag(x.shape().size(), false));
        auto w_dims = dims_of(w.shape());
        if (group > 1) {
            w_dims[0] = m / group;
            w_dims.insert(w_dims.begin(), group);
        }
        state->user_weights = memory::desc(w_dims, memory::data_type::f32, plain_tag(w_dims.size(), group > 1));
        state->user_dst = memory::desc(dims_of(y_shape), memory::data_type::f32, plain_tag(y_shape.size(), false));
        memory::dims dilation(spatial), pad_l(spatial), pad_r(spatial);
        for (size_t d = 0; d < spatial; ++d) {
            dilation[d] = window.dilations[d] - 1;  // oneDNN counts the gaps
            pad_l[d] = window.pad_begin[d];
            pad_r[d] = window.pad_end[d];
        }
        const auto any = memory::format_tag::any;
        const memory::desc bias_md({m}, memory::data_type::f32, memory::format_tag::a);
        dnnl::convolution_forward::desc desc(
            dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
            memory::desc(state->user_src.dims(), memory::data_type::f32, any),
            memory::desc(state->user_weights.dims(), memory::data_type::f32, any), bias_md,
            memory::desc(state->user_dst.dims(), memory::data_type::f32, any),
            dims_of(window.strides), dilation, pad_l, pad_r);
        state->pd = dnnl::convolution_forward::primitive_desc(desc, cpu_engine());
        state->primitive = dnnl::convolution_forward(state->pd);
        ctx.state = state;
    }
    auto& engine = cpu_engine();
    dnnl::stream stream(engine);
    auto as_memory = [&](const memory::desc& user, const memory::desc& wanted, const Tensor& t) {
        memory src(user, engine, const_cast<std::byte*>(t.bytes().data()));
        if (user == wanted) return src;
        memory dst(wanted, engine);
        dnnl::reorder(src, dst).execute(stream, src, dst);
        return dst;
    };
    const memory src = as_memory(state->user_src, state->pd.src_desc(), x);
    const memory weights = as_memory(state->user_weights, state->pd.weights_desc(), w);
    Tensor zero_bias;
    if (!ctx.has_input(2)) zero_bias = Tensor(DataType::Float, {m});
    const Tensor& b = ctx.has_input(2) ? ctx.input(2) : zero_bias;
    if (b.size() != m) ctx.fail("the bias length does not match the output channels");
    memory bias({{m}, memory::data_type::f32, memory::format_tag::a}, engine, const_cast<std::byte*>(b.bytes().data()));

    Tensor y(DataType::Float, y_shape);
    memory user_dst(state->user_dst, engine, y.mutable_bytes().data());
    const bool direct = state->pd.dst_desc() == state->user_dst;
    memory dst = direct ? user_dst : memory(state->pd.dst_desc(), engine);
    state->primitive.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_BIAS, bias}, {DNNL_ARG_DST, dst}});
    if (!direct) dnnl::reorder(dst, user_dst).execute(stream, dst, user_dst);
    stream.wait();
    out[0] = std::move(y);
}

const KernelRegistration kKernels[] = {
    {"", "Conv", 1, 21, conv},
};

}  // namespace
}  // namespace vaiq::runtime
