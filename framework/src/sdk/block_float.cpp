#include "vaiq/block_float.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "vaiq/error.hpp"
#include "vaiq/vaiq_ops.hpp"

namespace vaiq {

namespace {

// A float format's element: E exponent and M mantissa bits, largest exponent
// emax, largest finite value (OCP MX v1.0; E4M3 has no infinity, so 448).
BlockFloatFormat float_element(int e, int m, int emax, float max_norm, DataType float8 = DataType::Undefined) {
    BlockFloatFormat f;
    f.float_elements = true;
    f.exponent_bits = e;
    f.mantissa_bits = m;
    f.emax = emax;
    f.max_norm = max_norm;
    f.float8 = float8;
    return f;
}

constexpr std::array<std::pair<QuantType, std::string_view>, 6> kMxElements{{
    {QuantType::QMXInt8, "int8"},
    {QuantType::QMXFP8E4M3, "fp8_e4m3"},
    {QuantType::QMXFP8E5M2, "fp8_e5m2"},
    {QuantType::QMXFP6E3M2, "fp6_e3m2"},
    {QuantType::QMXFP6E2M3, "fp6_e2m3"},
    {QuantType::QMXFP4E2M1, "fp4_e2m1"},
}};

// y rounded to an integer, ties as Quark's rounding_mode says (0 away from zero,
// 1 upward, 2 to even). y - floor(y) is exact, so the tie test is too.
float round_half(float y, int mode) {
    if (mode == kHalfToEvenRoundingMode) return std::nearbyint(y);
    const float a = mode == 0 ? std::abs(y) : y, t = std::floor(a);
    const float q = a - t < 0.5f ? t : t + 1.0f;
    // A zero comes out +0 (adding +0 makes -0 so), as ONNX Runtime computes the
    // simulation's Where; Quark's kernels keep some -0: the same value.
    return (mode == 0 && y < 0.0f ? -q : q) + 0.0f;
}

// A float element rounded to its grid, saturated (see the header).
float round_to_element(float e, const BlockFloatFormat& f, float min_normal, int mode) {
    if (f.float8 != DataType::Undefined && mode == kHalfToEvenRoundingMode)
        return float8_to_float(float_to_float8(e, f.float8, true), f.float8);
    const float step = std::ldexp(std::max(floor_power_of_two(e), min_normal), -f.mantissa_bits);
    const float q = round_half(e / step, mode) * step;
    return std::clamp(q, -f.max_norm, f.max_norm);
}

}  // namespace

BlockFloatFormat block_float_format(QuantType type) {
    switch (type) {
        case QuantType::QBFP16: return BlockFloatFormat{};
        case QuantType::QMXInt8: {
            BlockFloatFormat f;
            f.qmin = -128;
            return f;
        }
        case QuantType::QMXFP8E4M3: return float_element(4, 3, 8, 448.0f, DataType::Float8E4M3FN);
        case QuantType::QMXFP8E5M2: return float_element(5, 2, 15, 57344.0f, DataType::Float8E5M2);
        case QuantType::QMXFP6E3M2: return float_element(3, 2, 4, 28.0f);
        case QuantType::QMXFP6E2M3: return float_element(2, 3, 2, 7.5f);
        case QuantType::QMXFP4E2M1: return float_element(2, 1, 2, 6.0f);
        default: break;
    }
    throw InternalError(fmt::format("{} is not a block float type", quant_type_name(type)));
}

std::optional<QuantType> mx_type_of_element(std::string_view element_dtype) {
    for (const auto& [type, name] : kMxElements)
        if (name == element_dtype) return type;
    return std::nullopt;
}

std::string_view mx_element_name(QuantType type) {
    for (const auto& [t, name] : kMxElements)
        if (t == type) return name;
    return {};
}

int shared_exponent_axis(int axis, size_t rank, std::string_view tensor) {
    if (rank <= 1) return 0;
    const int r = static_cast<int>(rank);
    if (axis < -r || axis >= r)
        throw InputError(
            fmt::format("the shared-exponent blocks of '{}' run along axis {}, which a tensor of rank {} "
                        "does not have (set the block axis: BFPAttributes.axis or MXAttributes.axis)",
                        tensor, axis, rank));
    return axis < 0 ? axis + r : axis;
}

float floor_power_of_two(float a) {
    a = std::abs(a);
    if (a == 0.0f || !std::isfinite(a)) return a;
    int exponent = 0;
    std::frexp(a, &exponent);  // a = m * 2^exponent, m in [0.5, 1)
    return std::ldexp(1.0f, exponent - 1);
}

Tensor block_float_fake_quantize(const Tensor& values, QuantType type, const SharedExponentBlocks& blocks,
                                 std::string_view tensor) {
    const auto f = block_float_format(type);
    if (blocks.size < 1)
        throw InputError(fmt::format("the shared-exponent blocks of '{}' have size {}", tensor, blocks.size));
    if (blocks.rounding_mode < 0 || blocks.rounding_mode > 2)
        throw InputError(fmt::format("the rounding_mode of '{}' is {}, not 0, 1 or 2", tensor, blocks.rounding_mode));
    if (values.type() != DataType::Float)
        throw InputError(
            fmt::format("'{}' is {}: block float types quantize float values", tensor, data_type_name(values.type())));
    const auto& shape = values.shape();
    Tensor out = values;  // a copy
    if (values.size() <= 1) return out;
    const int axis = shared_exponent_axis(blocks.axis, shape.size(), tensor);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= shape[d];
    for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
    const int64_t channels = shape.empty() ? 1 : shape[axis];
    const int64_t per_row = channels / blocks.size + (channels % blocks.size != 0);  // no overflow for any size
    const auto in = values.data<float>();
    auto dst = out.mutable_data<float>();
    const float kSmallest = std::ldexp(1.0f, -127);  // a block of zeros or subnormals
    const float fixed_up = std::ldexp(1.0f, f.fraction_bits), fixed_down = std::ldexp(1.0f, -f.fraction_bits);
    const float element_scale = std::ldexp(1.0f, -f.emax);
    // A float element's smallest normal power, 2^(1 - bias), bias = 2^(E-1) - 1.
    const float min_normal = f.float_elements ? std::ldexp(1.0f, 2 - (1 << (f.exponent_bits - 1))) : 0.0f;
    const auto lo = static_cast<float>(f.qmin), hi = static_cast<float>(f.qmax);
    const int64_t jobs = outer * per_row;
#pragma omp parallel for schedule(static) if (values.size() >= (int64_t{1} << 16))
    for (int64_t job = 0; job < jobs; ++job) {
        const int64_t o = job / per_row, b = job % per_row;
        const int64_t c0 = b * blocks.size, c1 = std::min(c0 + blocks.size, channels);
        const float* from = in.data() + o * channels * inner;
        float* to = dst.data() + o * channels * inner;
        thread_local std::vector<float> power;  // each position's power of two, kept between blocks
        power.assign(static_cast<size_t>(inner), 0.0f);
        for (int64_t c = c0; c < c1; ++c)
            for (int64_t i = 0; i < inner; ++i) power[i] = std::max(power[i], std::abs(from[c * inner + i]));
        for (auto& p : power) {
            p = std::max(floor_power_of_two(p), kSmallest);
            if (f.float_elements) p *= element_scale;
        }
        for (int64_t c = c0; c < c1; ++c)
            for (int64_t i = 0; i < inner; ++i) {
                const float x = from[c * inner + i], p = power[i];
                if (f.float_elements) {
                    to[c * inner + i] = round_to_element(x / p, f, min_normal, blocks.rounding_mode) * p;
                } else {
                    const float q = std::clamp(round_half(x / p * fixed_up, blocks.rounding_mode), lo, hi);
                    to[c * inner + i] = q * fixed_down * p;
                }
            }
    }
    return out;
}

}  // namespace vaiq

