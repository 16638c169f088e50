// vaiq/quant.hpp - quantization types, specs, ranges and the plan formats write.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "vaiq/export.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {

/// The documented quant types (QuantType / VitisQuantType), and the 4-bit
/// weight types of weight-only quantization (held one value per byte in
/// memory, packed two per byte by the formats that write them).
enum class QuantType {
    QInt8,
    QUInt8,
    QInt16,
    QUInt16,
    QInt32,
    QUInt32,
    QFloat16,
    QBFloat16,
    QInt4,
    QUInt4,
    QFloat8E4M3FN,
    QFloat8E5M2,
    /// Block floating point and OCP microscaling (vaiq/block_float.hpp): values
    /// stay float, each block of them rounded onto a grid set by its largest
    /// exponent at run time; nothing is calibrated.
    QBFP16,
    QMXInt8,
    QMXFP8E4M3,
    QMXFP8E5M2,
    QMXFP6E3M2,
    QMXFP6E2M3,
    QMXFP4E2M1
};

/// Parses a documented name, with or without its prefix ("QuantType.QInt8",
/// "vai_q_onnx.VitisQuantType.QInt16"); nullopt when it is not one.
VAIQ_API std::optional<QuantType> parse_quant_type(std::string_view name);
VAIQ_API std::string quant_type_name(QuantType type);
/// The storage type of quantized values (int4/uint4: one value per byte in memory).
VAIQ_API DataType storage_type(QuantType type);
/// Bits of a quantized value (4 for QInt4/QUInt4).
VAIQ_API int quant_bits(QuantType type);
VAIQ_API bool is_integer(QuantType type);
/// QFloat8E4M3FN or QFloat8E5M2: a scale per tensor or channel and a float8
/// grid (QuantizeLinear/DequantizeLinear from opset 19, zero point 0).
VAIQ_API bool is_float8(QuantType type);
/// QBFP16 or one of the QMX types: blocks sharing an exponent (vaiq/block_float.hpp).
VAIQ_API bool is_block_float(QuantType type);
/// QInt8 or QUInt8: what integer kernels and the NPUs take for activations.
inline bool is_eight_bit(QuantType type) { return type == QuantType::QInt8 || type == QuantType::QUInt8; }
/// Integer range of a quant type: [qmin, qmax]. With `reduce_range` one bit fewer,
/// with `symmetric` on signed types the range is [-qmax, qmax] (e.g. [-127, 127]).
VAIQ_API std::pair<int64_t, int64_t> integer_range(QuantType type, bool symmetric = false, bool reduce_range = false);

/// What a tensor is to the node that reads it.
enum class TensorRole { Activation, Weight, Bias };
VAIQ_API std::string role_name(TensorRole role);

/// The blocks of a block floating point or MX type (is_block_float): `size`
/// consecutive values along `axis` (the only axis of a vector) share an exponent;
/// `rounding_mode` is Quark's: 0 half away from zero, 1 half upward, 2 half to even.
struct SharedExponentBlocks {
    int axis = 1;
    int64_t size = 0;
    int rounding_mode = 2;
    bool operator==(const SharedExponentBlocks&) const = default;
};

/// How one tensor is to be quantized.
struct QuantSpec {
    QuantType type = QuantType::QInt8;
    bool symmetric = false;
    bool reduce_range = false;
    bool per_channel = false;
    int axis = 0;               ///< channel axis when per_channel, blocked axis when block_size > 0
    int64_t block_size = 0;     ///< > 0: a scale per block of this many values along axis (weights)
    bool power_of_two = false;  ///< scales restricted to 2^-k (NPU)
    bool int16_scale = false;   ///< float scales rounded to M * 2^-N, M a positive int16 (Int16Scale)
    /// Quantized at run time by DynamicQuantizeLinear (`static: false`): the
    /// plan carries the type only, no scale or zero point.
    bool dynamic = false;
    SharedExponentBlocks shared_exponent{};  ///< block float types only
    bool operator==(const QuantSpec&) const = default;
};

/// The observed float range of a tensor.
struct TensorRange {
    float min = 0.0f;
    float max = 0.0f;
};

/// Scale and zero point per tensor (one entry) or per channel (one per channel).
/// Block-wise (block_size > 0): as ONNX's DequantizeLinear from opset 21, one
/// scale per `block_size` consecutive values along `axis` and per position of
/// every other axis; scale and zero_point are then laid out as a tensor of
/// `block_shape` (the value's shape with ceil(dim / block_size) along axis).
struct QuantParams {
    QuantParams() = default;
    QuantParams(QuantType t, std::vector<float> s, std::vector<int64_t> zp, int a = -1)
        : type(t), scale(std::move(s)), zero_point(std::move(zp)), axis(a) {}

