// Convolution through oneDNN, which picks AVX2/AVX-512/VNNI code at run time.
#include <cstring>
#include <functional>
#include <limits>

#include "runtime/cpu_features.hpp"
#include "runtime/kernels/depthwise_pair.hpp"
#include "runtime/kernels/dnnl_util.hpp"
#include "runtime/kernels/ort_float.hpp"
#include "runtime/kernels/window.hpp"
#include "runtime/layout.hpp"
#include "runtime/parallel_for.hpp"

namespace vaiq::runtime {
namespace {

using dnnl::memory;

// The primitive for one input shape, and constant weights already in the
// primitive's layout: both kept across runs.
struct ConvState {
    std::vector<int64_t> x_shape, y_shape;
    dnnl::convolution_forward::primitive_desc pd;
    dnnl::convolution_forward primitive;
    memory::desc user_src, user_weights, user_dst;
    ConstantOperand weights;
};

// A Relu/Clip the layout optimisation fused in (attributes <prefix>_min and
// <prefix>_max): clamped as the op would, in the same pass. A plain Relu goes
// in as oneDNN's relu, which every convolution implementation takes (the
// Winograd ones take no clip).
void append_activation(dnnl::post_ops& ops, const Attributes& attributes, const std::string& prefix) {
    if (!attributes.has(prefix + "_min")) return;
    const float lo = attributes.get_float(prefix + "_min", 0.0f), hi = attributes.get_float(prefix + "_max", 0.0f);
    if (lo == 0.0f && hi == std::numeric_limits<float>::infinity())
        ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    else
        ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_clip, lo, hi);
}

// Whether a convolution may run as Winograd's F(2x2, 3x3) or F(4x4, 3x3): a
// dense 3x3 of stride 1 over at least 16 channels in and out. oneDNN's
// AVX-512 kernels then do 2-3 times fewer multiplications (one thread: 64
// channels at 56x56 1.97 -> 1.01 ms, 128 at 28x28 1.91 -> 0.62 ms, 16 -> 64 at
// 55x55 0.49 -> 0.33 ms) with results within a few 1e-6 of the direct ones.
// They take blocked layouts only, so the tensors are reordered around them,
// and no clip post-op, so a Relu6 keeps a convolution direct. Never in a model
// that quantizes (see quantizes()).
bool winograd_candidate(const std::vector<int64_t>& kernel, const WindowGeometry& window, int64_t group, int64_t c,
                        int64_t m, bool accumulates) {
    const auto ones = std::vector<int64_t>(kernel.size(), 1);
    return kernel == std::vector<int64_t>{3, 3} && window.strides == ones && window.dilations == ones && group == 1 &&
           c >= 16 && m >= 16 && !accumulates;
}

// The primitive for `ctx`'s input shape (kept in `state` across runs) with
// `ops` applied to its result. With `nhwc` the input and output tensors are 4-D
// and channels-last (NhwcConv, from the executor's layout optimisation);
// weights stay OIHW.
ConvState& prepare_conv(KernelContext& ctx, std::shared_ptr<ConvState>& state, bool nhwc, const dnnl::post_ops& ops) {
    const auto& x = ctx.input(0);
    const auto& w = ctx.input(1);
    if (x.type() != DataType::Float || w.type() != DataType::Float) ctx.fail("only float convolution is supported");
    if (x.shape().size() < 3 || x.shape().size() > 5 || w.shape().size() != x.shape().size() ||
        (nhwc && x.shape().size() != 4))
        ctx.fail("input and weight must be 3-D, 4-D or 5-D of the same rank");
    if (state && state->x_shape == x.shape()) return *state;
    // The logical NCHW dimensions, whatever the layout.
    std::vector<int64_t> dims = x.shape();
    if (nhwc) dims = {x.shape()[0], x.shape()[3], x.shape()[1], x.shape()[2]};
    const size_t spatial = dims.size() - 2;
    const int64_t group = ctx.attributes.get_int("group", 1);
    const int64_t n = dims[0], c = dims[1], m = w.shape()[0];
    if (group < 1 || c % group != 0 || m % group != 0 || w.shape()[1] != c / group)
        ctx.fail("channels, weight shape and group do not agree");
    const std::vector<int64_t> in(dims.begin() + 2, dims.end());
    const std::vector<int64_t> kernel(w.shape().begin() + 2, w.shape().end());
    const auto window = WindowGeometry::from(ctx, in, kernel, false);
    state = std::make_shared<ConvState>();
    state->x_shape = x.shape();
    std::vector<int64_t> y_dims{n, m};
    y_dims.insert(y_dims.end(), window.out.begin(), window.out.end());
    state->y_shape = nhwc ? std::vector<int64_t>{n, y_dims[2], y_dims[3], m} : y_dims;
    const auto layout = nhwc ? memory::format_tag::nhwc : plain_tag(dims.size());
    state->user_src = memory::desc(dims_of(dims), memory::data_type::f32, layout);
    auto w_dims = dims_of(w.shape());
    if (group > 1) {
        w_dims[0] = m / group;
        w_dims.insert(w_dims.begin(), group);
    }
    state->user_weights = memory::desc(w_dims, memory::data_type::f32, plain_tag(w_dims.size(), group > 1));
    state->user_dst = memory::desc(dims_of(y_dims), memory::data_type::f32, layout);
    memory::dims dilation(spatial), pad_l(spatial), pad_r(spatial);
    for (size_t d = 0; d < spatial; ++d) {
        dilation[d] = window.dilations[d] - 1;  // oneDNN counts the gaps
        pad_l[d] = window.pad_begin[d];
        pad_r[d] = window.pad_end[d];
    }
    const auto any = memory::format_tag::any;
    bool accumulates = false;  // a sum post-op reads the output as given: it must be in the user's layout
    for (int i = 0; i < ops.len(); ++i) accumulates = accumulates || ops.kind(i) == dnnl::primitive::kind::sum;
    auto desc = [&](dnnl::algorithm algorithm, bool as_given) {
        return dnnl::convolution_forward::desc(
            dnnl::prop_kind::forward_inference, algorithm,
            memory::desc(state->user_src.dims(), memory::data_type::f32, as_given ? layout : any),
            memory::desc(state->user_weights.dims(), memory::data_type::f32, any),
            memory::desc({m}, memory::data_type::f32, memory::format_tag::a),
            memory::desc(state->user_dst.dims(), memory::data_type::f32, accumulates || as_given ? layout : any),
            dims_of(window.strides), dilation, pad_l, pad_r);
    };
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    bool winograd = winograd_candidate(kernel, window, group, c, m, accumulates) && !quantizes(ctx.model);
    if (winograd) {
        try {
            state->pd = dnnl::convolution_forward::primitive_desc(desc(dnnl::algorithm::convolution_winograd, false),
                                                                  attr, cpu_engine());
        } catch (const dnnl::error&) {
            winograd = false;  // no Winograd kernel for this CPU, shape or post-op
        }
    }
    if (!winograd) {
        // Before AVX-512, oneDNN picks its blocked layouts, reordered to and
        // from channels-last around every convolution (resnet50, one thread: 122
        // -> 105 ms without); its AVX2 kernels take channels-last too, except
        // with a sum post-op. (The AVX-512 choice was measured and is kept.)
        const bool as_given = nhwc && !cpu_features().avx512f;
        state->pd = dnnl::convolution_forward::primitive_desc(desc(dnnl::algorithm::convolution_direct, as_given), attr,
                                                              cpu_engine());
        if (as_given && is_reference(state->pd))
            state->pd = dnnl::convolution_forward::primitive_desc(desc(dnnl::algorithm::convolution_direct, false),
                                                                  attr, cpu_engine());
    }
    state->primitive = dnnl::convolution_forward(state->pd);
    return *state;
}

// Runs the prepared convolution into `y` (of the state's output shape; read
// first when a sum post-op accumulates into it).
void execute_conv(KernelContext& ctx, ConvState& state, Tensor& y) {
    const auto& x = ctx.input(0);
    const auto& w = ctx.input(1);
    const int64_t m = w.shape()[0];
    dnnl::stream stream(cpu_engine());
    Tensor src_storage, weights_storage, dst_storage;  // this call's reordered copies
    const memory src = reordered(stream, wrap(state.user_src, x), state.pd.src_desc(), &src_storage);
    const memory weights = operand(stream, w, ctx.is_constant(1), state.user_weights, state.pd.weights_desc(),
                                   state.weights, weights_storage);
    Tensor zero_bias;
    if (!ctx.has_input(2)) zero_bias = Tensor(DataType::Float, {m});
    const Tensor& b = ctx.has_input(2) ? ctx.input(2) : zero_bias;
    if (b.size() != m) ctx.fail("the bias length does not match the output channels");
    const memory bias = wrap({{m}, memory::data_type::f32, memory::format_tag::a}, b);
    memory user_dst(state.user_dst, cpu_engine(), y.mutable_bytes().data());
    const bool direct = state.pd.dst_desc() == state.user_dst;
    memory dst = direct ? user_dst : call_memory(state.pd.dst_desc(), dst_storage);
    state.primitive.execute(
        stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_BIAS, bias}, {DNNL_ARG_DST, dst}});
    if (!direct) dnnl::reorder(dst, user_dst).execute(stream, dst, user_dst);
    stream.wait();
}

