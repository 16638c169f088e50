// Search to an accuracy target (`vaiq tune`): candidate recipes, cheapest
// first, each run whole and scored by a measure of its report; the first that
// meets the target is kept.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeline/pipeline.hpp"

namespace vaiq {

/// What the kept model must reach: "measure>=bound" or "measure<=bound".
/// Measures (of the run's report, the first output where there are several):
/// accuracy and accuracy_drop (float minus quantized, with evaluation_labels
/// of classes), perplexity and perplexity_increase (relative, with labels of
/// tokens), sqnr_db, cosine, top1_agreement; or `metric`, the caller's own
/// (the Python API's callable), of the quantized model file and its report.
struct TuneTarget {
    std::string measure;
    bool at_least = true;
    double bound = 0;
    std::function<double(const std::filesystem::path& model, const nlohmann::json& report)> metric;

    /// Throws InputError for an unknown measure or a malformed target.
    static TuneTarget parse(std::string_view text);
    /// The measure of the trial that wrote `model` and `report`; throws InputError naming what the report lacks.
    double score(const nlohmann::json& report, const std::filesystem::path& model) const;
    /// Within a rounding's width of the bound counts (97.5 % - 97.0 % is 0.005 for accuracy_drop<=0.005).
    bool met(double score) const {
        const double slack = 1e-9 * std::max(1.0, std::abs(bound));
        return at_least ? score >= bound - slack : score <= bound + slack;
    }
    std::string text() const;
};

/// One candidate: settings ("key.path=value") over the run's recipe, or over
/// another recipe (a shipped one) that takes the run's model and data.
struct TuneCandidate {
    std::string name;
    std::optional<std::filesystem::path> recipe;
    std::vector<std::string> assignments;
};

/// A space file: `candidates:` (a list, tried in order: each {name, recipe,
/// set}) and/or `dimensions:` (setting -> values, cheapest first: the grid of
/// their combinations, ordered by the sum of the values' positions). A name
/// not found is looked for among the shipped spaces (recipes/spaces). Throws
/// InputError, naming the file, for anything else.
std::vector<TuneCandidate> load_tune_space(const std::filesystem::path& file);

struct TuneTrial {
    std::string name;
    std::string recipe;                    ///< the recipe it started from
    std::vector<std::string> assignments;  ///< the candidate's own settings
    double seconds = 0;
    bool calibration_reused = false;  ///< it took an earlier trial's calibration
    std::optional<double> score;      ///< none when the run failed
    bool met = false;
    std::string error;  ///< why the run failed
};

struct TuneResult {
    std::vector<TuneTrial> trials;
    std::optional<size_t> kept;  ///< the trial written: the first that met the target, else the best
    bool met = false;
    std::filesystem::path output, report, tune_report;
    nlohmann::json to_json(const TuneTarget& target) const;
};

/// Runs the candidates in order, each as `vaiq run` would with `assignments`
/// (the command line's) after its own, until one meets `target`. Writes the
/// kept trial's model and report where the run's recipe says (model_output,
/// report) and every trial in `<output>.tune.json`; nothing else stays.
/// Throws InputError when no trial ran (every one failed: the first error).
TuneResult tune(const std::filesystem::path& recipe, const std::vector<std::string>& assignments,
                const std::vector<TuneCandidate>& candidates, const TuneTarget& target, PluginRegistry& registry,
                const RunOptions& options);

}  // namespace vaiq
