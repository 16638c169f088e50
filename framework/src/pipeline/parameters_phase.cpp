// The parameters phase: the plan computed, then the algorithm plugins run on it through their context.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "data/batch_workers.hpp"
#include "pipeline/algorithm_context.hpp"
#include "pipeline/run_state.hpp"
#include "pipeline/selection.hpp"
#include "util/progress.hpp"
#include "vaiq/error.hpp"
#include "vaiq/log.hpp"

namespace vaiq::phases {

std::map<std::string, Tensor> rounded_for(const Planning& planning, const QuantPlan& plan) {
    auto same = [](const QuantParams& a, const QuantParams& b) {
        return a.type == b.type && a.scale == b.scale && a.zero_point == b.zero_point && a.axis == b.axis &&
               a.block_size == b.block_size;
    };
    std::map<std::string, Tensor> out;
    for (const auto& [name, value] : planning.rounded_weights) {
        const auto* t = plan.find(name);
        const auto fitted = planning.rounded_on.find(name);
        if (t && fitted != planning.rounded_on.end() && same(t->params, fitted->second)) out.emplace(name, value);
    }
    return out;
}

Model emit_plan(RunSetup& setup, const Model& model, const QuantPlan& plan,
                const std::map<std::string, Tensor>& rounded) {
    Model out = model;
    for (auto& init : *out.graph().mutable_initializer())
        if (auto it = rounded.find(init.name()); it != rounded.end()) init = it->second.to_proto(init.name());
    setup.format().emit(out, plan);
    return out;
}

namespace {

// The plan computed from the calibration and `draft`, with the parameters the
// algorithms chose and the target's constraints (counted in `refined`).
QuantPlan plan_of(RunState& s, const DraftPlan& draft, std::map<std::string, TensorRange>* ranges,
                  std::vector<ConstraintCount>* refined) {
    auto plan = compute_parameters(s.floats.model, draft, s.calibrated.outcome, ranges, &s.planning.constant_params);
    for (auto& t : plan.tensors)
        if (auto it = s.planning.chosen_params.find(t.tensor); it != s.planning.chosen_params.end())
            t.params = it->second;
    auto counts = s.setup.target->refine(s.floats.model, plan, s.setup.run);
    if (refined) *refined = std::move(counts);
    return plan;
}

// The run's plan computed anew (after a change to its draft, parameters or float model).
void recompute_plan(RunState& s) {
    s.planning.ranges.clear();
    s.planning.plan = plan_of(s, s.planning.draft, &s.planning.ranges, &s.planning.refined);
}

// The float model's outputs on the calibration data for AlgorithmContext::agreement(),
// computed once per output and split into the batch sets (vaiq::in_batch_set).
const ReferenceBatches& agreement_reference(RunState& s, int output_index, Batches batches) {
    auto key = std::make_tuple(output_index, batches.set, batches.first);
    if (auto it = s.calibrated.agreement_references.find(key); it != s.calibrated.agreement_references.end())
        return it->second;
    if (batches.set == BatchSet::All && batches.first == 0) {
        auto all = reference_batches(s.floats.reference(), *s.calibrated.data, 0, output_index, s.setup.threads);
        return s.calibrated.agreement_references.emplace(key, std::move(all)).first->second;
    }
    const auto& all = agreement_reference(s, output_index, BatchSet::All);
    ReferenceBatches part = all;
    part.feeds.clear(), part.outputs.clear();
    for (size_t b = 0; b < all.feeds.size(); ++b) {
        if (!in_batch_set(b, all.feeds.size(), batches.set)) continue;
        if (batches.first > 0 && part.feeds.size() == batches.first) break;
        part.feeds.push_back(all.feeds[b]);
        part.outputs.push_back(all.outputs[b]);
    }
    return s.calibrated.agreement_references.emplace(key, std::move(part)).first->second;
}

// Algorithm `algorithm` gives `tensor` new parameters: the same form as those
// calibration gave (type, count, axis), so the format and the target take them.
void choose_parameters(RunState& s, const std::string& algorithm, const std::string& tensor,
                       const QuantParams& params) {
    auto it = std::find_if(s.planning.plan.tensors.begin(), s.planning.plan.tensors.end(),
                           [&](const TensorQuant& t) { return t.tensor == tensor; });
    if (it == s.planning.plan.tensors.end())
        throw InputError(fmt::format("algorithm '{}' chose parameters for '{}', which the plan does not quantize",
                                     algorithm, tensor));
    const auto& old = it->params;
    const bool same_form = params.type == old.type && params.scale.size() == old.scale.size() &&
                           params.zero_point.size() == old.zero_point.size() && params.axis == old.axis &&
                           params.block_size == old.block_size;
    const bool scales_ok =
        std::all_of(params.scale.begin(), params.scale.end(), [](float v) { return std::isfinite(v) && v > 0; }) &&
        (params.float_zero_point.empty() || params.float_zero_point.size() == params.scale.size()) &&
        std::all_of(params.float_zero_point.begin(), params.float_zero_point.end(),
                    [](float v) { return std::isfinite(v); });
    if (!same_form || !scales_ok)
        throw InputError(
            fmt::format("algorithm '{}' chose parameters for '{}' of another form than calibration's "
                        "({} {} scales, axis {}) or with a scale that is not finite and positive (or a float "
                        "zero point that is not finite, or not one a scale)",
                        algorithm, tensor, quant_type_name(old.type), old.scale.size(), old.axis));
    it->params = params;
    s.planning.chosen_params[tensor] = params;
}

// The instance of algorithm `name` for try_algorithm() by `asked_by`: the run's
// own, or one of those it may try, created the first time.
Algorithm& algorithm_named(RunState& s, const std::string& name, const std::string& asked_by) {
    const auto& declared = s.setup.registry.require(PluginKind::Algorithm, asked_by).may_try;
    if (std::find(declared.begin(), declared.end(), name) == declared.end())
        throw InputError(
            fmt::format("algorithm '{}' tried '{}', which its descriptor's may_try does not list", asked_by, name));
    for (size_t a = 0; a < s.setup.algorithms.size(); ++a)
        if (s.setup.plugins.algorithms[a].info->name == name) return *s.setup.algorithms[a];
    auto& instance = s.setup.tried[name];
    for (const auto& choice : s.setup.plugins.tried)
        if (!instance && choice.info->name == name) instance = s.setup.registry.create<Algorithm>(name, choice.options);
    if (!instance) throw InternalError(fmt::format("algorithm '{}' was not resolved for '{}'", name, asked_by));
    return *instance;
}

// Runs algorithm `other` for algorithm `name` and keeps what it changed only if `keep()` says so.
bool try_algorithm(RunState& s, const std::string& name, const std::string& other, const std::function<bool()>& keep) {
    if (other == name) throw InternalError(fmt::format("algorithm '{}' tried itself", name));
    auto& algorithm = algorithm_named(s, other, name);
    if (algorithm.stage() != AlgorithmStage::Parameters)
        throw InputError(fmt::format("algorithm '{}' tried '{}', which does not work on the plan", name, other));
    const auto weights = s.planning.rounded_weights;
    const auto on = s.planning.rounded_on;
    const auto params = s.planning.chosen_params;
    const auto draft = s.planning.draft;
    const bool reported = s.report.contains(other);
    run_algorithm(s, algorithm, other, AlgorithmStage::Parameters);
    if (keep()) return true;
    s.planning.rounded_weights = weights, s.planning.rounded_on = on, s.planning.chosen_params = params,
    s.planning.draft = draft;
    recompute_plan(s);
    if (!reported) s.report.erase(other);
    return false;
}

// The services of the calibrated run (Parameters and Corrections stages).
void offer_plan_services(RunState& s, AlgorithmInputs& inputs, const std::string& name, AlgorithmStage stage) {
    inputs.agreement = [&s](const Model& quantized, int output_index, Batches batches) {
        return measure_output(quantized, agreement_reference(s, output_index, batches), s.setup.threads);
    };
    inputs.agreements = [&s](size_t variants, const Model& compiled, const std::function<VariantRun(int)>& make_run,
                             int output_index, Batches batches, std::optional<size_t> reference_variant) {
        return measure_outputs(variants, make_run, batch_threads(s.setup.threads, compiled),
                               agreement_reference(s, output_index, batches), reference_variant);
    };
    inputs.measured_output = [&s](int output_index) {
        const auto& reference = agreement_reference(s, output_index, BatchSet::All);
        return MeasuredOutput{reference.describe_outputs(), reference.describe_measures(), reference.decodes_samples()};
    };
    if (stage == AlgorithmStage::Corrections) {
        inputs.replace_initializers = [&s](std::map<std::string, Tensor> values) {
            if (!s.floats.uncorrected) s.floats.uncorrected = s.floats.model;
            s.planning.constant_params.weights.clear();
            for (auto& init : *s.floats.model.graph().mutable_initializer())
                if (auto it = values.find(init.name()); it != values.end()) init = it->second.to_proto(init.name());
        };
        return;
    }
    inputs.target_runs = [&s](QuantType activation, QuantType weight) {
        QuantRequest request = s.setup.run;
        request.activation_type = activation;
        request.weight_type = weight;
        try {
            s.setup.target->check(request);
            return true;
        } catch (const InputError&) {
            return false;
        }
    };
    inputs.raised_plan = [&s](const std::set<std::string>& tensors, const Precision& precision, size_t* count) {
        return plan_of(s, raise_tensors(s.floats.model, s.planning.draft, tensors, precision, count), nullptr, nullptr);
    };
    inputs.set_precision = [&s](const std::set<std::string>& tensors, const Precision& precision) {
        s.planning.draft = raise_tensors(s.floats.model, s.planning.draft, tensors, precision, nullptr);
        recompute_plan(s);
    };
    inputs.try_algorithm = [&s, name](const std::string& other, const std::function<bool()>& keep) {
        return try_algorithm(s, name, other, keep);
    };
}

// Whether the Written stage has data: a run calibrated from statistics files
// alone has only the random data its evaluation runs on.
bool written_model_measurable(const RunState& s) {
    return s.calibrated.data &&
           (has_calibration_data(s.setup.settings, s.setup.options) || s.setup.options.calibration_files.empty());
}

// The services of the written model (Written stage).
void offer_written_services(RunState& s, AlgorithmInputs& inputs) {
    inputs.data_kept_bytes = 0;  // one pass
    inputs.written = [&s]() -> Model& { return s.written.quantized; };
    inputs.quantize_nested = [&s](const Model& model, DataReader& data, const nlohmann::json& shared_inputs,
                                  const nlohmann::json& shared_outputs) {
        return quantize_nested(s.setup.recipe, s.setup.nested, model, data, shared_inputs, shared_outputs);
    };
}

}  // namespace

void run_algorithm(RunState& s, Algorithm& algorithm, const std::string& name, AlgorithmStage stage) {
    const bool prepare = stage == AlgorithmStage::Prepare, plan = stage == AlgorithmStage::Plan,
               written = stage == AlgorithmStage::Written;
    // Before calibration the reader is opened for the model as preparation left it.
    if (prepare) s.calibrated.data = calibration_reader(s.setup, s.floats.model);
    const bool measurable = plan ? data_decides_plan(s.setup) : written ? written_model_measurable(s) : true;
    if (plan && measurable && !s.calibrated.data) s.calibrated.data = calibration_reader(s.setup, s.floats.model);
    const auto none = measurable ? nullptr : no_data();
    AlgorithmInputs inputs(s.floats.model, s.planning.plan, none ? *none : *s.calibrated.data, s.setup.threads);
    inputs.measurable = measurable;
    inputs.fitted_weights = [&s] { return rounded_for(s.planning, s.planning.plan); };
    inputs.emit = [&s](const QuantPlan& plan, const std::map<std::string, Tensor>& weights) {
        return emit_plan(s.setup, s.floats.model, plan, weights);
    };
    inputs.keep_fitted = [&s](std::map<std::string, Tensor> weights) {
        for (auto& [weight, value] : weights) {
            const auto* t = s.planning.plan.find(weight);
            if (!t) continue;  // not quantized: nothing to fit
            s.planning.rounded_on[weight] = t->params;
            s.planning.rounded_weights[weight] = std::move(value);
        }
    };
    inputs.keep_parameters = [&s, name](const std::string& tensor, const QuantParams& params) {
        choose_parameters(s, name, tensor, params);
    };
    inputs.report = [&s, name](nlohmann::json section) { s.report[name] = std::move(section); };
    inputs.mixed_scale_tensors = [&s] {
        return std::set<std::string>(s.planning.mixed_scales.begin(), s.planning.mixed_scales.end());
    };
    inputs.reported = [&s](const std::string& algorithm) { return s.report.value(algorithm, nlohmann::json()); };
    inputs.note = [&s, name](const std::string& tensor, std::string text) {
        s.report["notes"].push_back({{"tensor", tensor}, {"by", name}, {"note", std::move(text)}});
    };
    inputs.runs = [&s](const std::string& other) {
        return std::any_of(s.setup.plugins.algorithms.begin(), s.setup.plugins.algorithms.end(),
                           [&](const PluginChoice& c) { return c.info->name == other; });
    };
    inputs.quantized_nodes = [&s] {
        std::set<std::string> out;
        for (const auto& d : decide_nodes(s.setup.recipe, s.floats.model, *s.setup.target))
            if (d.quantized) out.insert(d.name);
        return out;
    };
    inputs.default_spec = [&s](TensorRole role) { return s.setup.target->default_spec(role, s.setup.run); };
    if (prepare)
        inputs.replace_model = [&s, name](Model model) {
            if (input_signature(model) != input_signature(s.floats.model))
                throw InternalError(fmt::format("algorithm '{}' changed the model's inputs", name));
            s.floats.model = std::move(model);
            s.planning.constant_params.weights.clear();
            s.floats.function_kept = false;  // kept in exact arithmetic, but counted as not, as CLE is
        };
    else if (plan)
        offer_draft_services(s, inputs);
    else if (written)
        offer_written_services(s, inputs);
    else
        offer_plan_services(s, inputs, name, stage);
    HostAlgorithmContext context(std::move(inputs));
    algorithm.run(context);
}

// The algorithm plugins of `stage`, in the recipe's order.
void run_algorithms(RunState& s, AlgorithmStage stage) {
    for (size_t a = 0; a < s.setup.algorithms.size(); ++a)
        if (s.setup.algorithms[a]->stage() == stage)
            run_algorithm(s, *s.setup.algorithms[a], s.setup.plugins.algorithms[a].info->name, stage);
}

void parameters_phase(RunState& s) {
    recompute_plan(s);
    run_algorithms(s, AlgorithmStage::Precision);  // before the weights are fitted at the precisions
    run_algorithms(s, AlgorithmStage::Parameters);
    if (!s.planning.chosen_params.empty()) recompute_plan(s);  // the target's constraints on what they chose
    // Last: the corrections are for the weights' final types and values.
    run_algorithms(s, AlgorithmStage::Corrections);
    if (s.floats.uncorrected) recompute_plan(s);
    if (!s.planning.refined.empty()) s.report["constraints"] = constraints_json(s.planning.refined, true);
    s.report["tensors"] = nlohmann::json::array();
    for (const auto& t : s.planning.plan.tensors) s.report["tensors"].push_back(params_json(t, s.planning.ranges));
}

}  // namespace vaiq::phases