// Conv, and NhwcConv with what the layout optimisation fused in: an optional
// fourth input added to the result (a residual Add: oneDNN's sum post-op,
// in place of that input when it is donated), then an optional Relu/Clip.
struct ConvStates {
    std::shared_ptr<ConvState> fused, plain;  ///< plain: for a residual that broadcasts
};

void conv(KernelContext& ctx, std::vector<Tensor>& out, bool nhwc) {
    auto states = std::static_pointer_cast<ConvStates>(ctx.state);
    if (!states) ctx.state = states = std::make_shared<ConvStates>();
    const bool residual = nhwc && ctx.has_input(3);
    dnnl::post_ops ops;
    if (residual) ops.append_sum(1.0f);
    if (nhwc) append_activation(ops, ctx.attributes, "activation");
    auto& state = prepare_conv(ctx, states->fused, nhwc, ops);
    // Broadcasting, or no oneDNN kernel but its reference loops for the sum into
    // channels-last (AVX2: 100 times slower): the convolution alone, then the
    // Add and the activation as the ops would.
    if (residual &&
        (ctx.input(3).type() != DataType::Float || ctx.input(3).shape() != state.y_shape || is_reference(state.pd))) {
        auto& plain = prepare_conv(ctx, states->plain, nhwc, {});
        Tensor y = Tensor::uninitialized(DataType::Float, plain.y_shape);
        execute_conv(ctx, plain, y);
        if (ctx.input(3).type() != DataType::Float) ctx.fail("the added input must be float");
        const bool same_shape = ctx.input(3).shape() == y.shape();  // added in the clamp's pass below
        if (!same_shape) y = broadcast_binary<float, float>(ctx, y, ctx.input(3), std::plus<float>());
        const float* add = same_shape ? ctx.input(3).data<float>().data() : nullptr;
        const float lo = ctx.attributes.get_float("activation_min", -std::numeric_limits<float>::infinity());
        const float hi = ctx.attributes.get_float("activation_max", std::numeric_limits<float>::infinity());
        float* v = y.mutable_data<float>().data();
        const int64_t count = y.size();
        parallel_for(count, count > kParallelGrain,
                     [&](int64_t i) { v[i] = std::min(std::max(add ? v[i] + add[i] : v[i], lo), hi); });
        out[0] = std::move(y);
        return;
    }
    Tensor y = residual ? ctx.take_input(3) : Tensor::uninitialized(DataType::Float, state.y_shape);
    execute_conv(ctx, state, y);
    out[0] = std::move(y);
}

