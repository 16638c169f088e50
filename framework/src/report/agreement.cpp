#include "report/agreement.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>

#include "data/batch_workers.hpp"
#include "sdk/vector_intrinsics.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/log.hpp"

namespace vaiq {

namespace {

// Rows over the last axis (a classifier's [N, C], a sequence model's [N, T, C]).
int64_t row_length(const Tensor& t) { return t.shape().size() >= 2 ? t.shape().back() : 0; }

// Whether `meaning`, read on output `f`, decodes samples (a sequence's, a
// classifier's), which sequence_agreement counts: classes along an axis a
// Softmax names or rows of two or more, and a first axis to take samples along.
bool decodes_samples(const OutputMeaning& meaning, const Tensor& f) {
    return meaning.kind == OutputMeaning::Kind::Argmax && !(meaning.source.empty() && row_length(f) < 2) &&
           !f.shape().empty() && f.shape()[0] > 0;
}

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

bool ReferenceBatches::decodes_samples() const {
    for (size_t k = 0; k < measured.size() && !outputs.empty(); ++k)
        if (vaiq::decodes_samples(measured[k].meaning, outputs.front()[k])) return true;
    return false;
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

const std::set<std::string, std::less<>> kBooleanOps = {
    "Equal", "Greater", "GreaterOrEqual", "Less",  "LessOrEqual", "Not", "And",
    "Or",    "Xor",     "IsNaN",          "IsInf", "BitwiseNot"};
const std::set<std::string, std::less<>> kReshapes = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose"};

// A Cast of a comparison's or a logical op's result: a 0/1 mask.
bool is_mask(const onnx::GraphProto& graph, const GraphIndex& index, const std::string& tensor) {
    const int p = index.producer(tensor);
    if (p < 0 || graph.node(p).op_type() != "Cast" || !is_default_domain(graph.node(p))) return false;
    const int q = index.producer(graph.node(p).input(0));
    return q >= 0 && kBooleanOps.count(graph.node(q).op_type()) > 0;
}

// The first index of a row's greatest value: no NaN is greater than anything,
// so a NaN first stays the choice and others are passed over.
int64_t first_greatest_portable(const float* row, int64_t n) {
    int64_t best = 0;
    for (int64_t c = 1; c < n; ++c)
        if (row[c] > row[best]) best = c;
    return best;
}

// The same with AVX-512: the greatest value (max keeps its second operand,
// the running one, over a NaN), then the first index holding it (-0 and +0
// compare equal, and the scalar loop keeps the first of them too). A
// recognizer's rows of 6,625 classes made this a measurable share of every
// candidate's measurement.
[[gnu::target("avx512f")]] int64_t first_greatest_avx512(const float* row, int64_t n) {
    if (n < 32 || std::isnan(row[0])) return first_greatest_portable(row, n);
    __m512 greatest = _mm512_set1_ps(row[0]);
    int64_t c = 0;
    for (; c + 16 <= n; c += 16) greatest = _mm512_max_ps(_mm512_loadu_ps(row + c), greatest);
    const auto rest = static_cast<__mmask16>((1u << (n - c)) - 1);
    greatest = _mm512_mask_max_ps(greatest, rest, _mm512_maskz_loadu_ps(rest, row + c), greatest);
    const __m512 value = _mm512_set1_ps(_mm512_reduce_max_ps(greatest));
    for (c = 0; c < n; c += 16) {
        const auto in = static_cast<__mmask16>(c + 16 <= n ? 0xffffu : (1u << (n - c)) - 1);
        if (const __mmask16 hit = _mm512_mask_cmp_ps_mask(in, _mm512_maskz_loadu_ps(in, row + c), value, _CMP_EQ_OQ))
            return c + __builtin_ctz(hit);
    }
    return 0;  // not reached: the greatest value is in the row
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
    if (inner == 1) {  // classes along the last axis: each row contiguous
        static const auto first_greatest =
            __builtin_cpu_supports("avx512f") ? first_greatest_avx512 : first_greatest_portable;
        for (int64_t o = 0; o < outer; ++o)
            out[static_cast<size_t>(o)] = first_greatest(values.data() + o * classes, classes);
        return out;
    }
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
        const bool masked = is_mask(graph, index, tensor) ||
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
            if (row_length(f) == 1)                          // one score a row: its decision
                for (size_t r = 0; r < fv.size(); ++r, ++rows_)
                    agree_ += (fv[r] >= threshold_) == (qv[r] >= threshold_);
            return;
        }
        const auto fa = argmaxes(fv, f.shape(), meaning_.axis, meaning_.flattened),
                   qa = argmaxes(qv, q.shape(), meaning_.axis, meaning_.flattened);
        for (size_t r = 0; r < fa.size(); ++r, ++rows_) agree_ += qa[r] == fa[r];
        if (!decodes_samples(meaning_, f)) return;
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
                                         BatchThreads split, const ReferenceBatches& reference,
                                         std::optional<size_t> reference_variant) {
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
            std::vector<Tensor> own;  // the reference variant's measured outputs on this batch
            run(reference.feeds[b], [&](size_t variant, const std::vector<Tensor>& outputs) {
                if (variant >= variants || given[variant])
                    throw InternalError(
                        fmt::format("variant {} of {} given outputs twice on a batch", variant, variants));
                const bool is_reference = variant == reference_variant;
                if (reference_variant && !is_reference && !given[*reference_variant])
                    throw InternalError(fmt::format("variant {} given outputs before the reference", variant));
                given[variant] = true;
                // Each variant's counts see the batches in order.
                const auto point = std::to_string(variant);
                turns.await(point, b);
                for (size_t k = 0; k < reference.measured.size(); ++k) {
                    const auto& q = checked_output(outputs, reference.measured[k].index, "a reference batch");
                    counts[variant][k].add(reference_variant && !is_reference ? own[k] : reference.outputs[b][k], q);
                    if (is_reference) own.push_back(q);
                }
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

}  // namespace vaiq
