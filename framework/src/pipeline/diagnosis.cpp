#include "pipeline/diagnosis.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "runtime/executor.hpp"
#include "vaiq/graph.hpp"

namespace vaiq {

namespace {

// Tensors both graphs produce with a node, in the float graph's order.
std::vector<std::pair<std::string, std::string>> shared_tensors(const Model& float_model, const Model& quantized) {
    std::set<std::string> produced;
    for (const auto& node : quantized.graph().node())
        for (const auto& out : node.output()) produced.insert(out);
    std::vector<std::pair<std::string, std::string>> out;
    const auto& graph = float_model.graph();
    for (int n : topological_order(graph)) {
        const auto& node = graph.node(n);
        for (const auto& t : node.output())
            if (!t.empty() && produced.count(t))
                out.emplace_back(t, node.name().empty() ? node.op_type() : node.name());
    }
    return out;
}

// 10 log10(sum f^2 / sum (f - q)^2); nullopt when it says nothing (no signal,
// other sizes, not float).
std::optional<double> sqnr_db(const Tensor& f, const Tensor& q) {
    if (f.type() != DataType::Float || q.type() != DataType::Float || f.size() != q.size()) return std::nullopt;
    double signal = 0, noise = 0;
    const auto a = f.data<float>(), b = q.data<float>();
    for (size_t i = 0; i < a.size(); ++i) {
        const double d = static_cast<double>(a[i]) - b[i];
        signal += static_cast<double>(a[i]) * a[i];
        noise += d * d;
    }
    if (!(signal > 0)) return std::nullopt;
    return noise == 0 ? std::numeric_limits<double>::infinity() : 10.0 * std::log10(signal / noise);
}

}  // namespace

void compare_tensors(const Model& float_model, const Model& quantized, const std::map<std::string, Tensor>& feeds,
                     int threads, const std::set<std::string>& only, const ComparisonVisitor& visit,
                     size_t budget_bytes) {
    auto tensors = shared_tensors(float_model, quantized);
    if (!only.empty())
        std::erase_if(tensors, [&](const auto& t) { return !only.count(t.first); });
    if (tensors.empty()) return;
    runtime::ExecutorOptions options;
    options.threads = threads;
    for (const auto& [t, node] : tensors) options.taps.insert(t);  // no fusion hides them
    runtime::Executor reference(float_model, options);
    options.fuse_qdq = false;  // integer kernels would compute the tapped float values away
    runtime::Executor candidate(quantized, options);

    constexpr size_t kGroup = 64;
    for (size_t start = 0; start < tensors.size();) {
        std::vector<std::string> group;
        for (size_t i = start; i < std::min(start + kGroup, tensors.size()); ++i) group.push_back(tensors[i].first);
        // The float values of the group's first tensors, within the budget (at least one).
        std::map<std::string, Tensor> kept;
        size_t bytes = 0;
        bool full = false;
        reference.run(feeds, group, [&](const std::string& name, const Tensor& value) {
            if (full) return;
            if (!kept.empty() && bytes + value.bytes().size() > budget_bytes) {
                full = true;
                return;
            }
            bytes += value.bytes().size();
            kept.emplace(name, value);
        });
        // Taps arrive in run order, which may differ from the graph order: keep a prefix.
        size_t taken = 0;
        while (taken < group.size() && kept.count(group[taken])) ++taken;
        if (taken == 0) {  // tapped nothing (a value no run computes): skip it
            ++start;
            continue;
        }
        group.resize(taken);
        std::map<std::string, double> sqnr;
        candidate.run(feeds, group, [&](const std::string& name, const Tensor& value) {
            auto it = kept.find(name);
            if (it == kept.end()) return;
            if (auto db = sqnr_db(it->second, value)) sqnr[name] = *db;
        });
        for (size_t i = start; i < start + taken; ++i) {
            auto it = sqnr.find(tensors[i].first);
            if (it == sqnr.end()) continue;
            if (!visit({tensors[i].first, tensors[i].second, it->second, kept.at(tensors[i].first)})) return;
        }
        start += taken;
    }
}

std::optional<Divergence> first_divergence(const Model& float_model, const Model& quantized,
                                           const std::map<std::string, Tensor>& feeds, double threshold_db, int threads,
                                           size_t budget_bytes) {
    std::optional<Divergence> found;
    compare_tensors(
        float_model, quantized, feeds, threads, {},
        [&](const TensorComparison& c) {
            if (c.sqnr_db >= threshold_db) return true;
            found = Divergence{c.tensor, c.node, c.sqnr_db};
            return false;
        },
        budget_bytes);
    return found;
}

}  // namespace vaiq
