// A run's parts (setup, float model, calibration, planning, written model),
// the phases that take them, and the helpers the pipeline's files share
// (internal to the host).
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "data/data_reader.hpp"
#include "pipeline/algorithm_context.hpp"
#include "pipeline/calibration.hpp"
#include "pipeline/nested_run.hpp"
#include "pipeline/pipeline.hpp"
#include "pipeline/planner.hpp"
#include "pipeline/run_settings.hpp"
#include "report/agreement.hpp"
#include "report/evaluation.hpp"
#include "vaiq/algorithm.hpp"
#include "vaiq/report.hpp"
#include "vaiq/spool.hpp"

namespace vaiq::phases {

// The plugin `name` of `kind` with the recipe's options for it (`key` names the setting that chose it).
PluginChoice choose(const Recipe& recipe, const PluginRegistry& registry, PluginKind kind, const std::string& name,
                    std::string_view key);

// Algorithm `name` with `options` and the recipe's extra options for it (`origin`: what asks for it).
PluginChoice choose_algorithm(const Recipe& recipe, const PluginRegistry& registry, const std::string& name,
                              const nlohmann::json& options, const std::string& origin);

// A run up to, not including, saving: the quantized model and its report.
struct QuantizedRun {
    Model quantized;
    std::shared_ptr<TensorSpool> parked;  ///< holds the quantized model's large weights, when evaluation parked them
    nlohmann::json report;
    std::filesystem::path input, output, report_path;
    std::optional<CalibrationTables> tables;  ///< when asked for
    std::vector<PluginInstance<ReportWriter>> reports;  ///< what renders the report when it is saved
};

// What setup decides and every later phase reads: the recipe, its settings
// and plugins, the paths. The plugins are made at setup, but for the format
// (on first use) and an algorithm another tries (when first tried).
struct RunSetup {
    RunSetup(const Recipe& r, PluginRegistry& reg, const RunOptions& o)
        : recipe(r),
          settings(RunSettings::of(r)),
          registry(reg),
          last(o.stop_after.value_or(Phase::Save)),
          options(o),
          calibrators([this](const std::string& method) {
              const auto choice = calibrator_choice(method);
              return registry.create<Calibrator>(choice.info->name, choice.options);
          }) {}

    // The run's calibrator with its resolved options; another method (an override's) resolved now.
    PluginChoice calibrator_choice(const std::string& method) const {
        return method == plugins.calibrator.info->name
                   ? plugins.calibrator
                   : choose(recipe, registry, PluginKind::Calibrator, method, "calibrate_method");
    }
    // The run's format, made on first use.
    Format& format() {
        if (!format_) format_ = registry.create<Format>(plugins.format.info->name, plugins.format.options);
        return *format_;
    }

    const Recipe& recipe;
    const RunSettings settings;
    PluginRegistry& registry;
    const Phase last;
    const RunOptions& options;
    std::filesystem::path input, output, report_path;
    ResolvedPlugins plugins;
    PluginInstance<Target> target;
    /// The instances of plugins.algorithms, made at setup, and of plugins.tried, once tried.
    std::vector<PluginInstance<Algorithm>> algorithms;
    std::map<std::string, PluginInstance<Algorithm>> tried;
    DataReaders readers;        ///< the data paths' readers, made at setup
    std::vector<PluginInstance<ReportWriter>> reports;  ///< made at setup: their options are checked before any work
    CalibratorSet calibrators;  ///< the plan points into them
    QuantRequest run;           ///< what the recipe asks of the whole run, for the target
    bool keep_tables = false;   ///< calibration keeps its statistics (vaiq calibrate)
    NestedRun nested;           ///< the pipeline, for the nested runs of Written algorithms
    const int threads = 0;

