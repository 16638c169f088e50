#include "report/sensitivity.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>

#include "data/batch_workers.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/log.hpp"

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
    data.rewind();
    while (auto batch = data.next()) {
        if (max_batches > 0 && static_cast<int>(out.feeds.size()) >= max_batches) break;
        auto outputs = executor.run(batch->feeds, taps, tap);
        if (out.feeds.empty()) {  // which outputs: one, or every float one
            if (output_index != kEveryOutput) checked_output(outputs, output_index, batch->source);
            for (int i = 0; i < static_cast<int>(outputs.size()); ++i)
                if (i == output_index || (output_index == kEveryOutput && outputs[i].type() == DataType::Float))
                    out.measured.push_back(
                        {i, executor.output_names()[i],
                         output_meaning(float_model, executor.output_names()[i], outputs[i].shape().size())});
            if (out.measured.empty()) throw InputError("the model has no float output: its error cannot be measured");
        }
        auto& kept = out.outputs.emplace_back();
        for (const auto& m : out.measured) kept.push_back(checked_output(outputs, m.index, batch->source));
        out.feeds.push_back(std::move(batch->feeds));
    }
    if (out.feeds.empty()) throw InputError("the data holds no batches");
    return out;
}

std::string ReferenceBatches::describe_outputs() const {
    if (measured.size() == 1) return measured.front().name;
    std::string names;
    for (size_t i = 0; i < measured.size() && i < 3; ++i)
        names += fmt::format("{}'{}'", i ? ", " : "", measured[i].name);
    return fmt::format("every output ({}: {}{})", measured.size(), names, measured.size() > 3 ? ", ..." : "");
}

std::string ReferenceBatches::describe_measures() const {
    std::vector<std::string> seen;
    for (const auto& m : measured)
        if (auto d = m.meaning.describe(); std::find(seen.begin(), seen.end(), d) == seen.end()) seen.push_back(d);
    std::string out;
    for (const auto& d : seen) out += (out.empty() ? "" : "; ") + d;
    return measured.size() > 1 ? out + " (the worst output counts)" : out;
}