namespace vaiq {

void add_block_float_op(Model& model, UniqueNames& names, const TensorQuant& t, const std::string& input,
                        const std::string& output) {
    const auto type = t.params.type;
    const bool bfp = type == QuantType::QBFP16;
    import_opset(model.proto(), std::string(kVaiqDomain), kVaiqDomainVersion);
    auto& n = make_node(model.graph(), names, std::string(bfp ? kBFPOp : kMXOp), {input}, {output}, output + "_node",
                        std::string(kVaiqDomain));
    if (bfp) {
        set_attribute(n, "bfp_method", std::string("to_bfp"));
        set_attribute(n, "bit_width", int64_t{16});
    } else {
        set_attribute(n, "element_dtype", std::string(mx_element_name(type)));
    }
    set_attribute(n, "axis", static_cast<int64_t>(t.params.shared_exponent.axis));
    set_attribute(n, "block_size", t.params.shared_exponent.size);
    set_attribute(n, "rounding_mode", static_cast<int64_t>(t.params.shared_exponent.rounding_mode));
}

int64_t block_float_simulation_opset(QuantType) { return 11; }

namespace {

// Writes the nodes of one simulation: each step names its output after the tensor.
class SimulationWriter {
  public:
    SimulationWriter(Model& model, UniqueNames& names, std::string base)
        : model_(model), names_(names), base_(std::move(base)) {}

