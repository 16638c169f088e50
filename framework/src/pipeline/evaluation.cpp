#include "pipeline/evaluation.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "runtime/executor.hpp"
#include "vaiq/error.hpp"

namespace vaiq {

namespace {

struct Sums {
    double signal = 0, noise = 0, dot = 0, q2 = 0, max_abs = 0;
    int64_t elements = 0;
    int64_t rows = 0, agree = 0;
    bool classifier = true;
};

bool is_classifier(const Tensor& t) { return t.shape().size() == 2 && t.shape()[1] >= 2; }

int64_t argmax_row(std::span<const float> row) { return std::max_element(row.begin(), row.end()) - row.begin(); }

int64_t label_at(const Tensor& labels, int64_t i) {
    switch (labels.type()) {
        case DataType::Int64: return labels.data<int64_t>()[i];
        case DataType::Int32: return labels.data<int32_t>()[i];
        case DataType::UInt8: return labels.data<uint8_t>()[i];
        default: throw InputError(fmt::format("labels must be integers, not {}", data_type_name(labels.type())));
    }
}

}  // namespace

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
    return j;
}

Evaluation compare_outputs(const Model& float_model, const Model& quantized, DataReader& data, const Tensor* labels,
                           int threads, int max_batches) {
    runtime::ExecutorOptions options;
    options.threads = threads;
    runtime::Executor reference(float_model, options);
    runtime::Executor candidate(quantized, options);
    const auto& names = reference.output_names();
    std::vector<Sums> sums(names.size());
    int64_t float_correct = 0, quant_correct = 0, labelled = 0;
    Evaluation out;
    data.rewind();
    while (auto batch = data.next()) {
        if (max_batches > 0 && out.batches >= max_batches) break;
        std::vector<Tensor> f, q;
        try {
            f = reference.run(batch->feeds);
            q = candidate.run(batch->feeds);
        } catch (const InputError& e) {
            throw InputError(fmt::format("evaluation data {}: {}", batch->source, e.what()));
        }
        for (size_t o = 0; o < names.size(); ++o) {
            auto& s = sums[o];
            if (f[o].type() != DataType::Float || q[o].type() != DataType::Float) continue;
            const auto fv = f[o].data<float>();
            const auto qv = q[o].data<float>();
            if (fv.size() != qv.size())
                throw InternalError(fmt::format("the quantized model's output '{}' has {} values, the float one {}",
                                                names[o], qv.size(), fv.size()));
            for (size_t i = 0; i < fv.size(); ++i) {
                const double a = fv[i], b = qv[i], d = a - b;
                s.signal += a * a;
                s.noise += d * d;
                s.dot += a * b;
                s.q2 += b * b;
                s.max_abs = std::max(s.max_abs, std::abs(d));
            }
            s.elements += static_cast<int64_t>(fv.size());
            s.classifier = s.classifier && is_classifier(f[o]);
            if (!s.classifier) continue;
            const int64_t rows = f[o].shape()[0], cols = f[o].shape()[1];
            for (int64_t r = 0; r < rows; ++r) {
                const int64_t fa = argmax_row(fv.subspan(r * cols, cols));
                const int64_t qa = argmax_row(qv.subspan(r * cols, cols));
                s.agree += fa == qa;
                if (o == 0 && labels) {
                    if (labelled >= labels->size())
                        throw InputError(
                            fmt::format("evaluation_labels holds {} labels, but the evaluation data has "
                                        "more samples",
                                        labels->size()));
                    const int64_t want = label_at(*labels, labelled++);
                    float_correct += fa == want;
                    quant_correct += qa == want;
                }
            }
            s.rows += rows;
        }
        if (!f.empty() && !f[0].shape().empty()) out.samples += f[0].shape()[0];
        ++out.batches;
    }
    if (out.batches == 0) throw InputError("the evaluation data holds no batches");
    if (labels && max_batches == 0 && labelled != labels->size())
        throw InputError(fmt::format("evaluation_labels holds {} labels, but the evaluation data has {} samples",
                                     labels->size(), labelled));
    for (size_t o = 0; o < names.size(); ++o) {
        const auto& s = sums[o];
        if (s.elements == 0) continue;
        OutputMetrics m;
        m.name = names[o];
        m.elements = s.elements;
        m.sqnr_db = s.noise == 0 ? std::numeric_limits<double>::infinity() : 10.0 * std::log10(s.signal / s.noise);
        m.cosine = (s.signal == 0 || s.q2 == 0) ? (s.signal == s.q2 ? 1.0 : 0.0) : s.dot / std::sqrt(s.signal * s.q2);
        m.max_abs_error = s.max_abs;
        if (s.classifier && s.rows > 0) m.top1_agreement = static_cast<double>(s.agree) / static_cast<double>(s.rows);
        out.outputs.push_back(m);
    }
    if (labels && labelled > 0) {
        out.float_accuracy = static_cast<double>(float_correct) / static_cast<double>(labelled);
        out.quantized_accuracy = static_cast<double>(quant_correct) / static_cast<double>(labelled);
    }
    return out;
}

}  // namespace vaiq
