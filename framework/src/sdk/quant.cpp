#include "vaiq/quant.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "sdk/one_scale.hpp"
#include "sdk/vector_intrinsics.hpp"
#include "vaiq/block_float.hpp"
#include "vaiq/error.hpp"

namespace vaiq {

namespace {
constexpr std::array<std::pair<QuantType, std::string_view>, 19> kQuantTypeNames{{
    {QuantType::QInt8, "QInt8"},
    {QuantType::QUInt8, "QUInt8"},
    {QuantType::QInt16, "QInt16"},
    {QuantType::QUInt16, "QUInt16"},
    {QuantType::QInt32, "QInt32"},
    {QuantType::QUInt32, "QUInt32"},
    {QuantType::QFloat16, "QFloat16"},
    {QuantType::QBFloat16, "QBFloat16"},
    {QuantType::QInt4, "QInt4"},
    {QuantType::QUInt4, "QUInt4"},
    {QuantType::QFloat8E4M3FN, "QFloat8E4M3FN"},
    {QuantType::QFloat8E5M2, "QFloat8E5M2"},
    {QuantType::QBFP16, "QBFP16"},
    {QuantType::QMXInt8, "QMXINT8"},
    {QuantType::QMXFP8E4M3, "QMXFP8E4M3"},
    {QuantType::QMXFP8E5M2, "QMXFP8E5M2"},
    {QuantType::QMXFP6E3M2, "QMXFP6E3M2"},
    {QuantType::QMXFP6E2M3, "QMXFP6E2M3"},
    {QuantType::QMXFP4E2M1, "QMXFP4E2M1"},
}};
}  // namespace

std::optional<QuantType> parse_quant_type(std::string_view name) {
    // Accept the bare name and every documented spelling: QuantType.X,
    // VitisQuantType.X, vai_q_onnx.QuantType.X, ...
    if (auto dot = name.rfind('.'); dot != std::string_view::npos) {
        auto prefix = name.substr(0, dot);
        auto last = prefix.rfind('.');
        auto owner = last == std::string_view::npos ? prefix : prefix.substr(last + 1);
        if (owner != "QuantType" && owner != "VitisQuantType" && owner != "ExtendedQuantType") return std::nullopt;
        name = name.substr(dot + 1);
    }
    for (const auto& [type, type_name] : kQuantTypeNames)
        if (type_name == name) return type;
    if (name == "QBFP") return QuantType::QBFP16;  // ExtendedQuantType.QBFP: vaiq computes bit_width 16
    return std::nullopt;
}

std::string quant_type_name(QuantType type) {
    for (const auto& [t, name] : kQuantTypeNames)
        if (t == type) return std::string(name);
    return "unknown";
}

DataType storage_type(QuantType type) {
    if (is_block_float(type)) return DataType::Float;  // quantized and dequantized at run time
    switch (type) {
        case QuantType::QInt8: return DataType::Int8;
        case QuantType::QUInt8: return DataType::UInt8;
        case QuantType::QInt16: return DataType::Int16;
        case QuantType::QUInt16: return DataType::UInt16;
        case QuantType::QInt32: return DataType::Int32;
        case QuantType::QUInt32: return DataType::UInt32;
        case QuantType::QFloat16: return DataType::Float16;
        case QuantType::QBFloat16: return DataType::BFloat16;
        case QuantType::QInt4: return DataType::Int4;
        case QuantType::QUInt4: return DataType::UInt4;
        case QuantType::QFloat8E4M3FN: return DataType::Float8E4M3FN;
        case QuantType::QFloat8E5M2: return DataType::Float8E5M2;
        default: break;
    }
    return DataType::Undefined;
}

int quant_bits(QuantType type) {
    if (type == QuantType::QInt4 || type == QuantType::QUInt4) return 4;
    if (type == QuantType::QBFP16) return 16;  // its name's bit_width: the shared exponent's 8 bits counted too
    if (is_block_float(type)) {
        const auto f = block_float_format(type);
        return f.float_elements ? 1 + f.exponent_bits + f.mantissa_bits : 8;
    }
    return static_cast<int>(element_size(storage_type(type)) * 8);
}

bool is_integer(QuantType type) {
    return type != QuantType::QFloat16 && type != QuantType::QBFloat16 && !is_float8(type) && !is_block_float(type);
}

bool is_block_float(QuantType type) {
    switch (type) {
        case QuantType::QBFP16:
        case QuantType::QMXInt8:
        case QuantType::QMXFP8E4M3:
        case QuantType::QMXFP8E5M2:
        case QuantType::QMXFP6E3M2:
        case QuantType::QMXFP6E2M3:
        case QuantType::QMXFP4E2M1: return true;
        default: return false;
    }
}

bool is_float8(QuantType type) { return type == QuantType::QFloat8E4M3FN || type == QuantType::QFloat8E5M2; }

std::pair<int64_t, int64_t> integer_range(QuantType type, bool symmetric, bool reduce_range) {
    if (!is_integer(type)) throw InternalError(fmt::format("{} has no integer range", quant_type_name(type)));
    const bool is_signed = type == QuantType::QInt8 || type == QuantType::QInt16 || type == QuantType::QInt32 ||
                           type == QuantType::QInt4;
    const int bits = quant_bits(type);
    if (reduce_range) {
        // One bit fewer, as ONNX Runtime does for weights: u8 [0, 127], i8 [-64, 64].
        const int64_t half = int64_t{1} << (bits - 2);
        return is_signed ? std::pair{-half, half} : std::pair{int64_t{0}, (half << 1) - 1};
    }
    if (is_signed) {
        const int64_t max = (int64_t{1} << (bits - 1)) - 1;
        return {symmetric ? -max : -max - 1, max};
    }
    const int64_t max = bits == 32 ? int64_t{std::numeric_limits<uint32_t>::max()} : (int64_t{1} << bits) - 1;
    return {0, symmetric ? max - 1 : max};
}

std::string role_name(TensorRole role) {
    switch (role) {
        case TensorRole::Activation: return "activation";
        case TensorRole::Weight: return "weight";
        case TensorRole::Bias: return "bias";
    }
    return "unknown";
}

namespace {

// A float8 grid is relative: a power-of-two calibrator's position (an integer
// grid's step) has no meaning for it.
void refuse_power_of_two_float8(const QuantSpec& spec) {
    if (spec.power_of_two && is_float8(spec.type))
        throw InputError(
            fmt::format("{} takes a float scale; the power-of-two calibrators (PowerOfTwoMethod) do "
                        "not apply to it: use MinMax or Percentile",
                        quant_type_name(spec.type)));
}

// Float quant types keep the value's own scale: the rounding is the quantization.
QuantParams float_type_params(QuantType type) { return QuantParams{type, {1.0f}, {0}, -1}; }

}  // namespace

QuantParams compute_quant_params(TensorRange range, const QuantSpec& spec) {
    if (!std::isfinite(range.min) || !std::isfinite(range.max) || range.min > range.max)
        throw InputError(fmt::format("cannot quantize the range [{}, {}]", range.min, range.max));
    refuse_power_of_two_float8(spec);
    if (is_float8(spec.type)) {
        // Symmetric by construction: the largest magnitude onto the largest finite value.
        const double absmax =
            std::max(std::abs(static_cast<double>(range.min)), std::abs(static_cast<double>(range.max)));
        const double scale = absmax / float8_max(storage_type(spec.type));
        return QuantParams{
            spec.type, {scale >= std::numeric_limits<float>::min() ? static_cast<float>(scale) : 1.0f}, {0}, -1};
    }
    if (!is_integer(spec.type)) {
        auto params = float_type_params(spec.type);
        if (is_block_float(spec.type)) params.shared_exponent = spec.shared_exponent;
        return params;
    }
    const auto [qmin, qmax] = integer_range(spec.type, spec.symmetric, spec.reduce_range);
    double rmin = std::min<double>(range.min, 0.0);
    double rmax = std::max<double>(range.max, 0.0);
    if (spec.symmetric) {
        const double absmax = std::max(std::abs(rmin), std::abs(rmax));
        rmin = -absmax;
        rmax = absmax;
    }
    QuantParams params;
    params.type = spec.type;
    double scale = (rmax - rmin) / static_cast<double>(qmax - qmin);
    int64_t zero_point = 0;
    if (scale >= std::numeric_limits<float>::min() && spec.int16_scale && !spec.power_of_two)
        scale = nearest_int16_scale(scale);
    if (scale < std::numeric_limits<float>::min()) {
        scale = 1.0;
    } else if (spec.symmetric) {
        zero_point = static_cast<int64_t>(std::nearbyint((qmin + qmax) / 2.0));
    } else {
        zero_point = static_cast<int64_t>(std::nearbyint(qmin - rmin / scale));
    }
    params.scale = {static_cast<float>(scale)};
    params.zero_point = {std::clamp(zero_point, qmin, qmax)};
    if (spec.power_of_two) return power_of_two_params(range, scale_to_position(params.scale[0]), spec);
    return params;
}

double nearest_int16_scale(double scale) {
    if (!(scale > 0.0) || !std::isfinite(scale)) return scale;
    constexpr int kMaxM = 32767;
    if (scale >= kMaxM) return kMaxM;
    // The largest N that keeps M = round(scale * 2^N) within int16 gives the most significant bits.
    int n = std::clamp(14 - static_cast<int>(std::floor(std::log2(scale))), 0, 65535);
    double m = std::nearbyint(std::ldexp(scale, n));
    if (m > kMaxM) m = std::nearbyint(std::ldexp(scale, --n));
    return std::ldexp(std::max(m, 1.0), -n);
}

int scale_to_position(double scale) {
    const double clamped = std::clamp(scale, std::ldexp(1.0, -127), std::ldexp(1.0, 127));
    return static_cast<int>(std::clamp(std::rint(-std::log2(clamped)), -127.0, 127.0));
}

QuantParams power_of_two_params(TensorRange range, int position, const QuantSpec& spec) {
    refuse_power_of_two_float8(spec);
    if (!is_integer(spec.type)) return float_type_params(spec.type);
    QuantSpec float_spec = spec;
    float_spec.power_of_two = false;
    QuantParams params = compute_quant_params(range, float_spec);
    const auto [qmin, qmax] = integer_range(spec.type, spec.symmetric, spec.reduce_range);
    if (spec.symmetric) params.zero_point = {static_cast<int64_t>(std::nearbyint((qmin + qmax) / 2.0))};
    if (spec.symmetric && spec.type == QuantType::QUInt8) params.zero_point = {128};
    params.scale = {static_cast<float>(std::ldexp(1.0, -position))};
    return params;
}

std::vector<TensorRange> channel_ranges(const Tensor& data, int axis) {
    const auto values = data.data<float>();
    const auto& shape = data.shape();
    const int64_t channels = axis >= 0 ? shape[axis] : 1;
    int64_t inner = 1;
    if (axis >= 0)
        for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
    std::vector<TensorRange> out(
        static_cast<size_t>(std::max<int64_t>(channels, 1)),
        TensorRange{std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()});
    // Block by block: each block of `inner` values is one channel's.
    const auto block = static_cast<size_t>(axis >= 0 ? inner : std::max<size_t>(values.size(), 1));
    for (size_t b = 0, c = 0; b < values.size(); b += block, c = axis >= 0 ? (c + 1) % out.size() : 0) {
        auto& r = out[c];
        for (size_t i = b; i < std::min(b + block, values.size()); ++i) {
            r.min = std::min(r.min, values[i]);
            r.max = std::max(r.max, values[i]);
        }
    }
    for (auto& r : out)
        if (r.min > r.max) r = {0.0f, 0.0f};  // an empty tensor
    return out;
}

namespace {

constexpr int kPositions = 5;  // the overflow-free position and four finer ones
constexpr int kLanes = 8;
constexpr int64_t kChunk = int64_t{1} << 15;

// Each position's summed squared round-trip error over values[0, n): for a scale
// of 2^-p, v / scale is v * 2^p exactly, and a value clamped one step beyond the
// integer range rounds (to nearest even, by adding and taking away 1.5 * 2^52)
// and clamps as nearbyint and then clamping would. The sums run in kLanes lanes
// added up at the end, a fixed order the compiler keeps in vector registers.
std::array<double, kPositions> round_trip_errors(const float* values, int64_t n,
                                                 const std::array<double, kPositions>& scales, double lo, double hi) {
    constexpr double kRound = 6755399441055744.0;
    std::array<double, kPositions> out{};
    for (int p = 0; p < kPositions; ++p) {
        const double s = scales[p], inv = 1.0 / s;
        double lane[kLanes] = {};
        auto add = [&](int l, double v) {
            const double x = std::clamp(v * inv, lo - 1, hi + 1);
            const double q = std::clamp((x + kRound) - kRound, lo, hi);
            const double d = v - q * s;
            lane[l] += d * d;
        };
        int64_t i = 0;
        for (; i + kLanes <= n; i += kLanes)
            for (int l = 0; l < kLanes; ++l) add(l, values[i + l]);
        for (int l = 0; i < n; ++i, ++l) add(l, values[i]);
        for (int l = 0; l < kLanes; ++l) out[p] += lane[l];
    }
    return out;
}

}  // namespace

// The overflow bound counts from the zero point: a constant stored with a
// symmetric uint8 activation type (zero point 128) reaches only 126 steps up,
// not 254, and since the search never tries larger scales, taking 254 would
// halve every such constant (the 3 of a HardSwish became 1.98).
int best_power_of_two_position(const Tensor& data, int axis, size_t channel, TensorRange range, const QuantSpec& spec) {
    const auto [qmin, qmax] = integer_range(spec.type, spec.symmetric, spec.reduce_range);
    const auto zp = static_cast<double>(power_of_two_params(range, 0, spec).zero_point[0]);
    const double over = std::max(static_cast<double>(range.min) / (static_cast<double>(qmin) - zp - 0.5),
                                 static_cast<double>(range.max) / (static_cast<double>(qmax) - zp + 0.5));
    const int start = over > 0 ? static_cast<int>(std::clamp(std::floor(-std::log2(over)), -127.0, 123.0)) : 123;
    // The channel's values: blocks of `inner` at a stride of channels x inner,
    // gathered when there are several (so that a channel along the last axis is
    // not summed value by value), then cut into chunks that the threads share,
    // each chunk's sums kept apart and added in order: the result does not
    // depend on the thread count.
    const auto values = data.data<float>();
    const auto& shape = data.shape();
    int64_t inner = static_cast<int64_t>(values.size()), channels = 1;
    if (axis >= 0) {
        channels = shape[axis];
        inner = 1;
        for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d) inner *= shape[d];
    }
    const int64_t stride = channels * inner;
    std::vector<float> gathered;
    std::span<const float> mine;
    if (stride >= static_cast<int64_t>(values.size())) {
        const size_t first = std::min(values.size(), static_cast<size_t>(channel * inner));
        mine = values.subspan(first, std::min(static_cast<size_t>(inner), values.size() - first));
    } else {
        for (int64_t block = static_cast<int64_t>(channel) * inner; block < static_cast<int64_t>(values.size());
             block += stride)
            gathered.insert(gathered.end(), values.begin() + block, values.begin() + block + inner);
        mine = gathered;
    }
    const auto count = (static_cast<int64_t>(mine.size()) + kChunk - 1) / kChunk;
    std::array<double, kPositions> scales{};
    for (int p = 0; p < kPositions; ++p) scales[p] = power_of_two_params(range, start + p, spec).scale[0];
    // Every position's zero point is the range's: only the scale moves.
    const double lo = static_cast<double>(qmin) - zp, hi = static_cast<double>(qmax) - zp;
    std::vector<std::array<double, kPositions>> sums(static_cast<size_t>(count));
#pragma omp parallel for schedule(static) if (count > 1)
    for (int64_t c = 0; c < count; ++c)
        sums[c] = round_trip_errors(mine.data() + c * kChunk,
                                    std::min<int64_t>(kChunk, static_cast<int64_t>(mine.size()) - c * kChunk), scales,
                                    lo, hi);
    int best = start;
    double best_error = std::numeric_limits<double>::infinity();
    for (int p = 0; p < kPositions; ++p) {
        double error = 0;
        for (const auto& chunk : sums) error += chunk[p];
        if (error < best_error) {
            best_error = error;
            best = start + p;
        }
    }
    return best;
}

