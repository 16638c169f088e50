// The phases after the parameters: emit, check (the target's constraints) and evaluate (the quantized model against the
// float one).
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

void emit_phase(RunState& s) {
    s.quantized = emit_plan(s, s.plan);
    s.report["quantized"] = true;
    s.report["model"]["quantized_tensors"] = s.plan.tensors.size();
    s.report["model"]["nodes_after"] = s.quantized.graph().node_size();
}

// What refinement promised, checked on what was written. The target reads
// standard Q/DQ: a format's own pairs (Vitis Q/DQ, FixNeuron) through the
// format's conversion, where it has one for the model.
void check_phase(RunState& s) {
    check_model(s.quantized);
    if (s.last < Phase::Emit) return;
    // Only a model with the format's own ops is copied (a large model's weights would double).
    const Model* readable = &s.quantized;
    Model native;
    if (s.format->wrote(s.quantized)) {
        native = s.quantized;
        try {
            s.format->to_native(native);
            readable = &native;
        } catch (const InputError&) {  // not for every tensor (32-bit ones): checked as written
        }
    }
    const auto checked = s.target->verify(*readable, s.run);
    if (checked.empty()) return;
    s.report["constraints_written"] = constraints_json(checked, false);
    std::vector<std::string> broken;
    for (const auto& c : checked)
        if (c.violated > 0) broken.push_back(fmt::format("{} on {} of {} nodes", c.name, c.violated, c.checked));
    if (!broken.empty())
        log_warn("the written model breaks device constraints: {} (see the report's constraints_written)",
                 join(broken, "; "));
    else
        log_info("device constraints hold in the written model ({} checks)", checked.size());
}

namespace {

// Bins of a value histogram: fine enough to show a distribution's shape and
// where a range clips it, small enough for a report on a large model.
constexpr int kHistogramBins = 48;

// Every quantized activation's SQNR in the quantized model on one batch, and a
// histogram of its float values spanning the calibrated range, for the HTML report.
nlohmann::json tensor_errors_json(const Model& reference, const Model& quantized, const Batch& batch,
                                  const nlohmann::json& report, int threads) {
    std::map<std::string, std::array<double, 2>> ranges;
    const auto planned = report.find("tensors");
    if (planned != report.end())
        for (const auto& t : *planned)
            if (t.value("role", "") == "activation" && t.contains("range"))
                ranges[t["tensor"].get<std::string>()] = {t["range"][0].get<double>(), t["range"][1].get<double>()};
    std::set<std::string> wanted;
    for (const auto& [name, range] : ranges) wanted.insert(name);
    auto out = nlohmann::json::array();
    if (wanted.empty()) return out;
    compare_tensors(reference, quantized, batch.feeds, threads, wanted, [&](const TensorComparison& c) {
        const auto values = c.reference.data<float>();
        const auto& range = ranges.at(c.tensor);
        double lo = range[0], hi = range[1];
        for (float v : values)
            if (std::isfinite(v)) lo = std::min<double>(lo, v), hi = std::max<double>(hi, v);
        if (!(hi > lo)) hi = lo + 1;
        std::vector<int64_t> counts(kHistogramBins, 0);
        for (float v : values)
            if (std::isfinite(v))
                ++counts[std::clamp(static_cast<int>((v - lo) / (hi - lo) * kHistogramBins), 0, kHistogramBins - 1)];
        out.push_back({{"tensor", c.tensor},
                       {"node", c.node},
                       {"sqnr_db", std::isfinite(c.sqnr_db) ? nlohmann::json(c.sqnr_db) : nlohmann::json(nullptr)},
                       {"histogram", {{"min", lo}, {"max", hi}, {"counts", counts}}}});
        return true;
    });
    return out;
}

// Runs a diagnosis, which explains a result: one that cannot be computed is
// named in the log and in the report's `diagnoses_unavailable`, and the run goes
// on to write its model. Input errors of the run itself were raised before evaluation.
template <class Diagnosis>
void diagnose(RunState& s, const char* what, Diagnosis&& diagnosis) {
    try {
        diagnosis();
    } catch (const std::exception& e) {
        log_warn("{} could not be computed, and is left out of the report: {}", what, e.what());
        s.report["diagnoses_unavailable"].push_back({{"diagnosis", what}, {"error", e.what()}});
    }
}

}  // namespace

