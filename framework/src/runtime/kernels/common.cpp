#include "runtime/kernels/common.hpp"

#include <algorithm>

namespace vaiq::runtime {

std::vector<int64_t> broadcast_shapes(const KernelContext& ctx, const std::vector<int64_t>& a,
                                      const std::vector<int64_t>& b) {
    const size_t rank = std::max(a.size(), b.size());
    std::vector<int64_t> out(rank);
    for (size_t i = 0; i < rank; ++i) {
        const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
        const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
        if (da != db && da != 1 && db != 1)
            ctx.fail(fmt::format("shapes cannot broadcast: dimension {} is {} and {}", i, da, db));
        out[i] = da == 1 ? db : da;
    }
    return out;
}

std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
    std::vector<int64_t> strides(shape.size(), 1);
    for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
    return strides;
}

Tensor permute4(const Tensor& t, const std::vector<int64_t>& perm) {
    const auto& s = t.shape();
    const auto in_strides = strides_of(s);
    Tensor out(t.type(), {s[perm[0]], s[perm[1]], s[perm[2]], s[perm[3]]});
    const auto& o = out.shape();
    const size_t elem = element_size(t.type());
    const auto* src = t.bytes().data();
    auto* dst = out.mutable_bytes().data();
    int64_t i = 0;
    for (int64_t a = 0; a < o[0]; ++a)
        for (int64_t b = 0; b < o[1]; ++b)
            for (int64_t c = 0; c < o[2]; ++c)
                for (int64_t d = 0; d < o[3]; ++d, ++i) {
                    const int64_t at = a * in_strides[perm[0]] + b * in_strides[perm[1]] + c * in_strides[perm[2]] +
                                       d * in_strides[perm[3]];
                    copy_bytes(dst + i * elem, src + at * elem, elem);
                }
    return out;
}

std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& shape, const std::vector<int64_t>& out_shape) {
    const size_t rank = out_shape.size();
    const size_t offset = rank - shape.size();
    const auto in_strides = strides_of(shape);
    std::vector<int64_t> stride(rank, 0);
    for (size_t d = offset; d < rank; ++d) stride[d] = shape[d - offset] == 1 ? 0 : in_strides[d - offset];
    return stride;
}

std::vector<int64_t> broadcast_index(const std::vector<int64_t>& shape, const std::vector<int64_t>& out_shape) {
    const size_t rank = out_shape.size();
    const auto stride = broadcast_strides(shape, out_shape);
    const int64_t total = element_count(out_shape);
    std::vector<int64_t> index(static_cast<size_t>(total));
    std::vector<int64_t> counter(rank, 0);
    int64_t at = 0;
    for (int64_t i = 0; i < total; ++i) {
        index[i] = at;
        for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
            if (++counter[d] < out_shape[d]) {
                at += stride[d];
                break;
            }
            at -= stride[d] * (out_shape[d] - 1);
            counter[d] = 0;
        }
    }
    return index;
}

int64_t normalize_axis(const KernelContext& ctx, int64_t axis, int64_t rank) {
    if (axis < -rank || axis >= rank)
        ctx.fail(fmt::format("axis {} is out of range for rank {}", axis, rank));
    return axis < 0 ? axis + rank : axis;
}

std::vector<int64_t> read_ints(const KernelContext& ctx, const Tensor& t) {
    if (t.type() == DataType::Int64) {
        auto d = t.data<int64_t>();
        return {d.begin(), d.end()};
    }
    if (t.type() == DataType::Int32) {
        auto d = t.data<int32_t>();
        return {d.begin(), d.end()};
    }
    ctx.fail(fmt::format("expected an int64 tensor, got {}", data_type_name(t.type())));
}

double read_scalar(const KernelContext& ctx, const Tensor& t) {
    if (t.size() != 1) ctx.fail(fmt::format("expected a scalar, got {} elements", t.size()));
    double v = 0;
    dispatch(t.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        v = static_cast<double>(view<T>(t)[0]);
    });
    return v;
}

bool quantizes(const Model& model) {
    for (const auto& node : model.graph().node())
        if (node.op_type() == "QuantizeLinear" || node.op_type() == "DequantizeLinear" || node.op_type() == "FixNeuron")
            return true;
    return false;
}

}  // namespace vaiq::runtime
