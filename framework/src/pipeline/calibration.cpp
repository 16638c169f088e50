#include "pipeline/calibration.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>

#include "data/batch_workers.hpp"
#include "runtime/executor.hpp"
#include "util/progress.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"

namespace vaiq {

std::map<std::string, const PlannedTensor*> observing_tensors(const DraftPlan& plan) {
    std::map<std::string, const PlannedTensor*> owner;
    for (const auto& t : plan.tensors) {
        if (!t.observed()) continue;
        const auto& source = t.range_from.empty() ? t.tensor : t.range_from;
        if (!owner.count(source) || source == t.tensor) owner[source] = &t;
    }
    return owner;
}

Observations make_observers(const DraftPlan& plan) {
    Observations out;
    const auto owners = observing_tensors(plan);
    for (const auto& name : plan.observed()) {
        const auto* t = owners.at(name);
        out.observers[name] = t->calibrator->make_observer(name, t->spec);
    }
    return out;
}

void observe(Observations& into, const Model& model, const DraftPlan& plan, DataReader& data, int threads,
             const std::function<void(int)>& on_batch, const OutputSink& outputs) {
    const auto observed = plan.observed();
    // Activations nothing observes (float quant types, fixed ranges) must be float
    // too; an exporter's shape arithmetic (int64) often has no declared type, so
    // the first batch tells.
    std::vector<std::string> typed = observed;
    for (const auto& t : plan.tensors)
        if (!t.constant && t.role == TensorRole::Activation && !t.observed() && t.share_with.empty())
            typed.push_back(t.tensor);
    if (typed.empty()) return;
    // Block float activations calibrate nothing, but a block that holds an
    // infinity (an attention mask's -inf) turns into NaNs: every batch tells
    // whether they stay finite.
    std::set<std::string> watched;
    for (const auto& t : plan.tensors)
        if (!t.constant && t.role == TensorRole::Activation && is_block_float(t.spec.type) && t.share_with.empty() &&
            !into.not_finite.count(t.tensor))
            watched.insert(t.tensor);
    auto tapped = observed;
    tapped.insert(tapped.end(), watched.begin(), watched.end());

    std::map<std::string, TensorRange> clamps;
    for (const auto& [name, t] : observing_tensors(plan))
        if (t->saturates_outside) clamps[name] = *t->saturates_outside;

    const auto split = batch_threads(threads, model);
    runtime::ExecutorOptions options;
    options.threads = split.threads_each;
    options.taps.insert(typed.begin(), typed.end());
    auto& observers = into.observers;
    // Those only typed, and those observed by order-free observers, may come in NHWC.
    for (const auto& name : typed)
        if (auto it = observers.find(name); it == observers.end() || it->second->order_free())
            options.any_order_taps.insert(name);
    std::mutex not_float;  // guards into.not_float, and into.not_finite for the watched tensors
    // What each observed tensor has held so far. Only the tensor's own turn touches its entry
    // (see batch_workers.hpp), so no lock: the map itself does not change while batches run.
    struct Seen {
        bool values = false;
        bool not_finite = false;
    };
    std::map<std::string, Seen> seen;
    for (const auto& [name, observer] : observers)
        seen[name] = {into.held_values.count(name) > 0, into.not_finite.count(name) > 0};
    std::set<std::string> inputs;
    for (const auto& i : model.graph().input()) inputs.insert(i.name());
    // Each observer sees the batches one at a time and in order (see batch_workers.hpp);
    // different observers may observe at once.
    auto observe_in_turn = [&](BatchTurns& turns, size_t index, const std::string& name, const Tensor& value) {
        if (value.type() != DataType::Float) {
            std::lock_guard lock(not_float);
            into.not_float.insert(name);
            return;
        }
        auto observer = observers.find(name);
        if (observer == observers.end()) {  // only its type was wanted, or whether it stays finite
            const auto v = value.data<float>();
            if (watched.count(name) && !std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); })) {
                std::lock_guard lock(not_float);
                into.not_finite.insert(name);
            }
            return;
        }
        auto clamp = clamps.find(name);
        turns.await(name, index);
        auto& state = seen.at(name);
        if (state.not_finite) return turns.passed(name, index);
        state.values = state.values || value.size() > 0;
        try {
            if (clamp == clamps.end()) {
                observer->second->observe(value.view<float>());
            } else {  // the reader saturates outside the interval: observe what it sees
                Tensor clamped = value;
                for (float& v : clamped.mutable_data<float>())
                    if (!std::isnan(v)) v = std::clamp(v, clamp->second.min, clamp->second.max);
                observer->second->observe(clamped.view<float>());
            }
        } catch (const InputError&) {
            // The calibrators refuse values no range holds. A tensor the model computes that way
            // (an attention mask's -inf) stays float; an input that holds them is bad data.
            const auto v = value.data<float>();
            if (inputs.count(name) || std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); })) throw;
            state.not_finite = true;
        }
        turns.passed(name, index);
    };
    const int first = into.batches;
    data.rewind();
    // Past the first batch only what is observed (or watched) is tapped; nothing: one batch.
    const size_t read = run_batches(data, split.batches, tapped.empty() ? 1 : 0, [&]() -> BatchWork {
        auto executor = std::make_shared<runtime::Executor>(model, options);
        return [&, executor](size_t index, const Batch& batch, BatchTurns& turns) {
            const runtime::Tap tap = [&](const std::string& name, const Tensor& value) {
                observe_in_turn(turns, index, name, value);
            };
            std::vector<Tensor> results;
            try {
                results = executor->run(batch.feeds, index == 0 ? typed : tapped, tap);
            } catch (const InputError& e) {
                throw InputError(fmt::format("calibration data {}: {}", batch.source, e.what()));
            }
            turns.finish(index, [&] {
                if (outputs) outputs(batch, std::move(results));
                ++into.batches;
                report_progress("batch", into.batches - first);
                if (on_batch) on_batch(into.batches);
            });
        };
    });
    if (read == 0) throw InputError("the calibration data holds no batches");
    for (const auto& [name, state] : seen) {
        if (state.values) into.held_values.insert(name);
        if (state.not_finite) into.not_finite.insert(name);
    }
}

