#include "report/diagnosis.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "runtime/executor.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/spool.hpp"

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
// other sizes, not float); -infinity when q holds NaN or infinity (a division
// by a zero that quantization made): no signal is left.
std::optional<double> sqnr_db(const Tensor& f, const Tensor& q) {
    if (f.type() != DataType::Float || q.type() != DataType::Float || f.size() != q.size()) return std::nullopt;
    double signal = 0, noise = 0;
    const auto a = f.data<float>(), b = q.data<float>();
    for (size_t i = 0; i < a.size(); ++i) {
        const double d = static_cast<double>(a[i]) - b[i];
        signal += static_cast<double>(a[i]) * a[i];
        noise += d * d;
    }
    if (!(signal > 0) || std::isinf(signal)) return std::nullopt;
    if (!std::isfinite(noise)) return -std::numeric_limits<double>::infinity();
    return noise == 0 ? std::numeric_limits<double>::infinity() : 10.0 * std::log10(signal / noise);
}

}  // namespace

void compare_tensors(const Model& float_model, const Model& quantized, const std::map<std::string, Tensor>& feeds,
                     int threads, const std::set<std::string>& only, const ComparisonVisitor& visit,
                     const ReferenceVisitor& reference, size_t budget_bytes) {
    auto tensors = shared_tensors(float_model, quantized);
    if (!only.empty())
        std::erase_if(tensors, [&](const auto& t) { return !only.count(t.first); });
    if (tensors.empty()) return;
    std::vector<std::string> names;
    for (const auto& [t, node] : tensors) names.push_back(t);
    runtime::ExecutorOptions options;
    options.threads = threads;
    options.taps.insert(names.begin(), names.end());  // no fusion hides them
    // One run of the float model puts its values aside, then one run of the
    // quantized model compares against them: the two models' weights are never
    // in memory together, and values beyond the budget wait in a temporary file.
    // A tensor either executor computes away all the same is not compared: a
    // diagnosis reports what it can see and never fails the run it explains.
    auto tappable = [](const runtime::Executor& e, std::vector<std::string> wanted) {
        std::erase_if(wanted, [&](const std::string& t) { return !e.can_tap(t); });
        return wanted;
    };
    TensorSpool spool(budget_bytes);
    std::map<std::string, size_t> float_values;
    {
        runtime::Executor executor(float_model, options);
        names = tappable(executor, std::move(names));
        executor.run(feeds, names, [&](const std::string& name, const Tensor& value) {
            if (value.type() != DataType::Float) return;
            float_values.emplace(name, spool.put(value));
            if (reference) reference(name, value);
        });
    }
    options.fuse_qdq = false;  // integer kernels would compute the tapped float values away
    runtime::Executor candidate(quantized, options);
    names = tappable(candidate, std::move(names));
    std::map<std::string, double> sqnr;
    candidate.run(feeds, names, [&](const std::string& name, const Tensor& value) {
        auto it = float_values.find(name);
        if (it == float_values.end()) return;
        if (auto db = sqnr_db(spool.get(it->second), value)) sqnr[name] = *db;
        spool.drop(it->second);  // read once: what it held in memory serves no one now
        float_values.erase(it);
    });
    for (const auto& [tensor, node] : tensors) {
        auto it = sqnr.find(tensor);
        if (it == sqnr.end()) continue;
        if (!visit({tensor, node, it->second})) return;
    }
}

}  // namespace vaiq
