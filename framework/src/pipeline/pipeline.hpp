// The quantization pipeline: fixed phases, plugins chosen by the recipe.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/data_reader.hpp"
#include "plugin/registry.hpp"
#include "recipe/recipe.hpp"
#include "vaiq/calibrator.hpp"
#include "vaiq/format.hpp"
#include "vaiq/pass.hpp"
#include "vaiq/target.hpp"

namespace vaiq {

struct CalibrationCache;  // pipeline/calibration_cache.hpp

/// A plugin chosen by a recipe, with its checked options.
struct PluginChoice {
    const PluginInfo* info = nullptr;
    Options options;
    /// Where the recipe sets each option it sets ("recipe.yaml:3:5"); the rest are the plugin's defaults.
    std::map<std::string, std::string> set_by;
};

/// The plugins a recipe names, found and their options checked.
struct ResolvedPlugins {
    PluginChoice target;
    PluginChoice format;
    PluginChoice calibrator;
    std::vector<PluginChoice> passes;      ///< the recipe's own passes, in order
    std::optional<PluginChoice> equalization;  ///< include_cle's pass
    std::vector<PluginChoice> algorithms;  ///< in the order they run
    /// What the algorithms may try (their may_try) and the run does not run anyway.
    std::vector<PluginChoice> tried;
    /// Every loaded reader: a data path opens with the one that claims it most.
    std::vector<PluginChoice> readers;
    std::vector<PluginChoice> reports;  ///< report_html's page, then the recipe's reports
};

/// Loads the recipe's plugin_paths into `registry`, then finds every plugin the
/// recipe names (include_cle's pass among them) and checks its options: their
/// types, then their values, by configuring an instance of each once. Throws
/// InputError at the recipe line.
ResolvedPlugins resolve_plugins(const Recipe& recipe, PluginRegistry& registry);

/// Recipe keys set explicitly (not defaults) that this build cannot honour yet
/// in the phases up to and including `last`, as "key (file:line:col)".
std::vector<std::string> unsupported_settings(const Recipe& recipe, Phase last);

struct RunOptions {
    /// Stop after this phase and write what exists then (e.g. Phase::Prepare).
    std::optional<Phase> stop_after;
    /// Show a progress bar on stderr.
    bool progress = false;
    /// Statistics files (`vaiq calibrate`) to calibrate from instead of the
    /// data: merged as if one process had seen every shard.
    std::vector<std::filesystem::path> calibration_files;
    /// Calibration data from the caller (the Python API's CalibrationDataReader)
    /// in place of calibration_data_reader: opens a reader for the model as it
    /// stands; called for every pass over the data.
    std::function<std::unique_ptr<DataReader>(const Model&)> calibration_reader;
    /// Calibrations kept across the runs of one process (`vaiq tune`'s trials):
    /// a run that observes the same tensors of the same prepared model on the
    /// same data with the same calibrators takes an earlier run's statistics,
    /// channel-scale measurement and float outputs instead of calibrating again.
    /// Null: every run calibrates.
    std::shared_ptr<CalibrationCache> calibration_cache;
};

struct RunResult {
    std::filesystem::path output;
    std::filesystem::path report;
    std::vector<std::filesystem::path> documents;  ///< what the report plugins wrote beside the report
    nlohmann::json report_json;
};

/// Runs the pipeline. Writes the output model and its report atomically and
/// never over the input. Throws InputError for bad input; nothing is written then.
RunResult run_pipeline(const Recipe& recipe, PluginRegistry& registry, const RunOptions& options);

/// What `vaiq calibrate` produces: the statistics file and the calibrated
/// ranges as the tables ONNX Runtime writes (calibration.json, calibration.cache).
struct CalibrationTables {
    nlohmann::json statistics;
    nlohmann::json ort_json;
    std::string tensorrt_cache;
};

/// Runs the pipeline up to calibration (on the recipe's data, or merging
/// options.calibration_files) and returns the statistics; nothing is written.
CalibrationTables calibrate_pipeline(const Recipe& recipe, PluginRegistry& registry, const RunOptions& options);

/// Quantizes in memory with sensitivity_analysis on and returns the report:
/// nothing is written (model_output is not needed).
nlohmann::json analyze_pipeline(const Recipe& recipe, PluginRegistry& registry, const RunOptions& options);

/// `report` as report plugin `name` renders it with its default options.
std::string render_report(const PluginRegistry& registry, std::string_view name, const nlohmann::json& report);

/// The resolved recipe as text: plugins, every setting with its origin; with a
/// model, what applies to each node.
std::string explain(const Recipe& recipe, const ResolvedPlugins& plugins, PluginRegistry& registry, const Model* model);

}  // namespace vaiq