QuantParams constant_params(const Tensor& data, const QuantSpec& spec) {
    if (is_block_float(spec.type)) return compute_quant_params({}, spec);  // blocks at run time, no range
    if (spec.block_size > 0) return blocked_constant_params(data, spec);
    refuse_power_of_two_float8(spec);
    const int axis = spec.per_channel ? spec.axis : -1;
    const auto ranges = channel_ranges(data, axis);
    QuantParams out;
    out.type = spec.type;
    out.axis = axis;
    for (size_t c = 0; c < ranges.size(); ++c) {
        const auto& r = ranges[c];
        const auto p = spec.power_of_two
                           ? power_of_two_params(r, best_power_of_two_position(data, axis, c, r, spec), spec)
                           : compute_quant_params(r, spec);
        out.type = p.type;
        out.scale.push_back(p.scale[0]);
        out.zero_point.push_back(p.zero_point[0]);
    }
    return out;
}

std::optional<int> exact_position(const QuantParams& params) {
    if (params.block_size > 0) return std::nullopt;
    if (params.scale.size() != 1 || !(params.scale[0] > 0.0f)) return std::nullopt;
    int exponent = 0;
    const double mantissa = std::frexp(static_cast<double>(params.scale[0]), &exponent);
    if (mantissa != 0.5) return std::nullopt;
    return 1 - exponent;  // scale = 0.5 * 2^e = 2^-(1-e)
}

