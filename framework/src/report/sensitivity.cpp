#include "report/sensitivity.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <tuple>

#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"

namespace vaiq {

namespace {

struct ErrorSums {
    double signal = 0, noise = 0;
    void add(std::span<const float> f, std::span<const float> q) {
        for (size_t i = 0; i < f.size(); ++i) {
            const double d = static_cast<double>(f[i]) - q[i];
            signal += static_cast<double>(f[i]) * f[i];
            noise += d * d;
        }
    }
    std::optional<double> sqnr_db() const {
        if (!(signal > 0)) return std::nullopt;
        return noise == 0 ? std::numeric_limits<double>::infinity() : 10.0 * std::log10(signal / noise);
    }
};

// Rows over the last axis (a classifier's [N, C], a sequence model's [N, T, C]).
int64_t row_length(const Tensor& t) { return t.shape().size() >= 2 ? t.shape().back() : 0; }

// CTC greedy decoding of a row argmax sequence: repeats merged, the blank (0) dropped.
std::vector<int64_t> collapse(std::span<const int64_t> classes) {
    std::vector<int64_t> out;
    int64_t previous = -1;
    for (const int64_t c : classes) {
        if (c != previous && c != 0) out.push_back(c);
        previous = c;
    }
    return out;
}

const Tensor& checked_output(const std::vector<Tensor>& outputs, int index, const std::string& source) {
    if (index < 0 || index >= static_cast<int>(outputs.size()))
        throw InputError(
            fmt::format("output index {} does not exist: the model has {} outputs", index, outputs.size()));
    if (outputs[index].type() != DataType::Float)
        throw InputError(fmt::format("output {} is not float on {}: its error cannot be measured", index, source));
    return outputs[index];
}

}  // namespace

ReferenceBatches reference_batches(const Model& float_model, DataReader& data, int max_batches, int output_index,
                                   int threads, const std::vector<std::string>& taps, const runtime::Tap& tap) {
    runtime::ExecutorOptions options;
    options.threads = threads;
    options.taps.insert(taps.begin(), taps.end());
    runtime::Executor executor(float_model, options);
    ReferenceBatches out;
    out.output_index = output_index;
    data.rewind();
    while (auto batch = data.next()) {
        if (max_batches > 0 && static_cast<int>(out.feeds.size()) >= max_batches) break;
        auto outputs = executor.run(batch->feeds, taps, tap);
        out.outputs.push_back(checked_output(outputs, output_index, batch->source));
        out.feeds.push_back(std::move(batch->feeds));
    }
    if (out.feeds.empty()) throw InputError("the data holds no batches");
    out.output_name = executor.output_names()[output_index];
    out.meaning = output_meaning(float_model, out.output_name, out.outputs.front().shape().size());
    return out;
}

namespace {

// One score a row (a wake word's or a detector's logit): what the model says is
// the score against 0.5 where every reference value is a probability, against 0
// otherwise. An argmax over one value always agrees.
float decision_threshold(const ReferenceBatches& reference) {
    for (const auto& f : reference.outputs)
        for (float v : f.data<float>())
            if (!(v >= 0.0f && v <= 1.0f)) return 0.0f;
    return 0.5f;
}

const std::set<std::string, std::less<>> kBooleanOps = {"Equal", "Greater",   "GreaterOrEqual", "Less", "LessOrEqual",
                                                        "Not",   "And",       "Or",             "Xor",  "IsNaN",
                                                        "IsInf", "BitwiseNot"};
const std::set<std::string, std::less<>> kReshapes = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose"};

// A Cast of a comparison's or a logical op's result: a 0/1 mask.
bool is_mask(const onnx::GraphProto& graph, const GraphIndex& index, const std::string& tensor) {
    const int p = index.producer(tensor);
    if (p < 0 || graph.node(p).op_type() != "Cast" || !is_default_domain(graph.node(p))) return false;
    const int q = index.producer(graph.node(p).input(0));
    return q >= 0 && kBooleanOps.count(graph.node(q).op_type()) > 0;
}

// The argmax along `axis` at every other position: the classes of
// `values` (of `shape`) lie along `axis`, or from `axis` on when `flattened`.
std::vector<int64_t> argmaxes(std::span<const float> values, const std::vector<int64_t>& shape, int64_t axis,
                              bool flattened) {
    const auto rank = static_cast<int64_t>(shape.size());
    if (rank == 0) return {};
    if (axis < 0) axis += rank;
    axis = std::clamp<int64_t>(axis, 0, rank - 1);
    int64_t outer = 1, classes = 1, inner = 1;
    for (int64_t d = 0; d < rank; ++d) (d < axis ? outer : d == axis || flattened ? classes : inner) *= shape[d];
    std::vector<int64_t> out(static_cast<size_t>(outer * inner));
    for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) {
            const float* base = values.data() + o * classes * inner + i;
            int64_t best = 0;
            for (int64_t c = 1; c < classes; ++c)
                if (base[c * inner] > base[best * inner]) best = c;
            out[static_cast<size_t>(o * inner + i)] = best;
        }
    return out;
}

}  // namespace