    QuantType type = QuantType::QInt8;
    std::vector<float> scale;
    std::vector<int64_t> zero_point;
    int axis = -1;  ///< -1: per tensor; the channel axis, or the blocked axis when block_size > 0
    int64_t block_size = 0;
    std::vector<int64_t> block_shape;  ///< the scale tensor's shape when block_size > 0
    /// Block float types (scale 1, zero point 0, per tensor): their shared-exponent blocks.
    SharedExponentBlocks shared_exponent{};
    /// Non-empty: a float zero point per scale (HQQ's), used in place of
    /// zero_point (which holds them rounded): q = round(x / scale + z), then
    /// (q - z) * scale. Only MatMulNBits stores them; other formats refuse them.
    std::vector<float> float_zero_point;
};

/// Scale and zero point for [rmin, rmax] as ONNX Runtime computes them: the range
/// is widened to include 0, symmetric ranges are centred on 0, zero point rounded
/// half to even. A degenerate range gets scale 1. With spec.power_of_two the
/// scale is rounded to the nearest power of two (scale_to_position); with
/// spec.int16_scale to the nearest M * 2^-N (nearest_int16_scale). Float types
/// (QFloat16, QBFloat16) get scale 1 and zero point 0: they round, not scale;
/// float8 types map the range's largest magnitude onto their largest finite
/// value (448 for E4M3FN, 57344 for E5M2), zero point 0.
VAIQ_API QuantParams compute_quant_params(TensorRange range, const QuantSpec& spec);

/// The value M * 2^-N nearest to `scale`, M in [1, 32767] (a positive int16) and
/// N in [0, 65535] (a uint16 shift): 15 significant bits, so the relative change
/// is at most 2^-16. Scales of 32768 and more saturate to M = 32767, N = 0.
VAIQ_API double nearest_int16_scale(double scale);

/// The position p of the power-of-two scale 2^-p nearest to `scale`, as the
/// anchors round it (rint of -log2, so it can be up to sqrt(2) too small),
/// clamped to [-127, 127].
VAIQ_API int scale_to_position(double scale);

/// Parameters with the scale 2^-position for `range` under `spec`: the zero
/// point follows the range as for float scales (symmetric: the middle of the
/// integer range, and 128 for symmetric uint8, as the NPU requires).
VAIQ_API QuantParams power_of_two_params(TensorRange range, int position, const QuantSpec& spec);

/// The squared error of quantizing `value` with a per-tensor scale and zero
/// point and dequantizing it again, the integer saturated to [qmin, qmax].
inline double round_trip_error(double value, double scale, double zero_point, int64_t qmin, int64_t qmax) {
    const double q =
        std::clamp(std::nearbyint(value / scale) + zero_point, static_cast<double>(qmin), static_cast<double>(qmax));
    const double d = value - (q - zero_point) * scale;
    return d * d;
}

/// The extremes of a float constant per channel along `axis`, or of the whole
/// tensor (one entry) when `axis` is negative. An empty tensor gives [0, 0].
VAIQ_API std::vector<TensorRange> channel_ranges(const Tensor& data, int axis);

/// A constant's power-of-two position as vai_q_onnx searches it: from the
/// position at which nothing of `range` overflows (counted from the zero
/// point), up to four smaller scales, the one of least squared error over the
/// values of `channel` along `axis` (all values when `axis` is negative).
VAIQ_API int best_power_of_two_position(const Tensor& data, int axis, size_t channel, TensorRange range,
                                        const QuantSpec& spec);

/// Parameters of a float constant (a weight, or a bias quantized on its own)
/// under `spec`: in blocks of spec.block_size along spec.axis when block_size
/// > 0, else per channel along spec.axis when spec.per_channel (the axis
/// already within the tensor's rank), else per tensor; each block or channel
/// from its extremes (round to nearest: RTN), or with spec.power_of_two from
/// best_power_of_two_position.
VAIQ_API QuantParams constant_params(const Tensor& data, const QuantSpec& spec);

/// The position p of parameters whose scale is exactly 2^-p; nullopt for
/// per-channel parameters or a scale that is not a power of two.
VAIQ_API std::optional<int> exact_position(const QuantParams& params);

/// One quantized value: `scaled` (already divided by the scale, in float32 as
/// ONNX Runtime computes it) rounded half to even, plus the zero point,
/// saturated to Q's range. Formats and the executor's kernels all quantize
/// through this, so what is written and what is simulated agree bit for bit.
template <typename Q>
Q quantize_value(float scaled, double zero_point) {
    const double q = static_cast<double>(std::nearbyint(scaled)) + zero_point;
    // Branch-free selects rather than std::clamp in hot loops; NaN (a NaN input,
    // or 0 / 0) fails the first comparison and becomes Q's minimum, as in ONNX
    // Runtime, instead of an undefined conversion.
    constexpr double lo = static_cast<double>(std::numeric_limits<Q>::min());
    constexpr double hi = static_cast<double>(std::numeric_limits<Q>::max());
    return static_cast<Q>(q >= lo ? std::min(q, hi) : lo);
}