  private:
    PluginInstance<Format> format_;
};

// The float model as preparation, and then bias correction, leave it.
struct FloatModel {
    Model model;
    std::optional<Model> uncorrected;  ///< the prepared model before a correction (set_initializers), when one ran
    bool function_kept = true;         ///< preparation changed only how the model computes, not what
    bool inputs_changed = false;       ///< preparation changed the model's inputs (NCHW to NHWC, float16 to float32)

    // What quantized candidates are measured against: the prepared model, uncorrected.
    const Model& reference() const { return uncorrected ? *uncorrected : model; }
};

// What calibration leaves the later phases: its outcome, the data, and the
// float outputs on it that evaluation and the algorithms' measurements reuse.
struct Calibrated {
    std::unique_ptr<DataReader> data;
    CalibrationOutcome outcome;
    std::optional<CalibrationTables> tables;  ///< when setup.keep_tables
    /// The float outputs on the calibration data as calibration computed them
    /// (the prepared model's, or the input model's joined into it), kept when
    /// evaluation will compare against them.
    std::shared_ptr<ReferenceOutputs> float_outputs;  ///< shared with the calibration cache, if any
    /// The prepared model's outputs on the calibration data, kept where preparation
    /// changed the function and evaluation, on that data, runs the input model apart.
    std::shared_ptr<ReferenceOutputs> prepared_outputs;
    bool float_outputs_from_input = false;  ///< they are the input model's, joined into calibration
    /// The float model's outputs on the calibration data, by output index and part, for agreement().
    std::map<std::tuple<int, BatchSet, size_t>, ReferenceBatches> agreement_references;
};

// The plan, from the draft to the parameters, and what the algorithms chose on it.
struct Planning {
    DraftPlan draft;
    QuantPlan plan;
    std::map<std::string, TensorRange> ranges;
    ConstantParamsCache constant_params;            ///< cleared where the model's initializers change
    std::map<std::string, Tensor> rounded_weights;  ///< algorithms' fitted grid values, written instead of the weights
    std::map<std::string, QuantParams> rounded_on;  ///< the quantization each was fitted to (see rounded_for)
    /// Parameters algorithms chose (AlgorithmContext::set_parameters), kept when the plan is recomputed.
    std::map<std::string, QuantParams> chosen_params;
    std::vector<ConstraintCount> refined;  ///< what the target's constraints changed in the last plan computed
    /// Tensors the Plan stage found holding channels on different scales on one grid
    /// (AlgorithmContext::mark_mixed_scales).
    std::vector<std::string> mixed_scales;
};

// The written model.
struct Written {
    Model quantized;
    std::shared_ptr<TensorSpool> parked;  ///< the file the quantized model's large weights wait in
};

// A run's parts, from phase to phase. Each phase takes the parts it reads and
// writes; the algorithm stages take the whole run, as their context offers
// services on all of it.
struct RunState {
    RunState(const Recipe& r, PluginRegistry& reg, const RunOptions& o) : setup(r, reg, o) {}

