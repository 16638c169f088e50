// vaiq/statistics.hpp - what a calibration observer has learned, as data.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "vaiq/export.hpp"

namespace vaiq {

/// An observer's statistics as named arrays of numbers (extremes, histogram
/// counts, votes): what `vaiq calibrate` writes to a statistics file and `vaiq
/// run --calibration` reads back, so that observers of different data shards
/// can be merged.
using Statistics = std::map<std::string, std::vector<double>>;

/// The one value under `key`; throws InputError naming `what` when it is absent
/// or not a single number (a damaged or foreign statistics file).
VAIQ_API double statistic(const Statistics& stats, const std::string& key, const std::string& what);

/// The array under `key`; throws InputError naming `what` when it is absent.
VAIQ_API const std::vector<double>& statistic_array(const Statistics& stats, const std::string& key,
                                                    const std::string& what);

}  // namespace vaiq
