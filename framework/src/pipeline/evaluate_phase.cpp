// The evaluate phase: the quantized model against the float one, with the
// diagnoses that explain a poor result (per-tensor error, where it starts).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <set>

#include "pipeline/run_state.hpp"
#include "report/diagnosis.hpp"
#include "vaiq/log.hpp"
#include "vaiq/reader.hpp"
#include "vaiq/spool.hpp"

namespace vaiq::phases {

namespace {

// Bins of a value histogram: fine enough to show a distribution's shape and
// where a range clips it, small enough for a report on a large model.
constexpr int kHistogramBins = 48;

// A histogram of a tensor's float values spanning (at least) the calibrated `range`.
nlohmann::json value_histogram(const Tensor& value, const std::array<double, 2>& range) {
    const auto values = value.data<float>();
    double lo = range[0], hi = range[1];
    for (float v : values)
        if (std::isfinite(v)) lo = std::min<double>(lo, v), hi = std::max<double>(hi, v);
    if (!(hi > lo)) hi = lo + 1;
    std::vector<int64_t> counts(kHistogramBins, 0);
    for (float v : values)
        if (std::isfinite(v))
            ++counts[std::clamp(static_cast<int>((v - lo) / (hi - lo) * kHistogramBins), 0, kHistogramBins - 1)];
    return {{"min", lo}, {"max", hi}, {"counts", counts}};
}

// One batch's per-tensor diagnoses, from one run of each model: with
// `per_tensor`, every quantized activation's SQNR in the quantized model and a
// histogram of its float values spanning the calibrated range, for the
// report's page (out["tensors"]); with `divergence_below`, the first tensor in
// graph order whose SQNR is below it (out["first_divergence"]).
void tensor_diagnoses(const Model& reference, const Model& quantized, const Batch& batch, const nlohmann::json& report,
                      int threads, bool per_tensor, std::optional<double> divergence_below, nlohmann::json& out) {
    std::map<std::string, std::array<double, 2>> ranges;
    const auto planned = report.find("tensors");
    if (per_tensor && planned != report.end())
        for (const auto& t : *planned)
            if (t.value("role", "") == "activation" && t.contains("range"))
                ranges[t["tensor"].get<std::string>()] = {t["range"][0].get<double>(), t["range"][1].get<double>()};
    // The divergence is looked for among every tensor both models compute; the page shows the planned ones.
    std::set<std::string> wanted;
    if (!divergence_below) {
        for (const auto& [name, range] : ranges) wanted.insert(name);
        if (wanted.empty()) {
            out["tensors"] = nlohmann::json::array();
            return;
        }
    }
    auto tensors = nlohmann::json::array();
    std::optional<Divergence> divergence;
    std::map<std::string, nlohmann::json> histograms;  // made while the float values are at hand
    compare_tensors(
        reference, quantized, batch.feeds, threads, wanted,
        [&](const TensorComparison& c) {
            if (divergence_below && !divergence && c.sqnr_db < *divergence_below)
                divergence = Divergence{c.tensor, c.node, c.sqnr_db};
            if (const auto h = histograms.find(c.tensor); h != histograms.end())
                tensors.push_back(
                    {{"tensor", c.tensor},
                     {"node", c.node},
                     {"sqnr_db", std::isfinite(c.sqnr_db) ? nlohmann::json(c.sqnr_db) : nlohmann::json(nullptr)},
                     {"histogram", std::move(h->second)}});
            return per_tensor || !divergence;
        },
        [&](const std::string& tensor, const Tensor& value) {
            if (const auto range = ranges.find(tensor); range != ranges.end())
                histograms[tensor] = value_histogram(value, range->second);
        });
    if (per_tensor) out["tensors"] = std::move(tensors);
    if (divergence)
        out["first_divergence"] = {{"tensor", divergence->tensor},
                                   {"node", divergence->node},
                                   {"sqnr_db", divergence->sqnr_db},
                                   {"data", batch.source}};
}

// Runs a diagnosis, which explains a result: one that cannot be computed is
// named in the log and in the report's `diagnoses_unavailable`, and the run goes
// on to write its model. Input errors of the run itself were raised before evaluation.
template <class Diagnosis>
void diagnose(nlohmann::json& report, const char* what, Diagnosis&& diagnosis) {
    try {
        diagnosis();
    } catch (const std::exception& e) {
        log_warn("{} could not be computed, and is left out of the report: {}", what, e.what());
        report["diagnoses_unavailable"].push_back({{"diagnosis", what}, {"error", e.what()}});
    }
}

}  // namespace

// The quantized model against the float one on the evaluation (or calibration)
// data; with a low output SQNR, where the error starts.
void evaluate_phase(const RunSetup& setup, const FloatModel& floats, Calibrated& calibrated, Written& written,
                    nlohmann::json& report) {
    // The quantized model's large weights wait on disk while the float model runs:
    // the two models' weights are never in memory together.
    written.parked = std::make_shared<TensorSpool>(0);
    if (const size_t parked = written.parked->park_initializers(written.quantized, size_t{1} << 20))
        log_debug("evaluation: {:.1f} MB of quantized weights parked in a temporary file", parked / 1e6);
    std::unique_ptr<DataReader> eval_data;
    if (setup.settings.evaluation_data)
        eval_data = setup.readers.open(*setup.settings.evaluation_data, floats.model, "evaluation data");
    std::optional<Tensor> labels;
    if (setup.settings.evaluation_labels) labels = read_tensor_file(*setup.settings.evaluation_labels);
    // The reference is the model as given, so function-changing preparation (the DPU
    // simulations, ReplaceClip6Relu) counts as error; a model whose inputs preparation
    // changed (NHWC, float16) cannot take the same data and is compared as prepared.
    // When preparation kept the function, the prepared model's outputs calibration
    // computed stand for the given model's: it does not run again.
    // (Calibration keeps them only for a run evaluated on its data.)
    const bool from_calibration = calibrated.float_outputs != nullptr;
    Model given;
    bool as_given = false;
    if (!from_calibration) {
        given = load_model(setup.input);
        as_given = same_inputs(given, floats.model);
        if (!as_given) {
            given = Model();
            log_info("evaluating against the prepared float model: preparation changed the model's inputs");
        }
    }
    const Model& reference = as_given ? given : floats.reference();
    auto& data = eval_data ? *eval_data : *calibrated.data;
    const int batches = evaluation_batches(setup.settings);
    const Tensor* label_tensor = labels ? &*labels : nullptr;
    if (!from_calibration) calibrated.float_outputs = reference_outputs(reference, data, setup.threads, batches);
    const auto evaluation =
        compare_outputs(*calibrated.float_outputs, written.quantized, data, label_tensor, setup.threads, batches);
    if (as_given &&
        !floats.function_kept) {  // the prepared model ran on this data in calibration, unless it is held out
        const auto e =
            calibrated.prepared_outputs  // kept for the batches evaluation compares
                ? compare_outputs(*calibrated.float_outputs, *calibrated.prepared_outputs)
                : compare_outputs(*calibrated.float_outputs, floats.reference(), data, nullptr, setup.threads, batches);
        report_preparation_error(setup.settings.warn_output_sqnr_db, e,
                                 eval_data ? "evaluation_data" : "calibration_data", report);
    }
    calibrated.float_outputs.reset();
    calibrated.prepared_outputs.reset();
    auto& out = report["evaluation"] = evaluation.to_json();
    out["reference"] = from_calibration && calibrated.float_outputs_from_input ? "input model, joined into calibration"
                       : from_calibration ? "prepared model (its preparation keeps the function), as calibrated"
                       : as_given         ? "input model"
                                          : "prepared model";
    out["data"] = eval_data ? "evaluation_data" : "calibration_data";
    const bool limited = batches > 0 && evaluation.batches == batches;  // there may be more
    if (limited) out["batches_limit"] = batches;
    log_info("quantized vs float on {} data{}: {}", eval_data ? "evaluation" : "calibration",
             limited ? fmt::format(" (its first {} batches; evaluation_batches: 0 compares all)", batches) : "",
             summary_line(evaluation));
    const double warn_db = setup.settings.warn_output_sqnr_db;
    const bool low = std::any_of(evaluation.outputs.begin(), evaluation.outputs.end(),
                                 [&](const auto& o) { return o.sqnr_db < warn_db; });
    data.rewind();
    const bool per_tensor = !setup.plugins.reports.empty();  // for the pages they draw
    auto batch = low || per_tensor ? data.next() : std::nullopt;
    if (batch)
        diagnose(report,
                 per_tensor && low ? "the per-tensor error and the first diverging tensor"
                 : per_tensor      ? "the per-tensor error"
                                   : "the first diverging tensor",
                 [&] {
                     tensor_diagnoses(reference, written.quantized, *batch, report, setup.threads, per_tensor,
                                      low ? std::optional(warn_db) : std::nullopt, out);
                 });
}

}  // namespace vaiq::phases
