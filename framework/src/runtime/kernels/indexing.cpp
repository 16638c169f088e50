// Ops that select, move or scatter elements by index: CumSum, DepthToSpace,
// SpaceToDepth, GatherND, OneHot, TopK, Trilu, ScatterND, ScatterElements (and
// the older Scatter), Shrink, EyeLike, NonZero, Compress, ReverseSequence.
#include <algorithm>
#include <numeric>

#include "runtime/kernels/common.hpp"

namespace vaiq::runtime {
namespace {

// Index into a dimension of size n, negative counting from the end.
int64_t checked_index(const KernelContext& ctx, int64_t i, int64_t n) {
    if (i < -n || i >= n) ctx.fail(fmt::format("index {} is out of range for a dimension of {}", i, n));
    return i < 0 ? i + n : i;
}

// Calls f with (output flat index, input flat index) for y = transpose(reshape(x, dims), perm).
template <typename F>
void permuted(const std::vector<int64_t>& dims, const std::vector<int64_t>& perm, F&& f) {
    const auto in_strides = strides_of(dims);
    std::vector<int64_t> out_dims(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) out_dims[i] = dims[perm[i]];
    const int64_t total = element_count(out_dims);
    std::vector<int64_t> counter(perm.size(), 0);
    for (int64_t o = 0; o < total; ++o) {
        int64_t src = 0;
        for (size_t d = 0; d < perm.size(); ++d) src += counter[d] * in_strides[perm[d]];
        f(o, src);
        for (int64_t d = static_cast<int64_t>(perm.size()) - 1; d >= 0; --d) {
            if (++counter[d] < out_dims[d]) break;
            counter[d] = 0;
        }
    }
}

Tensor rearranged(const Tensor& x, const std::vector<int64_t>& dims, const std::vector<int64_t>& perm,
                  std::vector<int64_t> shape) {
    Tensor y = Tensor::uninitialized(x.type(), std::move(shape));
    const size_t elem = element_size(x.type());
    permuted(dims, perm, [&](int64_t o, int64_t i) {
        copy_bytes(y.mutable_bytes().data() + o * elem, x.bytes().data() + i * elem, elem);
    });
    return y;
}

void depth_to_space(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    if (x.shape().size() != 4) ctx.fail("the input must be 4-D");
    const int64_t b = ctx.attributes.get_int("blocksize", 0);
    const int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
    if (b < 1 || c % (b * b) != 0) ctx.fail("channels must be a multiple of blocksize squared");
    const bool crd = ctx.attributes.get_string("mode", "DCR") == "CRD";
    const int64_t c2 = c / (b * b);
    out[0] = crd ? rearranged(x, {n, c2, b, b, h, w}, {0, 1, 4, 2, 5, 3}, {n, c2, h * b, w * b})
                 : rearranged(x, {n, b, b, c2, h, w}, {0, 3, 4, 1, 5, 2}, {n, c2, h * b, w * b});
}

void space_to_depth(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    if (x.shape().size() != 4) ctx.fail("the input must be 4-D");
    const int64_t b = ctx.attributes.get_int("blocksize", 0);
    const int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
    if (b < 1 || h % b != 0 || w % b != 0) ctx.fail("height and width must be multiples of blocksize");
    out[0] = rearranged(x, {n, c, h / b, b, w / b, b}, {0, 3, 5, 1, 2, 4}, {n, c * b * b, h / b, w / b});
}

void cumsum(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto rank = static_cast<int64_t>(x.shape().size());
    if (rank == 0) ctx.fail("the input must have at least one dimension");
    const int64_t axis = normalize_axis(ctx, static_cast<int64_t>(read_scalar(ctx, ctx.input(1))), rank);
    const bool exclusive = ctx.attributes.get_int("exclusive", 0) != 0;
    const bool reverse = ctx.attributes.get_int("reverse", 0) != 0;
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= x.shape()[d];
    for (int64_t d = axis + 1; d < rank; ++d) inner *= x.shape()[d];
    const int64_t n = x.shape()[axis];
    dispatch_numeric(x.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        out[0] = make_tensor<T>(x.shape());
        auto y = mutable_view<T>(out[0]);
        const auto v = view<T>(x);
        for (int64_t o = 0; o < outer; ++o)
            for (int64_t i = 0; i < inner; ++i) {
                T sum{};
                for (int64_t s = 0; s < n; ++s) {
                    const int64_t j = reverse ? n - 1 - s : s;
                    const int64_t at = (o * n + j) * inner + i;
                    if (exclusive) {
                        y[at] = sum;
                        sum = static_cast<T>(sum + v[at]);
                    } else {
                        sum = static_cast<T>(sum + v[at]);
                        y[at] = sum;
                    }
                }
            }
    });
}

void gather_nd(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& data = ctx.input(0);
    const auto& idx_t = ctx.input(1);
    const auto indices = read_ints(ctx, idx_t);
    const int64_t batch_dims = ctx.attributes.get_int("batch_dims", 0);
    const auto& ds = data.shape();
    const auto& is = idx_t.shape();
    if (is.empty()) ctx.fail("indices must have at least one dimension");
    const int64_t last = is.back();
    const auto r = static_cast<int64_t>(ds.size());
    if (batch_dims < 0 || batch_dims + last > r) ctx.fail("indices address more dimensions than the data has");
    // Output: indices.shape[:-1] + data.shape[batch_dims + last:].
    std::vector<int64_t> shape(is.begin(), is.end() - 1);
    shape.insert(shape.end(), ds.begin() + batch_dims + last, ds.end());
    const auto strides = strides_of(ds);
    int64_t slice = 1;
    for (int64_t d = batch_dims + last; d < r; ++d) slice *= ds[d];
    int64_t batch = 1;
    for (int64_t d = 0; d < batch_dims; ++d) batch *= ds[d];
    const int64_t tuples = element_count(std::vector<int64_t>(is.begin(), is.end() - 1));
    const int64_t per_batch = batch ? tuples / batch : 0;
    Tensor y = Tensor::uninitialized(data.type(), shape);
    const size_t elem = element_size(data.type());
    for (int64_t t = 0; t < tuples; ++t) {
        const int64_t b = per_batch ? t / per_batch : 0;
        int64_t src = b * (batch_dims ? strides[batch_dims - 1] : 0);
        for (int64_t k = 0; k < last; ++k)
            src += checked_index(ctx, indices[t * last + k], ds[batch_dims + k]) * strides[batch_dims + k];
        copy_bytes(y.mutable_bytes().data() + t * slice * elem, data.bytes().data() + src * elem, slice * elem);
    }
    out[0] = std::move(y);
}

// Any numeric tensor's values as integers (OneHot takes float indices too).
std::vector<int64_t> as_ints(const KernelContext& ctx, const Tensor& t) {
    std::vector<int64_t> out;
    out.reserve(static_cast<size_t>(t.size()));
    dispatch_numeric(t.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (auto v : view<T>(t)) out.push_back(static_cast<int64_t>(v));
    });
    return out;
}