CalibrationOutcome conclude(const DraftPlan& plan, const Observations& observations) {
    CalibrationOutcome outcome;
    outcome.batches = observations.batches;
    const auto& not_float = observations.not_float;
    const auto& not_finite = observations.not_finite;
    std::set<std::string> empty;
    for (const auto& [name, observer] : observations.observers)
        if (!not_float.count(name) && !not_finite.count(name)) {
            if (observations.batches > 0 && !observations.held_values.count(name)) {
                empty.insert(name);  // every batch held none of it: no range to conclude
                continue;
            }
            outcome.results[name] = observer->result();
        }
    // A planned tensor is dropped when the value it is observed through is not float, or held no finite range.
    for (const auto& t : plan.tensors) {
        const auto& source = t.range_from.empty() ? t.tensor : t.range_from;
        if ((t.observed() && not_float.count(source)) || (!t.observed() && not_float.count(t.tensor)))
            outcome.not_float.push_back(t.tensor);
        else if (not_finite.count(source))  // observed itself, or taking its range from one that was
            outcome.not_finite.push_back(t.tensor);
        else if (empty.count(source))
            outcome.empty.push_back(t.tensor);
    }
    return outcome;
}

CalibrationOutcome calibrate(const Model& model, const DraftPlan& plan, DataReader& data, int threads,
                             const std::function<void(int)>& on_batch) {
    auto observations = make_observers(plan);
    observe(observations, model, plan, data, threads, on_batch);
    return conclude(plan, observations);
}

namespace {

// An int32 bias takes input scale x weight scale, which with 16- or 32-bit
// inputs or weights can be so small that the bias saturates int32. Such a
// channel's scale is widened just enough (to a power of two when it was one),
// so the bias keeps its value; ONNX Runtime's integer kernels, which need the
// product, do not take those types anyway.
void widen_saturating_bias_scales(const Tensor& bias, TensorQuant& q) {
    const auto ranges = channel_ranges(bias, q.params.axis);
    if (ranges.size() != q.params.scale.size()) return;
    const double limit = static_cast<double>(integer_range(q.params.type).second);
    for (size_t c = 0; c < ranges.size(); ++c) {
        const double absmax = std::max(std::abs(ranges[c].min), std::abs(ranges[c].max));
        const double scale = q.params.scale[c];
        if (absmax / scale <= limit) continue;
        const double needed = absmax / limit;
        int exponent = 0;
        const bool power_of_two = std::frexp(scale, &exponent) == 0.5;
        q.params.scale[c] = static_cast<float>(
            power_of_two ? std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(needed)))) : needed * (1 + 1e-6));
    }
}

}  // namespace