void check_quant_params(const TensorQuant& t, int64_t opset, bool blocks) {
    if (t.spec.dynamic)
        throw InputError(fmt::format("tensor '{}' is quantized at run time (static: false), which this format cannot "
                                     "write; use quant_format IntegerOps or QLinearOps",
                                     t.tensor));
    const auto& p = t.params;
    const bool four_bit_integer = quant_bits(p.type) == 4 && is_integer(p.type);
    if ((four_bit_integer || p.block_size > 0) && !blocks)
        throw InputError(fmt::format("tensor '{}' is {}{}, which this format cannot write; weights in blocks are "
                                     "written by quant_format QDQ or MatMulNBits",
                                     t.tensor, quant_type_name(p.type), p.block_size > 0 ? " in blocks" : ""));
    if (four_bit_integer && p.block_size == 0)
        throw InputError(fmt::format("tensor '{}' is {}: 4-bit weights are quantized in blocks (set block_size)",
                                     t.tensor, quant_type_name(p.type)));
    if (!p.float_zero_point.empty())
        throw InputError(
            fmt::format("tensor '{}' has float zero points (weight_only_algorithm: hqq), which "
                        "DequantizeLinear cannot hold; quant_format MatMulNBits stores them",
                        t.tensor));
    if (p.scale.empty() || p.scale.size() != p.zero_point.size())
        throw InputError(
            fmt::format("tensor '{}' has {} scales and {} zero points", t.tensor, p.scale.size(), p.zero_point.size()));
    for (float s : p.scale)
        if (!(s > 0.0f) || !std::isfinite(s))
            throw InputError(
                fmt::format("tensor '{}' has the scale {}; scales must be positive and finite", t.tensor, s));
    if (p.block_size > 0 && opset < 21)
        throw InputError(fmt::format("tensor '{}' is quantized in blocks, which DequantizeLinear takes from opset 21 "
                                     "(the model has opset {}); convert it (vaiq convert-opset --opset 21) or use "
                                     "quant_format MatMulNBits",
                                     t.tensor, opset));
    if (p.axis >= 0 && opset < 13)
        throw InputError(
            fmt::format("tensor '{}' is quantized per channel, which needs opset 13 or newer (the model "
                        "has opset {})",
                        t.tensor, opset));
    if (is_block_float(p.type) && p.shared_exponent.size < 1)
        throw InputError(fmt::format("tensor '{}' is {} in blocks of {} values; blocks hold one value or more",
                                     t.tensor, quant_type_name(p.type), p.shared_exponent.size));
    if (!is_integer(p.type)) {
        for (int64_t z : p.zero_point)
            if (z != 0)
                throw InputError(fmt::format("tensor '{}' is {} with the zero point {}; float types take zero point 0",
                                             t.tensor, quant_type_name(p.type), z));
        return;
    }
    const auto [qmin, qmax] = integer_range(p.type);
    for (int64_t z : p.zero_point)
        if (z < qmin || z > qmax)
            throw InputError(
                fmt::format("tensor '{}' has the zero point {}, outside [{}, {}]", t.tensor, z, qmin, qmax));
}

