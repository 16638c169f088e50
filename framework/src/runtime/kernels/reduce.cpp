// Reductions over axes (ReduceSum, ReduceMean, ...) and ArgMax/ArgMin.
#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/kernels/common.hpp"
#include "runtime/kernels/ort_float.hpp"

namespace vaiq::runtime {
namespace {

enum class Reduce { Sum, Mean, Max, Min, Prod, L1, L2, LogSum, LogSumExp, SumSquare };

// Axes from the attribute, or from input 1 where the op's opset moved them
// there (ReduceSum at 13, the others at 18).
std::vector<int64_t> reduce_axes(KernelContext& ctx, bool axes_as_input) {
    if (axes_as_input) return ctx.has_input(1) ? read_ints(ctx, ctx.input(1)) : std::vector<int64_t>{};
    return ctx.attributes.get_ints("axes");
}

template <Reduce kOp>
void reduce(KernelContext& ctx, std::vector<Tensor>& out, int axes_input_since) {
    const auto& x = ctx.input(0);
    const auto rank = static_cast<int64_t>(x.shape().size());
    auto axes = reduce_axes(ctx, ctx.opset >= axes_input_since);
    const bool keepdims = ctx.attributes.get_int("keepdims", 1) != 0;
    const bool noop = ctx.attributes.get_int("noop_with_empty_axes", 0) != 0;
    std::vector<bool> reduced(rank, axes.empty() && !noop);
    for (auto a : axes) reduced[normalize_axis(ctx, a, rank)] = true;
    std::vector<int64_t> kept_shape, out_shape;
    for (int64_t d = 0; d < rank; ++d) {
        kept_shape.push_back(reduced[d] ? 1 : x.shape()[d]);
        if (!reduced[d])
            out_shape.push_back(x.shape()[d]);
        else if (keepdims)
            out_shape.push_back(1);
    }
    // Reducing trailing axes only (LayerNorm's ReduceMean): contiguous rows.
    int64_t first_reduced = rank;
    while (first_reduced > 0 && reduced[first_reduced - 1]) --first_reduced;
    const bool trailing = std::none_of(reduced.begin(), reduced.begin() + first_reduced, [](bool r) { return r; });
    if (trailing && x.type() == DataType::Float && first_reduced < rank &&
        (kOp == Reduce::Sum || kOp == Reduce::Mean || kOp == Reduce::Max || kOp == Reduce::Min)) {
        const int64_t rows = element_count(std::vector<int64_t>(x.shape().begin(), x.shape().begin() + first_reduced));
        const int64_t len = rows ? x.size() / rows : 0;
        out[0] = Tensor(DataType::Float, out_shape);
        auto o = out[0].mutable_data<float>();
        const auto xv = x.data<float>();
        parallel_for(rows, x.size() > kParallelGrain, [&](int64_t r) {
            const float* row = xv.data() + r * len;
            if constexpr (kOp == Reduce::Sum || kOp == Reduce::Mean) {
                const float sum = ort_row_sum(row, len);
                o[r] = kOp == Reduce::Mean ? sum / static_cast<float>(len) : sum;
                return;
            }
            double acc = kOp == Reduce::Max   ? -std::numeric_limits<double>::infinity()
                         : kOp == Reduce::Min ? std::numeric_limits<double>::infinity()
                                              : 0.0;
            for (int64_t j = 0; j < len; ++j) {
                if constexpr (kOp == Reduce::Max)
                    acc = std::max<double>(acc, row[j]);
                else if constexpr (kOp == Reduce::Min)
                    acc = std::min<double>(acc, row[j]);
                else
                    acc += row[j];
            }
            o[r] = static_cast<float>(kOp == Reduce::Mean ? acc / static_cast<double>(len) : acc);
        });
        return;
    }
    // Each input element adds to the output element at its broadcast position.
    const auto target = broadcast_index(kept_shape, x.shape());
    const int64_t count = element_count(kept_shape) ? x.size() / std::max<int64_t>(element_count(kept_shape), 1) : 0;
    dispatch_numeric(x.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const double init = kOp == Reduce::Max    ? -std::numeric_limits<double>::infinity()
                            : kOp == Reduce::Min  ? std::numeric_limits<double>::infinity()
                            : kOp == Reduce::Prod ? 1.0
                                                  : 0.0;
        std::vector<double> acc(static_cast<size_t>(element_count(kept_shape)), init);
        const auto xv = view<T>(x);
        for (size_t i = 0; i < xv.size(); ++i) {
            const double v = static_cast<double>(xv[i]);
            double& a = acc[target[i]];
            switch (kOp) {
                case Reduce::Max: a = std::max(a, v); break;
                case Reduce::Min: a = std::min(a, v); break;
                case Reduce::Prod: a *= v; break;
                case Reduce::L1: a += std::abs(v); break;
                case Reduce::L2:
                case Reduce::SumSquare: a += v * v; break;
                case Reduce::LogSumExp: a += std::exp(v); break;
                default: a += v; break;
            }
        }
        out[0] = make_tensor<T>(out_shape);
        auto o = mutable_view<T>(out[0]);
        for (size_t i = 0; i < acc.size(); ++i) {
            double r = acc[i];
            if (kOp == Reduce::Mean) r /= static_cast<double>(count);
            if (kOp == Reduce::L2) r = std::sqrt(r);
            if (kOp == Reduce::LogSum || kOp == Reduce::LogSumExp) r = std::log(r);
            o[i] = static_cast<T>(r);
        }
    });
}

template <bool kMax>
void arg_reduce(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto rank = static_cast<int64_t>(x.shape().size());
    const int64_t axis = normalize_axis(ctx, ctx.attributes.get_int("axis", 0), rank);
    const bool keepdims = ctx.attributes.get_int("keepdims", 1) != 0;
    const bool last = ctx.attributes.get_int("select_last_index", 0) != 0;
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= x.shape()[d];
    for (int64_t d = axis + 1; d < rank; ++d) inner *= x.shape()[d];
    const int64_t n = x.shape()[axis];
    auto shape = x.shape();
    if (keepdims)
        shape[axis] = 1;
    else
        shape.erase(shape.begin() + axis);
    out[0] = Tensor(DataType::Int64, shape);
    auto o = out[0].mutable_data<int64_t>();
    dispatch_numeric(x.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const auto xv = view<T>(x);
        for (int64_t a = 0; a < outer; ++a)
            for (int64_t i = 0; i < inner; ++i) {
                int64_t best = 0;
                for (int64_t j = 1; j < n; ++j) {
                    const T v = xv[(a * n + j) * inner + i], b = xv[(a * n + best) * inner + i];
                    if (kMax ? (v > b || (last && v == b)) : (v < b || (last && v == b))) best = j;
                }
                o[a * inner + i] = best;
            }
    });
}

