#include "bias_correction.hpp"

#include <set>

#include "vaiq/graph.hpp"

namespace vaiq {

namespace {

// One layer to correct: its input, weight and bias names and how the weight reads the input.
struct Layer {
    std::string input, weight, bias;
    bool gemm = false;
    bool trans_b = false;
    int64_t group = 1;
};

// Whether a fit moved the weight off nearest rounding (the grids differ).
bool fitted(const Tensor& original, const Tensor& rounded, const QuantParams& params, const std::string& name) {
    const Tensor a = fake_quantize(original, params, name), b = fake_quantize(rounded, params, name);
    const auto av = a.data<float>(), bv = b.data<float>();
    return !std::equal(av.begin(), av.end(), bv.begin(), bv.end());
}

std::vector<Layer> layers_to_correct(const Model& model, const QuantPlan& plan,
                                     const std::map<std::string, Tensor>& rounded, int64_t& fitted_left) {
    const GraphIndex index(model);
    std::vector<Layer> out;
    for (const auto& node : model.graph().node()) {
        const bool conv = node.op_type() == "Conv", gemm = node.op_type() == "Gemm";
        if (!is_default_domain(node) || !(conv || gemm) || node.input_size() < 3) continue;
        if (gemm && int_attribute(node, "transA", 0) != 0) continue;
        const auto* w = index.initializer(node.input(1));
        const auto* b = index.initializer(node.input(2));
        if (!w || !b || !plan.find(node.input(1)) || w->data_type() != onnx::TensorProto::FLOAT ||
            b->data_type() != onnx::TensorProto::FLOAT)
            continue;
        const auto chosen = rounded.find(node.input(1));
        if (chosen != rounded.end() &&
            fitted(Tensor::from_proto(*w), chosen->second, plan.find(node.input(1))->params, node.input(1))) {
            ++fitted_left;
            continue;
        }
        out.push_back({node.input(0), node.input(1), node.input(2), gemm, int_attribute(node, "transB", 0) != 0,
                       int_attribute(node, "group", 1)});
    }
    return out;
}

// Running per-channel sums of an input: channel axis 1 for a convolution, the last for a Gemm.
struct ChannelMeans {
    std::vector<double> sum;
    int64_t count = 0;  // values per channel so far
    void add(const Tensor& value, bool last_axis) {
        const auto& shape = value.shape();
        if (shape.size() < 2) return;
        const int64_t channels = last_axis ? shape.back() : shape[1];
        const int64_t inner = last_axis ? 1 : static_cast<int64_t>(value.size()) / (shape[0] * channels);
        if (sum.empty()) sum.assign(channels, 0.0);
        if (static_cast<int64_t>(sum.size()) != channels) return;
        const auto v = value.data<float>();
        for (size_t i = 0; i < v.size(); ++i) sum[(i / inner) % channels] += v[i];
        count += static_cast<int64_t>(v.size()) / channels;
    }
    double mean(size_t c) const { return count ? sum[c] / static_cast<double>(count) : 0.0; }
};

}  // namespace

BiasCorrections corrected_biases(AlgorithmContext& context, const Model& quantized,
                                 const std::map<std::string, Tensor>& rounded) {
    const Model& float_model = context.model();
    const QuantPlan& plan = context.plan();
    BiasCorrections result;
    const auto layers = layers_to_correct(float_model, plan, rounded, result.fitted_left);
    auto& out = result.biases;
    if (layers.empty()) return result;
    std::set<std::string> inputs;
    for (const auto& l : layers) inputs.insert(l.input);
    std::map<std::string, bool> last_axis;
    for (const auto& l : layers) last_axis[l.input] = l.gemm;

    // Float values: the tapped inputs are the quantized model's, between their Q/DQ.
    const auto runner = context.runner(quantized, true, inputs);
    const std::vector<std::string> taps(inputs.begin(), inputs.end());
    std::map<std::string, ChannelMeans> means;
    auto& data = context.data();
    data.rewind();
    while (auto batch = data.next()) {
        runner->run(*batch, taps, [&](const std::string& name, const Tensor& value) {
            if (value.type() == DataType::Float) means[name].add(value, last_axis[name]);
        });
    }

    const GraphIndex index(float_model);
    for (const auto& l : layers) {
        const auto& m = means[l.input];
        const Tensor w = Tensor::from_proto(*index.initializer(l.weight));
        Tensor b = Tensor::from_proto(*index.initializer(l.bias));
        const Tensor wq = fake_quantize(w, plan.find(l.weight)->params, l.weight);  // a fit left it at nearest
        const auto& shape = w.shape();
        const auto wv = w.data<float>(), qv = wq.data<float>();
        auto bias = b.mutable_data<float>();
        if (m.sum.empty()) continue;
        if (l.gemm) {  // B is [K, N], or [N, K] with transB
            if (shape.size() != 2) continue;
            const int64_t k_dim = l.trans_b ? shape[1] : shape[0], n_dim = l.trans_b ? shape[0] : shape[1];
            if (static_cast<int64_t>(m.sum.size()) != k_dim || static_cast<int64_t>(bias.size()) != n_dim) continue;
            for (int64_t n = 0; n < n_dim; ++n)
                for (int64_t k = 0; k < k_dim; ++k) {
                    const size_t i = l.trans_b ? n * k_dim + k : k * n_dim + n;
                    bias[n] += static_cast<float>((wv[i] - qv[i]) * m.mean(k));
                }
        } else {  // [Cout, Cin / group, kernel...]
            if (shape.size() < 3) continue;
            const int64_t cout = shape[0], cin_g = shape[1];
            const int64_t kernel = static_cast<int64_t>(w.size()) / (cout * cin_g);
            if (static_cast<int64_t>(bias.size()) != cout || cout % l.group != 0 ||
                static_cast<int64_t>(m.sum.size()) != cin_g * l.group)
                continue;
            for (int64_t c = 0; c < cout; ++c) {
                const int64_t first_in = c / (cout / l.group) * cin_g;
                double delta = 0;
                for (int64_t j = 0; j < cin_g; ++j)
                    for (int64_t k = 0; k < kernel; ++k) {
                        const size_t i = (c * cin_g + j) * kernel + k;
                        delta += (wv[i] - qv[i]) * m.mean(first_in + j);
                    }
                bias[c] += static_cast<float>(delta);
            }
        }
        out.emplace(l.bias, std::move(b));
    }
    return result;
}

}  // namespace vaiq