namespace {

// One score a row (a wake word's or a detector's logit): what the model says is
// the score against 0.5 where every reference value is a probability, against 0
// otherwise. An argmax over one value always agrees.
float decision_threshold(const ReferenceBatches& reference, size_t k) {
    for (const auto& batch : reference.outputs)
        for (float v : batch[k].data<float>())
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
        case Kind::Threshold:
            return fmt::format("decisions at 0.5 ({}: independent probabilities)", source);
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

namespace {

// One output's agreement, counted batch by batch by what it means.
class AgreementCount {
  public:
    AgreementCount(const OutputMeaning& meaning, float threshold) : meaning_(meaning), threshold_(threshold) {}

    void add(const Tensor& f, const Tensor& q) {
        if (q.size() != f.size())
            throw InternalError(
                fmt::format("a candidate's output has {} values, the float model's {}", q.size(), f.size()));
        sums_.add(f.data<float>(), q.data<float>());
        const auto fv = f.data<float>(), qv = q.data<float>();
        if (meaning_.kind == OutputMeaning::Kind::Values) {
            if (fv.empty()) return;
            const auto [lo, hi] = std::minmax_element(fv.begin(), fv.end());
            const double tolerance = OutputMeaning::kValuesTolerance * (static_cast<double>(*hi) - *lo);
            for (size_t i = 0; i < fv.size(); ++i, ++rows_)
                agree_ += std::abs(static_cast<double>(qv[i]) - fv[i]) <= tolerance;
            return;
        }
        if (meaning_.kind != OutputMeaning::Kind::Argmax) {  // each element a decision
            const bool nonzero = meaning_.kind == OutputMeaning::Kind::NonZero;
            map_ = map_ || f.shape().size() >= 3;
            for (size_t i = 0; i < fv.size(); ++i, ++rows_) {
                const bool yes_f = nonzero ? fv[i] != 0.0f : fv[i] >= 0.5f;
                const bool yes_q = nonzero ? qv[i] != 0.0f : qv[i] >= 0.5f;
                agree_ += yes_f == yes_q, both_ += yes_f && yes_q, either_ += yes_f || yes_q;
            }
            return;
        }
        if (meaning_.source.empty() && row_length(f) < 2) {  // no Softmax says where the classes are
            if (row_length(f) == 1)  // one score a row: its decision
                for (size_t r = 0; r < fv.size(); ++r, ++rows_)
                    agree_ += (fv[r] >= threshold_) == (qv[r] >= threshold_);
            return;
        }
        const auto fa = argmaxes(fv, f.shape(), meaning_.axis, meaning_.flattened),
                   qa = argmaxes(qv, q.shape(), meaning_.axis, meaning_.flattened);
        for (size_t r = 0; r < fa.size(); ++r, ++rows_) agree_ += qa[r] == fa[r];
        if (f.shape().empty() || f.shape()[0] <= 0) return;
        const std::span<const int64_t> fs(fa), qs(qa);
        const auto per_sample = fa.size() / static_cast<size_t>(f.shape()[0]);
        for (size_t i = 0; i < static_cast<size_t>(f.shape()[0]); ++i, ++samples_)
            samples_agree_ +=
                collapse(qs.subspan(i * per_sample, per_sample)) == collapse(fs.subspan(i * per_sample, per_sample));
    }

    OutputError result() const {
        OutputError out;
        out.sqnr_db = sums_.sqnr_db().value_or(std::numeric_limits<double>::infinity());
        out.relative_l2 = sums_.signal > 0 ? std::sqrt(sums_.noise / sums_.signal) : 0.0;
        if (map_) {  // a mask's or peak map's positives: their IoU (its background agrees trivially)
            out.top1_agreement = either_ > 0 ? static_cast<double>(both_) / static_cast<double>(either_) : 1.0;
            out.rows = either_;
        } else {
            out.top1_agreement = rows_ > 0 ? static_cast<double>(agree_) / static_cast<double>(rows_) : 1.0;
            out.rows = rows_;
        }
        out.sequence_agreement =
            samples_ > 0 ? static_cast<double>(samples_agree_) / static_cast<double>(samples_) : 1.0;
        out.samples = samples_;
        return out;
    }

  private:
    const OutputMeaning& meaning_;
    float threshold_;
    ErrorSums sums_;
    int64_t rows_ = 0, agree_ = 0, samples_ = 0, samples_agree_ = 0, both_ = 0, either_ = 0;
    bool map_ = false;
};

// The worst of each measure over several outputs' agreements.
OutputError worst(const std::vector<OutputError>& each) {
    OutputError out = each.front();
    for (const auto& e : each) {
        if (e.sqnr_db < out.sqnr_db) out.sqnr_db = e.sqnr_db;
        if (e.relative_l2 > out.relative_l2) out.relative_l2 = e.relative_l2;
        if (e.top1_agreement < out.top1_agreement) out.top1_agreement = e.top1_agreement, out.rows = e.rows;
        if (e.sequence_agreement < out.sequence_agreement)
            out.sequence_agreement = e.sequence_agreement, out.samples = e.samples;
    }
    return out;
}

}  // namespace

std::vector<OutputError> measure_outputs(size_t variants, const std::function<VariantRun(int threads)>& make_run,
                                         BatchThreads split, const ReferenceBatches& reference) {
    std::vector<OutputError> out(variants);
    if (reference.feeds.empty()) return out;  // nothing to measure: batches 0
    std::vector<std::vector<AgreementCount>> counts(variants);
    for (auto& each : counts)
        for (size_t k = 0; k < reference.measured.size(); ++k) {
            const auto& meaning = reference.measured[k].meaning;
            each.emplace_back(meaning,
                              meaning.kind == OutputMeaning::Kind::Argmax ? decision_threshold(reference, k) : 0.5f);
        }
    run_items(reference.feeds.size(), split.batches, [&]() -> ItemWork {
        auto run = make_run(split.threads_each);
        return [&, run](size_t b, BatchTurns& turns) {
            std::vector<bool> given(variants, false);
            run(reference.feeds[b], [&](size_t variant, const std::vector<Tensor>& outputs) {
                if (variant >= variants || given[variant])
                    throw InternalError(
                        fmt::format("variant {} of {} given outputs twice on a batch", variant, variants));
                given[variant] = true;
                // Each variant's counts see the batches in order.
                const auto point = std::to_string(variant);
                turns.await(point, b);
                for (size_t k = 0; k < reference.measured.size(); ++k)
                    counts[variant][k].add(reference.outputs[b][k],
                                           checked_output(outputs, reference.measured[k].index, "a reference batch"));
                turns.passed(point, b);
            });
            if (const auto missing = std::find(given.begin(), given.end(), false); missing != given.end())
                throw InternalError(
                    fmt::format("variant {} of {} was given no outputs on a batch", missing - given.begin(), variants));
            turns.finish(b, {});
        };
    });
    for (size_t v = 0; v < variants; ++v) {
        std::vector<OutputError> each;
        for (const auto& c : counts[v]) each.push_back(c.result());
        out[v] = worst(each);
        out[v].batches = static_cast<int64_t>(reference.feeds.size());
    }
    return out;
}

OutputError measure_output(const Model& candidate, const ReferenceBatches& reference, int threads) {
    if (reference.feeds.empty()) return {};  // compiles nothing
    auto make_run = [&](int each) -> VariantRun {
        runtime::ExecutorOptions options;
        options.threads = each;
        auto executor = std::make_shared<runtime::Executor>(candidate, options);
        return [executor](const std::map<std::string, Tensor>& feeds, const VariantOutputs& give) {
            give(0, executor->run(feeds));
        };
    };
    // One batch at a time: on the recognizer two at once, each compiling the
    // candidate, took as long (3.1 against 3.25 s for its seven prefixes).
    return measure_outputs(1, make_run, {1, threads}, reference).front();
}

namespace {

// The output error of every tensor in `forked` quantized alone, on every
// reference batch: the run of the model the plan is written into (an executor
// `make_executor` compiles) forks where the tensor is computed (a weight: before
// its first reader) and only the steps from there run again with its quantized
// values, each resumed output measured at once (not held: an output a tensor).
// `fitted` weights are quantized in place of the float ones, as the emitted
// model writes them. Measured against that model's own outputs, or against the
// reference's where `own_reference` is false (a model whose biases were
// corrected against it). Batches run `at_once` at a time, an executor each,
// and add to each tensor's sums in their order: the sums do not depend on it.
std::map<std::string, std::vector<ErrorSums>> forked_output_errors(
    const QuantPlan& plan, const std::vector<std::string>& forked, const std::map<std::string, Tensor>& fitted,
    const ReferenceBatches& reference, const std::function<std::shared_ptr<runtime::Executor>()>& make_executor,
    int at_once, bool own_reference, const std::function<void()>& on_measured) {
    std::map<std::string, std::vector<ErrorSums>> out;
    const auto& measured = reference.measured;
    for (const auto& name : forked) out[name].resize(measured.size());  // made before the workers add to them
    std::set<std::string> forked_at;
    std::mutex counting;
    run_items(reference.feeds.size(), at_once, [&]() -> ItemWork {
        auto executor = make_executor();
        return [&, executor](size_t b, BatchTurns& turns) {
            const auto& feeds = reference.feeds[b];
            std::vector<Tensor> f = reference.outputs[b];
            if (own_reference) {
                const auto own = executor->run(feeds);
                for (size_t k = 0; k < measured.size(); ++k)
                    f[k] = checked_output(own, measured[k].index, "a forked run");
            }
            executor->run_forking(
                feeds, forked, [&](const std::string& name, const Tensor& value, const runtime::Resume& resume) {
                    const auto weight = fitted.find(name);
                    const auto q = resume(
                        fake_quantize(weight != fitted.end() ? weight->second : value, plan.find(name)->params, name));
                    turns.await(name, b);
                    auto& sums = out.at(name);
                    for (size_t k = 0; k < measured.size(); ++k)
                        sums[k].add(f[k].data<float>(),
                                    checked_output(q, measured[k].index, "a forked run").data<float>());
                    {
                        std::lock_guard lock(counting);
                        forked_at.insert(name);
                        on_measured();
                    }
                    turns.passed(name, b);
                });
            turns.finish(b, {});
        };
    });
    std::erase_if(out, [&](const auto& entry) { return !forked_at.count(entry.first); });  // never computed
    return out;
}

}  // namespace

std::vector<TensorSensitivity> analyze_sensitivity(const Model& float_model, const Model& written,
                                                   const QuantPlan& plan, const PlanEmitter& emit,
                                                   const std::map<std::string, Tensor>& fitted, DataReader& data,
                                                   int max_batches, int output_index, int threads,
                                                   const std::function<void(size_t, size_t)>& on_measured,
                                                   int max_tensors) {
    const GraphIndex index(float_model);
    std::vector<std::string> taps;
    for (const auto& t : plan.tensors)
        if (!index.initializer(t.tensor)) taps.push_back(t.tensor);
    // Each activation's own error, accumulated while the reference batches are computed.
    std::map<std::string, ErrorSums> own;
    double tapped_values = 0;  // what a measurement costs, roughly: the activations' size
    const auto reference = reference_batches(
        float_model, data, max_batches, output_index, threads, taps, [&](const std::string& name, const Tensor& value) {
            const auto* t = plan.find(name);
            if (!t || value.type() != DataType::Float) return;
            tapped_values += static_cast<double>(value.size());
            const auto quantized = fake_quantize(value, t->params, name);
            own[name].add(value.data<float>(), quantized.data<float>());
        });
    // Each tensor's own SQNR after quantize-dequantize (weights: their fitted values).
    std::map<std::string, std::optional<double>> own_sqnr;
    for (const auto& t : plan.tensors) {
        if (const auto* init = index.initializer(t.tensor)) {
            const auto value = Tensor::from_proto(*init);
            if (value.type() != DataType::Float) continue;
            ErrorSums sums;
            const auto quantized = fake_quantize(value, t.params, t.tensor);
            sums.add(value.data<float>(), quantized.data<float>());
            own_sqnr[t.tensor] = sums.sqnr_db();
        } else if (auto it = own.find(t.tensor); it != own.end()) {
            own_sqnr[t.tensor] = it->second.sqnr_db();
        }
    }
    const double inf = std::numeric_limits<double>::infinity();
    auto own_of = [&](const std::string& tensor) {
        const auto it = own_sqnr.find(tensor);
        return it != own_sqnr.end() && it->second ? *it->second : inf;
    };
    // Which tensors are measured: every one, or, where that costs too much (a
    // large model at a large input), those whose own error is largest.
    std::vector<const TensorQuant*> candidates;
    for (const auto& t : plan.tensors)
        if (t.role != TensorRole::Bias) candidates.push_back(&t);
    size_t limit = candidates.size();
    if (max_tensors > 0) limit = std::min(limit, static_cast<size_t>(max_tensors));
    if (max_tensors < 0 && tapped_values > 0)
        limit = std::min(limit, static_cast<size_t>(std::max(1.0, kSensitivityBudgetValues / tapped_values)));
    if (limit < candidates.size()) {
        std::stable_sort(candidates.begin(), candidates.end(),
                         [&](const auto* a, const auto* b) { return own_of(a->tensor) < own_of(b->tensor); });
        candidates.resize(limit);
        log_info("sensitivity analysis: the {} tensors whose own error is largest are measured, of {}{}", limit,
                 plan.tensors.size(), max_tensors < 0 ? " (sensitivity_tensors: 0 measures every one)" : "");
    }
    // Float tensors the float model's run can fork at are measured that way;
    // the others (a constant only folded steps read) on the emitted model, a
    // whole inference per batch.
    // Batches at once, an executor each, where the model is small enough.
    const auto split = batch_threads(threads, written);
    const int at_once = std::min<int>(split.batches, static_cast<int>(reference.feeds.size()));
    auto probe = std::make_shared<runtime::Executor>(
        written, runtime::forking_options(at_once > 1 ? split.threads_each : threads, {taps.begin(), taps.end()}));
    auto& executor = *probe;
    std::vector<std::string> forked;
    std::vector<const TensorQuant*> emitted;
    for (const auto* t : candidates) {
        const auto* init = index.initializer(t->tensor);
        const bool is_float = init ? init->data_type() == onnx::TensorProto::FLOAT : own.count(t->tensor) > 0;
        if (is_float && executor.can_fork(t->tensor))
            forked.push_back(t->tensor);
        else
            emitted.push_back(t);
    }
    const size_t total = forked.size() * reference.feeds.size() + emitted.size();
    size_t done = 0;
    auto measured = [&] {
        if (on_measured) on_measured(++done, total);
    };
    std::map<std::string, double> output_sqnr;
    for (const auto& [name, sums] : forked_output_errors(
             plan, forked, fitted, reference,
             [&] {  // the probe where it runs on this thread, alone
                 return at_once > 1
                            ? std::make_shared<runtime::Executor>(
                                  written, runtime::forking_options(split.threads_each, {taps.begin(), taps.end()}))
                            : probe;
             },
             at_once, &written == &float_model, measured)) {
        double lowest = inf;  // the worst output's
        for (const auto& s : sums) lowest = std::min(lowest, s.sqnr_db().value_or(inf));
        output_sqnr[name] = lowest;
    }
    for (const auto* t : emitted) {
        QuantPlan alone;
        alone.tensors.push_back(*t);
        output_sqnr[t->tensor] = measure_output(emit(alone), reference, threads).sqnr_db;
        measured();
    }
    std::vector<TensorSensitivity> out;
    for (const auto& t : plan.tensors) {
        TensorSensitivity s{t.tensor, t.role, t.params.type, std::nullopt, std::nullopt};
        if (auto it = own_sqnr.find(t.tensor); it != own_sqnr.end()) s.tensor_sqnr_db = it->second;
        if (auto it = output_sqnr.find(t.tensor); it != output_sqnr.end()) s.output_sqnr_db = it->second;
        out.push_back(std::move(s));
    }
    // Measured tensors by their cost to the output; those not measured after, by their own error.
    std::stable_sort(out.begin(), out.end(), [&](const auto& a, const auto& b) {
        if (a.output_sqnr_db.has_value() != b.output_sqnr_db.has_value()) return a.output_sqnr_db.has_value();
        if (a.output_sqnr_db) return *a.output_sqnr_db < *b.output_sqnr_db;
        return a.tensor_sqnr_db.value_or(inf) < b.tensor_sqnr_db.value_or(inf);
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
