#include "pipeline/calibration.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <set>

#include "runtime/executor.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"

namespace vaiq {

CalibrationOutcome calibrate(const Model& model, const DraftPlan& plan, DataReader& data,
                             const std::map<std::string, const Calibrator*>& calibrators, int threads,
                             const std::function<void(int)>& on_batch) {
    CalibrationOutcome outcome;
    const auto observed = plan.observed();
    if (observed.empty()) return outcome;

    // The method that observes a tensor: its own, or that of the tensor taking its range.
    std::map<std::string, const PlannedTensor*> owner;
    for (const auto& t : plan.tensors) {
        if (t.calibrate_method.empty()) continue;
        const auto& source = t.range_from.empty() ? t.tensor : t.range_from;
        if (!owner.count(source) || source == t.tensor) owner[source] = &t;
    }
    std::map<std::string, std::unique_ptr<RangeObserver>> observers;
    std::map<std::string, TensorRange> clamps;
    for (const auto& name : observed) {
        const auto* t = owner.at(name);
        if (t->saturates_outside) clamps[name] = *t->saturates_outside;
        auto it = calibrators.find(t->calibrate_method);
        if (it == calibrators.end())
            throw InternalError(fmt::format("no calibrator for method '{}'", t->calibrate_method));
        observers[name] = it->second->make_observer(name, t->spec);
    }

    runtime::ExecutorOptions options;
    options.threads = threads;
    options.taps.insert(observed.begin(), observed.end());
    runtime::Executor executor(model, options);
    std::set<std::string> not_float;
    data.rewind();
    while (auto batch = data.next()) {
        try {
            executor.run(batch->feeds, observed, [&](const std::string& name, const Tensor& value) {
                if (value.type() != DataType::Float) {
                    not_float.insert(name);
                    return;
                }
                auto clamp = clamps.find(name);
                if (clamp == clamps.end()) {
                    observers.at(name)->observe(value.view<float>());
                    return;
                }
                // The reader saturates outside the interval: observe what it sees.
                Tensor clamped = value;
                for (float& v : clamped.mutable_data<float>())
                    if (!std::isnan(v)) v = std::clamp(v, clamp->second.min, clamp->second.max);
                observers.at(name)->observe(clamped.view<float>());
            });
        } catch (const InputError& e) {
            throw InputError(fmt::format("calibration data {}: {}", batch->source, e.what()));
        }
        ++outcome.batches;
        if (on_batch) on_batch(outcome.batches);
    }
    if (outcome.batches == 0) throw InputError("the calibration data holds no batches");
    for (auto& [name, observer] : observers)
        if (!not_float.count(name)) outcome.results[name] = observer->result();
    // A planned tensor is dropped when the value it is observed through is not float.
    for (const auto& t : plan.tensors) {
        const auto& source = t.range_from.empty() ? t.tensor : t.range_from;
        if (!t.calibrate_method.empty() && not_float.count(source)) outcome.not_float.push_back(t.tensor);
    }
    return outcome;
}

namespace {

// Per-channel (or whole-tensor) extremes of a constant.
std::vector<TensorRange> constant_ranges(const Tensor& data, int axis) {
    const auto values = data.data<float>();
    const auto& shape = data.shape();
    const int64_t channels = axis >= 0 ? shape[axis] : 1;
    int64_t inner = 1;
    if (axis >= 0)
        for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
    std::vector<TensorRange> out(static_cast<size_t>(std::max<int64_t>(channels, 1)),
                                 TensorRange{std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()});
    for (size_t i = 0; i < values.size(); ++i) {
        auto& r = out[axis >= 0 ? (i / inner) % channels : 0];
        r.min = std::min(r.min, values[i]);
        r.max = std::max(r.max, values[i]);
    }
    for (auto& r : out)
        if (r.min > r.max) r = {0.0f, 0.0f};  // an empty tensor
    return out;
}

// A weight's power-of-two position as vai_q_onnx searches it: from the position
// at which nothing overflows, up to four smaller scales, the one of least
// squared error over the weight's values (channel `c` along `axis`, or all).
// The overflow bound counts from the zero point: a constant stored with a
// symmetric uint8 activation type (zero point 128) reaches only 126 steps up,
// not 254, and since the search never tries larger scales, taking 254 would
// halve every such constant (the 3 of a HardSwish became 1.98).
int best_weight_position(const Tensor& data, int axis, size_t c, TensorRange range, const QuantSpec& spec) {
    const auto [qmin, qmax] = integer_range(spec.type, spec.symmetric, spec.reduce_range);
    const auto zp = static_cast<double>(power_of_two_params(range, 0, spec).zero_point[0]);
    const double over = std::max(static_cast<double>(range.min) / (static_cast<double>(qmin) - zp - 0.5),
                                 static_cast<double>(range.max) / (static_cast<double>(qmax) - zp + 0.5));
    const int start = over > 0 ? static_cast<int>(std::clamp(std::floor(-std::log2(over)), -127.0, 123.0)) : 123;
    // The channel's values: blocks of `inner` at a stride of channels x inner.
    const auto values = data.data<float>();
    const auto& shape = data.shape();
    int64_t inner = static_cast<int64_t>(values.size()), channels = 1;
    if (axis >= 0) {
        channels = shape[axis];
        inner = 1;
        for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d) inner *= shape[d];
    }
    const int64_t stride = channels * inner;
    int best = start;
    double best_error = std::numeric_limits<double>::infinity();
    for (int p = start; p <= start + 4; ++p) {
        const auto params = power_of_two_params(range, p, spec);
        const double s = params.scale[0], zp = static_cast<double>(params.zero_point[0]);
        double error = 0;
        for (int64_t block = static_cast<int64_t>(c) * inner; block < static_cast<int64_t>(values.size()); block += stride)
            for (int64_t i = block; i < block + inner; ++i) {
                const double q =
                    std::clamp(std::nearbyint(values[i] / s) + zp, static_cast<double>(qmin), static_cast<double>(qmax));
                const double d = values[i] - (q - zp) * s;
                error += d * d;
            }
        if (error < best_error) {
            best_error = error;
            best = p;
        }
    }
    return best;
}

// An int32 bias takes input scale x weight scale, which with 16- or 32-bit
// inputs or weights can be so small that the bias saturates int32. Such a
// channel's scale is widened just enough (to a power of two when it was one),
// so the bias keeps its value; ONNX Runtime's integer kernels, which need the
// product, do not take those types anyway.
void widen_saturating_bias_scales(const Tensor& bias, TensorQuant& q) {
    const auto ranges = constant_ranges(bias, q.params.axis);
    if (ranges.size() != q.params.scale.size()) return;
    const double limit = static_cast<double>(integer_range(q.params.type).second);
    for (size_t c = 0; c < ranges.size(); ++c) {
        const double absmax = std::max(std::abs(ranges[c].min), std::abs(ranges[c].max));
        const double scale = q.params.scale[c];
        if (absmax / scale <= limit) continue;
        const double needed = absmax / limit;
        int exponent = 0;
        const bool power_of_two = std::frexp(scale, &exponent) == 0.5;
        q.params.scale[c] = static_cast<float>(power_of_two ? std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(needed))))
                                                            : needed * (1 + 1e-6));
    }
}

}  // namespace