uint16_t quantize_float_value(float scaled, float zero_point, QuantType type) {
    const bool half = type == QuantType::QFloat16;
    if (!half && type != QuantType::QBFloat16)
        throw InternalError(fmt::format("{} is not a float quant type", quant_type_name(type)));
    // The largest finite values: 65504 for float16, (2 - 2^-7) * 2^127 for bfloat16.
    const float limit = half ? 65504.0f : std::ldexp(255.0f, 120);
    float v = scaled + zero_point;
    if (!std::isnan(v)) v = std::clamp(v, -limit, limit);
    return half ? float_to_half(v) : float_to_bfloat16(v);
}

float float_quant_value(uint16_t bits, QuantType type) {
    return type == QuantType::QFloat16 ? half_to_float(bits) : bfloat16_to_float(bits);
}

namespace {

std::vector<int64_t> params_shape(const QuantParams& p) {
    if (p.block_size > 0) return p.block_shape;
    return p.axis >= 0 ? std::vector<int64_t>{static_cast<int64_t>(p.scale.size())} : std::vector<int64_t>{};
}

template <typename Q>
void fill_zero_points(Tensor& t, const QuantParams& p) {
    auto out = t.mutable_data<Q>();
    for (size_t i = 0; i < p.zero_point.size(); ++i) out[i] = static_cast<Q>(p.zero_point[i]);
}

template <typename Q>
void quantize_into(std::span<const float> in, std::span<Q> out, const QuantParams& p, const ParamLayout& layout,
                   int64_t qmin, int64_t qmax) {
    const auto n = static_cast<int64_t>(in.size());
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 16))
    for (int64_t i = 0; i < n; ++i) {
        const size_t c = layout.index(static_cast<size_t>(i));
        const Q q = p.float_zero_point.empty()
                        ? quantize_value<Q>(in[i] / p.scale[c], static_cast<double>(p.zero_point[c]))
                        : quantize_value<Q>(in[i] / p.scale[c] + p.float_zero_point[c], 0.0);
        // 4-bit values live in a byte: saturate to their own range.
        out[i] = static_cast<Q>(std::clamp<int64_t>(q, qmin, qmax));
    }
}

