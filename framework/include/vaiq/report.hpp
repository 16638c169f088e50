// vaiq/report.hpp - report plugins: the run's JSON report rendered as another
// document beside it (the HTML page; a summary for a dashboard or a CI log in
// a plugin of your own).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "vaiq/export.hpp"
#include "vaiq/plugin.hpp"

namespace vaiq {

/// A report plugin. A run renders each report the recipe names (`reports:`;
/// report_html: true names the HTML page) once the model is quantized and
/// evaluated, and writes it beside the JSON report, under the same name with
/// the plugin's extension. Every report is rendered before anything is
/// written: one that fails leaves no file behind.
class VAIQ_API ReportWriter : public Plugin {
  public:
    static constexpr PluginKind kKind = PluginKind::Report;
    using Interface = ReportWriter;

    /// What the written file's name ends with in place of the JSON report's
    /// ".json": ".html", ".md".
    virtual std::string extension() const = 0;
    /// The document for `report`, the JSON report as the run writes it
    /// (docs/report.md): its sections may be missing or of another shape in a
    /// run stopped early or in a later vaiq, so read them defensively.
    virtual std::string render(const nlohmann::json& report) const = 0;
};

/// A report section of this "kind" ranks quantized tensors by their cost to the
/// output: "tensors", most harmful first, each with "tensor", "role" and
/// "output_sqnr_db" (the output's SQNR with that tensor alone quantized; "inf"
/// when exact, null when not measured). The report's page draws the first of
/// them and its advice names the most harmful, whichever algorithm ranked.
inline constexpr const char* kTensorRankingSection = "tensor_ranking";

/// The tensors of the report's first tensor ranking section, most harmful
/// first; an empty array when it has none.
inline const nlohmann::json& tensor_ranking(const nlohmann::json& report) {
    static const nlohmann::json none = nlohmann::json::array();
    if (!report.is_object()) return none;
    for (const auto& section : report)
        if (section.is_object() && section.value("kind", "") == kTensorRankingSection && section.contains("tensors") &&
            section["tensors"].is_array())
            return section["tensors"];
    return none;
}

}  // namespace vaiq