std::vector<int64_t> greedy_decode(std::span<const float> sample, int64_t row_length) {
    if (row_length <= 0) return {};
    return collapse(argmaxes(sample, {static_cast<int64_t>(sample.size()) / row_length, row_length}, -1, false));
}

std::string OutputMeaning::describe() const {
    switch (kind) {
        case Kind::Threshold: return fmt::format("decisions at 0.5 ({}: independent probabilities)", source);
        case Kind::NonZero: return fmt::format("its nonzero elements ({} masks it)", source);
        case Kind::Values:
            return fmt::format(
                "values within {:g} % of the float output's range (no op says it holds classes or decisions)",
                100 * kValuesTolerance);
        case Kind::Argmax: break;
    }
    if (source.empty()) return "the argmax over the last axis (one score a row: its decision)";
    return fmt::format("the argmax over axis {}{} ({})", axis, flattened ? " and after" : "", source);
}

OutputMeaning output_meaning(const Model& model, const std::string& output, size_t rank) {
    const auto& graph = model.graph();
    const GraphIndex index(graph);
    OutputMeaning m;
    bool reshaped = false;  // decisions do not depend on the layout; an argmax's axis does
    std::string tensor = output;
    for (int p = index.producer(tensor); p >= 0; p = index.producer(tensor)) {
        const auto& node = graph.node(p);
        const auto& op = node.op_type();
        if (!is_default_domain(node) || node.input_size() == 0) break;
        if (op == "Softmax" || op == "LogSoftmax") {
            if (reshaped) break;
            const bool old = model.opset() < 13;  // before 13: over every axis from `axis` on
            m.axis = int_attribute(node, "axis", old ? 1 : -1);
            m.flattened = old;
            m.source = describe_node(node);
            return m;
        }
        if (op == "Sigmoid" || op == "HardSigmoid") {
            m.kind = OutputMeaning::Kind::Threshold;
            m.source = describe_node(node);
            return m;
        }
        const bool masked =
            is_mask(graph, index, tensor) ||
            (op == "Mul" && node.input_size() == 2 &&
             (is_mask(graph, index, node.input(0)) || is_mask(graph, index, node.input(1))));
        if (masked) {
            m.kind = OutputMeaning::Kind::NonZero;
            m.source = describe_node(node);
            return m;
        }
        if (op != "Identity" && !kReshapes.count(op)) break;
        reshaped = reshaped || op != "Identity";
        tensor = node.input(0);
    }
    // A map's last axis is its width (or, channels last, its features): an
    // argmax there means nothing, so its values are compared instead.
    if (rank >= 4) m.kind = OutputMeaning::Kind::Values;
    return m;
}