void one_hot(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto indices = as_ints(ctx, ctx.input(0));
    const int64_t depth = static_cast<int64_t>(read_scalar(ctx, ctx.input(1)));
    const auto& values = ctx.input(2);
    if (values.size() != 2) ctx.fail("values must hold [off, on]");
    if (depth < 1) ctx.fail("depth must be positive");
    auto shape = ctx.input(0).shape();
    const auto rank = static_cast<int64_t>(shape.size()) + 1;
    const int64_t axis = normalize_axis(ctx, ctx.attributes.get_int("axis", -1), rank);
    shape.insert(shape.begin() + axis, depth);
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= shape[d];
    for (int64_t d = axis + 1; d < rank; ++d) inner *= shape[d];
    const size_t elem = element_size(values.type());
    Tensor y = Tensor::uninitialized(values.type(), shape);
    const std::byte* off = values.bytes().data();
    const std::byte* on = off + elem;
    for (int64_t o = 0; o < outer; ++o)
        for (int64_t k = 0; k < depth; ++k)
            for (int64_t i = 0; i < inner; ++i) {
                int64_t index = indices[o * inner + i];
                if (index < 0) index += depth;
                copy_bytes(y.mutable_bytes().data() + ((o * depth + k) * inner + i) * elem, index == k ? on : off,
                           elem);
            }
    out[0] = std::move(y);
}

