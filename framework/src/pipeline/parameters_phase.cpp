// The parameters phase: the plan computed, then the algorithm plugins run on it through their context.
#include "pipeline/run_state.hpp"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>

#include "data/batch_workers.hpp"
#include "data/data_reader.hpp"
#include "data/statistics_file.hpp"
#include "pipeline/algorithm_context.hpp"
#include "pipeline/calibration.hpp"
#include "pipeline/channel_ranges.hpp"
#include "pipeline/fragile_inputs.hpp"
#include "pipeline/joined_reference.hpp"
#include "pipeline/mixed_scale.hpp"
#include "pipeline/planner.hpp"
#include "pipeline/preprocess.hpp"
#include "pipeline/selection.hpp"
#include "recipe/defaults.hpp"
#include "report/diagnosis.hpp"
#include "report/dump.hpp"
#include "report/evaluation.hpp"
#include "report/html_report.hpp"
#include "report/sensitivity.hpp"
#include "sdk/atomic_file.hpp"
#include "sdk/npy.hpp"
#include "sdk/text.hpp"
#include "util/model_size.hpp"
#include "util/progress.hpp"
#include "util/spool.hpp"
#include "vaiq/error.hpp"
#include "vaiq/log.hpp"

namespace fs = std::filesystem;

namespace vaiq::phases {

// The fitted weights that `plan` still quantizes as they were fitted: a weight
// whose parameters changed since (a recomputed plan refined anew, a tensor
// raised) is rounded to nearest on its new grid instead.
std::map<std::string, Tensor> rounded_for(const RunState& s, const QuantPlan& plan) {
    auto same = [](const QuantParams& a, const QuantParams& b) {
        return a.type == b.type && a.scale == b.scale && a.zero_point == b.zero_point && a.axis == b.axis &&
               a.block_size == b.block_size;
    };
    std::map<std::string, Tensor> out;
    for (const auto& [name, value] : s.rounded_weights) {
        const auto* t = plan.find(name);
        const auto fitted = s.rounded_on.find(name);
        if (t && fitted != s.rounded_on.end() && same(t->params, fitted->second)) out.emplace(name, value);
    }
    return out;
}

// The prepared float model with `plan` written into it by the run's format,
// the `rounded` weights in place of the float ones.
Model emit_plan(RunState& s, const QuantPlan& plan, const std::map<std::string, Tensor>& rounded) {
    if (!s.format) s.format = s.registry.create<Format>(s.plugins.format.info->name, s.plugins.format.options);
    Model out = s.model;
    for (auto& init : *out.graph().mutable_initializer())
        if (auto it = rounded.find(init.name()); it != rounded.end()) init = it->second.to_proto(init.name());
    s.format->emit(out, plan);
    return out;
}

// The same with the run's fitted weights that `plan` still applies to.
Model emit_plan(RunState& s, const QuantPlan& plan) { return emit_plan(s, plan, rounded_for(s, plan)); }

// What quantized candidates are measured against: the prepared float model.
const Model& float_reference(const RunState& s) { return s.uncorrected ? *s.uncorrected : s.model; }

// Every tensor of the plan measured on the calibration data (so that
// evaluation_data stays held out), most harmful first; computed once per output.
const std::vector<TensorSensitivity>& sensitivity_of(RunState& s, int output_index) {
    if (auto it = s.sensitivity.find(output_index); it != s.sensitivity.end()) return it->second;
    const int batches = static_cast<int>(s.settings.sensitivity_batches);
    const int max_tensors = s.settings.sensitivity_tensors ? static_cast<int>(*s.settings.sensitivity_tensors) : -1;
    log_info("sensitivity analysis: {} tensors, each on {} batches", s.plan.tensors.size(),
             batches > 0 ? std::to_string(batches) : "all");
    size_t reported = 0;
    auto ranking = analyze_sensitivity(
        float_reference(s), s.model, s.plan, [&](const QuantPlan& plan) { return emit_plan(s, plan); },
        rounded_for(s, s.plan), *s.data, batches, output_index, s.threads,
        [&](size_t done, size_t total) {
            report_progress("measurement", static_cast<int64_t>(done), static_cast<int64_t>(total));
            if (done * 10 / total == reported) return;
            reported = done * 10 / total;
            log_info("sensitivity analysis: {} of {} measurements (a tensor on a batch)", done, total);
        },
        max_tensors);
    for (auto& t : ranking)
        t.mixed_scales = std::find(s.mixed_scales.begin(), s.mixed_scales.end(), t.tensor) != s.mixed_scales.end();
    return s.sensitivity.emplace(output_index, std::move(ranking)).first->second;
}

namespace {

// The plan computed from the calibration and `draft`, with the parameters the
// algorithms chose and the target's constraints (counted in `refined`).
QuantPlan plan_of(RunState& s, const DraftPlan& draft, std::map<std::string, TensorRange>* ranges,
                  std::vector<ConstraintCount>* refined) {
    auto plan = compute_parameters(s.model, draft, s.calibration, ranges, &s.constant_params);
    for (auto& t : plan.tensors)
        if (auto it = s.chosen_params.find(t.tensor); it != s.chosen_params.end()) t.params = it->second;
    auto counts = s.target->refine(s.model, plan, s.run);
    if (refined) *refined = std::move(counts);
    return plan;
}

// The run's plan computed anew (after a change to its draft, parameters or float model).
void recompute_plan(RunState& s) {
    s.ranges.clear();
    s.plan = plan_of(s, s.draft, &s.ranges, &s.refined);
}

// The float model's outputs on the calibration data for AlgorithmContext::agreement(),
// computed once per output and split into the batch sets (vaiq::in_batch_set).
const ReferenceBatches& agreement_reference(RunState& s, int output_index, BatchSet batches) {
    auto key = std::make_pair(output_index, batches);
    if (auto it = s.agreement_references.find(key); it != s.agreement_references.end()) return it->second;
    if (batches == BatchSet::All) {
        auto all = reference_batches(float_reference(s), *s.data, 0, output_index, s.threads);
        return s.agreement_references.emplace(key, std::move(all)).first->second;
    }
    const auto& all = agreement_reference(s, output_index, BatchSet::All);
    ReferenceBatches part = all;
    part.feeds.clear(), part.outputs.clear();
    for (size_t b = 0; b < all.feeds.size(); ++b) {
        if (!in_batch_set(b, all.feeds.size(), batches)) continue;
        part.feeds.push_back(all.feeds[b]);
        part.outputs.push_back(all.outputs[b]);
    }
    return s.agreement_references.emplace(key, std::move(part)).first->second;
}

// Algorithm `algorithm` gives `tensor` new parameters: the same form as those
// calibration gave (type, count, axis), so the format and the target take them.
void choose_parameters(RunState& s, const std::string& algorithm, const std::string& tensor,
                       const QuantParams& params) {
    auto it = std::find_if(s.plan.tensors.begin(), s.plan.tensors.end(),
                           [&](const TensorQuant& t) { return t.tensor == tensor; });
    if (it == s.plan.tensors.end())
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
    s.chosen_params[tensor] = params;
}

// The instance of algorithm `name` for try_algorithm() by `asked_by`: the run's
// own, or one of those it may try, created the first time.
Algorithm& algorithm_named(RunState& s, const std::string& name, const std::string& asked_by) {
    const auto& declared = s.registry.require(PluginKind::Algorithm, asked_by).may_try;
    if (std::find(declared.begin(), declared.end(), name) == declared.end())
        throw InputError(
            fmt::format("algorithm '{}' tried '{}', which its descriptor's may_try does not list", asked_by, name));
    for (size_t a = 0; a < s.algorithms.size(); ++a)
        if (s.plugins.algorithms[a].info->name == name) return *s.algorithms[a];
    auto& instance = s.tried[name];
    for (const auto& choice : s.plugins.tried)
        if (!instance && choice.info->name == name) instance = s.registry.create<Algorithm>(name, choice.options);
    if (!instance) throw InternalError(fmt::format("algorithm '{}' was not resolved for '{}'", name, asked_by));
    return *instance;
}

// Runs algorithm `other` for algorithm `name` and keeps what it changed only if `keep()` says so.
bool try_algorithm(RunState& s, const std::string& name, const std::string& other, const std::function<bool()>& keep) {
    if (other == name) throw InternalError(fmt::format("algorithm '{}' tried itself", name));
    auto& algorithm = algorithm_named(s, other, name);
    if (algorithm.stage() != AlgorithmStage::Parameters)
        throw InputError(fmt::format("algorithm '{}' tried '{}', which does not work on the plan", name, other));
    const auto weights = s.rounded_weights;
    const auto on = s.rounded_on;
    const auto params = s.chosen_params;
    const auto draft = s.draft;
    const bool reported = s.report.contains(other);
    run_algorithm(s, algorithm, other, AlgorithmStage::Parameters);
    if (keep()) return true;
    s.rounded_weights = weights, s.rounded_on = on, s.chosen_params = params, s.draft = draft;
    recompute_plan(s);
    if (!reported) s.report.erase(other);
    return false;
}

// The services of the calibrated run (Parameters and Corrections stages).
void offer_plan_services(RunState& s, AlgorithmInputs& inputs, const std::string& name, AlgorithmStage stage) {
    inputs.agreement = [&s](const Model& quantized, int output_index, BatchSet batches) {
        return measure_output(quantized, agreement_reference(s, output_index, batches), s.threads);
    };
    inputs.agreements = [&s](size_t variants, const Model& compiled, const std::function<VariantRun(int)>& make_run,
                             int output_index, BatchSet batches) {
        return measure_outputs(variants, make_run, batch_threads(s.threads, compiled),
                               agreement_reference(s, output_index, batches));
    };
    inputs.measured_output = [&s](int output_index) {
        const auto& reference = agreement_reference(s, output_index, BatchSet::All);
        return MeasuredOutput{reference.describe_outputs(), reference.describe_measures()};
    };
    inputs.sensitivity = [&s](int output_index) { return sensitivity_of(s, output_index); };
    if (stage == AlgorithmStage::Corrections) {
        inputs.replace_initializers = [&s](std::map<std::string, Tensor> values) {
            if (!s.uncorrected) s.uncorrected = s.model;
            s.constant_params.weights.clear();
            for (auto& init : *s.model.graph().mutable_initializer())
                if (auto it = values.find(init.name()); it != values.end()) init = it->second.to_proto(init.name());
        };
        return;
    }
    inputs.target_runs = [&s](QuantType activation, QuantType weight) {
        QuantRequest request = s.run;
        request.activation_type = activation;
        request.weight_type = weight;
        try {
            s.target->check(request);
            return true;
        } catch (const InputError&) {
            return false;
        }
    };
    inputs.raised_plan = [&s](const std::set<std::string>& tensors, const Precision& precision, size_t* count) {
        return plan_of(s, raise_tensors(s.model, s.draft, tensors, precision, count), nullptr, nullptr);
    };
    inputs.set_precision = [&s](const std::set<std::string>& tensors, const Precision& precision) {
        s.draft = raise_tensors(s.model, s.draft, tensors, precision, nullptr);
        recompute_plan(s);
    };
    inputs.try_algorithm = [&s, name](const std::string& other, const std::function<bool()>& keep) {
        return try_algorithm(s, name, other, keep);
    };
}

}  // namespace

void run_algorithm(RunState& s, Algorithm& algorithm, const std::string& name, AlgorithmStage stage) {
    const bool prepare = stage == AlgorithmStage::Prepare;
    // Before calibration the reader is opened for the model as preparation left it.
    if (prepare) s.data = calibration_reader(s.settings, s.options, s.model);
    AlgorithmInputs inputs(s.model, s.plan, *s.data, s.threads);
    inputs.fitted_weights = [&s] { return rounded_for(s, s.plan); };
    inputs.emit = [&s](const QuantPlan& plan, const std::map<std::string, Tensor>& weights) {
        return emit_plan(s, plan, weights);
    };
    inputs.keep_fitted = [&s](std::map<std::string, Tensor> weights) {
        for (auto& [weight, value] : weights) {
            const auto* t = s.plan.find(weight);
            if (!t) continue;  // not quantized: nothing to fit
            s.rounded_on[weight] = t->params;
            s.rounded_weights[weight] = std::move(value);
        }
    };
    inputs.keep_parameters = [&s, name](const std::string& tensor, const QuantParams& params) {
        choose_parameters(s, name, tensor, params);
    };
    inputs.report = [&s, name](nlohmann::json section) { s.report[name] = std::move(section); };
    inputs.runs = [&s](const std::string& other) {
        return std::any_of(s.plugins.algorithms.begin(), s.plugins.algorithms.end(),
                           [&](const PluginChoice& c) { return c.info->name == other; });
    };
    inputs.quantized_nodes = [&s] {
        std::set<std::string> out;
        for (const auto& d : decide_nodes(s.recipe, s.model, *s.target))
            if (d.quantized) out.insert(d.name);
        return out;
    };
    inputs.default_spec = [&s](TensorRole role) { return s.target->default_spec(role, s.run); };
    if (prepare)
        inputs.replace_model = [&s, name](Model model) {
            if (input_signature(model) != input_signature(s.model))
                throw InternalError(fmt::format("algorithm '{}' changed the model's inputs", name));
            s.model = std::move(model);
            s.constant_params.weights.clear();
            s.function_kept = false;  // kept in exact arithmetic, but counted as not, as CLE is
        };
    else
        offer_plan_services(s, inputs, name, stage);
    HostAlgorithmContext context(std::move(inputs));
    algorithm.run(context);
}

// The algorithm plugins of `stage`, in the recipe's order.
void run_algorithms(RunState& s, AlgorithmStage stage) {
    for (size_t a = 0; a < s.algorithms.size(); ++a)
        if (s.algorithms[a]->stage() == stage)
            run_algorithm(s, *s.algorithms[a], s.plugins.algorithms[a].info->name, stage);
}

void parameters_phase(RunState& s) {
    recompute_plan(s);
    run_algorithms(s, AlgorithmStage::Precision);  // before the weights are fitted at the precisions
    run_algorithms(s, AlgorithmStage::Parameters);
    if (!s.chosen_params.empty()) recompute_plan(s);  // the target's constraints on what they chose
    // Last: the corrections are for the weights' final types and values.
    run_algorithms(s, AlgorithmStage::Corrections);
    if (s.uncorrected) recompute_plan(s);
    if (!s.refined.empty()) s.report["constraints"] = constraints_json(s.refined, true);
    s.report["tensors"] = nlohmann::json::array();
    for (const auto& t : s.plan.tensors) s.report["tensors"].push_back(params_json(t, s.ranges));
}

}  // namespace vaiq::phases
