// BatchNormalization (inference), InstanceNormalization, LayerNormalization,
// LpNormalization and the softmax family.
#include <cmath>
#include <limits>
#include <span>

#include "runtime/kernels/common.hpp"
#include "runtime/kernels/ort_float.hpp"
#include "runtime/layout.hpp"

namespace vaiq::runtime {
namespace {

// BatchNormalization as one multiply and one add per value, with the scale and
// shift per channel computed in float in ONNX Runtime's order, so that quantized
// models whose Q follows a BatchNormalization round the same way.
struct Affine {
    std::vector<float> scale, shift;
};
Affine batch_norm_affine(std::span<const float> scale, std::span<const float> bias, const std::vector<double>& mean,
                         const std::vector<double>& var, float epsilon) {
    Affine a;
    for (size_t ch = 0; ch < mean.size(); ++ch) {
        const float inv_std = 1.0f / std::sqrt(static_cast<float>(var[ch]) + epsilon);
        a.scale.push_back(inv_std * scale[ch]);
        a.shift.push_back(bias[ch] - static_cast<float>(mean[ch]) * a.scale.back());
    }
    return a;
}

// Inference uses the running statistics; training mode (opset 14+) normalises
// with the batch's own and also returns the updated running statistics.
void batch_norm(KernelContext& ctx, std::vector<Tensor>& out) {
    const bool training = ctx.attributes.get_int("training_mode", 0) != 0;
    const auto& x = ctx.input(0);
    if (x.type() != DataType::Float) ctx.fail("only float is supported");
    const double momentum = ctx.attributes.get_float("momentum", 0.9f);
    if (x.shape().empty()) ctx.fail("the input must have a batch dimension");
    const int64_t n = x.shape()[0], c = x.shape().size() > 1 ? x.shape()[1] : 1;
    const int64_t inner = n * c != 0 ? x.size() / (n * c) : 0;
    for (size_t i = 1; i <= 4; ++i)
        if (ctx.input(i).size() != c) ctx.fail(fmt::format("input {} must hold one value per channel ({})", i, c));
    const auto scale = ctx.input(1).data<float>(), bias = ctx.input(2).data<float>();
    const auto running_mean = ctx.input(3).data<float>(), running_var = ctx.input(4).data<float>();
    const auto xv = x.data<float>();
    std::vector<double> mean(running_mean.begin(), running_mean.end()), var(running_var.begin(), running_var.end());
    if (training) {
        for (int64_t ch = 0; ch < c; ++ch) {
            double sum = 0, sq = 0;
            for (int64_t b = 0; b < n; ++b)
                for (int64_t i = 0; i < inner; ++i) sum += xv[(b * c + ch) * inner + i];
            mean[ch] = sum / static_cast<double>(n * inner);
            for (int64_t b = 0; b < n; ++b)
                for (int64_t i = 0; i < inner; ++i) {
                    const double d = xv[(b * c + ch) * inner + i] - mean[ch];
                    sq += d * d;
                }
            var[ch] = sq / static_cast<double>(n * inner);
        }
    }
    out[0] = Tensor(DataType::Float, x.shape());
    auto y = out[0].mutable_data<float>();
    const auto [s, t] = batch_norm_affine(scale, bias, mean, var, ctx.attributes.get_float("epsilon", 1e-5f));
    for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t b = 0; b < n; ++b) {
            const int64_t base = (b * c + ch) * inner;
            for (int64_t i = 0; i < inner; ++i) {
                const float scaled = xv[base + i] * s[ch];
                y[base + i] = scaled + t[ch];
            }
        }
    for (size_t o = 1; o < out.size() && o < 3; ++o) {
        const auto& batch = o == 1 ? mean : var;
        const auto running = o == 1 ? running_mean : running_var;
        out[o] = Tensor(DataType::Float, {c});
        auto r = out[o].mutable_data<float>();
        for (int64_t ch = 0; ch < c; ++ch)
            r[ch] = static_cast<float>(running[ch] * momentum + batch[ch] * (1 - momentum));
    }
}

// BatchNormalization in inference of a channels-last value (runtime/layout.hpp
// moves it there between channels-last convolutions): the same arithmetic.
void nhwc_batch_norm(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    if (x.type() != DataType::Float || x.shape().empty()) ctx.fail("expects a float channels-last tensor");
    const int64_t c = x.shape().back();
    for (size_t i = 1; i <= 4; ++i)
        if (ctx.input(i).size() != c) ctx.fail(fmt::format("input {} must hold one value per channel ({})", i, c));
    const auto mean = ctx.input(3).data<float>(), var = ctx.input(4).data<float>();
    const Affine affine =
        batch_norm_affine(ctx.input(1).data<float>(), ctx.input(2).data<float>(), {mean.begin(), mean.end()},
                          {var.begin(), var.end()}, ctx.attributes.get_float("epsilon", 1e-5f));
    const auto& s = affine.scale;  // (named, not bound: the loop below captures them)
    const auto& t = affine.shift;
    out[0] = Tensor::uninitialized(DataType::Float, x.shape());
    float* y = out[0].mutable_data<float>().data();
    const float* xv = x.data<float>().data();
    const int64_t pixels = c != 0 ? x.size() / c : 0;
    parallel_for_pieces(pixels, 4096, x.size() >= (int64_t{1} << 16), [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p)
            for (int64_t ch = 0; ch < c; ++ch) {
                const float scaled = xv[p * c + ch] * s[ch];
                y[p * c + ch] = scaled + t[ch];
            }
    });
}