// Calls f with a value of the storage type of `type` (int8_t, uint8_t, ...).
template <typename F>
void with_storage_type(QuantType type, F&& f) {
    switch (type) {
        case QuantType::QInt8:
        case QuantType::QInt4: f(int8_t{}); break;
        case QuantType::QUInt8:
        case QuantType::QUInt4: f(uint8_t{}); break;
        case QuantType::QInt16: f(int16_t{}); break;
        case QuantType::QUInt16: f(uint16_t{}); break;
        case QuantType::QInt32: f(int32_t{}); break;
        case QuantType::QUInt32: f(uint32_t{}); break;
        default: throw InputError(fmt::format("{} is not an integer quant type", quant_type_name(type)));
    }
}

}  // namespace

ParamLayout::ParamLayout(const std::vector<int64_t>& shape, const QuantParams& p, std::string_view tensor)
    : ParamLayout(shape, p.axis, p.block_size, p.scale.size(), tensor) {}

ParamLayout::ParamLayout(const std::vector<int64_t>& shape, int axis, int64_t block_size, size_t count,
                         std::string_view tensor)
    : count_(count) {
    if (axis < 0) {
        if (count_ != 1)
            throw InputError(fmt::format("tensor '{}' has {} scales but is quantized per tensor", tensor, count_));
        return;
    }
    if (axis >= static_cast<int>(shape.size()))
        throw InputError(fmt::format("tensor '{}' of rank {} cannot be quantized along axis {}", tensor, shape.size(),
                                     axis));
    dim_ = shape[static_cast<size_t>(axis)];
    for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d) inner_ *= shape[d];
    int64_t outer = 1;
    for (size_t d = 0; d < static_cast<size_t>(axis); ++d) outer *= shape[d];
    block_ = block_size;
    blocks_ = block_ > 0 ? (dim_ + block_ - 1) / block_ : dim_;
    const auto expected = static_cast<size_t>(block_ > 0 ? outer * blocks_ * inner_ : dim_);
    if (count_ != expected)
        throw InputError(fmt::format("tensor '{}' has {} scales, which do not match axis {} of its shape{}", tensor,
                                     count_, axis,
                                     block_ > 0 ? fmt::format(" in blocks of {} ({} expected)", block_, expected)
                                                : std::string()));
}