    // One initializer a value, however often the simulation reads it.
    std::string scalar(float value) {
        auto& name = scalars_[std::bit_cast<uint32_t>(value)];
        if (name.empty()) {
            const float v[] = {value};
            name = add_initializer(model_.graph(), names_, base_ + "_bf_constant", Tensor::from_values<float>({}, v));
        }
        return name;
    }
    std::string ints(const std::vector<int64_t>& values) {
        return add_initializer(model_.graph(), names_, base_ + "_bf_shape",
                               Tensor::from_values<int64_t>({static_cast<int64_t>(values.size())}, values));
    }
    std::string node(const std::string& op, std::vector<std::string> inputs, const std::string& output = {}) {
        const auto out = output.empty() ? names_.fresh(base_ + "_bf_" + op) : output;
        last_ = &make_node(model_.graph(), names_, op, std::move(inputs), {out}, out + "_node", "");
        return out;
    }
    onnx::NodeProto& last() { return *last_; }
    // v rounded to an integer, ties as Quark's rounding_mode says; as round_half computes it.
    std::string rounded(const std::string& v, int mode) {
        if (mode == kHalfToEvenRoundingMode) return node("Round", {v});
        const auto a = mode == 0 ? node("Abs", {v}) : v;
        const auto t = node("Floor", {a});
        const auto q =
            node("Where", {node("Less", {node("Sub", {a, t}), scalar(0.5f)}), t, node("Add", {t, scalar(1.0f)})});
        const auto sign = mode == 0 ? node("Where", {node("Less", {v, scalar(0.0f)}), node("Neg", {q}), q}) : q;
        return node("Add", {sign, scalar(0.0f)});
    }
    // int64 zeros, as many as the 1-D `count` says at run time.
    std::string zeros(const std::string& count) {
        const auto out = node("ConstantOfShape", {count});
        auto* value = last_->add_attribute();
        value->set_name("value");
        value->set_type(onnx::AttributeProto::TENSOR);
        *value->mutable_t() = Tensor(DataType::Int64, {1}).to_proto("zero");
        return out;
    }

    // The largest power of two not above a (a >= 0): 2^floor(log2 a) from Log
    // and Pow, then halved where above a and doubled where its double is not,
    // so that Log's last bit does not matter (floor is off by at most one).
    std::string floor_power_of_two(const std::string& a) {
        const auto log2 = node("Mul", {node("Log", {a}), scalar(static_cast<float>(1.0 / std::log(2.0)))});
        auto p = node("Pow", {scalar(2.0f), node("Floor", {log2})});
        p = node("Where", {node("Greater", {p, a}), node("Mul", {p, scalar(0.5f)}), p});
        const auto twice = node("Mul", {p, scalar(2.0f)});
        return node("Where", {node("Greater", {twice, a}), p, twice});
    }

