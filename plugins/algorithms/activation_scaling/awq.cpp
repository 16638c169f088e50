#include "awq.hpp"

#include <fmt/format.h>
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <map>

#include "activation_sample.hpp"
#include "smooth_quant.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/log.hpp"

namespace vaiq {

namespace {

// Mean over outputs of |W_jn| / max |W| of its block (its column when per channel or per tensor).
std::vector<double> normalised_weight_magnitude(const std::vector<Tensor>& weights, const QuantSpec& spec) {
    const auto k = static_cast<size_t>(weights[0].shape()[0]);
    std::vector<double> out(k, 0.0);
    size_t columns = 0;
    for (const auto& w : weights) {
        const auto n = static_cast<size_t>(w.shape()[1]);
        const auto v = w.data<float>();
        const size_t block = spec.block_size > 0 ? static_cast<size_t>(spec.block_size) : k;
        for (size_t col = 0; col < n; ++col)
            for (size_t start = 0; start < k; start += block) {
                const size_t end = std::min(k, start + block);
                float top = 0;
                for (size_t j = start; j < end; ++j) top = std::max(top, std::abs(v[j * n + col]));
                if (top == 0) continue;
                for (size_t j = start; j < end; ++j) out[j] += std::abs(v[j * n + col]) / top;
            }
        columns += n;
    }
    for (auto& x : out) x /= static_cast<double>(std::max<size_t>(columns, 1));
    return out;
}

// ||X (W - Q(W))||² over the token rows `rows` (X), W quantized with `params`.
double rows_error(const Tensor& w, const QuantParams& params, const std::vector<const std::vector<float>*>& rows) {
    const auto k = w.shape()[0], n = w.shape()[1];
    const Tensor q = fake_quantize(w, params, "weight");
    const Matrix d =
        Eigen::Map<const Matrix>(w.data<float>().data(), k, n) - Eigen::Map<const Matrix>(q.data<float>().data(), k, n);
    return static_cast<double>((stack(rows, k) * d).squaredNorm());
}

struct ClipSearch {
    QuantParams params;
    int64_t blocks = 0;  ///< (block, column) pairs searched (not all zero)
};

// AWQ-clip's search on a symmetric weight blocked along K: each (block,
// column)'s clip ratio in 1, 0.95, ..., 0.5 of its max |w| with the least
// output error over `rows`; `plan` with the chosen scales.
ClipSearch search_clip(const Tensor& w, const QuantParams& plan, const std::vector<const std::vector<float>*>& rows) {
    ClipSearch out{plan};
    auto& p = out.params;
    const auto k = w.shape()[0], n = w.shape()[1], block = p.block_size;
    const auto wv = w.data<float>();
    const auto range = integer_range(p.type, true);  // not a structured binding: the lambda reads it (clang 14)
    const auto qmin = range.first, qmax = range.second;
    std::vector<double> d(static_cast<size_t>(block));
    for (int64_t b = 0; b * block < k; ++b) {
        const int64_t first = b * block, last = std::min(k, first + block);
        for (int64_t col = 0; col < n; ++col) {
            double amax = 0;
            for (int64_t j = first; j < last; ++j)
                amax = std::max(amax, std::abs(static_cast<double>(wv[j * n + col])));
            if (amax == 0) continue;
            // Output error of the block's rounding over the rows, for one clip ratio.
            auto error = [&](double scale) {
                for (int64_t j = first; j < last; ++j) {
                    const double v = wv[j * n + col];
                    const double q =
                        std::clamp(std::nearbyint(v / scale), static_cast<double>(qmin), static_cast<double>(qmax));
                    d[static_cast<size_t>(j - first)] = v - q * scale;
                }
                double e = 0;
                for (const auto* row : rows) {
                    double dot = 0;
                    for (int64_t j = first; j < last; ++j)
                        dot += (*row)[static_cast<size_t>(j)] * d[static_cast<size_t>(j - first)];
                    e += dot * dot;
                }
                return e;
            };
            const auto param = static_cast<size_t>(b * n + col);
            double best_scale = p.scale[param], best = error(best_scale);
            for (int step = 0; step <= 10; ++step) {
                const double scale = amax * (1.0 - 0.05 * step) / static_cast<double>(qmax);
                const double e = error(scale);
                if (e < best) best = e, best_scale = scale;
            }
            ++out.blocks;
            p.scale[param] = static_cast<float>(best_scale);
        }
    }
    return out;
}

// Summed over the readers: mean squared difference between X W and (X / s) Q(diag(s) W).
double output_error(const Matrix& x, const std::vector<Tensor>& weights, const std::vector<Matrix>& reference,
                    const std::vector<float>& s, const QuantSpec& spec) {
    const Matrix xs = divide_channels(x, s);
    double error = 0;
    for (size_t i = 0; i < weights.size(); ++i) {
        const Eigen::Map<const Matrix> w(weights[i].data<float>().data(), weights[i].shape()[0], weights[i].shape()[1]);
        error += static_cast<double>((xs * quantize_scaled_weight(w, s, spec) - reference[i]).squaredNorm()) /
                 static_cast<double>(reference[i].size());
    }
    return error;
}

}  // namespace

AwqResult awq_lite(Model& model, AlgorithmContext& context, const AwqOptions& options,
                   const std::set<std::string>& nodes) {
    AwqResult result;
    // Activations whose every channel reader is a MatMul to quantize with an unshared 2-D weight.
    std::map<std::string, int64_t> channels;
    {
        const GraphIndex index(model);
        for (const auto& [x, readers] : channel_readers(model, index)) {
            bool all = true;
            for (const auto& r : readers) {
                const auto& n = model.graph().node(r.node);
                all &= n.op_type() == "MatMul" && nodes.count(n.name()) && index.consumers(n.input(1)).size() == 1;
            }
            if (all) channels[x] = index.initializer(model.graph().node(readers[0].node).input(1))->dims(0);
        }
    }
    if (channels.empty()) return result;
    const auto samples = sample_activations(model, context, channels, with_held_out(options.sample_rows));

    int64_t searched = 0;
    for (const auto& [x, k] : channels) {
        context.progress("input", ++searched, static_cast<int64_t>(channels.size()));
        const auto& sample = samples.at(x);
        if (sample.rows.empty()) continue;
        const GraphIndex index(model);
        const auto readers = channel_readers(model, index).at(x);
        std::vector<Tensor> weights;
        for (const auto& r : readers)
            weights.push_back(Tensor::from_proto(*index.initializer(model.graph().node(r.node).input(1))));
        // A quarter of the sampled rows is held out: α is searched on the others, and the
        // scales are kept only when they beat s = 1 on the held-out rows.
        const auto split = split_rows(sample);
        const auto held = static_cast<Eigen::Index>(split.held.size());
        Matrix fit_x = stack(split.fitted, k), held_x = stack(split.held, k);
        std::vector<Matrix> fit_reference, held_reference;
        for (const auto& w : weights) {
            const Eigen::Map<const Matrix> wm(w.data<float>().data(), k, w.shape()[1]);
            fit_reference.emplace_back(fit_x * wm);
            held_reference.emplace_back(held_x * wm);
        }

        std::vector<double> x_mean(static_cast<size_t>(k));
        for (size_t j = 0; j < x_mean.size(); ++j)
            x_mean[j] = sample.abs_sum[j] / static_cast<double>(std::max<int64_t>(sample.rows_seen, 1));
        const auto w_mean = normalised_weight_magnitude(weights, options.spec);

        const std::vector<float> identity(static_cast<size_t>(k), 1.0f);
        // α in 0, 0.1, ..., 1 for the least output error over the rows `x` (s = 1 unless one beats it).
        auto search = [&](const Matrix& x, const std::vector<Matrix>& reference) {
            double best_error = output_error(x, weights, reference, identity, options.spec);
            std::vector<float> best = identity;
            for (int step = 0; step <= 10; ++step) {
                const double alpha = step / 10.0;
                std::vector<float> s(static_cast<size_t>(k));
                double lo = 1e30, hi = 0;
                for (size_t j = 0; j < s.size(); ++j) {
                    const double v =
                        std::pow(std::max(x_mean[j], 1e-12), alpha) / std::pow(std::max(w_mean[j], 1e-12), 1 - alpha);
                    s[j] = static_cast<float>(std::clamp(v, 1e-4, 1e4));
                    lo = std::min(lo, static_cast<double>(s[j]));
                    hi = std::max(hi, static_cast<double>(s[j]));
                }
                const double centre = std::sqrt(lo * hi);
                for (auto& v : s) v = static_cast<float>(v / centre);
                const double error = output_error(x, weights, reference, s, options.spec);
                if (error < best_error) best_error = error, best = s;
            }
            return best;
        };
        const auto best = search(fit_x, fit_reference);
        // No row held out: judged on the fitted ones.
        const bool judge_fitted = held == 0;
        const double rtn = output_error(judge_fitted ? fit_x : held_x, weights,
                                        judge_fitted ? fit_reference : held_reference, identity, options.spec);
        const double awq = best == identity
                               ? rtn
                               : output_error(judge_fitted ? fit_x : held_x, weights,
                                              judge_fitted ? fit_reference : held_reference, best, options.spec);
        ++result.activations;
        result.error_rtn += rtn;
        if (!(awq < rtn)) {
            result.error_awq += rtn;
            continue;
        }
        // Kept: searched again on every sampled row (the same method, a third more data).
        std::vector<float> chosen = best;
        if (held > 0) {
            Matrix all_x(fit_x.rows() + held, k);
            all_x << fit_x, held_x;
            std::vector<Matrix> all_reference;
            for (size_t i = 0; i < weights.size(); ++i) {
                all_reference.emplace_back(all_x.rows(), fit_reference[i].cols());
                all_reference.back() << fit_reference[i], held_reference[i];
            }
            chosen = search(all_x, all_reference);
        }
        if (chosen == identity) {
            result.error_awq += rtn;
            continue;
        }
        result.error_awq += awq;
        result.folded += scale_input_channels(model, x, chosen, true, "pre_quant");
        ++result.scaled;
        log_debug("awq_lite: '{}': held-out output error {:.4g} -> {:.4g}", x, rtn, awq);
    }
    return result;
}

AwqClipResult awq_clip(AlgorithmContext& context, int sample_rows) {
    const Model& model = context.model();
    const QuantPlan& plan = context.plan();
    AwqClipResult result;
    const GraphIndex index(model.graph());
    // The weights to search, by the activation they multiply.
    std::map<std::string, std::vector<const TensorQuant*>> by_input;
    std::map<std::string, int64_t> channels;
    for (const auto& node : model.graph().node()) {
        if (!is_default_domain(node) || node.op_type() != "MatMul" || node.input_size() != 2) continue;
        auto it = std::find_if(plan.tensors.begin(), plan.tensors.end(),
                               [&](const TensorQuant& t) { return t.tensor == node.input(1); });
        const auto* init = index.initializer(node.input(1));
        if (it == plan.tensors.end() || !init || init->dims_size() != 2) continue;
        const auto& p = it->params;
        if (p.block_size <= 0 || p.axis != 0 || !it->spec.symmetric || !is_integer(p.type)) continue;
        by_input[node.input(0)].push_back(&*it);
        channels[node.input(0)] = init->dims(0);
    }
    if (by_input.empty()) return result;
    const auto samples = sample_activations(model, context, channels, with_held_out(sample_rows));
    for (auto& [x, weights] : by_input) {
        // The search weighs three quarters of the sampled rows; the rest judges each weight's result.
        auto [rows, held] = split_rows(samples.at(x));
        if (rows.empty()) continue;
        if (held.empty()) held = rows;  // none held out: judged on the searched ones
        std::vector<const std::vector<float>*> every_row(rows);
        if (held != rows) every_row.insert(every_row.end(), held.begin(), held.end());
        for (const auto* t : weights) {
            const auto w = Tensor::from_proto(*index.initializer(t->tensor));
            const auto fitted = search_clip(w, t->params, rows);
            ++result.weights;
            result.blocks += fitted.blocks;
            if (fitted.params.scale == t->params.scale) continue;
            if (!(rows_error(w, fitted.params, held) < rows_error(w, t->params, held))) {
                ++result.rejected;
                continue;
            }
            // Kept: searched again on every sampled row (the same method, a third more data).
            const auto p = every_row.size() > rows.size() ? search_clip(w, t->params, every_row).params : fitted.params;
            for (size_t i = 0; i < p.scale.size(); ++i) result.clipped += p.scale[i] != t->params.scale[i];
            context.set_parameters(t->tensor, p);
        }
    }
    return result;
}

}  // namespace vaiq