size_t ParamLayout::index(size_t i) const {
    if (count_ == 1 && block_ == 0) return 0;
    const auto inner = static_cast<size_t>(inner_), dim = static_cast<size_t>(dim_);
    if (block_ == 0) return (i / inner) % dim;
    const size_t r = i % inner, d = (i / inner) % dim, o = i / (inner * dim);
    return (o * static_cast<size_t>(blocks_) + d / static_cast<size_t>(block_)) * inner + r;
}

std::vector<int64_t> ParamLayout::block_shape(std::vector<int64_t> shape, int axis, int64_t block_size) {
    auto& d = shape[static_cast<size_t>(axis)];
    d = (d + block_size - 1) / block_size;
    return shape;
}

QuantParams blocked_constant_params(const Tensor& data, const QuantSpec& spec) {
    const auto& shape = data.shape();
    if (spec.axis < 0 || spec.axis >= static_cast<int>(shape.size()))
        throw InputError(fmt::format("a tensor of rank {} cannot be quantized in blocks along axis {}", shape.size(),
                                     spec.axis));
    if (spec.power_of_two) throw InputError("block-wise quantization takes float scales, not powers of two");
    QuantParams out;
    out.type = spec.type;
    out.axis = spec.axis;
    out.block_size = spec.block_size;
    out.block_shape = ParamLayout::block_shape(shape, spec.axis, spec.block_size);
    size_t count = 1;
    for (auto d : out.block_shape) count *= static_cast<size_t>(d);
    out.scale.assign(count, 1.0f);  // sized for the layout, then filled
    const ParamLayout layout(shape, out, "weight");
    std::vector<TensorRange> ranges(count, TensorRange{std::numeric_limits<float>::infinity(),
                                                       -std::numeric_limits<float>::infinity()});
    const auto values = data.data<float>();
    for (size_t i = 0; i < values.size(); ++i) {
        auto& r = ranges[layout.index(i)];
        r.min = std::min(r.min, values[i]);
        r.max = std::max(r.max, values[i]);
    }
    out.zero_point.resize(count);
    for (size_t b = 0; b < count; ++b) {
        const auto p = compute_quant_params(ranges[b].min <= ranges[b].max ? ranges[b] : TensorRange{}, spec);
        out.scale[b] = p.scale[0];
        out.zero_point[b] = p.zero_point[0];
    }
    return out;
}

