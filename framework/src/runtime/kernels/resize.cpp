// Resize (opsets 11-17) as the ONNX spec's reference computes it: per axis, the
// output coordinate maps back to an input coordinate (coordinate_transformation_mode),
// which is read by nearest (nearest_mode), linear or cubic (cubic_coeff_a,
// exclude_outside) interpolation with edge values beyond the borders;
// tf_crop_and_resize reads extrapolation_value outside the region of interest.
// Axes are interpolated one inside the other, innermost first. A float bilinear
// Resize of image planes computes as ONNX Runtime does instead (see
// bilinear_as_onnx_runtime), since that is where the quantized model runs.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "runtime/kernels/common.hpp"
#include "runtime/layout.hpp"

namespace vaiq::runtime {
namespace {

// How one output coordinate reads one input axis.
struct Taps {
    bool extrapolated = false;
    std::vector<int64_t> index;
    std::vector<double> weight;
};

struct Settings {
    std::string coordinates, mode, nearest;
    double cubic_a;
    bool exclude_outside;
};

// As the reference computes it, the resized length is in_len * scale, unrounded.
double original_coordinate(const Settings& s, double x, double scale, int64_t in_len, double start, double end) {
    const double out_len = scale * static_cast<double>(in_len);
    const auto& m = s.coordinates;
    if (m == "half_pixel") return (x + 0.5) / scale - 0.5;
    if (m == "pytorch_half_pixel") return out_len > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
    if (m == "align_corners") return out_len == 1 ? 0.0 : x * static_cast<double>(in_len - 1) / (out_len - 1);
    if (m == "asymmetric") return x / scale;
    if (m == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
    if (m == "half_pixel_symmetric") {  // opset 19: half_pixel, centred when the length was rounded down
        const double adjustment = std::floor(out_len) / out_len;
        return static_cast<double>(in_len) / 2 * (1 - adjustment) + (x + 0.5) / scale - 0.5;
    }
    // tf_crop_and_resize
    return out_len > 1 ? start * static_cast<double>(in_len - 1) +
                             x * (end - start) * static_cast<double>(in_len - 1) / (out_len - 1)
                       : 0.5 * (start + end) * static_cast<double>(in_len - 1);
}

int64_t nearest_index(const Settings& s, double x) {
    const auto& m = s.nearest;
    if (m == "floor") return static_cast<int64_t>(std::floor(x));
    if (m == "ceil") return static_cast<int64_t>(std::ceil(x));
    const double fl = std::floor(x);
    if (x - fl == 0.5) return static_cast<int64_t>(m == "round_prefer_ceil" ? fl + 1 : fl);
    return static_cast<int64_t>(std::round(x));
}

std::vector<double> cubic_weights(double ratio, double a) {
    auto w = [a](double d) {
        d = std::abs(d);
        if (d <= 1) return ((a + 2) * d - (a + 3)) * d * d + 1;
        if (d < 2) return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
        return 0.0;
    };
    return {w(ratio + 1), w(ratio), w(1 - ratio), w(2 - ratio)};
}

Taps taps_for(const Settings& s, double x, int64_t in_len) {
    Taps t;
    const auto clamp = [in_len](int64_t i) { return std::clamp<int64_t>(i, 0, in_len - 1); };
    if (s.mode == "nearest") {
        t.index = {clamp(nearest_index(s, x))};
        t.weight = {1.0};
        return t;
    }
    const double x0 = std::floor(x);
    const double ratio = x - x0;
    const auto base = static_cast<int64_t>(x0);
    if (s.mode == "linear") {
        t.index = {clamp(base), clamp(base + 1)};
        t.weight = {1.0 - ratio, ratio};
        return t;
    }
    auto weights = cubic_weights(ratio, s.cubic_a);
    double kept = 0;
    for (int64_t k = 0; k < 4; ++k) {
        const int64_t i = base - 1 + k;
        if (s.exclude_outside && (i < 0 || i >= in_len)) weights[k] = 0.0;
        kept += weights[k];
        t.index.push_back(clamp(i));
    }
    if (s.exclude_outside && kept != 0)
        for (auto& w : weights) w /= kept;
    t.weight = weights;
    return t;
}

// Nearest without extrapolation: each output element is one input element,
// copied as it is (any element type; the 8-bit integers of a dropped Q/DQ pair
// among them). The input offset is a sum of one offset per axis; the innermost
// axis is walked from its table, the outer rows split over the threads. False
// for element sizes it does not copy (4-bit types).
bool copy_nearest(const Tensor& x, const std::vector<std::vector<Taps>>& taps, const std::vector<int64_t>& strides,
                  Tensor& y) {
    const auto rank = taps.size();
    std::vector<std::vector<int64_t>> offsets(rank);
    for (size_t d = 0; d < rank; ++d)
        for (const auto& t : taps[d]) offsets[d].push_back(t.index[0] * strides[d]);
    const auto& inner = offsets[rank - 1];
    const auto width = static_cast<int64_t>(inner.size());
    const int64_t rows = y.size() / width;
    // An innermost axis copied as it is (a channels-last value's channels): one block a row.
    bool contiguous = true;
    for (int64_t o = 0; o < width && contiguous; ++o) contiguous = inner[static_cast<size_t>(o)] == o;
    auto copy = [&](auto element) {
        using E = decltype(element);
        const auto* from = reinterpret_cast<const E*>(x.bytes().data());
        auto* to = reinterpret_cast<E*>(y.mutable_bytes().data());
        parallel_for(rows, y.size() > kParallelGrain, [&](int64_t r) {
            int64_t base = 0;
            for (int64_t d = static_cast<int64_t>(rank) - 2, rest = r; d >= 0; --d) {
                const auto count = static_cast<int64_t>(offsets[d].size());
                base += offsets[d][rest % count];
                rest /= count;
            }
            E* row = to + r * width;
            if (contiguous) {
                std::copy_n(from + base, width, row);
                return;
            }
            for (int64_t o = 0; o < width; ++o) row[o] = from[base + inner[o]];
        });
    };
    switch (element_size(x.type())) {
        case 1: copy(uint8_t{}); return true;
        case 2: copy(uint16_t{}); return true;
        case 4: copy(uint32_t{}); return true;
        case 8: copy(uint64_t{}); return true;
        default: return false;
    }
}

// ONNX Runtime's coordinate in float (its CPU Resize's transforms); nullopt
// for a mode it computes otherwise or not at all here.
std::optional<float> onnx_runtime_coordinate(const std::string& mode, float x, float scale, float out_len,
                                             float in_len) {
    if (mode == "half_pixel") return ((x + 0.5f) / scale) - 0.5f;
    if (mode == "pytorch_half_pixel") return out_len > 1 ? (x + 0.5f) / scale - 0.5f : 0.0f;
    if (mode == "asymmetric") return x / scale;
    if (mode == "tf_half_pixel_for_nn") return (x + 0.5f) / scale;
    if (mode == "align_corners") return out_len == 1 ? 0.0f : x * (in_len - 1) / (out_len - 1);
    return std::nullopt;
}

// One axis as ONNX Runtime's bilinear Resize reads it: per output coordinate
// the input coordinate clamped into the axis, its neighbours below and above
// and its float distances to them (both 0.5 where the two are one).
struct BilinearAxis {
    std::vector<int64_t> below, above;
    std::vector<float> from_below, from_above;
};

// `whole`: the output length is in_len * scale, as the reference takes it (sizes
// given, or scales whose product is whole); ONNX Runtime takes the output's
// length, so the modes that read it are computed by the reference otherwise.
std::optional<BilinearAxis> bilinear_axis(const std::string& mode, int64_t in_len, int64_t out_len, float scale,
                                          bool whole) {
    if (!whole && (mode == "align_corners" || mode == "pytorch_half_pixel")) return std::nullopt;
    BilinearAxis a;
    for (int64_t o = 0; o < out_len; ++o) {
        float at = static_cast<float>(o);
        if (scale != 1.0f) {
            const auto c =
                onnx_runtime_coordinate(mode, at, scale, static_cast<float>(out_len), static_cast<float>(in_len));
            if (!c) return std::nullopt;
            at = *c;
        }
        at = std::max(0.0f, std::min(at, static_cast<float>(in_len - 1)));
        const int64_t below = std::min(static_cast<int64_t>(at), in_len - 1), above = std::min(below + 1, in_len - 1);
        a.below.push_back(below), a.above.push_back(above);
        a.from_below.push_back(below == above ? 0.5f : std::fabs(at - static_cast<float>(below)));
        a.from_above.push_back(below == above ? 0.5f : std::fabs(at - static_cast<float>(above)));
    }
    return a;
}

// A float linear Resize of the last two axes of a 2-D or 4-D tensor (N and C
// kept) as ONNX Runtime 1.30's CPU kernel computes it, bit for bit: each
// output is ((c11 X11 + c21 X21) + c12 X12) + c22 X22, its neighbours' values
// times products of the two axes' distances, in float. The ONNX reference's
// double sums differ in the last bit, which a QuantizeLinear after the Resize
// turns into whole steps (ISNet's mask: 37 % of its values off ONNX Runtime's).
// False where ONNX Runtime computes otherwise (other ranks, modes or a
// resized N or C): the general path then computes it.
bool bilinear_as_onnx_runtime(const Settings& s, const Tensor& x, const std::vector<float>& scales,
                              const std::vector<bool>& whole, Tensor& y) {
    const auto& in = x.shape();
    const auto& out = y.shape();
    const size_t rank = in.size();
    if ((rank != 2 && rank != 4) || (rank == 4 && (out[0] != in[0] || out[1] != in[1]))) return false;
    const int64_t h = in[rank - 2], w = in[rank - 1], oh = out[rank - 2], ow = out[rank - 1];
    if (h <= 0 || w <= 0) return false;
    const auto rows = bilinear_axis(s.coordinates, h, oh, scales[rank - 2], whole[rank - 2]);
    const auto columns = bilinear_axis(s.coordinates, w, ow, scales[rank - 1], whole[rank - 1]);
    if (!rows || !columns) return false;
    const int64_t planes = rank == 4 ? in[0] * in[1] : 1;
    const float* v = x.data<float>().data();
    float* o = y.mutable_data<float>().data();
    parallel_for(planes * oh, y.size() > kParallelGrain, [&](int64_t r) {
        const int64_t p = r / oh, row = r % oh;
        const float* top = v + (p * h + rows->below[static_cast<size_t>(row)]) * w;
        const float* bottom = v + (p * h + rows->above[static_cast<size_t>(row)]) * w;
        const float dy1 = rows->from_below[static_cast<size_t>(row)], dy2 = rows->from_above[static_cast<size_t>(row)];
        float* line = o + r * ow;
        for (int64_t c = 0; c < ow; ++c) {
            const auto k = static_cast<size_t>(c);
            const float dx1 = columns->from_below[k], dx2 = columns->from_above[k];
            const int64_t x1 = columns->below[k], x2 = columns->above[k];
            line[c] = dx2 * dy2 * top[x1] + dx1 * dy2 * top[x2] + dx2 * dy1 * bottom[x1] + dx1 * dy1 * bottom[x2];
        }
    });
    return true;
}

// Linear and cubic when every axis but the last two reads one input coordinate
// (the image planes of NCHW resized, N and C kept) and ONNX Runtime's bilinear
// does not apply: the output's rows, each of one plane, split over the threads,
// each row's taps read from tables. The arithmetic is the general path's below,
// in the same order and in double, so the two give the same bits; that path, one
// recursive call per tap and on one thread, had taken 1.4 s of the 1.6 s of a
// 1024 x 1024 segmenter's inference. False when an outer axis blends coordinates.
template <class T>
bool resize_planes(const Tensor& x, const std::vector<std::vector<Taps>>& taps, const std::vector<int64_t>& strides,
                   Tensor& y) {
    const size_t rank = taps.size(), outer = rank - 2;
    const auto height = static_cast<int64_t>(taps[rank - 2].size()),
               width = static_cast<int64_t>(taps[rank - 1].size());
    // Linear reads two coordinates an axis, cubic four.
    const size_t per_column = taps[rank - 1].front().index.size();
    for (size_t d = rank - 2; d < rank; ++d)
        for (const auto& t : taps[d])
            if (t.extrapolated || t.index.size() != per_column || (per_column != 2 && per_column != 4)) return false;
    // Per outer output coordinate: the offset of the one input coordinate it reads,
    // with weight 1 (linear or cubic at a whole coordinate): the general path's
    // 0 + 1 x sum there is the sum itself, which is never -0.0 (see below).
    std::vector<std::vector<int64_t>> picks(outer);
    for (size_t d = 0; d < outer; ++d)
        for (const auto& t : taps[d]) {
            int nonzero = 0;
            for (size_t k = 0; k < t.index.size(); ++k)
                if (t.weight[k] != 0) ++nonzero, picks[d].push_back(t.index[k] * strides[d]);
            if (nonzero != 1 || std::find(t.weight.begin(), t.weight.end(), 1.0) == t.weight.end()) return false;
        }
    int64_t planes = 1;
    for (size_t d = 0; d < outer; ++d) planes *= static_cast<int64_t>(picks[d].size());
    std::vector<int64_t> plane_offset(static_cast<size_t>(planes));
    for (int64_t p = 0; p < planes; ++p)
        for (int64_t d = static_cast<int64_t>(outer) - 1, rest = p; d >= 0; --d) {
            const auto& pick = picks[static_cast<size_t>(d)];
            plane_offset[static_cast<size_t>(p)] += pick[static_cast<size_t>(rest % static_cast<int64_t>(pick.size()))];
            rest /= static_cast<int64_t>(pick.size());
        }
    // The columns' taps as flat tables. A tap the general path skips (weight 0)
    // adds +0.0 here instead, which leaves a sum begun at +0.0 as it was: such a
    // sum is never -0.0.
    const auto& columns = taps[rank - 1];
    std::vector<int64_t> column_index(static_cast<size_t>(width) * per_column);
    std::vector<double> column_weight(column_index.size());
    for (size_t o = 0; o < columns.size(); ++o)
        for (size_t k = 0; k < per_column; ++k) {
            column_index[o * per_column + k] = columns[o].index[k];
            column_weight[o * per_column + k] = columns[o].weight[k];
        }
    const T* v = view<T>(x).data();
    auto out = mutable_view<T>(y);
    const int64_t row_stride = strides[rank - 2];
    // Adds weight x (one input row, interpolated at every output column) to `sums`.
    auto add_row = [&]<size_t K>(std::integral_constant<size_t, K>, const T* from, double weight, double* sums) {
        const int64_t* index = column_index.data();
        const double* w = column_weight.data();
        for (int64_t o = 0; o < width; ++o, index += K, w += K) {
            double inner = 0;
            for (size_t k = 0; k < K; ++k) inner += w[k] != 0 ? w[k] * static_cast<double>(from[index[k]]) : 0.0;
            sums[o] += weight * inner;
        }
    };
    parallel_for(planes * height, y.size() > kParallelGrain, [&](int64_t r) {
        thread_local std::vector<double> sums;
        sums.assign(static_cast<size_t>(width), 0.0);
        const int64_t p = r / height;
        const auto& rows = taps[rank - 2][static_cast<size_t>(r % height)];
        for (size_t ky = 0; ky < rows.index.size(); ++ky) {
            if (rows.weight[ky] == 0) continue;
            const T* from = v + plane_offset[static_cast<size_t>(p)] + rows.index[ky] * row_stride;
            if (per_column == 2)
                add_row(std::integral_constant<size_t, 2>{}, from, rows.weight[ky], sums.data());
            else
                add_row(std::integral_constant<size_t, 4>{}, from, rows.weight[ky], sums.data());
        }
        for (int64_t o = 0; o < width; ++o) out[r * width + o] = static_cast<T>(sums[static_cast<size_t>(o)]);
    });
    return true;
}

// Resize; `axis_of`, when given, names for each axis of the input the axis of
// the scales and sizes that it takes (a channels-last value's, whose scales
// and sizes are still the channels-first model's).
void resize_axes(KernelContext& ctx, std::vector<Tensor>& out, const std::vector<int64_t>* axis_of) {
    const auto& x = ctx.input(0);
    const auto& in = x.shape();
    const auto rank = static_cast<int64_t>(in.size());
    if (axis_of && static_cast<int64_t>(axis_of->size()) != rank) ctx.fail("the input must be 4-D (NHWC)");
    auto given = [&](int64_t d) { return axis_of ? (*axis_of)[static_cast<size_t>(d)] : d; };
    Settings s{ctx.attributes.get_string("coordinate_transformation_mode", "half_pixel"),
               ctx.attributes.get_string("mode", "nearest"),
               ctx.attributes.get_string("nearest_mode", "round_prefer_floor"),
               ctx.attributes.get_float("cubic_coeff_a", -0.75f), ctx.attributes.get_int("exclude_outside", 0) != 0};
    if (s.mode != "nearest" && s.mode != "linear" && s.mode != "cubic")
        ctx.fail("mode '" + s.mode + "' is not supported");
    // Opset 18's additions, at their defaults only.
    if (ctx.attributes.get_int("antialias", 0) != 0) ctx.fail("antialias is not supported");
    if (!ctx.attributes.get_ints("axes").empty()) ctx.fail("axes is not supported");
    if (ctx.attributes.get_string("keep_aspect_ratio_policy", "stretch") != "stretch")
        ctx.fail("keep_aspect_ratio_policy other than stretch is not supported");
    const double extrapolation = ctx.attributes.get_float("extrapolation_value", 0.0f);
    const bool crop = s.coordinates == "tf_crop_and_resize";
    std::vector<double> roi(2 * rank, 0.0);
    for (int64_t d = 0; d < rank; ++d) roi[rank + d] = 1.0;
    if (crop && ctx.has_input(1) && ctx.input(1).size() == 2 * rank) {
        const auto& r = ctx.input(1);
        for (int64_t i = 0; i < 2 * rank; ++i)
            roi[i] = r.type() == DataType::Float ? r.data<float>()[i] : read_ints(ctx, r)[i];
    }
    std::vector<double> scales(rank, 1.0);
    std::vector<float> float_scales(rank, 1.0f);  // as ONNX Runtime holds them
    std::vector<bool> whole(rank, true);          // the output length is in * scale
    std::vector<int64_t> shape(in);
    if (ctx.has_input(3) && ctx.input(3).size() > 0) {
        const auto sizes = read_ints(ctx, ctx.input(3));
        if (static_cast<int64_t>(sizes.size()) != rank) ctx.fail("sizes must give every dimension");
        for (int64_t d = 0; d < rank; ++d) {
            const int64_t size = sizes[given(d)];
            shape[d] = size;
            scales[d] = static_cast<double>(size) / static_cast<double>(in[d]);
            float_scales[d] = static_cast<float>(size) / static_cast<float>(in[d]);
        }
    } else if (ctx.has_input(2) && ctx.input(2).size() > 0) {
        const auto sc = ctx.input(2).data<float>();
        if (static_cast<int64_t>(sc.size()) != rank) ctx.fail("scales must give every dimension");
        for (int64_t d = 0; d < rank; ++d) {
            const float scale = sc[given(d)];
            if (!(std::isfinite(scale) && scale > 0)) ctx.fail(fmt::format("scale {} is not a positive number", scale));
            scales[d] = scale;
            float_scales[d] = scale;
            const double span = crop ? roi[rank + d] - roi[d] : 1.0;
            const double size = std::floor(static_cast<double>(in[d]) * span * scales[d]);
            if (!(size >= 0 && size < 9.2e18)) ctx.fail(fmt::format("scale {} gives no output size", scale));
            shape[d] = static_cast<int64_t>(size);
            whole[d] = static_cast<double>(in[d]) * scales[d] == size;
        }
    } else {
        ctx.fail("neither scales nor sizes is given");
    }
    for (int64_t d = 0; d < rank; ++d)
        if (shape[d] < 0) ctx.fail(fmt::format("output dimension {} is negative ({})", d, shape[d]));
    // The output first: a size beyond what can be allocated is refused before the taps are built.
    out[0] = Tensor::uninitialized(x.type(), shape);
    if (s.mode == "linear" && x.type() == DataType::Float && out[0].size() > 0 &&
        bilinear_as_onnx_runtime(s, x, float_scales, whole, out[0]))
        return;
    // Taps per axis and output coordinate.
    std::vector<std::vector<Taps>> taps(rank);
    for (int64_t d = 0; d < rank; ++d)
        for (int64_t o = 0; o < shape[d]; ++o) {
            const double xo = original_coordinate(s, static_cast<double>(o), scales[d], in[d], roi[d], roi[rank + d]);
            Taps t;
            if (crop && (xo < 0 || xo > static_cast<double>(in[d] - 1)))
                t.extrapolated = true;
            else
                t = taps_for(s, xo, in[d]);
            taps[d].push_back(std::move(t));
        }
    const auto strides = strides_of(in);
    if (s.mode == "nearest" && !crop && rank > 0 && out[0].size() > 0 && copy_nearest(x, taps, strides, out[0])) return;
    dispatch_float(x.type(), ctx, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (!crop && rank >= 2 && out[0].size() > 0 && resize_planes<T>(x, taps, strides, out[0])) return;
        auto y = mutable_view<T>(out[0]);
        const auto v = view<T>(x);
        std::vector<int64_t> counter(rank, 0);
        // Interpolates axis d (and those inside it) at the current output coordinate.
        auto interpolate = [&](auto&& self, int64_t d, int64_t offset) -> double {
            if (d == rank) return static_cast<double>(v[offset]);
            const auto& t = taps[d][counter[d]];
            if (t.extrapolated) return extrapolation;
            double acc = 0;
            for (size_t k = 0; k < t.index.size(); ++k)
                if (t.weight[k] != 0) acc += t.weight[k] * self(self, d + 1, offset + t.index[k] * strides[d]);
            return acc;
        };
        for (int64_t i = 0; i < out[0].size(); ++i) {
            y[i] = static_cast<T>(interpolate(interpolate, 0, 0));
            for (int64_t d = rank - 1; d >= 0; --d) {
                if (++counter[d] < shape[d]) break;
                counter[d] = 0;
            }
        }
    });
}

void resize(KernelContext& ctx, std::vector<Tensor>& out) { resize_axes(ctx, out, nullptr); }

// Nearest Resize of a channels-last value (see runtime/layout.cpp): the same
// copies, each axis with the scale or size the model gives its channels-first axis.
void nhwc_resize(KernelContext& ctx, std::vector<Tensor>& out) {
    if (ctx.attributes.get_string("mode", "nearest") != "nearest") ctx.fail("only nearest runs channels-last");
    static const std::vector<int64_t> kNhwcAxes{0, 2, 3, 1};
    resize_axes(ctx, out, &kNhwcAxes);
}

const KernelRegistration kKernels[] = {
    {"", "Resize", 11, kLatest, resize},
    {kInternalDomain, "NhwcResize", 0, 1, nhwc_resize},
};

}  // namespace
}  // namespace vaiq::runtime