    RunSetup setup;
    FloatModel floats;
    Calibrated calibrated;
    Planning planning;
    Written written;
    nlohmann::json report;
};

// A default that would switch behaviour on, in a phase that does not have it yet.
void warn_unimplemented_defaults(const Recipe& recipe, Phase phase);

// Initializers listed as graph inputs can be overridden by a caller, so they are
// not constants; removing them from the inputs lets their values be quantized.
int remove_initializer_inputs(Model& model);

// How many batches evaluation compares (0: all): evaluation_batches, or by default
// all of evaluation_data (or of labelled calibration data) and the first
// kDefaultEvaluationBatches of the calibration data.
int evaluation_batches(const RunSettings& settings);

// A phase's entry in the report: its time and the peak memory at its end.
nlohmann::json phase_entry(Phase phase, std::chrono::steady_clock::time_point start);

// The readers the recipe asks for: files, or random data when none are given.
std::unique_ptr<DataReader> random_reader(const RunSetup& setup, const Model& model);

// Whether the run has calibration data: files the recipe names, or the caller's reader.
bool has_calibration_data(const RunSettings& settings, const RunOptions& options);

std::unique_ptr<DataReader> calibration_reader(const RunSetup& setup, const Model& model);

nlohmann::json params_json(const TensorQuant& t, const std::map<std::string, TensorRange>& ranges);

// Per constraint: nodes checked, adjusted by refinement, still violated.
nlohmann::json constraints_json(const std::vector<ConstraintCount>& counts, bool refined);

// The inputs a model takes (names, element types, dimensions), comparable.
std::vector<std::string> input_signature(const Model& m);

// Whether two models take the same inputs.
bool same_inputs(const Model& a, const Model& b);

std::string summary_line(const Evaluation& e);

// The report before any phase ran: versions, the recipe's explicit settings.
nlohmann::json initial_report(const Recipe& recipe, Phase last);

// The phases, in order. The orchestration (pipeline.cpp) hands each the parts
// it needs; `report` gets its sections.

// Resolves and makes the recipe's plugins; checks what the run asks of the target.
void setup_phase(RunSetup& setup, nlohmann::json& report);

void load_phase(const RunSetup& setup, FloatModel& floats, nlohmann::json& report);

// The documented preparation steps, then the target's transforms, CLE and the
// recipe's passes; then the algorithms of the Prepare stage.
void prepare_phase(RunState& s);

// Which tensors are quantized, and how, before calibration; then the algorithms of the Plan stage.
void plan_phase(RunState& s);

// Whether data may decide the plan before calibration (channel ranges in the
// Plan stage): not where the run calibrates from statistics files or makes
// them (a shard must observe the plan the run reads them into), nor with given
// parameters and no data (random data must not decide), nor in a run that
// stops before calibrating (vaiq explain, --stop-after plan).
bool data_decides_plan(const RunSetup& setup);

// The Plan stage's services: the draft and its changes.
void offer_draft_services(RunState& s, AlgorithmInputs& inputs);

// Observes the calibration data (or statistics files) for `draft`, dropping
// the tensors that cannot be quantized. The prepared model is borrowed while
// the input model's outputs are computed beside it.
void calibrate_phase(RunSetup& setup, FloatModel& floats, DraftPlan& draft, Calibrated& out, nlohmann::json& report);

// The prepared float model against the input model, where preparation changed
// what it computes (the DPU simulations): error no quantization setting removes.
void report_preparation_error(double warn_output_sqnr_db, const Evaluation& e, const char* data,
                              nlohmann::json& report);

// The parameters from the calibration, then the algorithms of the Precision,
// Parameters and Corrections stages.
void parameters_phase(RunState& s);

// The fitted weights that `plan` still quantizes as they were fitted: a weight
// whose parameters changed since (a recomputed plan refined anew, a tensor
// raised) is rounded to nearest on its new grid instead.
std::map<std::string, Tensor> rounded_for(const Planning& planning, const QuantPlan& plan);

// The prepared float `model` with `plan` written into it by the run's format,
// the `rounded` weights in place of the float ones.
Model emit_plan(RunSetup& setup, const Model& model, const QuantPlan& plan,
                const std::map<std::string, Tensor>& rounded);

// Runs one algorithm plugin of `stage` on the run as it stands; its report section goes under its name.
void run_algorithm(RunState& s, Algorithm& algorithm, const std::string& name, AlgorithmStage stage);

// The algorithm plugins of `stage`, in the recipe's order.
void run_algorithms(RunState& s, AlgorithmStage stage);

void emit_phase(RunSetup& setup, const Model& model, const Planning& planning, Written& out, nlohmann::json& report);

// What refinement promised, checked on what was written.
void check_phase(RunSetup& setup, const Model& quantized, nlohmann::json& report);

// The quantized model against the float one on the evaluation (or calibration)
// data; with a low output SQNR, where the error starts.
void evaluate_phase(const RunSetup& setup, const FloatModel& floats, Calibrated& calibrated, Written& written,
                    nlohmann::json& report);

}  // namespace vaiq::phases