template <Reduce kOp>
KernelFn reducer(int axes_input_since) {
    return [axes_input_since](KernelContext& c, std::vector<Tensor>& o) { reduce<kOp>(c, o, axes_input_since); };
}

// Every kernel here shares its work only through parallel_for.hpp.
const KernelRegistrations kKernels(always_in_team, {
    {"", "ReduceSum", 1, 21, reducer<Reduce::Sum>(13)},
    {"", "ReduceMean", 1, 21, reducer<Reduce::Mean>(18)},
    {"", "ReduceMax", 1, 21, reducer<Reduce::Max>(18)},
    {"", "ReduceMin", 1, 21, reducer<Reduce::Min>(18)},
    {"", "ReduceProd", 1, 21, reducer<Reduce::Prod>(18)},
    {"", "ReduceL1", 1, 21, reducer<Reduce::L1>(18)},
    {"", "ReduceL2", 1, 21, reducer<Reduce::L2>(18)},
    {"", "ReduceLogSum", 1, 21, reducer<Reduce::LogSum>(18)},
    {"", "ReduceLogSumExp", 1, 21, reducer<Reduce::LogSumExp>(18)},
    {"", "ReduceSumSquare", 1, 21, reducer<Reduce::SumSquare>(18)},
    {"", "ArgMax", 1, 21, arg_reduce<true>},
    {"", "ArgMin", 1, 21, arg_reduce<false>},
});

}  // namespace
}  // namespace vaiq::runtime
