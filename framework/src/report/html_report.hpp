// The run's report as one self-contained HTML page (inline CSS and SVG, no
// script, nothing fetched): what a person reads to see which layers lost what.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace vaiq {

/// The page for a run's JSON report: summary (float vs quantized accuracy and
/// SQNR), per-tensor error sorted by harm, activation histograms with the
/// chosen ranges, sensitivity when measured, the plan, device adjustments,
/// passes, phase times and the explicit settings.
std::string html_report(const nlohmann::json& report);

/// The tensors of the report's first section whose "kind" is a tensor ranking
/// (vaiq::kTensorRankingSection, whichever algorithm wrote it), most harmful
/// first; an empty array when there is none.
const nlohmann::json& tensor_ranking(const nlohmann::json& report);

}  // namespace vaiq