Tensor scale_tensor(const QuantParams& params) {
    return Tensor::from_values<float>(params_shape(params), params.scale);
}

Tensor zero_point_tensor(const QuantParams& params) {
    Tensor zp(storage_type(params.type), params_shape(params));
    if (!is_integer(params.type)) return zp;  // zero bits are +0.0 in float16 and bfloat16
    with_storage_type(params.type, [&](auto q) { fill_zero_points<decltype(q)>(zp, params); });
    return zp;
}

Tensor quantize_tensor(const Tensor& values, const QuantParams& p, std::string_view tensor) {
    if (is_block_float(p.type)) return block_float_fake_quantize(values, p.type, p.shared_exponent, tensor);
    const auto& shape = values.shape();
    const ParamLayout layout(shape, p, tensor);
    Tensor q = Tensor::uninitialized(storage_type(p.type), shape);
    if (is_float8(p.type)) {  // as QuantizeLinear computes it: x / scale as a float8 (the zero point is 0)
        const auto in = values.data<float>();
        auto* out = reinterpret_cast<uint8_t*>(q.mutable_bytes().data());
        for (size_t i = 0; i < in.size(); ++i) out[i] = float_to_float8(in[i] / p.scale[layout.index(i)], q.type());
        return q;
    }
    if (!is_integer(p.type)) {
        const auto in = values.data<float>();
        auto* out = reinterpret_cast<uint16_t*>(q.mutable_bytes().data());  // float16/bfloat16 bits
        for (size_t i = 0; i < in.size(); ++i) {
            const size_t c = layout.index(i);
            out[i] = quantize_float_value(in[i] / p.scale[c], static_cast<float>(p.zero_point[c]), p.type);
        }
        return q;
    }
    const auto [qmin, qmax] = integer_range(p.type);
    with_storage_type(p.type, [&, qmin = qmin, qmax = qmax](auto v) {
        quantize_into(values.data<float>(), q.mutable_data<decltype(v)>(), p, layout, qmin, qmax);
    });
    return q;
}

namespace {

bool one_scale_up_to_16_bits(const Tensor& values, const QuantParams& p) {
    return values.type() == DataType::Float && is_integer(p.type) && quant_bits(p.type) <= 16 && p.scale.size() == 1 &&
           p.block_size == 0 && p.float_zero_point.empty();
}

// One scale of at most 16 bits: both steps in one pass, giving what they give
// bit for bit. Adding and taking away 1.5 * 2^23 rounds to the nearest
// integer, ties to even, below 2^22 in magnitude; larger values saturate
// either way. A NaN ends at lo (max(NaN, lo) is lo). Written out for AVX-512
// and AVX2, where the division (as QuantizeLinear divides) runs 16 or 8 lanes
// at a time; the baseline build's loop runs 4 (the recognizer's cpu_accurate
// run spent 7 % of its samples there, in the precision search's simulated
// runs). `to` may be `from`.
using detail::OneScale;
constexpr float kRoundingShift = 12582912.0f;  // 1.5 * 2^23

void one_scale_portable(const float* from, float* to, int64_t n, OneScale s) {
    for (int64_t i = 0; i < n; ++i) {
        const float steps = (from[i] / s.scale + kRoundingShift) - kRoundingShift;
        const float above = steps > s.lo ? steps : s.lo;  // maxps: NaN gives lo
        to[i] = (s.hi < above ? s.hi : above) * s.scale;
    }
}

[[gnu::target("avx2")]] void one_scale_avx2(const float* from, float* to, int64_t n, OneScale s) {
    const __m256 scale = _mm256_set1_ps(s.scale), lo = _mm256_set1_ps(s.lo), hi = _mm256_set1_ps(s.hi),
                 shift = _mm256_set1_ps(kRoundingShift);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 steps =
            _mm256_sub_ps(_mm256_add_ps(_mm256_div_ps(_mm256_loadu_ps(from + i), scale), shift), shift);
        // max and min return their second operand on NaN, as the portable loop's comparisons do.
        _mm256_storeu_ps(to + i, _mm256_mul_ps(_mm256_min_ps(hi, _mm256_max_ps(steps, lo)), scale));
    }
    one_scale_portable(from + i, to + i, n - i, s);
}

