#include "pipeline/channel_ranges.hpp"

#include <algorithm>
#include <set>

#include "runtime/executor.hpp"
#include "vaiq/quant.hpp"

namespace vaiq {

void for_each_tapped(const Model& model, DataReader& data, const std::vector<std::string>& tensors, int threads,
                     const std::function<void(const std::string&, const Tensor&)>& observe) {
    if (tensors.empty()) return;
    runtime::ExecutorOptions options;
    options.threads = threads;
    options.taps.insert(tensors.begin(), tensors.end());
    runtime::Executor executor(model, options);
    data.rewind();
    while (auto batch = data.next()) executor.run(batch->feeds, tensors, observe);
}

ChannelRanges measure_channel_ranges(const Model& model, DataReader& data,
                                     const std::vector<ChannelRangeRequest>& requests, int threads) {
    std::map<std::string, int> axis_of;
    for (const auto& r : requests) axis_of[r.tensor] = r.axis;
    std::vector<std::string> tensors;
    for (const auto& [name, axis] : axis_of) tensors.push_back(name);
    ChannelRanges out;
    std::set<std::string> unusable;
    for_each_tapped(model, data, tensors, threads, [&](const std::string& name, const Tensor& value) {
            const int rank = static_cast<int>(value.shape().size());
            const int axis = axis_of.at(name) < 0 ? axis_of.at(name) + rank : axis_of.at(name);
            if (value.type() != DataType::Float || axis < 0 || axis >= rank) {
                unusable.insert(name);
                return;
            }
            const auto ranges = channel_ranges(value, axis);
            auto& m = out[name];
            if (m.empty()) m.assign(ranges.size(), 0.0f);
            if (m.size() != ranges.size()) {
                unusable.insert(name);
                return;
            }
            for (size_t c = 0; c < ranges.size(); ++c) m[c] = std::max({m[c], -ranges[c].min, ranges[c].max});
    });
    for (const auto& name : unusable) out.erase(name);
    return out;
}

}  // namespace vaiq