// An NHWC convolution of fixed geometry, weights in oneDNN's chosen layout.
dnnl::convolution_forward::primitive_desc nhwc_conv(const memory::dims& src, const memory::dims& weights,
                                                    const memory::dims& dst, int64_t stride, int64_t pad,
                                                    const dnnl::post_ops& ops) {
    using memory::data_type::f32;
    dnnl::convolution_forward::desc desc(
        dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
        memory::desc(src, f32, memory::format_tag::nhwc), memory::desc(weights, f32, memory::format_tag::any),
        memory::desc({dst[1]}, f32, memory::format_tag::a), memory::desc(dst, f32, memory::format_tag::nhwc),
        {stride, stride}, {pad, pad}, {pad, pad});
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    return {desc, attr, cpu_engine()};
}

// Bytes of expanded activations one pass may hold, about a core's L2: with more
// images per pass they spill to memory between the two convolutions (MobileNetV2
// at batch 8, one thread: 77 ms with the whole batch per pass, 63 ms with 1 MB).
constexpr int64_t kExpandedBudget = 1 << 20;

struct DepthwiseState {
    std::vector<int64_t> x_shape;
    int64_t images = 1;  ///< per pass through both primitives
    dnnl::convolution_forward::primitive_desc pointwise_pd, depthwise_pd;
    dnnl::convolution_forward pointwise, depthwise;
    ConstantOperand pointwise_weights, depthwise_weights;
};