[[gnu::target("avx512f")]] void one_scale_avx512(const float* from, float* to, int64_t n, OneScale s) {
    const __m512 scale = _mm512_set1_ps(s.scale), lo = _mm512_set1_ps(s.lo), hi = _mm512_set1_ps(s.hi),
                 shift = _mm512_set1_ps(kRoundingShift);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 steps =
            _mm512_sub_ps(_mm512_add_ps(_mm512_div_ps(_mm512_loadu_ps(from + i), scale), shift), shift);
        _mm512_storeu_ps(to + i, _mm512_mul_ps(_mm512_min_ps(hi, _mm512_max_ps(steps, lo)), scale));
    }
    one_scale_portable(from + i, to + i, n - i, s);
}

void fake_quantize_one_scale(const float* from, float* to, int64_t n, const QuantParams& p) {
    static const auto kernel = detail::one_scale_kernels().back().second;
    const auto [qmin, qmax] = integer_range(p.type);
    const OneScale s{p.scale[0], static_cast<float>(qmin - p.zero_point[0]),
                     static_cast<float>(qmax - p.zero_point[0])};
    // Pieces of whole cache lines, one a thread.
    constexpr int64_t kParallelFrom = int64_t{1} << 16, kPiece = int64_t{1} << 14;
    if (n < kParallelFrom) return kernel(from, to, n, s);
    const int64_t pieces = (n + kPiece - 1) / kPiece;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < pieces; ++k)
        kernel(from + k * kPiece, to + k * kPiece, std::min(kPiece, n - k * kPiece), s);
}

}  // namespace

std::vector<std::pair<const char*, detail::OneScaleKernel>> detail::one_scale_kernels() {
    std::vector<std::pair<const char*, OneScaleKernel>> out{{"portable", one_scale_portable}};
    if (__builtin_cpu_supports("avx2")) out.emplace_back("avx2", one_scale_avx2);
    if (__builtin_cpu_supports("avx512f")) out.emplace_back("avx512", one_scale_avx512);
    return out;
}

Tensor fake_quantize(Tensor&& values, const QuantParams& p, std::string_view tensor) {
    if (!one_scale_up_to_16_bits(values, p)) return fake_quantize(std::as_const(values), p, tensor);
    const auto data = values.mutable_data<float>();
    fake_quantize_one_scale(data.data(), data.data(), static_cast<int64_t>(data.size()), p);
    return std::move(values);
}

Tensor fake_quantize(const Tensor& values, const QuantParams& p, std::string_view tensor) {
    if (is_block_float(p.type)) return block_float_fake_quantize(values, p.type, p.shared_exponent, tensor);
    const auto& shape = values.shape();
    const ParamLayout layout(shape, p, tensor);
    Tensor out = Tensor::uninitialized(DataType::Float, shape);
    auto dst = out.mutable_data<float>();
    if (one_scale_up_to_16_bits(values, p)) {
        const auto in = values.data<float>();
        fake_quantize_one_scale(in.data(), dst.data(), static_cast<int64_t>(in.size()), p);
        return out;
    }
    const Tensor q = quantize_tensor(values, p, tensor);
    if (is_float8(p.type)) {  // as DequantizeLinear computes it: the float8's value times the scale
        const auto* bits = reinterpret_cast<const uint8_t*>(q.bytes().data());
        for (size_t i = 0; i < dst.size(); ++i) dst[i] = float8_to_float(bits[i], q.type()) * p.scale[layout.index(i)];
        return out;
    }
    if (!is_integer(p.type)) {
        const auto* bits = reinterpret_cast<const uint16_t*>(q.bytes().data());
        for (size_t i = 0; i < dst.size(); ++i) {
            const size_t c = layout.index(i);
            dst[i] = (float_quant_value(bits[i], p.type) - static_cast<float>(p.zero_point[c])) * p.scale[c];
        }
        return out;
    }
    with_storage_type(p.type, [&](auto v) {
        const auto in = q.data<decltype(v)>();
        if (!p.float_zero_point.empty()) {
            for (size_t i = 0; i < dst.size(); ++i) {
                const size_t c = layout.index(i);
                dst[i] = (static_cast<float>(in[i]) - p.float_zero_point[c]) * p.scale[c];
            }
            return;
        }
        for (size_t i = 0; i < dst.size(); ++i) {
            const size_t c = layout.index(i);
            // As DequantizeLinear computes it: the integer difference, then one float multiply.
            dst[i] = static_cast<float>(static_cast<int64_t>(in[i]) - p.zero_point[c]) * p.scale[c];
        }
    });
    return out;
}

const TensorQuant* QuantPlan::find(std::string_view tensor) const {
    for (const auto& t : tensors)
        if (t.tensor == tensor) return &t;
    return nullptr;
}

}  // namespace vaiq