void top_k(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto rank = static_cast<int64_t>(x.shape().size());
    const int64_t axis = normalize_axis(ctx, ctx.attributes.get_int("axis", -1), rank);
    const int64_t k =
        ctx.opset >= 10 ? static_cast<int64_t>(read_scalar(ctx, ctx.input(1))) : ctx.attributes.get_int("k", 0);
    const bool largest = ctx.attributes.get_int("largest", 1) != 0;
    const int64_t n = x.shape()[axis];
    if (k < 0 || k > n) ctx.fail(fmt::format("k = {} is outside [0, {}]", k, n));
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= x.shape()[d];
    for (int64_t d = axis + 1; d < rank; ++d) inner *= x.shape()[d];
    auto shape = x.shape();
    shape[axis] = k;
    out[1] = make_tensor<int64_t>(shape);
    auto idx = mutable_view<int64_t>(out[1]);
    dispatch_numeric(x.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        out[0] = make_tensor<T>(shape);
        auto y = mutable_view<T>(out[0]);
        const auto v = view<T>(x);
        std::vector<int64_t> order(static_cast<size_t>(n));
        for (int64_t o = 0; o < outer; ++o)
            for (int64_t i = 0; i < inner; ++i) {
                auto at = [&](int64_t j) { return v[(o * n + j) * inner + i]; };
                std::iota(order.begin(), order.end(), 0);
                // Equal values keep the lower index first, as the spec asks.
                std::stable_sort(order.begin(), order.end(),
                                 [&](int64_t a, int64_t b) { return largest ? at(a) > at(b) : at(a) < at(b); });
                for (int64_t j = 0; j < k; ++j) {
                    y[(o * k + j) * inner + i] = at(order[j]);
                    idx[(o * k + j) * inner + i] = order[j];
                }
            }
    });
}

void trilu(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto& s = x.shape();
    if (s.size() < 2) ctx.fail("the input must have at least 2 dimensions");
    const int64_t k = ctx.has_input(1) ? static_cast<int64_t>(read_scalar(ctx, ctx.input(1))) : 0;
    const bool upper = ctx.attributes.get_int("upper", 1) != 0;
    const int64_t rows = s[s.size() - 2], cols = s.back();
    const int64_t mats = rows > 0 && cols > 0 ? x.size() / (rows * cols) : 0;
    Tensor y(x.type(), s);  // zeros
    const size_t elem = element_size(x.type());
    for (int64_t m = 0; m < mats; ++m)
        for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < cols; ++j) {
                if (upper ? j - i < k : j - i > k) continue;
                const int64_t at = (m * rows + i) * cols + j;
                copy_bytes(y.mutable_bytes().data() + at * elem, x.bytes().data() + at * elem, elem);
            }
    out[0] = std::move(y);
}

enum class Reduction { None, Add, Mul, Max, Min };

Reduction reduction_of(const KernelContext& ctx) {
    const auto r = ctx.attributes.get_string("reduction", "none");
    if (r == "none") return Reduction::None;
    if (r == "add") return Reduction::Add;
    if (r == "mul") return Reduction::Mul;
    if (r == "max") return Reduction::Max;
    if (r == "min") return Reduction::Min;
    ctx.fail(fmt::format("reduction '{}' is not one of none, add, mul, max, min", r));
}

template <typename T>
T reduced(Reduction r, T old, T update) {
    switch (r) {
        case Reduction::Add: return static_cast<T>(old + update);
        case Reduction::Mul: return static_cast<T>(old * update);
        case Reduction::Max: return std::max(old, update);
        case Reduction::Min: return std::min(old, update);
        case Reduction::None: break;
    }
    return update;
}

// The data with updates folded in: update block i (of `slice` elements) lands at
// element offset dst[i], in order.
void scatter(KernelContext& ctx, const Tensor& data, const Tensor& updates, const std::vector<int64_t>& dst,
             int64_t slice, std::vector<Tensor>& out) {
    const auto r = reduction_of(ctx);
    if (updates.size() != static_cast<int64_t>(dst.size()) * slice)
        ctx.fail("updates do not match the indices and the data's shape");
    dispatch(data.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        out[0] = make_tensor<T>(data.shape());
        auto y = mutable_view<T>(out[0]);
        const auto d = view<T>(data);
        std::copy(d.begin(), d.end(), y.begin());
        const auto u = view<T>(updates);
        for (size_t i = 0; i < dst.size(); ++i)
            for (int64_t e = 0; e < slice; ++e)
                y[dst[i] + e] = reduced<T>(r, y[dst[i] + e], u[static_cast<int64_t>(i) * slice + e]);
    });
}