// The two oneDNN primitives, where the AVX-512 kernel cannot run.
void conv_depthwise_dnnl(KernelContext& ctx, std::shared_ptr<DepthwiseState>& state, Tensor& y) {
    const auto& x = ctx.input(0);
    const auto& pw = ctx.input(1);
    const auto& dw = ctx.input(3);
    const int64_t n = x.shape()[0], h = x.shape()[1], w = x.shape()[2], c = x.shape()[3], m = pw.shape()[0];
    const int64_t stride = ctx.attributes.get_int("depthwise_stride", 1);
    const auto f32 = memory::data_type::f32;
    if (!state || state->x_shape != x.shape()) {
        state = std::make_shared<DepthwiseState>();
        state->x_shape = x.shape();
        const int64_t oh = y.shape()[1], ow = y.shape()[2];
        // A batch goes through in groups of images whose expanded tensor stays in cache.
        const int64_t image_bytes = h * w * m * static_cast<int64_t>(sizeof(float));
        state->images = n;
        while (state->images > 1 && (state->images * image_bytes > kExpandedBudget || n % state->images != 0))
            --state->images;
        const int64_t g = state->images;
        dnnl::post_ops pw_ops, dw_ops;
        append_activation(pw_ops, ctx.attributes, "activation");
        append_activation(dw_ops, ctx.attributes, "depthwise_activation");
        state->pointwise_pd = nhwc_conv({g, c, h, w}, {m, c, 1, 1}, {g, m, h, w}, 1, 0, pw_ops);
        state->depthwise_pd = nhwc_conv({g, m, h, w}, {m, 1, 1, 3, 3}, {g, m, oh, ow}, stride, 1, dw_ops);
        state->pointwise = dnnl::convolution_forward(state->pointwise_pd);
        state->depthwise = dnnl::convolution_forward(state->depthwise_pd);
    }
    dnnl::stream stream(cpu_engine());
    Tensor pw_storage, dw_storage;  // this call's reordered weights, where they are not constants
    const memory pw_weights = operand(stream, pw, ctx.is_constant(1), {{m, c, 1, 1}, f32, memory::format_tag::oihw},
                                      state->pointwise_pd.weights_desc(), state->pointwise_weights, pw_storage);
    const memory dw_weights = operand(stream, dw, ctx.is_constant(3), {{m, 1, 1, 3, 3}, f32, memory::format_tag::goihw},
                                      state->depthwise_pd.weights_desc(), state->depthwise_weights, dw_storage);
    Tensor zero_bias;  // made only for a missing bias
    if (!ctx.has_input(2) || !ctx.has_input(4)) zero_bias = Tensor(DataType::Float, {m});
    auto bias = [&](size_t slot) {
        const Tensor& b = ctx.has_input(slot) ? ctx.input(slot) : zero_bias;
        return wrap({{m}, f32, memory::format_tag::a}, b);
    };
    const int64_t g = state->images;
    Tensor expanded = Tensor::uninitialized(DataType::Float, {g, h, w, m});
    const memory mid(state->pointwise_pd.dst_desc(), cpu_engine(), expanded.mutable_bytes().data());
    const memory pw_bias = bias(2), dw_bias = bias(4);
    const int64_t x_image = h * w * c, y_image = y.shape()[1] * y.shape()[2] * m;
    for (int64_t first = 0; first < n; first += g) {
        const memory src(state->pointwise_pd.src_desc(), cpu_engine(),
                         const_cast<float*>(x.data<float>().data()) + first * x_image);
        const memory dst(state->depthwise_pd.dst_desc(), cpu_engine(),
                         y.mutable_data<float>().data() + first * y_image);
        state->pointwise.execute(
            stream,
            {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, pw_weights}, {DNNL_ARG_BIAS, pw_bias}, {DNNL_ARG_DST, mid}});
        state->depthwise.execute(
            stream,
            {{DNNL_ARG_SRC, mid}, {DNNL_ARG_WEIGHTS, dw_weights}, {DNNL_ARG_BIAS, dw_bias}, {DNNL_ARG_DST, dst}});
    }
    stream.wait();
}

struct DepthwiseStates {
    std::shared_ptr<DepthwiseState> dnnl;
    std::shared_ptr<const DepthwisePairWeights> packed;  ///< kept while the weights are initializers
    onnx::NodeProto projection;                          ///< the projection as an NhwcConv, where oneDNN runs it
    std::shared_ptr<void> projection_state;
};

Clamp clamp_of(const Attributes& attributes, const std::string& prefix) {
    return {attributes.get_float(prefix + "_min", -std::numeric_limits<float>::infinity()),
            attributes.get_float(prefix + "_max", std::numeric_limits<float>::infinity())};
}

