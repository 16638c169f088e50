#include "report/evaluation.hpp"

#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>

#include "data/batch_workers.hpp"
#include "runtime/executor.hpp"
#include "util/progress.hpp"
#include "vaiq/error.hpp"
#include "vaiq/spool.hpp"

namespace vaiq {

namespace {

bool is_classifier(const Tensor& t) { return t.shape().size() == 2 && t.shape()[1] >= 2; }

int64_t argmax_row(std::span<const float> row) { return std::max_element(row.begin(), row.end()) - row.begin(); }

// -log softmax(row)[label], computed stably.
double negative_log_likelihood(std::span<const float> row, int64_t label) {
    const double top = *std::max_element(row.begin(), row.end());
    double sum = 0;
    for (float v : row) sum += std::exp(static_cast<double>(v) - top);
    return top + std::log(sum) - static_cast<double>(row[static_cast<size_t>(label)]);
}

int64_t label_at(const Tensor& labels, int64_t i) {
    switch (labels.type()) {
        case DataType::Int64: return labels.data<int64_t>()[i];
        case DataType::Int32: return labels.data<int32_t>()[i];
        case DataType::UInt8: return labels.data<uint8_t>()[i];
        default: throw InputError(fmt::format("labels must be integers, not {}", data_type_name(labels.type())));
    }
}

// Runs `model` on the batches of `data` (`max_batches` 0: all), one at a time
// on every thread, and hands each batch's outputs to `take` in the data's order.
// Returns how many batches ran. One executor, not one for each batch in flight
// as calibration has: a second one's compile (the quantized weights packed
// again) costs more than it wins over the batches evaluation runs (mobilenet_v2's
// cpu.yaml model, 32 batches: 85-113 ms two at a time, 63-85 ms one; 100 batches:
// 175-194 against 159-160 ms; the text direction classifier's cnn_npu.yaml
// model, 32 batches: 160-164 against 107-113 ms).
size_t run_model_on_batches(const Model& model, DataReader& data, int threads, int max_batches,
                            const std::function<void(const Batch&, std::vector<Tensor>)>& take) {
    return run_batches(data, 1, static_cast<size_t>(std::max(max_batches, 0)), [&]() -> BatchWork {
        auto executor = std::make_shared<runtime::Executor>(model, runtime::ExecutorOptions{threads});
        return [&, executor](size_t index, const Batch& batch, BatchTurns& turns) {
            std::vector<Tensor> outputs;
            try {
                outputs = executor->run(batch.feeds);
            } catch (const InputError& e) {
                throw InputError(fmt::format("evaluation data {}: {}", batch.source, e.what()));
            }
            turns.finish(index, [&] { take(batch, std::move(outputs)); });
        };
    });
}

// float16 and bfloat16 outputs (a float16 model's) are compared in float.
void as_float(Tensor& t) {
    if (t.type() == DataType::Float16 || t.type() == DataType::BFloat16) t = convert_float_type(t, DataType::Float);
}

// The same without changing `t`: `t` itself, or its float copy in `scratch`.
const Tensor& as_float(const Tensor& t, Tensor& scratch) {
    if (t.type() != DataType::Float16 && t.type() != DataType::BFloat16) return t;
    scratch = convert_float_type(t, DataType::Float);
    return scratch;
}

}  // namespace

OutputComparison::OutputComparison(std::vector<std::string> names)
    : names_(std::move(names)), sums_(names_.size()) {}

void OutputComparison::add(const std::vector<Tensor>& reference, const std::vector<Tensor>& candidate,
                           const std::string& source) {
    for (size_t o = 0; o < names_.size() && o < reference.size() && o < candidate.size(); ++o) {
        Tensor f_float, q_float;
        const Tensor& f = as_float(reference[o], f_float);
        const Tensor& q = as_float(candidate[o], q_float);
        if (f.type() != DataType::Float || q.type() != DataType::Float) continue;
        const auto fv = f.data<float>();
        const auto qv = q.data<float>();
        if (fv.size() != qv.size())
            throw InputError(fmt::format("evaluation data {}: the quantized model's output '{}' has {} values, "
                                         "the float one {}",
                                         source, names_[o], qv.size(), fv.size()));
        auto& s = sums_[o];
        for (size_t i = 0; i < fv.size(); ++i) {
            const double a = fv[i], b = qv[i], d = a - b;
            s.signal += a * a;
            s.noise += d * d;
            s.dot += a * b;
            s.q2 += b * b;
            s.max_abs = std::max(s.max_abs, std::abs(d));
        }
        s.elements += static_cast<int64_t>(fv.size());
        s.classifier = s.classifier && is_classifier(f);
        if (!s.classifier) continue;
        const int64_t rows = f.shape()[0], cols = f.shape()[1];
        for (int64_t r = 0; r < rows; ++r)
            s.agree += argmax_row(fv.subspan(r * cols, cols)) == argmax_row(qv.subspan(r * cols, cols));
        s.rows += rows;
    }
}

std::vector<OutputMetrics> OutputComparison::metrics() const {
    std::vector<OutputMetrics> out;
    for (size_t o = 0; o < names_.size(); ++o) {
        const auto& s = sums_[o];
        if (s.elements == 0) continue;
        OutputMetrics m;
        m.name = names_[o];
        m.elements = s.elements;
        m.sqnr_db = s.noise == 0 ? std::numeric_limits<double>::infinity() : 10.0 * std::log10(s.signal / s.noise);
        m.cosine = (s.signal == 0 || s.q2 == 0) ? (s.signal == s.q2 ? 1.0 : 0.0) : s.dot / std::sqrt(s.signal * s.q2);
        m.max_abs_error = s.max_abs;
        if (s.classifier && s.rows > 0) m.top1_agreement = static_cast<double>(s.agree) / static_cast<double>(s.rows);
        out.push_back(m);
    }
    return out;
}

nlohmann::json Evaluation::to_json() const {
    nlohmann::json j = {{"batches", batches}, {"samples", samples}, {"outputs", nlohmann::json::array()}};
    for (const auto& o : outputs) {
        nlohmann::json m = {{"name", o.name},
                            {"elements", o.elements},
                            {"sqnr_db", std::isinf(o.sqnr_db) ? nlohmann::json("inf") : nlohmann::json(o.sqnr_db)},
                            {"cosine_similarity", o.cosine},
                            {"max_abs_error", o.max_abs_error}};
        if (o.top1_agreement) m["top1_agreement"] = *o.top1_agreement;
        j["outputs"].push_back(m);
    }
    if (float_accuracy) j["accuracy"] = {{"float", *float_accuracy}, {"quantized", *quantized_accuracy}};
    if (float_perplexity) j["perplexity"] = {{"float", *float_perplexity}, {"quantized", *quantized_perplexity}};
    return j;
}

std::vector<std::string> output_names(const Model& model) {
    std::vector<std::string> names;
    for (const auto& o : model.graph().output()) names.push_back(o.name());
    return names;
}

void ReferenceOutputs::add(const std::string& source, std::vector<Tensor> batch_outputs) {
    if (batch_outputs.size() != names.size())
        throw InternalError(fmt::format("{} outputs for a model of {}", batch_outputs.size(), names.size()));
    batch_samples.push_back(!batch_outputs.empty() && !batch_outputs[0].shape().empty() ? batch_outputs[0].shape()[0]
                                                                                        : 0);
    for (auto& t : batch_outputs) {
        as_float(t);
        // Only float outputs are compared: others leave an empty placeholder.
        outputs.put(t.type() == DataType::Float ? t : Tensor(DataType::UInt8, {0}));
    }
    sources.push_back(source);
}

std::unique_ptr<ReferenceOutputs> reference_outputs(const Model& float_model, DataReader& data, int threads,
                                                    int max_batches) {
    auto out = std::make_unique<ReferenceOutputs>();
    out->names = output_names(float_model);
    data.rewind();
    run_model_on_batches(float_model, data, threads, max_batches, [&](const Batch& batch, std::vector<Tensor> values) {
        report_progress("float batch", static_cast<int64_t>(out->sources.size()) + 1, max_batches);
        out->add(batch.source, std::move(values));
    });
    return out;
}

Evaluation compare_outputs(const ReferenceOutputs& reference, const ReferenceOutputs& candidate) {
    if (reference.names != candidate.names || reference.sources != candidate.sources)
        throw InternalError("the two models' outputs put aside are not of the same outputs and batches");
    const size_t outputs = reference.names.size();
    OutputComparison comparison(reference.names);
    Evaluation out;
    for (size_t b = 0; b < reference.sources.size(); ++b) {
        std::vector<Tensor> r(outputs), c(outputs);
        for (size_t o = 0; o < outputs; ++o) {
            r[o] = reference.outputs.get(b * outputs + o);
            c[o] = candidate.outputs.get(b * outputs + o);
        }
        comparison.add(r, c, reference.sources[b]);
        ++out.batches;
        out.samples += reference.batch_samples[b];
    }
    out.outputs = comparison.metrics();
    return out;
}

Evaluation compare_outputs(const Model& float_model, const Model& quantized, DataReader& data, const Tensor* labels,
                           int threads, int max_batches) {
    // The float model runs over the data first and its outputs are put aside, so
    // that the two models' weights are never in memory together (a model of
    // several GB would need them twice).
    const auto reference = reference_outputs(float_model, data, threads, max_batches);
    return compare_outputs(*reference, quantized, data, labels, threads, max_batches);
}

Evaluation compare_outputs(const ReferenceOutputs& reference, const Model& quantized, DataReader& data,
                           const Tensor* labels, int threads, int max_batches) {
    const auto& names = reference.names;
    const auto& float_outputs = reference.outputs;
    const auto& sources = reference.sources;
    const size_t batches =
        max_batches > 0 ? std::min(sources.size(), static_cast<size_t>(max_batches)) : sources.size();
    if (batches == 0) throw InputError("the evaluation data holds no batches");
    int64_t samples = 0;
    for (size_t b = 0; b < batches; ++b) samples += reference.batch_samples[b];
    OutputComparison comparison(names);
    int64_t float_correct = 0, quant_correct = 0, labelled = 0;
    double float_nll = 0, quant_nll = 0;
    bool language_model = false;
    Evaluation out;
    out.samples = samples;
    auto next_label = [&](bool token) {
        if (labelled >= labels->size())
            throw InputError(fmt::format("evaluation_labels holds {} {}, but the evaluation data has more {}",
                                         labels->size(), token ? "tokens" : "labels", token ? "positions" : "samples"));
        return label_at(*labels, labelled++);
    };
    size_t b = 0;  // batches scored
    auto score = [&](const Batch& batch, std::vector<Tensor> q) {
        report_progress("quantized batch", static_cast<int64_t>(b) + 1, static_cast<int64_t>(batches));
        std::vector<Tensor> f(names.size());
        for (size_t o = 0; o < names.size(); ++o) f[o] = float_outputs.get(b * names.size() + o);
        for (auto& t : q) as_float(t);
        // Labels score output 0: a language model's logits [N, T, V] per position, else [N, C] per row.
        if (labels && !f.empty() && !q.empty() && f[0].type() == DataType::Float && q[0].type() == DataType::Float &&
            f[0].size() == q[0].size() && (f[0].shape().size() == 3 || is_classifier(f[0]))) {
            language_model = f[0].shape().size() == 3;
            const int64_t cols = f[0].shape().back(), rows = static_cast<int64_t>(f[0].size()) / std::max<int64_t>(cols, 1);
            const auto fv = f[0].data<float>(), qv = q[0].data<float>();
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t want = next_label(language_model);
                const auto fr = fv.subspan(static_cast<size_t>(r * cols), static_cast<size_t>(cols));
                const auto qr = qv.subspan(static_cast<size_t>(r * cols), static_cast<size_t>(cols));
                float_correct += argmax_row(fr) == want;
                quant_correct += argmax_row(qr) == want;
                if (!language_model) continue;
                if (want < 0 || want >= cols)
                    throw InputError(
                        fmt::format("evaluation_labels holds the token {}, outside the {} logits", want, cols));
                float_nll += negative_log_likelihood(fr, want);
                quant_nll += negative_log_likelihood(qr, want);
            }
        }
        comparison.add(f, q, batch.source);
        ++out.batches;
        ++b;
    };
    data.rewind();
    const auto ran = run_model_on_batches(quantized, data, threads, static_cast<int>(batches), score);
    if (ran < batches)
        throw InputError(fmt::format("the evaluation data ended early on its second pass: batch {} ({}) is missing",
                                     ran + 1, sources[ran]));
    if (labels && max_batches == 0 && labelled != labels->size())
        throw InputError(fmt::format("evaluation_labels holds {} labels, but the evaluation data has {} samples",
                                     labels->size(), labelled));
    out.outputs = comparison.metrics();
    if (labels && labelled > 0) {
        out.float_accuracy = static_cast<double>(float_correct) / static_cast<double>(labelled);
        out.quantized_accuracy = static_cast<double>(quant_correct) / static_cast<double>(labelled);
    }
    if (language_model && labelled > 0) {
        out.float_perplexity = std::exp(float_nll / static_cast<double>(labelled));
        out.quantized_perplexity = std::exp(quant_nll / static_cast<double>(labelled));
    }
    return out;
}

}  // namespace vaiq
