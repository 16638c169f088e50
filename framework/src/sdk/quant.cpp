#include "vaiq/quant.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "vaiq/error.hpp"

namespace vaiq {

namespace {
constexpr std::array<std::pair<QuantType, std::string_view>, 8> kQuantTypeNames{{
    {QuantType::QInt8, "QInt8"},
    {QuantType::QUInt8, "QUInt8"},
    {QuantType::QInt16, "QInt16"},
    {QuantType::QUInt16, "QUInt16"},
    {QuantType::QInt32, "QInt32"},
    {QuantType::QUInt32, "QUInt32"},
    {QuantType::QFloat16, "QFloat16"},
    {QuantType::QBFloat16, "QBFloat16"},
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
    return std::nullopt;
}

std::string quant_type_name(QuantType type) {
    for (const auto& [t, name] : kQuantTypeNames)
        if (t == type) return std::string(name);
    return "unknown";
}

DataType storage_type(QuantType type) {
    switch (type) {
        case QuantType::QInt8: return DataType::Int8;
        case QuantType::QUInt8: return DataType::UInt8;
        case QuantType::QInt16: return DataType::Int16;
        case QuantType::QUInt16: return DataType::UInt16;
        case QuantType::QInt32: return DataType::Int32;
        case QuantType::QUInt32: return DataType::UInt32;
        case QuantType::QFloat16: return DataType::Float16;
        case QuantType::QBFloat16: return DataType::BFloat16;
    }
    return DataType::Undefined;
}

bool is_integer(QuantType type) {
    return type != QuantType::QFloat16 && type != QuantType::QBFloat16;
}

std::pair<int64_t, int64_t> integer_range(QuantType type, bool symmetric, bool reduce_range) {
    if (!is_integer(type)) throw InternalError(fmt::format("{} has no integer range", quant_type_name(type)));
    const bool is_signed = type == QuantType::QInt8 || type == QuantType::QInt16 || type == QuantType::QInt32;
    const int bits = static_cast<int>(element_size(storage_type(type)) * 8);
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

QuantParams compute_quant_params(TensorRange range, const QuantSpec& spec) {
    if (!std::isfinite(range.min) || !std::isfinite(range.max) || range.min > range.max)
        throw InputError(fmt::format("cannot quantize the range [{}, {}]", range.min, range.max));
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
    if (scale < std::numeric_limits<float>::min()) {
        scale = 1.0;
    } else if (spec.symmetric) {
        zero_point = static_cast<int64_t>(std::nearbyint((qmin + qmax) / 2.0));
    } else {
        zero_point = static_cast<int64_t>(std::nearbyint(qmin - rmin / scale));
    }
    params.scale = {static_cast<float>(scale)};
    params.zero_point = {std::clamp(zero_point, qmin, qmax)};
    return params;
}

const TensorQuant* QuantPlan::find(std::string_view tensor) const {
    for (const auto& t : tensors)
        if (t.tensor == tensor) return &t;
    return nullptr;
}

}  // namespace vaiq
