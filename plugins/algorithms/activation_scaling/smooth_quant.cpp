#include "smooth_quant.hpp"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>

#include "activation_sample.hpp"
#include "vaiq/graph.hpp"

namespace vaiq {

namespace {

// One smoothing tried on sampled rows: the weights it quantizes and the grid
// its scaled activation takes over the searched rows.
struct Trial {
    std::vector<float> s;
    QuantParams activation;
    std::vector<Matrix> dequantized;  ///< Q(diag(s) W), one per reader
};

Trial try_smoothing(const std::vector<float>& s, const Matrix& searched, const std::vector<Matrix>& weights,
                    const SmoothQuantOptions& o) {
    Trial t{s, {}, {}};
    const Matrix xs = divide_channels(searched, s);
    t.activation =
        compute_quant_params({std::min(xs.minCoeff(), 0.0f), std::max(xs.maxCoeff(), 0.0f)}, o.activation_spec);
    for (const auto& w : weights) t.dequantized.push_back(quantize_scaled_weight(w, s, o.weight_spec));
    return t;
}

// Squared error of the quantized product X/s · Q(diag(s) W) against X W over the rows `x`.
double trial_error(const Trial& t, const Matrix& x, const std::vector<Matrix>& reference) {
    if (x.rows() == 0) return 0;
    const Matrix xs = divide_channels(x, t.s);
    const auto tensor =
        Tensor::from_values<float>({xs.rows(), xs.cols()}, std::vector<float>(xs.data(), xs.data() + xs.size()));
    const auto q = fake_quantize(tensor, t.activation, "activation");
    const Eigen::Map<const Matrix> xq(q.data<float>().data(), xs.rows(), xs.cols());
    double error = 0;
    for (size_t i = 0; i < reference.size(); ++i)
        error += static_cast<double>((xq * t.dequantized[i] - reference[i]).squaredNorm());
    return error;
}

bool constant_float(const GraphIndex& index, const std::string& name) {
    const auto* t = index.initializer(name);
    return t && t->data_type() == onnx::TensorProto::FLOAT;
}

}  // namespace

std::map<std::string, std::vector<ChannelReader>> channel_readers(const Model& model, const GraphIndex& index) {
    std::map<std::string, std::vector<ChannelReader>> out;
    const auto& graph = model.graph();
    for (int i = 0; i < graph.node_size(); ++i) {
        const auto& n = graph.node(i);
        if (!is_default_domain(n) || n.input_size() < 2 || !constant_float(index, n.input(1))) continue;
        if (index.initializer(n.input(0))) continue;
        const auto* w = index.initializer(n.input(1));
        if (w->dims_size() != 2) continue;
        if (n.op_type() == "MatMul") out[n.input(0)].push_back({i, false});
        if (n.op_type() == "Gemm" && int_attribute(n, "transA", 0) == 0)
            out[n.input(0)].push_back({i, int_attribute(n, "transB", 0) != 0});
    }
    return out;
}

namespace {

// Scales element e of a constant along axis `axis` (of a 1-D or 2-D tensor) by f[channel].
void scale_initializer(onnx::GraphProto& graph, const std::string& name, const std::vector<float>& f, int axis) {
    for (auto& init : *graph.mutable_initializer()) {
        if (init.name() != name) continue;
        Tensor t = Tensor::from_proto(init);
        const auto& shape = t.shape();
        const size_t cols = shape.size() == 2 ? static_cast<size_t>(shape[1]) : 1;
        auto v = t.mutable_data<float>();
        for (size_t i = 0; i < v.size(); ++i) v[i] *= f[axis == 0 || shape.size() == 1 ? i / cols : i % cols];
        init = t.to_proto(name);
        return;
    }
}

// Whether a constant holds exactly K values along the axis the channels run (a 1-D [K], or the column axis of a 2-D).
bool per_channel_constant(const GraphIndex& index, const std::string& name, size_t k, bool columns) {
    const auto* t = index.initializer(name);
    if (!t || t->data_type() != onnx::TensorProto::FLOAT) return false;
    if (t->dims_size() == 1) return static_cast<size_t>(t->dims(0)) == k;
    return columns && t->dims_size() == 2 && static_cast<size_t>(t->dims(1)) == k;
}

// Folds x / s into the node writing X; false when it cannot.
bool fold_into_producer(Model& model, const GraphIndex& index, const std::string& x, const std::vector<float>& inv) {
    const int p = index.producer(x);
    if (p < 0) return false;
    const auto& n = model.graph().node(p);
    if (!is_default_domain(n)) return false;
    const size_t k = inv.size();
    auto& graph = model.graph();
    if (n.op_type() == "LayerNormalization" && n.input_size() >= 2 && int_attribute(n, "axis", -1) == -1) {
        for (int i = 1; i < n.input_size(); ++i)
            if (!per_channel_constant(index, n.input(i), k, false)) return false;
        for (int i = 1; i < n.input_size(); ++i) scale_initializer(graph, n.input(i), inv, 0);
        return true;
    }
    if (n.op_type() == "Mul" && per_channel_constant(index, n.input(1), k, false)) {
        scale_initializer(graph, n.input(1), inv, 0);
        return true;
    }
    // (y + c) / s needs y / s too: a spelled-out LayerNorm's Add(Mul(z, gamma), beta).
    if (n.op_type() == "Add" && per_channel_constant(index, n.input(1), k, false)) {
        const int m = index.producer(n.input(0));
        if (m < 0 || index.consumers(n.input(0)).size() != 1) return false;
        const auto& mul = graph.node(m);
        if (mul.op_type() != "Mul" || !is_default_domain(mul) || !per_channel_constant(index, mul.input(1), k, false))
            return false;
        scale_initializer(graph, mul.input(1), inv, 0);
        scale_initializer(graph, n.input(1), inv, 0);
        return true;
    }
    if ((n.op_type() == "MatMul" || n.op_type() == "Gemm") && per_channel_constant(index, n.input(1), k, true) &&
        int_attribute(n, "transB", 0) == 0 && index.consumers(n.output(0)).size() == 1) {
        if (n.input_size() >= 3 && !per_channel_constant(index, n.input(2), k, false)) return false;
        scale_initializer(graph, n.input(1), inv, 1);
        if (n.input_size() >= 3) scale_initializer(graph, n.input(2), inv, 0);
        return true;
    }
    return false;
}

}  // namespace

bool scale_input_channels(Model& model, const std::string& x, const std::vector<float>& s, bool folding,
                          const std::string& tag) {
    const GraphIndex index(model);
    const auto all = channel_readers(model, index);
    const auto& rs = all.at(x);
    const size_t k = s.size();
    std::vector<float> inv(k);
    for (size_t j = 0; j < k; ++j) inv[j] = 1.0f / s[j];
    bool folded = false;
    // Every reader of X is smoothed, so X itself may change; else a Mul feeds only them.
    const bool only_readers = index.consumers(x).size() == rs.size() && !index.is_graph_output(x);
    std::string smoothed = x;
    if (folding && only_readers && fold_into_producer(model, index, x, inv)) {
        folded = true;
    } else {
        auto& graph = model.graph();
        UniqueNames names(graph);
        const auto factor = add_initializer(graph, names, x + "_" + tag + "_scale",
                                            Tensor::from_values<float>({static_cast<int64_t>(k)}, inv));
        smoothed = names.fresh(x + "_" + tag + "_scaled");
        make_node(graph, names, "Mul", {x, factor}, {smoothed}, x + "_" + tag);
        // Into place: before the first reader, so the graph stays in order.
        int first = graph.node_size() - 1;
        for (const auto& r : rs) first = std::min(first, r.node);
        for (int i = graph.node_size() - 1; i > first; --i) graph.mutable_node()->SwapElements(i, i - 1);
        for (const auto& r : rs) graph.mutable_node(r.node + 1)->set_input(0, smoothed);
    }
    for (const auto& r : rs) {
        const auto& node = model.graph().node(r.node + (smoothed == x ? 0 : 1));
        scale_initializer(model.graph(), node.input(1), s, r.rows_are_columns ? 1 : 0);
    }
    return folded;
}

namespace {

// The alpha whose smoothing gives the least error on the searched rows, when it
// also beats no smoothing on the held-out ones.
std::optional<double> search_alpha(const Model& model, const GraphIndex& index, const std::vector<ChannelReader>& rs,
                                   const ActivationSample& sample,
                                   const std::function<std::vector<float>(double)>& scales,
                                   const SmoothQuantOptions& options) {
    if (sample.rows.empty()) return std::nullopt;
    const auto k = static_cast<Eigen::Index>(sample.rows.front().size());
    std::vector<Matrix> weights;  // [K, N] whatever the storage
    for (const auto& r : rs) {
        const Tensor w = Tensor::from_proto(*index.initializer(model.graph().node(r.node).input(1)));
        const Eigen::Map<const Matrix> stored(w.data<float>().data(), w.shape()[0], w.shape()[1]);
        weights.push_back(r.rows_are_columns ? Matrix(stored.transpose()) : Matrix(stored));
    }
    const auto split = split_rows(sample);
    const Matrix searched = stack(split.fitted, k), held = stack(split.held, k);
    std::vector<Matrix> searched_reference, held_reference;
    for (const auto& w : weights) {
        searched_reference.emplace_back(searched * w);
        held_reference.emplace_back(held * w);
    }
    const auto none = try_smoothing(std::vector<float>(static_cast<size_t>(k), 1.0f), searched, weights, options);
    double best_error = trial_error(none, searched, searched_reference);
    std::optional<double> best_alpha;
    std::optional<Trial> best;
    for (int step = 1; step <= 9; ++step) {
        auto t = try_smoothing(scales(step / 10.0), searched, weights, options);
        if (const double e = trial_error(t, searched, searched_reference); e < best_error)
            best_error = e, best_alpha = step / 10.0, best = std::move(t);
    }
    if (!best || split.held.empty()) return best_alpha;
    return trial_error(*best, held, held_reference) < trial_error(none, held, held_reference) ? best_alpha
                                                                                              : std::nullopt;
}

}  // namespace

SmoothQuantResult smooth_quant(Model& model, AlgorithmContext& context, const SmoothQuantOptions& options) {
    SmoothQuantResult result;
    std::vector<std::string> inputs;
    for (const auto& [x, r] : channel_readers(model, GraphIndex(model))) inputs.push_back(x);
    if (inputs.empty()) return result;
    std::vector<ChannelRangeRequest> requests;
    for (const auto& x : inputs) requests.push_back({x, -1});
    const auto maxima = context.channel_ranges(model, requests);
    std::map<std::string, ActivationSample> samples;
    if (options.alpha_search) {
        std::map<std::string, int64_t> channels;
        for (const auto& [x, m] : maxima) channels[x] = static_cast<int64_t>(m.size());
        samples = sample_activations(model, context, channels, with_held_out(options.sample_rows));
    }

    for (const auto& x : inputs) {
        // Node positions move as Muls are inserted: the readers are found again each time.
        const GraphIndex index(model);
        const auto all = channel_readers(model, index);
        if (!all.count(x)) continue;
        const auto& rs = all.at(x);
        // A weight another node reads too cannot take this input's scales.
        if (std::any_of(rs.begin(), rs.end(), [&](const ChannelReader& r) {
                return index.consumers(model.graph().node(r.node).input(1)).size() != 1;
            }))
            continue;
        auto it = maxima.find(x);
        if (it == maxima.end()) continue;
        const auto& amax = it->second;
        const size_t k = amax.size();
        // max |W_j| over every reader's row j.
        std::vector<float> wmax(k, 0.0f);
        bool fits = true;
        for (const auto& r : rs) {
            const Tensor w = Tensor::from_proto(*index.initializer(model.graph().node(r.node).input(1)));
            const size_t rows = static_cast<size_t>(w.shape()[0]), cols = static_cast<size_t>(w.shape()[1]);
            if ((r.rows_are_columns ? cols : rows) != k) fits = false;
            if (!fits) break;
            const auto v = w.data<float>();
            for (size_t i = 0; i < v.size(); ++i) {
                const size_t j = r.rows_are_columns ? i % cols : i / cols;
                wmax[j] = std::max(wmax[j], std::abs(v[i]));
            }
        }
        if (!fits) continue;
        auto scales = [&](double alpha) {
            std::vector<float> s(k);
            for (size_t j = 0; j < k; ++j) {
                const double denominator = std::max(std::pow(static_cast<double>(wmax[j]), 1.0 - alpha), 1e-5);
                s[j] = static_cast<float>(std::max(std::pow(static_cast<double>(amax[j]), alpha) / denominator, 1e-5));
            }
            return s;
        };
        std::vector<float> s;
        if (options.alpha_search) {
            const auto alpha = search_alpha(model, index, rs, samples[x], scales, options);
            result.alphas[x] = alpha;
            if (!alpha) continue;
            s = scales(*alpha);
        } else {
            s = scales(options.alpha);
        }
        result.folded += scale_input_channels(model, x, s, options.folding, "smooth");
        result.weights += static_cast<int>(rs.size());
        ++result.activations;
    }
    return result;
}

}  // namespace vaiq