// The quantized model against the float one on the evaluation (or calibration)
// data; with a low output SQNR, where the error starts.
void evaluate_phase(RunState& s) {
    // The quantized model's large weights wait on disk while the float model runs:
    // the two models' weights are never in memory together.
    s.parked = std::make_shared<TensorSpool>(0);
    if (const size_t parked = s.parked->park_initializers(s.quantized, size_t{1} << 20))
        log_debug("evaluation: {:.1f} MB of quantized weights parked in a temporary file", parked / 1e6);
    std::unique_ptr<DataReader> eval_data;
    if (s.settings.evaluation_data)
        eval_data = open_data_reader(*s.settings.evaluation_data, s.model, "evaluation data", &s.settings.images);
    std::optional<Tensor> labels;
    if (s.settings.evaluation_labels) labels = read_tensor_file(*s.settings.evaluation_labels);
    // The reference is the model as given, so function-changing preparation (the DPU
    // simulations, ReplaceClip6Relu) counts as error; a model whose inputs preparation
    // changed (NHWC, float16) cannot take the same data and is compared as prepared.
    // When preparation kept the function, the prepared model's outputs calibration
    // computed stand for the given model's: it does not run again.
    // (Calibration keeps them only for a run evaluated on its data.)
    const bool from_calibration = s.float_outputs != nullptr;
    Model given;
    bool as_given = false;
    if (!from_calibration) {
        given = load_model(s.input);
        as_given = same_inputs(given, s.model);
        if (!as_given) {
            given = Model();
            log_info("evaluating against the prepared float model: preparation changed the model's inputs");
        }
    }
    const Model& reference = as_given ? given : float_reference(s);
    auto& data = eval_data ? *eval_data : *s.data;
    const int batches = evaluation_batches(s.settings);
    const Tensor* label_tensor = labels ? &*labels : nullptr;
    if (!from_calibration) s.float_outputs = reference_outputs(reference, data, s.threads, batches);
    const auto evaluation = compare_outputs(*s.float_outputs, s.quantized, data, label_tensor, s.threads, batches);
    if (as_given && !s.function_kept) {    // the prepared model ran on this data in calibration, unless it is held out
        const auto e = s.prepared_outputs  // kept for the batches evaluation compares
                           ? compare_outputs(*s.float_outputs, *s.prepared_outputs)
                           : compare_outputs(*s.float_outputs, float_reference(s), data, nullptr, s.threads, batches);
        report_preparation_error(s, e, eval_data ? "evaluation_data" : "calibration_data");
    }
    s.float_outputs.reset();
    s.prepared_outputs.reset();
    auto& out = s.report["evaluation"] = evaluation.to_json();
    out["reference"] = from_calibration && s.float_outputs_from_input ? "input model, joined into calibration"
                       : from_calibration ? "prepared model (its preparation keeps the function), as calibrated"
                       : as_given         ? "input model"
                                          : "prepared model";
    out["data"] = eval_data ? "evaluation_data" : "calibration_data";
    const bool limited = batches > 0 && evaluation.batches == batches;  // there may be more
    if (limited) out["batches_limit"] = batches;
    log_info("quantized vs float on {} data{}: {}", eval_data ? "evaluation" : "calibration",
             limited ? fmt::format(" (its first {} batches; evaluation_batches: 0 compares all)", batches) : "",
             summary_line(evaluation));
    const double warn_db = s.settings.warn_output_sqnr_db;
    const bool low = std::any_of(evaluation.outputs.begin(), evaluation.outputs.end(),
                                 [&](const auto& o) { return o.sqnr_db < warn_db; });
    if (s.settings.sensitivity_analysis) {
        diagnose(s, "the sensitivity analysis", [&] {
            // The ranking an algorithm asked for (on the plan before it raised
            // anything: what explains its choice), else one over every output.
            const int output_index = s.sensitivity.size() == 1 ? s.sensitivity.begin()->first : kEveryOutput;
            const auto& ranking = sensitivity_of(s, output_index);
            s.report["sensitivity"] = {{"data", "calibration_data"},
                                       {"batches", s.settings.sensitivity_batches},
                                       {"tensors", sensitivity_json(ranking)}};
        });
    }
    data.rewind();
    const bool per_tensor = s.settings.report_html;
    auto batch = low || per_tensor ? data.next() : std::nullopt;
    if (batch && per_tensor)
        diagnose(s, "the per-tensor error",
                 [&] { out["tensors"] = tensor_errors_json(reference, s.quantized, *batch, s.report, s.threads); });
    if (batch && low)
        diagnose(s, "the first diverging tensor", [&] {
            const auto d = first_divergence(reference, s.quantized, batch->feeds, warn_db, s.threads);
            if (d)
                out["first_divergence"] = {
                    {"tensor", d->tensor}, {"node", d->node}, {"sqnr_db", d->sqnr_db}, {"data", batch->source}};
        });
}

}  // namespace vaiq::phases