// The projection of the depthwise outputs `d` (inputs 5-7) by the NhwcConv kernel.
Tensor project_dnnl(KernelContext& ctx, DepthwiseStates& states, const Tensor& d) {
    if (states.projection.op_type().empty()) {
        states.projection.set_op_type("NhwcConv");
        const std::string prefix = "projection_";  // projection_activation_min -> activation_min
        for (const auto& a : ctx.node.attribute())
            if (a.name().starts_with(prefix + "activation_")) {
                auto* copy = states.projection.add_attribute();
                *copy = a;
                copy->set_name(a.name().substr(prefix.size()));
            }
    }
    auto input = [&](size_t slot) { return ctx.has_input(slot) ? &ctx.input(slot) : nullptr; };
    KernelContext projection{ctx.model,
                             states.projection,
                             ctx.opset,
                             {&d, input(5), input(6), input(7)},
                             {false, ctx.is_constant(5), ctx.is_constant(6), false},
                             Attributes(states.projection),
                             states.projection_state,
                             {},
                             {nullptr, nullptr, nullptr, ctx.donated.size() > 7 ? ctx.donated[7] : nullptr}};
    std::vector<Tensor> out(1);
    conv(projection, out, true);
    return std::move(out[0]);
}

// NhwcConvDepthwise (from the layout optimisation): a 1x1 convolution (inputs
// 0-2, optional activation) and the depthwise 3x3 convolution that alone reads
// it (inputs 3-4: weights [M, 1, 3, 3] and bias; padding 1, `depthwise_stride`,
// optional activation) in one step, optionally with the 1x1 projection that
// alone reads that (inputs 5-6, its residual 7, optional activation). With
// AVX-512 and M a multiple of 16 the wide tensors are made a few rows at a
// time just before they are read (depthwise_pair.hpp); elsewhere they go
// through oneDNN primitives, the pair a few images at a time. (oneDNN's own
// depthwise post-op is not used: in oneDNN 2.6 its NHWC JIT kernel gives wrong
// results, and elsewhere it runs the two primitives one after the other.)
void conv_depthwise(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto& pw = ctx.input(1);
    const auto& dw = ctx.input(3);
    if (x.type() != DataType::Float || pw.type() != DataType::Float || dw.type() != DataType::Float)
        ctx.fail("only float convolution is supported");
    if (x.shape().size() != 4 || pw.shape().size() != 4 || dw.shape().size() != 4) ctx.fail("inputs must be 4-D");
    const int64_t n = x.shape()[0], h = x.shape()[1], w = x.shape()[2], c = x.shape()[3], m = pw.shape()[0];
    if (pw.shape() != std::vector<int64_t>{m, c, 1, 1} || dw.shape() != std::vector<int64_t>{m, 1, 3, 3})
        ctx.fail("the weights are not a 1x1 convolution followed by a depthwise 3x3 one");
    for (size_t slot : {2, 4})
        if (ctx.has_input(slot) && (ctx.input(slot).type() != DataType::Float || ctx.input(slot).size() != m))
            ctx.fail("a bias does not match the output channels");
    const int64_t stride = ctx.attributes.get_int("depthwise_stride", 1);
    if (stride < 1) ctx.fail("depthwise_stride must be positive");
    const bool projected = ctx.has_input(5);
    const auto& pj_shape = projected ? ctx.input(5).shape() : std::vector<int64_t>{};
    const int64_t p = pj_shape.empty() ? 0 : pj_shape[0];
    if (projected) {
        if (ctx.input(5).type() != DataType::Float || pj_shape != std::vector<int64_t>{p, m, 1, 1})
            ctx.fail("the projection is not a 1x1 convolution of the depthwise outputs");
        if (ctx.has_input(6) && (ctx.input(6).type() != DataType::Float || ctx.input(6).size() != p))
            ctx.fail("the projection's bias does not match its output channels");
    }
    auto states = std::static_pointer_cast<DepthwiseStates>(ctx.state);
    if (!states) ctx.state = states = std::make_shared<DepthwiseStates>();
    const int64_t oh = (h - 1) / stride + 1, ow = (w - 1) / stride + 1;
    const std::vector<int64_t> y_shape{n, oh, ow, projected ? p : m};
    const Tensor* residual = ctx.has_input(7) ? &ctx.input(7) : nullptr;
    if (!depthwise_pair_supported(m) || stride > 2 ||
        (residual && (residual->type() != DataType::Float || residual->shape() != y_shape))) {
        Tensor d = Tensor::uninitialized(DataType::Float, {n, oh, ow, m});
        conv_depthwise_dnnl(ctx, states->dnnl, d);
        out[0] = projected ? project_dnnl(ctx, *states, d) : std::move(d);
        return;
    }
    bool constant = true;
    for (size_t slot : {1, 2, 3, 4, 5, 6}) constant = constant && (!ctx.has_input(slot) || ctx.is_constant(slot));
    auto packed = states->packed;
    if (!packed || !constant) {
        auto data = [&](size_t slot) { return ctx.has_input(slot) ? ctx.input(slot).data<float>().data() : nullptr; };
        auto weights = pack_depthwise_pair(data(1), data(2), data(3), data(4), c, m);
        if (projected) add_projection(weights, data(5), data(6), p);
        packed = std::make_shared<const DepthwisePairWeights>(std::move(weights));
        if (constant) states->packed = packed;
    }
    // A donated residual becomes the output, each element read before it is written.
    const bool donated = residual && ctx.donated.size() > 7 && ctx.donated[7];
    Tensor y = donated ? ctx.take_input(7) : Tensor::uninitialized(DataType::Float, y_shape);
    const float* r = donated ? y.data<float>().data() : residual ? residual->data<float>().data() : nullptr;
    const Clamps clamps{clamp_of(ctx.attributes, "activation"), clamp_of(ctx.attributes, "depthwise_activation"),
                        clamp_of(ctx.attributes, "projection_activation")};
    run_depthwise_pair(*packed, x.data<float>().data(), n, h, w, stride, clamps, r, y.mutable_data<float>().data());
    out[0] = std::move(y);
}