void instance_norm(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    if (x.type() != DataType::Float) ctx.fail("only float is supported");
    const double eps = ctx.attributes.get_float("epsilon", 1e-5f);
    if (x.shape().size() < 3) ctx.fail("the input must be N x C x D1 ...");
    const int64_t n = x.shape()[0], c = x.shape()[1], inner = n * c != 0 ? x.size() / (n * c) : 0;
    if (ctx.input(1).size() != c || ctx.input(2).size() != c)
        ctx.fail(fmt::format("the scale and bias must hold one value per channel ({})", c));
    const auto scale = ctx.input(1).data<float>(), bias = ctx.input(2).data<float>();
    out[0] = Tensor(DataType::Float, x.shape());
    auto y = out[0].mutable_data<float>();
    const auto xv = x.data<float>();
    for (int64_t p = 0; p < n * c; ++p) {
        const float* v = xv.data() + p * inner;
        double mean = 0, sq = 0;
        for (int64_t i = 0; i < inner; ++i) mean += v[i];
        mean /= static_cast<double>(inner);
        for (int64_t i = 0; i < inner; ++i) sq += (v[i] - mean) * (v[i] - mean);
        const double inv = 1.0 / std::sqrt(sq / static_cast<double>(inner) + eps);
        const int64_t ch = p % c;
        for (int64_t i = 0; i < inner; ++i)
            y[p * inner + i] = static_cast<float>((v[i] - mean) * inv * scale[ch] + bias[ch]);
    }
}

