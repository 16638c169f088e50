// Pooling: MaxPool (with Indices), AveragePool, global pools, on float data.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "runtime/kernels/common.hpp"
#include "runtime/kernels/dnnl_util.hpp"
#include "runtime/kernels/window.hpp"
#include "runtime/layout.hpp"

namespace vaiq::runtime {
namespace {

// Visits every output position of every (n, c) plane; `fn(plane, out_index,
// window_start)` with positions as flat spatial coordinates.
struct PoolShape {
    std::vector<int64_t> in, out;
    int64_t planes;
};

template <typename F>
void for_each_window(const PoolShape& s, F fn) {
    const size_t rank = s.in.size();
    std::vector<int64_t> pos(rank, 0);
    const int64_t outs = element_count(s.out);
    for (int64_t p = 0; p < s.planes; ++p) {
        std::fill(pos.begin(), pos.end(), 0);
        for (int64_t o = 0; o < outs; ++o) {
            fn(p, o, pos);
            for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
                if (++pos[d] < s.out[d]) break;
                pos[d] = 0;
            }
        }
    }
}

struct PoolState {
    std::vector<int64_t> x_shape;
    dnnl::pooling_v2_forward primitive;
    dnnl::memory::desc src, dst;
    std::vector<int64_t> y_shape;
};

// oneDNN handles float pooling without an Indices output, except an average
// whose ceil_mode window reaches past the declared padding (oneDNN would count
// that extension as padding), and 8-bit max pooling (exact: a max of integers,
// as after a dropped Q/DQ pair). Returns false when it cannot.
bool dnnl_pool(KernelContext& ctx, std::vector<Tensor>& out, bool is_max, const WindowGeometry& g,
               const std::vector<int64_t>& kernel, bool nhwc) {
    const auto& x = ctx.input(0);
    const bool include_pad = ctx.attributes.get_int("count_include_pad", 0) != 0;
    const bool bytes = x.type() == DataType::UInt8 || x.type() == DataType::Int8;
    if ((x.type() != DataType::Float && !(bytes && is_max)) || out.size() > 1 ||
        (!is_max && include_pad && g.pad_end != g.declared_pad_end))
        return false;
    auto state = std::static_pointer_cast<PoolState>(ctx.state);
    if (!state || state->x_shape != x.shape()) {
        state = std::make_shared<PoolState>();
        state->x_shape = x.shape();
        using dnnl::memory;
        const auto& s = x.shape();
        const std::vector<int64_t> dims = nhwc ? std::vector<int64_t>{s[0], s[3], s[1], s[2]} : s;
        std::vector<int64_t> y_dims{dims[0], dims[1]};
        y_dims.insert(y_dims.end(), g.out.begin(), g.out.end());
        state->y_shape = nhwc ? std::vector<int64_t>{y_dims[0], y_dims[2], y_dims[3], y_dims[1]} : y_dims;
        const auto layout = nhwc ? memory::format_tag::nhwc : plain_tag(dims.size());
        const auto type = x.type() == DataType::UInt8  ? memory::data_type::u8
                          : x.type() == DataType::Int8 ? memory::data_type::s8
                                                       : memory::data_type::f32;
        state->src = memory::desc(dims_of(dims), type, layout);
        state->dst = memory::desc(dims_of(y_dims), type, layout);
        memory::dims dilation;
        for (auto d : g.dilations) dilation.push_back(d - 1);
        const auto alg = is_max        ? dnnl::algorithm::pooling_max
                         : include_pad ? dnnl::algorithm::pooling_avg_include_padding
                                       : dnnl::algorithm::pooling_avg_exclude_padding;
        dnnl::pooling_v2_forward::desc desc(dnnl::prop_kind::forward_inference, alg, state->src, state->dst,
                                            dims_of(g.strides), dims_of(kernel), dilation, dims_of(g.pad_begin),
                                            dims_of(g.pad_end));
        state->primitive = dnnl::pooling_v2_forward(dnnl::pooling_v2_forward::primitive_desc(desc, cpu_engine()));
        ctx.state = state;
    }
    Tensor y = Tensor::uninitialized(x.type(), state->y_shape);
    dnnl::stream stream(cpu_engine());
    dnnl::memory dst(state->dst, cpu_engine(), y.mutable_bytes().data());
    state->primitive.execute(stream, {{DNNL_ARG_SRC, wrap(state->src, x)}, {DNNL_ARG_DST, dst}});
    stream.wait();
    out[0] = std::move(y);
    return true;
}

template <typename T>
void pool(KernelContext& ctx, std::vector<Tensor>& out, bool is_max);
void max_pool(KernelContext& c, std::vector<Tensor>& o);
void average_pool(KernelContext& c, std::vector<Tensor>& o);

// NhwcMaxPool / NhwcAveragePool: 4-D channels-last, through oneDNN; other
// element types go through the general kernel in NCHW.
void nhwc_pool(KernelContext& ctx, std::vector<Tensor>& out, bool is_max) {
    const auto& s = ctx.input(0).shape();
    if (s.size() != 4) ctx.fail("expects a 4-D NHWC input");
    const auto kernel = ctx.attributes.get_ints("kernel_shape");
    const auto g = WindowGeometry::from(ctx, {s[1], s[2]}, kernel, ctx.attributes.get_int("ceil_mode", 0) != 0);
    if (dnnl_pool(ctx, out, is_max, g, kernel, true)) return;
    const Tensor nchw = permute4(ctx.input(0), {0, 3, 1, 2});
    KernelContext sub = ctx;
    sub.inputs[0] = &nchw;
    is_max ? max_pool(sub, out) : average_pool(sub, out);
    out[0] = permute4(out[0], {0, 2, 3, 1});
}

template <typename T>
void pool(KernelContext& ctx, std::vector<Tensor>& out, bool is_max) {
    const auto& x = ctx.input(0);
    if (x.shape().size() < 3) ctx.fail("the input must have a batch, a channel and spatial dimensions");
    const std::vector<int64_t> in(x.shape().begin() + 2, x.shape().end());
    const auto kernel = ctx.attributes.get_ints("kernel_shape");
    const auto g = WindowGeometry::from(ctx, in, kernel, ctx.attributes.get_int("ceil_mode", 0) != 0);
    if (dnnl_pool(ctx, out, is_max, g, kernel, false)) return;
    const bool include_pad = ctx.attributes.get_int("count_include_pad", 0) != 0;
    const bool column_major = ctx.attributes.get_int("storage_order", 0) != 0;
    const size_t rank = in.size();
    std::vector<int64_t> y_shape{x.shape()[0], x.shape()[1]};
    y_shape.insert(y_shape.end(), g.out.begin(), g.out.end());
    Tensor y = make_tensor<T>(y_shape);
    Tensor indices(DataType::Int64, y_shape);
    const auto xv = view<T>(x);
    auto yv = mutable_view<T>(y);
    auto iv = indices.mutable_data<int64_t>();
    const int64_t plane_in = element_count(in), plane_out = element_count(g.out);
    const auto strides = strides_of(in);
    std::vector<int64_t> col_strides(rank, 1);  // storage_order=1 counts indices column-major
    for (size_t d = 1; d < rank; ++d) col_strides[d] = col_strides[d - 1] * in[d - 1];
    std::vector<int64_t> k(rank);
    const int64_t window = element_count(kernel);
    for_each_window({in, g.out, x.shape()[0] * x.shape()[1]},
                    [&](int64_t p, int64_t o, const std::vector<int64_t>& pos) {
                        T best = std::numeric_limits<T>::lowest();
                        int64_t best_index = -1;
                        double sum = 0.0;
                        int64_t count = 0, padded_count = 0;
                        std::fill(k.begin(), k.end(), 0);
                        for (int64_t w = 0; w < window; ++w) {
                            bool inside = true, inside_padded = true;
                            int64_t flat = 0, col = 0;
                            for (size_t d = 0; d < rank; ++d) {
                                const int64_t at = pos[d] * g.strides[d] - g.pad_begin[d] + k[d] * g.dilations[d];
                                inside &= at >= 0 && at < in[d];
                                inside_padded &= at < in[d] + g.declared_pad_end[d];
                                flat += at * strides[d];
                                col += at * col_strides[d];
                            }
                            if (inside) {
                                const T v = xv[p * plane_in + flat];
                                if (v > best || best_index < 0) {
                                    best = v;
                                    best_index = (p * plane_in) + (column_major ? col : flat);
                                }
                                sum += v;
                                ++count;
                            }
                            padded_count += inside_padded;
                            for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
                                if (++k[d] < kernel[d]) break;
                                k[d] = 0;
                            }
                        }
                        const int64_t at = p * plane_out + o;
                        if (is_max) {
                            yv[at] = best;
                            iv[at] = best_index;
                        } else {
                            const int64_t divisor = include_pad ? padded_count : count;
                            yv[at] = divisor > 0 ? static_cast<T>(sum / static_cast<double>(divisor)) : T{0};
                        }
                    });
    out[0] = std::move(y);
    if (out.size() > 1) out[1] = std::move(indices);
}

