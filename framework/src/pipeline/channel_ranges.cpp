#include "pipeline/channel_ranges.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "runtime/executor.hpp"

namespace vaiq {

ChannelRanges channel_ranges(const Model& model, DataReader& data, const std::vector<ChannelRangeRequest>& requests,
                             int threads) {
    std::map<std::string, int> axis_of;
    for (const auto& r : requests) axis_of[r.tensor] = r.axis;
    std::vector<std::string> tensors;
    for (const auto& [name, axis] : axis_of) tensors.push_back(name);
    if (tensors.empty()) return {};
    runtime::ExecutorOptions options;
    options.threads = threads;
    options.taps.insert(tensors.begin(), tensors.end());
    runtime::Executor executor(model, options);
    ChannelRanges out;
    std::set<std::string> unusable;
    data.rewind();
    while (auto batch = data.next())
        executor.run(batch->feeds, tensors, [&](const std::string& name, const Tensor& value) {
            const auto& shape = value.shape();
            const int rank = static_cast<int>(shape.size());
            const int axis = axis_of.at(name) < 0 ? axis_of.at(name) + rank : axis_of.at(name);
            if (value.type() != DataType::Float || axis < 0 || axis >= rank) {
                unusable.insert(name);
                return;
            }
            size_t inner = 1;
            for (int d = axis + 1; d < rank; ++d) inner *= static_cast<size_t>(shape[d]);
            const auto channels = static_cast<size_t>(shape[axis]);
            auto& m = out[name];
            if (m.empty()) m.assign(channels, 0.0f);
            if (m.size() != channels) {
                unusable.insert(name);
                return;
            }
            const auto v = value.data<float>();
            for (size_t i = 0; i < v.size(); ++i) {
                float& c = m[(i / inner) % channels];
                c = std::max(c, std::abs(v[i]));
            }
        });
    for (const auto& name : unusable) out.erase(name);
    return out;
}

}  // namespace vaiq