void layer_norm(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    if (x.type() != DataType::Float) ctx.fail("only float is supported");
    const auto rank = static_cast<int64_t>(x.shape().size());
    const int64_t axis = normalize_axis(ctx, ctx.attributes.get_int("axis", -1), rank);
    const double eps = ctx.attributes.get_float("epsilon", 1e-5f);
    int64_t outer = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= x.shape()[d];
    const int64_t inner = outer ? x.size() / outer : 0;
    const std::vector<int64_t> norm_shape(x.shape().begin() + axis, x.shape().end());
    const auto& scale = ctx.input(1);
    for (size_t i = 1; i < 3 && i < ctx.input_count(); ++i)
        if (ctx.has_input(i) && broadcast_shapes(ctx, ctx.input(i).shape(), norm_shape) != norm_shape)
            ctx.fail(fmt::format("input {} does not broadcast to the normalized shape", i));
    const auto si = broadcast_index(scale.shape(), norm_shape);
    const auto sv = scale.data<float>();
    std::vector<int64_t> bi;
    std::span<const float> bv;
    if (ctx.has_input(2)) {
        bi = broadcast_index(ctx.input(2).shape(), norm_shape);
        bv = ctx.input(2).data<float>();
    }
    std::vector<int64_t> stat_shape = x.shape();
    for (int64_t d = axis; d < rank; ++d) stat_shape[d] = 1;
    out[0] = Tensor::uninitialized(DataType::Float, x.shape());
    Tensor mean_t(DataType::Float, stat_shape), inv_t(DataType::Float, stat_shape);
    auto y = out[0].mutable_data<float>();
    const auto xv = x.data<float>();
    // Scale and bias over the whole normalized shape: ONNX Runtime's kernel, to the bit.
    const bool dense = scale.size() == inner && (!ctx.has_input(2) || ctx.input(2).size() == inner);
    if (dense) {
        const float* bias = ctx.has_input(2) ? bv.data() : nullptr;
        float* means = mean_t.mutable_data<float>().data();
        float* inverses = inv_t.mutable_data<float>().data();
        parallel_for(outer, x.size() > kParallelGrain, [&](int64_t o) {
            ort_layer_norm_row(xv.data() + o * inner, sv.data(), bias, y.data() + o * inner, inner,
                               static_cast<float>(eps), &means[o], &inverses[o]);
        });
    }
    for (int64_t o = 0; o < (dense ? 0 : outer); ++o) {
        const float* v = xv.data() + o * inner;
        double mean = 0, sq = 0;
        for (int64_t i = 0; i < inner; ++i) mean += v[i];
        mean /= static_cast<double>(inner);
        for (int64_t i = 0; i < inner; ++i) sq += (v[i] - mean) * (v[i] - mean);
        const double inv = 1.0 / std::sqrt(sq / static_cast<double>(inner) + eps);
        for (int64_t i = 0; i < inner; ++i) {
            double r = (v[i] - mean) * inv * sv[si[i]];
            if (!bi.empty()) r += bv[bi[i]];
            y[o * inner + i] = static_cast<float>(r);
        }
        mean_t.mutable_data<float>()[o] = static_cast<float>(mean);
        inv_t.mutable_data<float>()[o] = static_cast<float>(inv);
    }
    if (out.size() > 1) out[1] = std::move(mean_t);
    if (out.size() > 2) out[2] = std::move(inv_t);
}

enum class SoftmaxKind { Softmax, LogSoftmax, Hardmax };