void scatter_nd(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& data = ctx.input(0);
    const auto& idx_t = ctx.input(1);
    const auto indices = read_ints(ctx, idx_t);
    const auto& ds = data.shape();
    const int64_t last = idx_t.shape().empty() ? 0 : idx_t.shape().back();
    if (last > static_cast<int64_t>(ds.size())) ctx.fail("indices address more dimensions than the data has");
    const auto strides = strides_of(ds);
    int64_t slice = 1;
    for (size_t d = static_cast<size_t>(last); d < ds.size(); ++d) slice *= ds[d];
    const int64_t tuples = last ? static_cast<int64_t>(indices.size()) / last : 0;
    std::vector<int64_t> dst(static_cast<size_t>(tuples), 0);
    for (int64_t t = 0; t < tuples; ++t)
        for (int64_t k = 0; k < last; ++k) dst[t] += checked_index(ctx, indices[t * last + k], ds[k]) * strides[k];
    scatter(ctx, data, ctx.input(2), dst, slice, out);
}

void scatter_elements(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& data = ctx.input(0);
    const auto& idx_t = ctx.input(1);
    const auto indices = read_ints(ctx, idx_t);
    const auto rank = static_cast<int64_t>(data.shape().size());
    const int64_t axis = normalize_axis(ctx, ctx.attributes.get_int("axis", 0), rank);
    const auto& shape = idx_t.shape();
    if (static_cast<int64_t>(shape.size()) != rank || ctx.input(2).shape() != shape)
        ctx.fail("indices and updates must have the data's rank and the same shape");
    const auto strides = strides_of(data.shape());
    std::vector<int64_t> dst(indices.size(), 0), counter(rank, 0);
    for (size_t i = 0; i < indices.size(); ++i) {
        for (int64_t a = 0; a < rank; ++a)
            dst[i] += (a == axis ? checked_index(ctx, indices[i], data.shape()[axis]) : counter[a]) * strides[a];
        for (int64_t a = rank - 1; a >= 0; --a) {
            if (++counter[a] < shape[a]) break;
            counter[a] = 0;
        }
    }
    scatter(ctx, data, ctx.input(2), dst, 1, out);
}

void shrink(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const double lambd = ctx.attributes.get_float("lambd", 0.5f), bias = ctx.attributes.get_float("bias", 0.0f);
    dispatch_numeric(x.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        out[0] = make_tensor<T>(x.shape());
        auto y = mutable_view<T>(out[0]);
        const auto v = view<T>(x);
        for (size_t i = 0; i < v.size(); ++i) {
            const double f = static_cast<double>(v[i]);
            y[i] = static_cast<T>(f < -lambd ? f + bias : f > lambd ? f - bias : 0.0);
        }
    });
}

void eye_like(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    if (x.shape().size() != 2) ctx.fail("the input must be 2-D");
    const auto type =
        ctx.attributes.has("dtype") ? static_cast<DataType>(ctx.attributes.get_int("dtype", 1)) : x.type();
    const int64_t k = ctx.attributes.get_int("k", 0);
    const int64_t rows = x.shape()[0], cols = x.shape()[1];
    dispatch(type, ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        out[0] = Tensor(type, {rows, cols});  // zeros
        auto y = mutable_view<T>(out[0]);
        for (int64_t i = 0; i < rows; ++i)
            if (i + k >= 0 && i + k < cols) y[i * cols + i + k] = T(1);
    });
}

void non_zero(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto& s = x.shape();
    std::vector<int64_t> hits;
    const size_t elem = element_size(x.type());
    const auto bytes = x.bytes();
    for (int64_t i = 0; i < x.size(); ++i) {
        bool nonzero = false;
        for (size_t b = 0; b < elem; ++b) nonzero = nonzero || bytes[i * elem + b] != std::byte{0};
        // -0.0 is zero too.
        if (nonzero && x.type() == DataType::Float) nonzero = x.data<float>()[i] != 0.0f;
        if (nonzero && x.type() == DataType::Double) nonzero = x.data<double>()[i] != 0.0;
        if (nonzero) hits.push_back(i);
    }
    const auto rank = static_cast<int64_t>(s.size());
    const auto count = static_cast<int64_t>(hits.size());
    out[0] = make_tensor<int64_t>({std::max<int64_t>(rank, 1), count});
    auto y = mutable_view<int64_t>(out[0]);
    const auto strides = strides_of(s);
    for (int64_t h = 0; h < count; ++h)
        for (int64_t d = 0; d < rank; ++d) y[d * count + h] = (hits[h] / strides[d]) % s[d];
}