  private:
    Model& model_;
    UniqueNames& names_;
    std::string base_;
    onnx::NodeProto* last_ = nullptr;
    std::map<uint32_t, std::string> scalars_;  ///< by the float's bits
};

}  // namespace

void add_block_float_simulation(Model& model, UniqueNames& names, const TensorQuant& t,
                                const std::optional<std::vector<int64_t>>& declared, const std::string& input,
                                const std::string& output) {
    const auto type = t.params.type;
    const auto f = block_float_format(type);
    const auto& blocks = t.params.shared_exponent;
    if (model.opset() < block_float_simulation_opset(type))
        throw InternalError(fmt::format("the simulation of {} needs opset {}", quant_type_name(type),
                                        block_float_simulation_opset(type)));
    if (blocks.size < 1) throw InputError(fmt::format("tensor '{}' has blocks of {} values", t.tensor, blocks.size));
    const bool rank_known = declared.has_value();
    const auto shape = declared.value_or(std::vector<int64_t>{});
    int64_t count = rank_known ? 1 : -1;
    for (auto d : shape) count = d < 0 || count < 0 ? -1 : count * d;
    if (count == 0 || count == 1) {  // no value, or a single one left as it is (as the op leaves it)
        make_node(model.graph(), names, "Identity", {input}, {output}, output + "_node", "");
        return;
    }
    SimulationWriter w(model, names, t.tensor);
    // The blocks as an axis of their own: [dims before, blocks, block size, dims after], from the
    // shape as written when it gives the axis' size, else from the tensor's shape at run time.
    const int axis = rank_known ? shared_exponent_axis(blocks.axis, shape.size(), t.tensor) : blocks.axis;
    const int64_t channels = rank_known ? shape[axis] : -1;
    const auto rank = static_cast<int64_t>(shape.size());
    std::string x = input, size_along;  // size_along: the size at run time, a 1-D int64
    int64_t padding = 0;
    int block_axis = axis + 1;  // of the blocked tensor
    std::string blocked;
    if (channels >= 0) {
        padding = (blocks.size - channels % blocks.size) % blocks.size;
        if (padding > 0) {
            std::vector<int64_t> pads(static_cast<size_t>(2 * rank), 0);
            pads[static_cast<size_t>(rank + axis)] = padding;
            x = w.node("Pad", {input, w.ints(pads)});
        }
        std::vector<int64_t> dims(static_cast<size_t>(axis), 0);  // 0: the dimension as it is
        dims.insert(dims.end(), {(channels + padding) / blocks.size, blocks.size});
        // The dimensions after the axis as written; -1 only where one is not known (a
        // -1 cannot be inferred in an empty tensor, as an empty key/value cache is).
        const bool after_known = std::all_of(shape.begin() + axis + 1, shape.end(), [](int64_t d) { return d >= 0; });
        if (after_known)
            dims.insert(dims.end(), shape.begin() + axis + 1, shape.end());
        else
            dims.push_back(-1);
        blocked = w.ints(dims);
    } else {
        // Whole blocks: zeros at the axis' end, as many as its size at run time needs
        // (pads [begin of each axis, end of each axis], the rank at run time too).
        constexpr int64_t kEnd = std::numeric_limits<int64_t>::max();
        const auto s = w.node("Shape", {input});
        size_along = w.node("Slice", {s, w.ints({axis}), w.ints({axis == -1 ? kEnd : axis + 1})});
        const auto block = w.ints({blocks.size});
        const auto missing = w.node("Mod", {w.node("Sub", {block, w.node("Mod", {size_along, block})}), block});
        const auto r = w.node("Shape", {s});
        const auto before = axis >= 0 ? w.node("Add", {r, w.ints({axis})})  // r + axis zeros, then the axis' end
                                      : w.node("Add", {w.node("Add", {r, r}), w.ints({axis})});
        const auto after = axis >= 0 ? w.node("Sub", {r, w.ints({axis + 1})}) : w.ints({-axis - 1});
        const auto pad_list = w.node("Concat", {w.zeros(before), missing, w.zeros(after)});
        set_attribute(w.last(), "axis", int64_t{0});
        x = w.node("Pad", {input, pad_list});
        std::vector<std::string> parts = {w.node("Slice", {s, w.ints({0}), w.ints({axis})}), w.ints({-1, blocks.size})};
        if (axis != -1) parts.push_back(w.node("Slice", {s, w.ints({axis + 1}), w.ints({kEnd})}));
        blocked = w.node("Concat", std::move(parts));
        set_attribute(w.last(), "axis", int64_t{0});
        if (axis < 0) block_axis = axis;  // counted from the end: the dims after the axis follow it
        padding = -1;                     // known at run time
    }
    const auto xb = w.node("Reshape", {x, blocked});
    const auto amax = w.node("ReduceMax", {w.node("Abs", {xb})});
    set_attribute(w.last(), "axes", std::vector<int64_t>{block_axis});
    set_attribute(w.last(), "keepdims", int64_t{1});
    if (model.opset() >= 18) {  // axes became an input
        remove_attribute(w.last(), "axes");
        w.last().add_input(w.ints({block_axis}));
    }
    auto scale = w.node("Max", {w.floor_power_of_two(amax), w.scalar(std::ldexp(1.0f, -127))});
    if (f.float_elements) scale = w.node("Mul", {scale, w.scalar(std::ldexp(1.0f, -f.emax))});
    const auto e = w.node("Div", {xb, scale});
    std::string element;
    if (!f.float_elements) {
        const auto q = w.rounded(w.node("Mul", {e, w.scalar(std::ldexp(1.0f, f.fraction_bits))}), blocks.rounding_mode);
        element = w.node(
            "Mul", {w.node("Clip", {q, w.scalar(static_cast<float>(f.qmin)), w.scalar(static_cast<float>(f.qmax))}),
                    w.scalar(std::ldexp(1.0f, -f.fraction_bits))});
    } else {
        // The element's step at e's own power of two (at least the smallest normal one):
        // for FP8 what a float8 conversion computes, without float8 types (opset 19),
        // which ONNX Runtime's graph optimizations mistake for integer pairs.
        const auto power = w.node("Max", {w.floor_power_of_two(w.node("Abs", {e})),
                                          w.scalar(std::ldexp(1.0f, 2 - (1 << (f.exponent_bits - 1))))});
        const auto step = w.node("Mul", {power, w.scalar(std::ldexp(1.0f, -f.mantissa_bits))});
        element = w.node("Clip", {w.node("Mul", {w.rounded(w.node("Div", {e, step}), blocks.rounding_mode), step}),
                                  w.scalar(-f.max_norm), w.scalar(f.max_norm)});
    }
    const auto y = w.node("Mul", {element, scale});
    if (padding == 0) {
        w.node("Reshape", {y, w.node("Shape", {input})}, output);
        return;
    }
    const auto unblocked = w.node("Reshape", {y, w.node("Shape", {x})});
    w.node("Slice", {unblocked, w.ints({0}), size_along.empty() ? w.ints({channels}) : size_along, w.ints({axis})},
           output);
}

}  // namespace vaiq