OutputError measure_output(const Model& candidate, const ReferenceBatches& reference, int threads) {
    if (reference.feeds.empty()) return {};  // nothing to measure: batches 0
    const auto& meaning = reference.meaning;
    const bool argmax = meaning.kind == OutputMeaning::Kind::Argmax;
    const float threshold = argmax ? decision_threshold(reference) : 0.5f;
    runtime::ExecutorOptions options;
    options.threads = threads;
    runtime::Executor executor(candidate, options);
    ErrorSums sums;
    int64_t rows = 0, agree = 0, samples = 0, samples_agree = 0, both = 0, either = 0;
    bool map = false;
    for (size_t b = 0; b < reference.feeds.size(); ++b) {
        const auto outputs = executor.run(reference.feeds[b]);
        const Tensor& q = checked_output(outputs, reference.output_index, "a reference batch");
        const Tensor& f = reference.outputs[b];
        if (q.size() != f.size())
            throw InternalError(
                fmt::format("a candidate's output has {} values, the float model's {}", q.size(), f.size()));
        sums.add(f.data<float>(), q.data<float>());
        const auto fv = f.data<float>(), qv = q.data<float>();
        if (meaning.kind == OutputMeaning::Kind::Values) {
            if (fv.empty()) continue;
            const auto [lo, hi] = std::minmax_element(fv.begin(), fv.end());
            const double tolerance = OutputMeaning::kValuesTolerance * (static_cast<double>(*hi) - *lo);
            for (size_t i = 0; i < fv.size(); ++i, ++rows)
                agree += std::abs(static_cast<double>(qv[i]) - fv[i]) <= tolerance;
            continue;
        }
        if (!argmax) {  // each element a decision
            const bool nonzero = meaning.kind == OutputMeaning::Kind::NonZero;
            map = map || f.shape().size() >= 3;
            for (size_t i = 0; i < fv.size(); ++i, ++rows) {
                const bool yes_f = nonzero ? fv[i] != 0.0f : fv[i] >= threshold;
                const bool yes_q = nonzero ? qv[i] != 0.0f : qv[i] >= threshold;
                agree += yes_f == yes_q, both += yes_f && yes_q, either += yes_f || yes_q;
            }
            continue;
        }
        if (meaning.source.empty() && row_length(f) < 2) {  // no Softmax says where the classes are
            if (row_length(f) == 1)  // one score a row: its decision
                for (size_t r = 0; r < fv.size(); ++r, ++rows) agree += (fv[r] >= threshold) == (qv[r] >= threshold);
            continue;
        }
        const auto fa = argmaxes(fv, f.shape(), meaning.axis, meaning.flattened),
                   qa = argmaxes(qv, q.shape(), meaning.axis, meaning.flattened);
        for (size_t r = 0; r < fa.size(); ++r, ++rows) agree += qa[r] == fa[r];
        if (f.shape().empty() || f.shape()[0] <= 0) continue;
        const std::span<const int64_t> fs(fa), qs(qa);
        const auto per_sample = fa.size() / static_cast<size_t>(f.shape()[0]);
        for (size_t i = 0; i < static_cast<size_t>(f.shape()[0]); ++i, ++samples)
            samples_agree += collapse(qs.subspan(i * per_sample, per_sample)) ==
                             collapse(fs.subspan(i * per_sample, per_sample));
    }
    OutputError out;
    out.sqnr_db = sums.sqnr_db().value_or(std::numeric_limits<double>::infinity());
    out.relative_l2 = sums.signal > 0 ? std::sqrt(sums.noise / sums.signal) : 0.0;
    if (map) {  // a mask's or peak map's positives: their IoU (its background agrees trivially)
        out.top1_agreement = either > 0 ? static_cast<double>(both) / static_cast<double>(either) : 1.0;
        out.rows = either;
    } else {
        out.top1_agreement = rows > 0 ? static_cast<double>(agree) / static_cast<double>(rows) : 1.0;
        out.rows = rows;
    }
    out.sequence_agreement = samples > 0 ? static_cast<double>(samples_agree) / static_cast<double>(samples) : 1.0;
    out.samples = samples;
    out.batches = static_cast<int64_t>(reference.feeds.size());
    return out;
}

namespace {

// The output error of every tensor in `forked` quantized alone, on every
// reference batch: the run of `executor` (of the float model the plan is
// written into) forks where the tensor is computed (a weight: before its first
// reader) and only the steps from there run again with its quantized values,
// each resumed output measured at once (not held: an output a tensor). `fitted`
// weights are quantized in place of the float ones, as the emitted model writes
// them. Measured against that model's own outputs, or against the reference's
// where `own_reference` is false (a model whose biases were corrected against it).
std::map<std::string, ErrorSums> forked_output_errors(const QuantPlan& plan, const std::vector<std::string>& forked,
                                                      const std::map<std::string, Tensor>& fitted,
                                                      const ReferenceBatches& reference, runtime::Executor& executor,
                                                      bool own_reference, const std::function<void()>& on_measured) {
    std::map<std::string, ErrorSums> out;
    for (size_t b = 0; b < reference.feeds.size(); ++b) {
        const auto& feeds = reference.feeds[b];
        const Tensor f = own_reference ? checked_output(executor.run(feeds), reference.output_index, "a forked run")
                                       : reference.outputs[b];
        executor.run_forking(
            feeds, forked, [&](const std::string& name, const Tensor& value, const runtime::Resume& resume) {
                const auto weight = fitted.find(name);
                const auto q = resume(
                    fake_quantize(weight != fitted.end() ? weight->second : value, plan.find(name)->params, name));
                out[name].add(f.data<float>(), checked_output(q, reference.output_index, "a forked run").data<float>());
                on_measured();
            });
    }
    return out;
}

}  // namespace