void global_pool(KernelContext& ctx, std::vector<Tensor>& out, bool is_max) {
    const auto& x = ctx.input(0);
    if (x.type() != DataType::Float) ctx.fail("only float pooling is supported");
    if (x.shape().size() < 3) ctx.fail("the input must have a batch, a channel and spatial dimensions");
    std::vector<int64_t> shape(x.shape().size(), 1);
    shape[0] = x.shape()[0];
    shape[1] = x.shape()[1];
    Tensor y(DataType::Float, shape);
    const int64_t planes = shape[0] * shape[1];
    const int64_t plane = planes ? x.size() / planes : 0;
    const auto xv = x.data<float>();
    auto yv = y.mutable_data<float>();
    // The planes on the run's threads, each summed in order as on one: a
    // squeeze-excitation block's pool of a 160 x 160 map took one core (3 % of
    // the PP-OCRv4 detector's accurate recipe, the other core idle).
    parallel_for(planes, planes > 1 && x.size() > kParallelGrain, [&](int64_t p) {
        const float* v = xv.data() + p * plane;
        if (is_max) {
            float best = -std::numeric_limits<float>::infinity();
            for (int64_t i = 0; i < plane; ++i) best = std::max(best, v[i]);
            yv[p] = best;
        } else {
            double sum = 0;
            for (int64_t i = 0; i < plane; ++i) sum += v[i];
            yv[p] = static_cast<float>(sum / static_cast<double>(plane));
        }
    });
    out[0] = std::move(y);
}

