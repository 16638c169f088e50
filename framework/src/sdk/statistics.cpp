#include "vaiq/statistics.hpp"

#include <fmt/format.h>

#include "vaiq/error.hpp"

namespace vaiq {

const std::vector<double>& statistic_array(const Statistics& stats, const std::string& key, const std::string& what) {
    auto it = stats.find(key);
    if (it == stats.end()) throw InputError(fmt::format("the statistics of {} have no '{}'", what, key));
    return it->second;
}

double statistic(const Statistics& stats, const std::string& key, const std::string& what) {
    const auto& values = statistic_array(stats, key, what);
    if (values.size() != 1)
        throw InputError(fmt::format("the statistics of {}: '{}' holds {} values, not one", what, key, values.size()));
    return values[0];
}

}  // namespace vaiq