QuantPlan compute_parameters(const Model& model, const DraftPlan& plan, const CalibrationOutcome& calibration,
                             std::map<std::string, TensorRange>* ranges, ConstantParamsCache* constants) {
    const GraphIndex index(model.graph());
    // A weight's parameters from its values, with its spec as they took it
    // (per channel only along an axis it has).
    auto weight_params = [&](const PlannedTensor& t) -> std::pair<QuantSpec, QuantParams> {
        if (constants)
            if (const auto it = constants->weights.find(t.tensor);
                it != constants->weights.end() && it->second.planned == t.spec && it->second.calibrator == t.calibrator)
                return {it->second.spec, it->second.params};
        auto spec = t.spec;
        QuantParams params;
        if (t.spec.block_size > 0) {
            // A float16 weight's blocks are measured in float (its scales are written back in float16).
            const auto data = convert_float_type(Tensor::from_proto(*index.initializer(t.tensor)), DataType::Float);
            params = t.calibrator ? t.calibrator->constant_params(data, spec) : constant_params(data, spec);
        } else {
            const auto data = Tensor::from_proto(*index.initializer(t.tensor));
            const int rank = static_cast<int>(data.shape().size());
            int axis = t.spec.per_channel ? t.spec.axis : -1;
            if (axis < 0 && t.spec.per_channel) axis += rank;
            if (axis >= rank) axis = -1;
            spec.per_channel = axis >= 0;
            spec.axis = std::max(axis, 0);
            params = t.calibrator ? t.calibrator->constant_params(data, spec) : constant_params(data, spec);
            params.axis = axis;
        }
        if (constants) constants->weights[t.tensor] = {t.spec, t.calibrator, spec, params};
        return {spec, params};
    };
    QuantPlan out;
    std::map<std::string, size_t> position;
    auto params_of = [&](const std::string& tensor) -> const QuantParams& {
        auto it = position.find(tensor);
        if (it == position.end()) throw InternalError(fmt::format("'{}' has no parameters yet", tensor));
        return out.tensors[it->second].params;
    };
    // Biases depend on their input's and weight's parameters; do them last.
    std::vector<const PlannedTensor*> order;
    for (const auto& t : plan.tensors)
        if (t.bias_input.empty()) order.push_back(&t);
    for (const auto& t : plan.tensors)
        if (!t.bias_input.empty()) order.push_back(&t);

    for (const auto* t : order) try {
            TensorQuant q{t->tensor, t->role, t->spec, {}};
            if (!t->bias_input.empty()) {
                const auto& in = params_of(t->bias_input);
                const auto& w = params_of(t->bias_weight);
                q.params.type = t->spec.type;
                for (float ws : w.scale) {
                    q.params.scale.push_back(in.scale[0] * ws);
                    q.params.zero_point.push_back(0);
                }
                q.params.axis = w.axis >= 0 ? 0 : -1;
                widen_saturating_bias_scales(Tensor::from_proto(*index.initializer(t->tensor)), q);
            } else if (t->given) {
                q.params = *t->given;
            } else if (t->spec.dynamic) {
                q.params.type = t->spec.type;  // DynamicQuantizeLinear's at run time
            } else if (!t->share_with.empty()) {
                q.params = params_of(t->share_with);
            } else if (t->constant) {
                std::tie(q.spec, q.params) = weight_params(*t);
                if (ranges && q.params.axis < 0 && t->spec.block_size == 0)
                    (*ranges)[t->tensor] = channel_ranges(Tensor::from_proto(*index.initializer(t->tensor)), -1)[0];
            } else {
                TensorRange range;
                if (t->fixed_range) {
                    range = *t->fixed_range;
                } else {
                    const auto& source = t->range_from.empty() ? t->tensor : t->range_from;
                    auto it = calibration.results.find(source);
                    if (it == calibration.results.end())
                        throw InternalError(fmt::format("tensor '{}' was planned but never calibrated", source));
                    range = it->second.range;
                }
                if (ranges) (*ranges)[t->tensor] = range;
                const auto& source = t->range_from.empty() ? t->tensor : t->range_from;
                const auto it = calibration.results.find(source);
                const bool positioned = !t->fixed_range && it != calibration.results.end() && it->second.position;
                q.params = positioned ? power_of_two_params(range, *it->second.position, t->spec)
                                      : compute_quant_params(range, t->spec);
            }
            position[t->tensor] = out.tensors.size();
            out.tensors.push_back(std::move(q));
        } catch (const InputError& e) {
            throw InputError(fmt::format("tensor '{}': {}", t->tensor, e.what()));
        }
    return out;
}

}  // namespace vaiq