QuantPlan compute_parameters(const Model& model, const DraftPlan& plan, const CalibrationOutcome& calibration,
                             std::map<std::string, TensorRange>* ranges) {
    const GraphIndex index(model.graph());
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

    for (const auto* t : order) {
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
        } else if (!t->share_with.empty()) {
            q.params = params_of(t->share_with);
        } else if (t->constant) {
            const auto data = Tensor::from_proto(*index.initializer(t->tensor));
            const int rank = static_cast<int>(data.shape().size());
            int axis = t->spec.per_channel ? t->spec.axis : -1;
            if (axis < 0 && t->spec.per_channel) axis += rank;
            if (axis >= rank) axis = -1;
            const auto channel_ranges = constant_ranges(data, axis);
            for (size_t c = 0; c < channel_ranges.size(); ++c) {
                const auto& r = channel_ranges[c];
                const auto p = t->spec.power_of_two
                                   ? power_of_two_params(r, best_weight_position(data, axis, c, r, t->spec), t->spec)
                                   : compute_quant_params(r, t->spec);
                q.params.type = p.type;
                q.params.scale.push_back(p.scale[0]);
                q.params.zero_point.push_back(p.zero_point[0]);
            }
            q.params.axis = axis;
            q.spec.per_channel = axis >= 0;
            q.spec.axis = std::max(axis, 0);
            if (ranges && axis < 0) (*ranges)[t->tensor] = channel_ranges[0];
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
    }
    return out;
}

}  // namespace vaiq