struct DeconvState {
    std::vector<int64_t> x_shape, y_shape;
    std::vector<int64_t> computed_shape, offset;  ///< what oneDNN computes, and where it sits in y
    dnnl::deconvolution_forward::primitive_desc pd;
    dnnl::deconvolution_forward primitive;
    memory::desc user_src, user_weights, user_dst;
};

memory::format_tag deconv_weights_tag(size_t spatial, bool grouped) {
    // ONNX stores ConvTranspose weights input-channels first: [C, M/group, k...].
    // In oneDNN's (g, o, i, k...) order that is the permutation "i before o".
    using t = memory::format_tag;
    if (grouped) return spatial == 1 ? t::acbd : spatial == 2 ? t::acbde : t::acbdef;
    return spatial == 1 ? t::bac : spatial == 2 ? t::bacd : t::bacde;
}

// A 2-D ConvTranspose whose strides equal its kernel (no padding, dilation or
// groups: the 2x upsampling of segmentation heads) writes each input pixel's
// kh x kw patch on its own, with no overlap. As ONNX Runtime computes it: the
// columns W^T X by MLAS's SGEMM, scattered into place, the bias added after;
// false when the node is not of that form.
bool patch_conv_transpose(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto& w = ctx.input(1);
    if (x.shape().size() != 4 || ctx.attributes.get_int("group", 1) != 1) return false;
    const std::vector<int64_t> kernel(w.shape().begin() + 2, w.shape().end());
    if (ctx.attributes.get_ints("kernel_shape", kernel) != kernel ||
        ctx.attributes.get_ints("strides", {1, 1}) != kernel ||
        ctx.attributes.get_ints("dilations", {1, 1}) != std::vector<int64_t>{1, 1} ||
        ctx.attributes.get_ints("pads", {0, 0, 0, 0}) != std::vector<int64_t>{0, 0, 0, 0} ||
        ctx.attributes.get_ints("output_padding", {0, 0}) != std::vector<int64_t>{0, 0} ||
        !ctx.attributes.get_ints("output_shape").empty() || ctx.attributes.get_string("auto_pad", "NOTSET") != "NOTSET")
        return false;
    const int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2], wd = x.shape()[3];
    const int64_t m = w.shape()[1], kh = kernel[0], kw = kernel[1];
    if (ctx.has_input(2) && ctx.input(2).size() != m) ctx.fail("the bias length does not match the output channels");
    // A = W^T: one row per (output channel, kernel row, kernel column), one column per input channel.
    const int64_t rows = m * kh * kw, plane = h * wd;
    std::vector<float> a(static_cast<size_t>(rows * c));
    const auto wv = w.data<float>();
    for (int64_t ci = 0; ci < c; ++ci)
        for (int64_t r = 0; r < rows; ++r) a[static_cast<size_t>(r * c + ci)] = wv[ci * rows + r];
    out[0] = Tensor::uninitialized(DataType::Float, {n, m, h * kh, wd * kw});
    float* y = out[0].mutable_data<float>().data();
    std::vector<float> columns(static_cast<size_t>(rows * plane));
    for (int64_t b = 0; b < n; ++b) {
        ort_sgemm(a.data(), x.data<float>().data() + b * c * plane, columns.data(), rows, c, plane);
        // Each output channel's patches scattered into place, the channels on the
        // run's threads, each output row written in order (it was one core's
        // strided writes: 3 % of the PP-OCRv4 detector's accurate recipes).
        parallel_for(m, rows * plane > kParallelGrain, [&](int64_t oc) {
            const float bias = ctx.has_input(2) ? ctx.input(2).data<float>()[oc] : 0.0f;
            float* yc = y + (b * m + oc) * plane * kh * kw;
            const float* patch = columns.data() + oc * kh * kw * plane;  // [kh][kw][h][wd]
            for (int64_t p = 0; p < h; ++p)
                for (int64_t i = 0; i < kh; ++i) {
                    float* row = yc + (p * kh + i) * wd * kw;
                    for (int64_t q = 0; q < wd; ++q)
                        for (int64_t j = 0; j < kw; ++j)
                            row[q * kw + j] = patch[(i * kw + j) * plane + p * wd + q] + bias;
                }
        });
    }
    return true;
}

