#include "vaiq/dpu.hpp"

#include <cmath>
#include <limits>

#include "vaiq/tensor.hpp"

namespace vaiq::dpu {

bool is_rescale(const onnx::NodeProto& node) {
    return node.op_type() == "Mul" && node.doc_string() == kRescaleMark && node.input_size() == 2;
}

float leaky_relu_alpha(float alpha) { return static_cast<float>(std::nearbyint(alpha * 256.0) / 256.0); }


bool is_dpu_hard_sigmoid(const onnx::NodeProto& node) {
    return node.op_type() == "HardSigmoid" && std::abs(float_attribute(node, "alpha", 0.2f) - 1.0f / 6.0f) < 1e-5f &&
           std::abs(float_attribute(node, "beta", 0.5f) - 0.5f) < 1e-5f;
}

double mean_factor(int64_t count) {
    if (count <= 0) return 1.0;
    // The DPU multiplies the sum by round(2^n / count) / 2^n for the n that
    // comes closest to 1 / count.
    const int n_max = 7 + static_cast<int>(std::ceil(std::log2(static_cast<double>(count))));
    double best_factor = 1.0, best_diff = std::numeric_limits<double>::infinity();
    for (int n = 0; n < n_max; ++n) {
        const double p = std::ldexp(1.0, n);
        const double k = std::nearbyint(p / static_cast<double>(count));  // halves to even
        const double diff = std::abs(k / p - 1.0 / static_cast<double>(count));
        if (diff < best_diff) {
            best_diff = diff;
            best_factor = k / p * static_cast<double>(count);
        }
    }
    return best_factor;
}

double average_pool_factor(int64_t kh, int64_t kw) {
    if (kh > 255 || kw > 255) return 1.0;
    if (kh == kw) {
        switch (kh) {
            case 3: return 9.0 * 7.0 / 64.0;
            case 5: return 25.0 * 10.0 / 256.0;
            case 6: return 36.0 * 7.0 / 256.0;
            case 7: return 49.0 * 21.0 / 1024.0;
            case 14: return 196.0 * 21.0 / 4096.0;
            default: break;
        }
    }
    return mean_factor(kh * kw);
}

std::optional<std::pair<float, float>> clip_bounds(const onnx::NodeProto& node, const GraphIndex& index) {
    float lo = -std::numeric_limits<float>::infinity(), hi = std::numeric_limits<float>::infinity();
    for (const auto& a : node.attribute()) {
        if (a.name() == "min") lo = a.f();
        if (a.name() == "max") hi = a.f();
    }
    for (int slot = 1; slot <= 2 && slot < node.input_size(); ++slot) {
        if (node.input(slot).empty()) continue;
        const auto* init = index.initializer(node.input(slot));
        if (!init || index.is_graph_input(node.input(slot))) return std::nullopt;
        const auto t = Tensor::from_proto(*init);
        if (t.type() != DataType::Float || t.size() != 1) return std::nullopt;
        (slot == 1 ? lo : hi) = t.data<float>()[0];
    }
    return std::make_pair(lo, hi);
}

bool pads_with_zeros(const onnx::NodeProto& pad, const GraphIndex& index) {
    if (pad.op_type() != "Pad") return false;
    const auto* mode = find_attribute(pad, "mode");
    if (mode && mode->s() != "constant") return false;
    if (float_attribute(pad, "value", 0.0f) != 0.0f) return false;  // opset < 11
    if (pad.input_size() < 3 || pad.input(2).empty()) return true;
    const auto* init = index.initializer(pad.input(2));
    if (!init || index.is_graph_input(pad.input(2))) return false;
    const auto t = Tensor::from_proto(*init);
    return t.type() == DataType::Float && t.size() == 1 && t.data<float>()[0] == 0.0f;
}

std::optional<int> exact_position(const QuantParams& params) {
    if (params.scale.size() != 1 || !(params.scale[0] > 0.0f)) return std::nullopt;
    int exponent = 0;
    const double mantissa = std::frexp(static_cast<double>(params.scale[0]), &exponent);
    if (mantissa != 0.5) return std::nullopt;
    return 1 - exponent;  // scale = 0.5 * 2^e = 2^-(1-e)
}

}  // namespace vaiq::dpu