// GlobalMaxPool / GlobalAveragePool of a channels-last [N, H, W, C] value, to
// [N, 1, 1, C] (the bytes of [N, C, 1, 1]): a squeeze-excitation block pools
// its convolution's output where it is, not after a transpose of the whole map
// back to channels-first. Each channel takes its values in the order
// global_pool takes them (its plane's, row by row), so the bits are the same;
// the channels go side by side, a block of them a task.
void nhwc_global_pool(KernelContext& ctx, std::vector<Tensor>& out, bool is_max) {
    const auto& x = ctx.input(0);
    if (x.type() != DataType::Float || x.shape().size() != 4) ctx.fail("the input must be float and 4-D (NHWC)");
    const int64_t batch = x.shape()[0], positions = x.shape()[1] * x.shape()[2], channels = x.shape()[3];
    Tensor y = Tensor::uninitialized(DataType::Float, {batch, 1, 1, channels});
    const auto xv = x.data<float>();
    auto yv = y.mutable_data<float>();
    constexpr int64_t kBlock = 16;
    const int64_t blocks = (channels + kBlock - 1) / kBlock;
    parallel_for(batch * blocks, x.size() > kParallelGrain, [&](int64_t task) {
        const int64_t b = task / blocks, first = task % blocks * kBlock;
        const int64_t width = std::min(kBlock, channels - first);
        const float* v = xv.data() + b * positions * channels + first;
        float* to = yv.data() + b * channels + first;
        if (is_max) {
            std::array<float, kBlock> best;
            best.fill(-std::numeric_limits<float>::infinity());
            for (int64_t p = 0; p < positions; ++p)
                for (int64_t c = 0; c < width; ++c) best[c] = std::max(best[c], v[p * channels + c]);
            std::copy_n(best.begin(), width, to);
        } else {
            std::array<double, kBlock> sum{};
            for (int64_t p = 0; p < positions; ++p)
                for (int64_t c = 0; c < width; ++c) sum[c] += v[p * channels + c];
            for (int64_t c = 0; c < width; ++c) to[c] = static_cast<float>(sum[c] / static_cast<double>(positions));
        }
    });
    out[0] = std::move(y);
}

void max_pool(KernelContext& c, std::vector<Tensor>& o) {
    // int8 and uint8 since opset 12.
    switch (c.input(0).type()) {
        case DataType::Float: return pool<float>(c, o, true);
        case DataType::Double: return pool<double>(c, o, true);
        case DataType::Int8: return pool<int8_t>(c, o, true);
        case DataType::UInt8: return pool<uint8_t>(c, o, true);
        default: c.fail("MaxPool supports float, double, int8 and uint8");
    }
}

void average_pool(KernelContext& c, std::vector<Tensor>& o) {
    dispatch_float(c.input(0).type(), c, [&](auto tag) { pool<typename decltype(tag)::type>(c, o, false); });
}

const KernelRegistration kKernels[] = {
    {"", "MaxPool", 8, 21, max_pool},
    {"", "AveragePool", 7, 21, average_pool},
    {kInternalDomain, "NhwcMaxPool", 0, 1, [](KernelContext& c, std::vector<Tensor>& o) { nhwc_pool(c, o, true); }},
    {kInternalDomain, "NhwcAveragePool", 0, 1,
     [](KernelContext& c, std::vector<Tensor>& o) { nhwc_pool(c, o, false); }},
    {kInternalDomain, "NhwcGlobalMaxPool", 0, 1,
     [](KernelContext& c, std::vector<Tensor>& o) { nhwc_global_pool(c, o, true); }},
    {kInternalDomain, "NhwcGlobalAveragePool", 0, 1,
     [](KernelContext& c, std::vector<Tensor>& o) { nhwc_global_pool(c, o, false); }},
    {"", "GlobalMaxPool", 1, 21, [](KernelContext& c, std::vector<Tensor>& o) { global_pool(c, o, true); }},
    {"", "GlobalAveragePool", 1, 21, [](KernelContext& c, std::vector<Tensor>& o) { global_pool(c, o, false); }},
};

}  // namespace
}  // namespace vaiq::runtime