template <SoftmaxKind kKind>
void softmax(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    const auto rank = static_cast<int64_t>(x.shape().size());
    const int64_t axis = normalize_axis(ctx, ctx.attributes.get_int("axis", ctx.opset >= 13 ? -1 : 1), rank);
    // Before opset 13 the input is seen as 2-D, split at the axis.
    int64_t outer = 1, inner = 1, n = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= x.shape()[d];
    if (ctx.opset >= 13) {
        n = x.shape()[axis];
        for (int64_t d = axis + 1; d < rank; ++d) inner *= x.shape()[d];
    } else {
        n = outer ? x.size() / outer : 0;
    }
    if (x.type() == DataType::Float && inner == 1 && kKind != SoftmaxKind::Hardmax) {
        // Contiguous rows (the usual last-axis case), rows in parallel, with ONNX
        // Runtime's exp and summation order (see ort_softmax.hpp).
        out[0] = Tensor::uninitialized(DataType::Float, x.shape());  // every row is written
        auto y = out[0].mutable_data<float>();
        const auto xv = x.data<float>();
        parallel_for(outer, x.size() > kParallelGrain, [&](int64_t o) {
            const float* row = xv.data() + o * n;
            float* dst = y.data() + o * n;
            const float best = ort_row_max(row, n);
            const float sum = ort_sum_exp(row, dst, n, -best);
            if constexpr (kKind == SoftmaxKind::Softmax) {
                const float inv = 1.0f / sum;
                for (int64_t j = 0; j < n; ++j) dst[j] *= inv;
            } else {
                const float log_sum = std::log(sum);
                for (int64_t j = 0; j < n; ++j) dst[j] = row[j] - best - log_sum;
            }
        });
        return;
    }
    dispatch_float(x.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        out[0] = make_tensor<T>(x.shape());
        auto y = mutable_view<T>(out[0]);
        const auto xv = view<T>(x);
        for (int64_t o = 0; o < outer; ++o) {
            for (int64_t i = 0; i < inner; ++i) {
                auto at = [&](int64_t j) { return (o * n + j) * inner + i; };
                T best = -std::numeric_limits<T>::infinity();
                int64_t best_j = 0;
                for (int64_t j = 0; j < n; ++j)
                    if (xv[at(j)] > best) {
                        best = xv[at(j)];
                        best_j = j;
                    }
                if constexpr (kKind == SoftmaxKind::Hardmax) {
                    for (int64_t j = 0; j < n; ++j) y[at(j)] = j == best_j ? T{1} : T{0};
                } else {
                    double sum = 0;
                    for (int64_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(xv[at(j)] - best));
                    for (int64_t j = 0; j < n; ++j) {
                        const double shifted = static_cast<double>(xv[at(j)] - best);
                        y[at(j)] = static_cast<T>(kKind == SoftmaxKind::Softmax ? std::exp(shifted) / sum
                                                                                : shifted - std::log(sum));
                    }
                }
            }
        }
    });
}

// x / ||x||_p along one axis (p 1 or 2); a zero norm gives zeros, as in ONNX Runtime.
void lp_norm(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& x = ctx.input(0);
    if (x.type() != DataType::Float) ctx.fail("only float is supported");
    const int64_t p = ctx.attributes.get_int("p", 2);
    if (p != 1 && p != 2) ctx.fail(fmt::format("p must be 1 or 2, not {}", p));
    const auto rank = static_cast<int64_t>(x.shape().size());
    int64_t axis = ctx.attributes.get_int("axis", -1);
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) ctx.fail("axis out of range");
    int64_t outer = 1, inner = 1;
    const int64_t n = x.shape()[axis];
    for (int64_t d = 0; d < axis; ++d) outer *= x.shape()[d];
    for (int64_t d = axis + 1; d < rank; ++d) inner *= x.shape()[d];
    out[0] = Tensor(DataType::Float, x.shape());
    const auto xv = x.data<float>();
    auto y = out[0].mutable_data<float>();
    for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) {
            const int64_t base = o * n * inner + i;
            float norm = 0;
            for (int64_t j = 0; j < n; ++j) {
                const float v = xv[base + j * inner];
                norm += p == 2 ? v * v : std::abs(v);
            }
            if (p == 2) norm = std::sqrt(norm);
            for (int64_t j = 0; j < n; ++j) y[base + j * inner] = norm != 0 ? xv[base + j * inner] / norm : 0.0f;
        }
}

// Every kernel here shares its work only through parallel_for.hpp.
const KernelRegistrations kKernels(always_in_team,
                                   {
                                       {"", "LpNormalization", 1, 21, lp_norm},
                                       {"", "BatchNormalization", 9, 21, batch_norm},
                                       {kInternalDomain, "NhwcBatchNormalization", 0, 1, nhwc_batch_norm},
                                       {"", "InstanceNormalization", 6, 21, instance_norm},
                                       {"", "LayerNormalization", 17, 21, layer_norm},
                                       {kInternalDomain, "LayerNormalization", 0, 1,
                                        layer_norm},  // fused from older opsets (runtime/layout.hpp)
                                       {"", "Softmax", 1, 21, softmax<SoftmaxKind::Softmax>},
                                       {"", "LogSoftmax", 1, 21, softmax<SoftmaxKind::LogSoftmax>},
                                       {"", "Hardmax", 1, 21, softmax<SoftmaxKind::Hardmax>},
                                   });

}  // namespace
}  // namespace vaiq::runtime