void compress(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto& cond_t = ctx.input(1);
    if (cond_t.type() != DataType::Bool) ctx.fail("condition must be bool");
    const auto cond = cond_t.bytes();
    const bool has_axis = ctx.attributes.has("axis");
    const auto rank = static_cast<int64_t>(x.shape().size());
    const int64_t axis = has_axis ? normalize_axis(ctx, ctx.attributes.get_int("axis", 0), rank) : 0;
    const std::vector<int64_t> dims = has_axis ? x.shape() : std::vector<int64_t>{x.size()};
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= dims[d];
    for (size_t d = static_cast<size_t>(axis) + 1; d < dims.size(); ++d) inner *= dims[d];
    const int64_t n = dims[axis];
    std::vector<int64_t> kept;
    for (int64_t j = 0; j < n && j < static_cast<int64_t>(cond.size()); ++j)
        if (cond[j] != std::byte{0}) kept.push_back(j);
    auto shape = dims;
    shape[axis] = static_cast<int64_t>(kept.size());
    Tensor y = Tensor::uninitialized(x.type(), shape);
    const size_t elem = element_size(x.type());
    for (int64_t o = 0; o < outer; ++o)
        for (size_t j = 0; j < kept.size(); ++j)
            copy_bytes(y.mutable_bytes().data() +
                           ((o * static_cast<int64_t>(kept.size()) + static_cast<int64_t>(j)) * inner) * elem,
                       x.bytes().data() + ((o * n + kept[j]) * inner) * elem, inner * elem);
    out[0] = std::move(y);
}

// ReverseSequence: reverses the first sequence_lens[b] elements along time_axis
// for each b along batch_axis.
void reverse_sequence(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto lens = read_ints(ctx, ctx.input(1));
    const int64_t time_axis = ctx.attributes.get_int("time_axis", 0);
    const int64_t batch_axis = ctx.attributes.get_int("batch_axis", 1);
    const auto& s = x.shape();
    if (s.size() < 2 || (time_axis != 0 && time_axis != 1) || batch_axis != 1 - time_axis)
        ctx.fail("time_axis and batch_axis must be 0 and 1 in some order");
    const auto strides = strides_of(s);
    const int64_t inner = strides[1];
    const size_t elem = element_size(x.type());
    Tensor y = Tensor::uninitialized(x.type(), s);
    for (int64_t i = 0; i < s[0]; ++i)
        for (int64_t j = 0; j < s[1]; ++j) {
            const int64_t b = batch_axis == 0 ? i : j, t = time_axis == 0 ? i : j;
            const int64_t len = lens.at(static_cast<size_t>(b));
            const int64_t src_t = t < len ? len - 1 - t : t;
            const int64_t src =
                (time_axis == 0 ? src_t * strides[0] + j * strides[1] : i * strides[0] + src_t * strides[1]);
            copy_bytes(y.mutable_bytes().data() + (i * strides[0] + j * strides[1]) * elem,
                       x.bytes().data() + src * elem, inner * elem);
        }
    out[0] = std::move(y);
}

// Every kernel here shares its work only through parallel_for.hpp.
const KernelRegistrations kKernels(always_in_team, {
    {"", "ReverseSequence", 10, kLatest, reverse_sequence},
    {"", "CumSum", 11, kLatest, cumsum},
    {"", "DepthToSpace", 1, kLatest, depth_to_space},
    {"", "SpaceToDepth", 1, kLatest, space_to_depth},
    {"", "GatherND", 11, kLatest, gather_nd},
    {"", "OneHot", 9, kLatest, one_hot},
    {"", "TopK", 1, kLatest, top_k},
    {"", "Trilu", 14, kLatest, trilu},
    {"", "ScatterND", 11, kLatest, scatter_nd},
    {"", "ScatterElements", 11, kLatest, scatter_elements},
    {"", "Scatter", 9, 10, scatter_elements},
    {"", "Shrink", 9, kLatest, shrink},
    {"", "EyeLike", 9, kLatest, eye_like},
    {"", "NonZero", 9, kLatest, non_zero},
    {"", "Compress", 9, kLatest, compress},
});

}  // namespace
}  // namespace vaiq::runtime