std::vector<TensorSensitivity> analyze_sensitivity(const Model& float_model, const Model& written,
                                                   const QuantPlan& plan, const PlanEmitter& emit,
                                                   const std::map<std::string, Tensor>& fitted, DataReader& data,
                                                   int max_batches, int output_index, int threads,
                                                   const std::function<void(size_t, size_t)>& on_measured) {
    const GraphIndex index(float_model);
    std::vector<std::string> taps;
    for (const auto& t : plan.tensors)
        if (!index.initializer(t.tensor)) taps.push_back(t.tensor);
    // Each activation's own error, accumulated while the reference batches are computed.
    std::map<std::string, ErrorSums> own;
    const auto reference = reference_batches(
        float_model, data, max_batches, output_index, threads, taps, [&](const std::string& name, const Tensor& value) {
            const auto* t = plan.find(name);
            if (!t || value.type() != DataType::Float) return;
            const auto quantized = fake_quantize(value, t->params, name);
            own[name].add(value.data<float>(), quantized.data<float>());
        });
    // Float tensors the float model's run can fork at are measured that way;
    // the others (a constant only folded steps read) on the emitted model, a
    // whole inference per batch.
    runtime::Executor executor(written, runtime::forking_options(threads, {taps.begin(), taps.end()}));
    std::vector<std::string> forked;
    std::vector<const TensorQuant*> emitted;
    for (const auto& t : plan.tensors) {
        if (t.role == TensorRole::Bias) continue;
        const auto* init = index.initializer(t.tensor);
        const bool is_float = init ? init->data_type() == onnx::TensorProto::FLOAT : own.count(t.tensor) > 0;
        if (is_float && executor.can_fork(t.tensor))
            forked.push_back(t.tensor);
        else
            emitted.push_back(&t);
    }
    const size_t total = forked.size() * reference.feeds.size() + emitted.size();
    size_t done = 0;
    auto measured = [&] {
        if (on_measured) on_measured(++done, total);
    };
    const double inf = std::numeric_limits<double>::infinity();
    std::map<std::string, double> output_sqnr;
    for (const auto& [name, sums] :
         forked_output_errors(plan, forked, fitted, reference, executor, &written == &float_model, measured))
        output_sqnr[name] = sums.sqnr_db().value_or(inf);
    for (const auto* t : emitted) {
        QuantPlan alone;
        alone.tensors.push_back(*t);
        output_sqnr[t->tensor] = measure_output(emit(alone), reference, threads).sqnr_db;
        measured();
    }
    std::vector<TensorSensitivity> out;
    for (const auto& t : plan.tensors) {
        TensorSensitivity s{t.tensor, t.role, t.params.type, std::nullopt, std::nullopt};
        if (const auto* init = index.initializer(t.tensor)) {
            const auto value = Tensor::from_proto(*init);
            if (value.type() == DataType::Float) {
                ErrorSums sums;
                const auto quantized = fake_quantize(value, t.params, t.tensor);
                sums.add(value.data<float>(), quantized.data<float>());
                s.tensor_sqnr_db = sums.sqnr_db();
            }
        } else if (auto it = own.find(t.tensor); it != own.end()) {
            s.tensor_sqnr_db = it->second.sqnr_db();
        }
        if (auto it = output_sqnr.find(t.tensor); it != output_sqnr.end()) s.output_sqnr_db = it->second;
        out.push_back(std::move(s));
    }
    std::stable_sort(out.begin(), out.end(), [&](const auto& a, const auto& b) {
        return a.output_sqnr_db.value_or(inf) < b.output_sqnr_db.value_or(inf);
    });
    return out;
}

nlohmann::json sensitivity_json(const std::vector<TensorSensitivity>& tensors) {
    auto db = [](const std::optional<double>& v) -> nlohmann::json {
        if (!v) return nullptr;
        return std::isinf(*v) ? nlohmann::json("inf") : nlohmann::json(*v);
    };
    nlohmann::json out = nlohmann::json::array();
    for (const auto& t : tensors)
        out.push_back({{"tensor", t.tensor},
                       {"role", role_name(t.role)},
                       {"type", quant_type_name(t.type)},
                       {"tensor_sqnr_db", db(t.tensor_sqnr_db)},
                       {"output_sqnr_db", db(t.output_sqnr_db)}});
    return out;
}

}  // namespace vaiq