/// One value quantized to a float quant type (QFloat16 or QBFloat16): `scaled`
/// plus the zero point, rounded to nearest even and saturated to the type's
/// largest finite value (NaN stays NaN). Returns the 16 stored bits.
VAIQ_API uint16_t quantize_float_value(float scaled, float zero_point, QuantType type);
/// The float a stored QFloat16/QBFloat16 value stands for.
VAIQ_API float float_quant_value(uint16_t bits, QuantType type);

/// One tensor of the plan.
struct TensorQuant {
    std::string tensor;
    TensorRole role = TensorRole::Activation;
    QuantSpec spec;
    QuantParams params;
};

/// Checks that parameters can be written: as many zero points as scales, scales
/// positive and finite, zero points inside the type's range, per-channel only on
/// opset >= 13, block-wise (and 4-bit, always block-wise) only when the format
/// writes `blocks` and on opset >= 21, no float zero points (MatMulNBits writes
/// those and does not call this). Throws InputError naming the tensor, also
/// for a dynamic tensor (formats that write DynamicQuantizeLinear check those
/// themselves).
VAIQ_API void check_quant_params(const TensorQuant& t, int64_t opset, bool blocks = false);

/// The scale as a float tensor and the zero point in the storage type: scalars
/// per tensor, vectors per channel, as QuantizeLinear/DequantizeLinear take them.
VAIQ_API Tensor scale_tensor(const QuantParams& params);
VAIQ_API Tensor zero_point_tensor(const QuantParams& params);

/// Which scale and zero point each element of a tensor of `shape` takes under
/// `params`: per tensor, per channel or block-wise, in row-major element order.
class VAIQ_API ParamLayout {
  public:
    /// Throws InputError naming `tensor` when the parameters do not fit the shape.
    ParamLayout(const std::vector<int64_t>& shape, const QuantParams& params, std::string_view tensor);
    /// The same from the layout alone: `count` parameters along `axis` (-1: one), in blocks when block_size > 0.
    ParamLayout(const std::vector<int64_t>& shape, int axis, int64_t block_size, size_t count, std::string_view tensor);
    size_t index(size_t element) const;
    /// `shape` with ceil(dim / block_size) along `axis`: the scale tensor's shape.
    static std::vector<int64_t> block_shape(std::vector<int64_t> shape, int axis, int64_t block_size);

  private:
    size_t count_;
    int64_t dim_ = 1, inner_ = 1, block_ = 0, blocks_ = 1;
};

/// constant_params for spec.block_size > 0: a scale (and zero point) per block.
VAIQ_API QuantParams blocked_constant_params(const Tensor& data, const QuantSpec& spec);

/// Quantizes float values with `params` (per tensor, or along params.axis),
/// through quantize_value. Throws InputError naming `tensor` when per-channel
/// scales do not match the shape.
VAIQ_API Tensor quantize_tensor(const Tensor& values, const QuantParams& params, std::string_view tensor);
/// Float values as they come back from quantize_tensor and a DequantizeLinear
/// with the same parameters: what a model computes on after a Q/DQ pair.
VAIQ_API Tensor fake_quantize(const Tensor& values, const QuantParams& params, std::string_view tensor);
/// The same, in `values`' own buffer where it can (one scale of up to 16 bits:
/// an activation's), which a simulated run does for every tensor it computes.
VAIQ_API Tensor fake_quantize(Tensor&& values, const QuantParams& params, std::string_view tensor);

/// Everything a format needs to write a quantized model.
struct QuantPlan {
    std::vector<TensorQuant> tensors;
    const TensorQuant* find(std::string_view tensor) const;
};

/// Running sums of a quantization error: the SQNR of q against f,
/// 10 log10(sum f^2 / sum (f - q)^2), accumulated in double.
struct ErrorSums {
    double signal = 0, noise = 0;
    void add(std::span<const float> f, std::span<const float> q) {
        for (size_t i = 0; i < f.size(); ++i) {
            const double d = static_cast<double>(f[i]) - q[i];
            signal += static_cast<double>(f[i]) * f[i];
            noise += d * d;
        }
    }
    /// nullopt without a signal (all zeros); +infinity when exact.
    std::optional<double> sqnr_db() const {
        if (!(signal > 0)) return std::nullopt;
        return noise == 0 ? std::numeric_limits<double>::infinity() : 10.0 * std::log10(signal / noise);
    }
};

}  // namespace vaiq