void conv_transpose(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto& w = ctx.input(1);
    if (x.type() != DataType::Float || w.type() != DataType::Float) ctx.fail("only float is supported");
    if (x.shape().size() < 3 || x.shape().size() > 5 || w.shape().size() != x.shape().size())
        ctx.fail("input and weight must be 3-D, 4-D or 5-D of the same rank");
    const size_t spatial = x.shape().size() - 2;
    const int64_t group = ctx.attributes.get_int("group", 1);
    const int64_t n = x.shape()[0], c = x.shape()[1], m = w.shape()[1] * group;
    if (group < 1 || c % group != 0 || w.shape()[0] != c) ctx.fail("channels, weight shape and group do not agree");
    if (patch_conv_transpose(ctx, out)) return;
    auto state = std::static_pointer_cast<DeconvState>(ctx.state);
    if (!state || state->x_shape != x.shape()) {
        const auto ones = std::vector<int64_t>(spatial, 1);
        const auto strides = ctx.attributes.get_ints("strides", ones);
        const auto dilations = ctx.attributes.get_ints("dilations", ones);
        auto kernel =
            ctx.attributes.get_ints("kernel_shape", std::vector<int64_t>(w.shape().begin() + 2, w.shape().end()));
        const auto out_pad = ctx.attributes.get_ints("output_padding", std::vector<int64_t>(spatial, 0));
        auto pads = ctx.attributes.get_ints("pads", std::vector<int64_t>(2 * spatial, 0));
        const auto output_shape = ctx.attributes.get_ints("output_shape");
        const auto auto_pad = ctx.attributes.get_string("auto_pad", "NOTSET");
        if (strides.size() != spatial || dilations.size() != spatial || kernel.size() != spatial ||
            out_pad.size() != spatial || pads.size() != 2 * spatial ||
            (!output_shape.empty() && output_shape.size() < spatial))
            ctx.fail("attributes do not match the input's rank");
        for (size_t d = 0; d < spatial; ++d)
            if (strides[d] < 1 || dilations[d] < 1 || kernel[d] < 1 || out_pad[d] < 0)
                ctx.fail("strides, dilations and the kernel must be positive, output_padding not negative");
        std::vector<int64_t> y_dims{n, m};
        for (size_t d = 0; d < spatial; ++d) {
            const int64_t in = x.shape()[2 + d];
            const int64_t full = strides[d] * (in - 1) + out_pad[d] + (kernel[d] - 1) * dilations[d] + 1;
            int64_t target = -1;
            if (!output_shape.empty())
                target = output_shape[output_shape.size() - spatial + d];
            else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER")
                target = in * strides[d];
            if (target >= 0) {
                const int64_t total = full - target;
                const int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);  // floor, as the spec's Python
                const bool upper = auto_pad == "SAME_UPPER";
                pads[d] = upper ? half : total - half;
                pads[d + spatial] = total - pads[d];
            } else if (auto_pad == "VALID") {
                pads[d] = pads[d + spatial] = 0;
            }
            y_dims.push_back(full - pads[d] - pads[d + spatial]);
        }
        state = std::make_shared<DeconvState>();
        state->x_shape = x.shape();
        state->y_shape = y_dims;
        // A negative pad (output_shape beyond the full result) adds rows that get only the bias:
        // oneDNN computes with the pad at 0 and the result is placed inside the larger output.
        state->computed_shape = y_dims;
        state->offset.assign(y_dims.size(), 0);
        for (size_t d = 0; d < spatial; ++d) {
            state->offset[2 + d] = std::max<int64_t>(0, -pads[d]);
            state->computed_shape[2 + d] -= state->offset[2 + d] + std::max<int64_t>(0, -pads[d + spatial]);
            pads[d] = std::max<int64_t>(0, pads[d]);
            pads[d + spatial] = std::max<int64_t>(0, pads[d + spatial]);
        }
        for (size_t d = 2; d < y_dims.size(); ++d)
            if (y_dims[d] < 1 || state->computed_shape[d] < 1)
                ctx.fail(fmt::format("the pads leave no output along spatial axis {}", d - 2));
        state->user_src = memory::desc(dims_of(x.shape()), memory::data_type::f32, plain_tag(x.shape().size()));
        state->user_dst =
            memory::desc(dims_of(state->computed_shape), memory::data_type::f32, plain_tag(y_dims.size()));
        memory::dims w_dims{m, c};
        if (group > 1) w_dims = {group, m / group, c / group};
        w_dims.insert(w_dims.end(), w.shape().begin() + 2, w.shape().end());
        state->user_weights = memory::desc(w_dims, memory::data_type::f32, deconv_weights_tag(spatial, group > 1));
        memory::dims dil, pad_l, pad_r;
        for (size_t d = 0; d < spatial; ++d) {
            dil.push_back(dilations[d] - 1);
            pad_l.push_back(pads[d]);
            pad_r.push_back(pads[d + spatial]);
        }
        const auto any = memory::format_tag::any;
        dnnl::deconvolution_forward::desc desc(
            dnnl::prop_kind::forward_inference, dnnl::algorithm::deconvolution_direct,
            memory::desc(state->user_src.dims(), memory::data_type::f32, any),
            memory::desc(w_dims, memory::data_type::f32, any),
            memory::desc({m}, memory::data_type::f32, memory::format_tag::a),
            memory::desc(state->user_dst.dims(), memory::data_type::f32, any), dims_of(strides), dil, pad_l, pad_r);
        state->pd = dnnl::deconvolution_forward::primitive_desc(desc, cpu_engine());
        state->primitive = dnnl::deconvolution_forward(state->pd);
        ctx.state = state;
    }
    dnnl::stream stream(cpu_engine());
    Tensor src_storage, weights_storage, dst_storage;  // this call's reordered copies
    const memory src = reordered(stream, wrap(state->user_src, x), state->pd.src_desc(), &src_storage);
    const memory weights = reordered(stream, wrap(state->user_weights, w), state->pd.weights_desc(), &weights_storage);
    Tensor zero_bias;
    if (!ctx.has_input(2)) zero_bias = Tensor(DataType::Float, {m});
    const Tensor& b = ctx.has_input(2) ? ctx.input(2) : zero_bias;
    if (b.size() != m) ctx.fail("the bias length does not match the output channels");
    Tensor y = Tensor::uninitialized(DataType::Float, state->computed_shape);
    memory user_dst(state->user_dst, cpu_engine(), y.mutable_bytes().data());
    const bool direct = state->pd.dst_desc() == state->user_dst;
    memory dst = direct ? user_dst : call_memory(state->pd.dst_desc(), dst_storage);
    state->primitive.execute(stream, {{DNNL_ARG_SRC, src},
                                      {DNNL_ARG_WEIGHTS, weights},
                                      {DNNL_ARG_BIAS, wrap({{m}, memory::data_type::f32, memory::format_tag::a}, b)},
                                      {DNNL_ARG_DST, dst}});
    if (!direct) dnnl::reorder(dst, user_dst).execute(stream, dst, user_dst);
    stream.wait();
    if (state->computed_shape == state->y_shape) {
        out[0] = std::move(y);
        return;
    }
    Tensor full(DataType::Float, state->y_shape);
    auto f = full.mutable_data<float>();
    const auto bv = b.data<float>();
    const int64_t plane = element_count(std::vector<int64_t>(state->y_shape.begin() + 2, state->y_shape.end()));
    for (int64_t i = 0; i < full.size(); ++i) f[i] = bv[(i / plane) % m];
    const auto fs = strides_of(state->y_shape);
    const auto& cs = state->computed_shape;
    const auto yv = y.data<float>();
    std::vector<int64_t> at(cs.size(), 0);
    for (int64_t i = 0; i < y.size(); ++i) {
        int64_t dst_index = 0;
        for (size_t d = 0; d < cs.size(); ++d) dst_index += (at[d] + state->offset[d]) * fs[d];
        f[dst_index] = yv[i];
        for (int d = static_cast<int>(cs.size()) - 1; d >= 0; --d) {
            if (++at[d] < cs[d]) break;
            at[d] = 0;
        }
    }
    out[0] = std::move(full);
}

const KernelRegistration kKernels[] = {
    {"", "ConvTranspose", 1, 21, conv_transpose},
    {"", "Conv", 1, 21, [](KernelContext& c, std::vector<Tensor>& o) { conv(c, o, false); }},
    {kInternalDomain, "NhwcConv", 0, 1, [](KernelContext& c, std::vector<Tensor>& o) { conv(c, o, true); }},
    {kInternalDomain, "NhwcConvDepthwise", 0, 1, conv_depthwise},
};

}  // namespace
}  // namespace vaiq::runtime
