#include "screening.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <thread>
#include <unordered_map>
#include <utility>

#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/log.hpp"

namespace vaiq {

namespace {

bool same_params(const QuantParams& a, const QuantParams& b) {
    return a.type == b.type && a.scale == b.scale && a.zero_point == b.zero_point && a.axis == b.axis &&
           a.block_size == b.block_size;
}

// A candidate's plan as changes to the shared one: its tensors' parameters, or
// nullopt for a tensor it leaves float.
using Overrides = std::map<std::string, std::optional<QuantParams>>;

Overrides changes(const QuantPlan& from, const QuantPlan& to) {
    Overrides out;
    for (const auto& t : from.tensors) {
        if (t.role == TensorRole::Bias) continue;
        const auto* now = to.find(t.tensor);
        if (!now)
            out[t.tensor] = std::nullopt;
        else if (!same_params(t.params, now->params))
            out[t.tensor] = now->params;
    }
    for (const auto& t : to.tensors)
        if (t.role != TensorRole::Bias && !from.find(t.tensor)) out[t.tensor] = t.params;
    return out;
}

}  // namespace

Estimates screen_raisings(AlgorithmContext& context, const Precision& precision, int output_index,
                          const std::set<std::string>& raised, const std::vector<std::string>& candidates,
                          BatchSet batches) {
    Estimates out;
    out.raised.resize(candidates.size());
    const Model& float_model = context.model();
    const GraphIndex index(float_model);
    const QuantPlan base = context.raised_plan(raised, precision);
    std::unordered_map<std::string, const QuantParams*> base_params;
    for (const auto& t : base.tensors)
        if (t.role != TensorRole::Bias) base_params[t.tensor] = &t.params;

    // Where each node runs (the executor keeps this order), and the first reading each tensor.
    const auto order = topological_order(float_model.graph());
    std::vector<size_t> position(order.size());
    for (size_t p = 0; p < order.size(); ++p) position[static_cast<size_t>(order[p])] = p;
    auto produced_at = [&](const std::string& tensor) -> std::optional<size_t> {
        const int p = index.producer(tensor);
        return p < 0 ? std::nullopt : std::optional<size_t>(position[static_cast<size_t>(p)]);
    };
    auto first_reader = [&](const std::string& tensor) {  // a graph output no step reads: after its producer
        size_t first = std::numeric_limits<size_t>::max();
        for (const auto& use : index.consumers(tensor))
            if (use.node >= 0) first = std::min(first, position[static_cast<size_t>(use.node)]);
        const auto made = produced_at(tensor);
        return first == std::numeric_limits<size_t>::max() && made && index.is_graph_output(tensor) ? *made + 1 : first;
    };

    // The simulation: the float model with the shared plan's weights quantized.
    Model simulated = float_model;
    for (auto& init : *simulated.graph().mutable_initializer()) {
        const auto it = base_params.find(init.name());
        if (it == base_params.end() || init.data_type() != onnx::TensorProto::FLOAT) continue;
        init = fake_quantize(Tensor::from_proto(init), *it->second, init.name()).to_proto(init.name());
    }
    // Each candidate's changes, and the tensor where its run forks: the changed
    // tensor read first. Every other change must be an activation computed after.
    std::vector<Overrides> overrides(candidates.size());
    std::vector<std::string> fork_of(candidates.size());  // empty: the candidate changes nothing
    std::vector<bool> expressible(candidates.size(), true);
    std::set<std::string> kept;  // what the runner computes under its own name
    for (const auto& [tensor, params] : base_params)
        if (!index.initializer(tensor)) kept.insert(tensor);
    for (size_t i = 0; i < candidates.size(); ++i) {
        auto with = raised;
        with.insert(candidates[i]);
        overrides[i] = changes(base, context.raised_plan(with, precision));
        std::string fork;
        for (const auto& [tensor, params] : overrides[i])
            if (fork.empty() || first_reader(tensor) < first_reader(fork)) fork = tensor;
        if (fork.empty()) continue;  // nothing changes: the run's own outputs
        const size_t at = first_reader(fork);
        fork_of[i] = fork;
        expressible[i] = at != std::numeric_limits<size_t>::max() &&
                         std::all_of(overrides[i].begin(), overrides[i].end(), [&](const auto& change) {
                             const auto made = produced_at(change.first);
                             return change.first == fork || (made && *made >= at);
                         });
        if (!expressible[i]) continue;
        kept.insert(fork);
        for (const auto& [tensor, params] : overrides[i])
            if (!index.initializer(tensor)) kept.insert(tensor);
    }
    std::unique_ptr<ModelRunner> probe;  // what can be forked at; then one worker's runner
    try {
        probe = context.forking_runner(simulated, kept, 0, true);
    } catch (const InputError& e) {
        log_info("mixed precision: candidates measured one model each: the simulation does not compile ({})", e.what());
        return out;
    }
    // What the runner cannot fork at (an activation only folded constants make)
    // stays float in the simulation, and a candidate changing it is not screened.
    std::vector<std::string> rewritten;
    for (const auto& tensor : kept)
        if (!index.initializer(tensor) && probe->can_fork(tensor)) rewritten.push_back(tensor);
    std::map<std::string, std::vector<size_t>> by_fork;  // fork tensor -> candidates
    std::vector<size_t> unchanged, screened;
    for (size_t i = 0; i < candidates.size(); ++i) {
        if (fork_of[i].empty()) {
            unchanged.push_back(i), screened.push_back(i);
            continue;
        }
        const bool forkable =
            expressible[i] && std::all_of(overrides[i].begin(), overrides[i].end(),
                                          [&](const auto& change) { return probe->can_fork(change.first); });
        if (!forkable) continue;
        by_fork[fork_of[i]].push_back(i), screened.push_back(i);
    }
    std::vector<std::string> forks;
    for (const auto& [tensor, which] : by_fork) forks.push_back(tensor);

    auto float_initializer = [&](const std::string& tensor) {
        const auto* init = index.initializer(tensor);
        if (!init) throw InternalError(fmt::format("screening: no float value of '{}' at its fork", tensor));
        return Tensor::from_proto(*init);
    };
    std::vector<size_t> variant_of(candidates.size());
    for (size_t v = 0; v < screened.size(); ++v) variant_of[screened[v]] = v;
    const size_t base_variant = screened.size();  // the shared plan's own outputs

    // One worker's runs: its runner (the probe, where the worker is this thread)
    // and the candidate its resumed run simulates.
    struct Worker {
        std::unique_ptr<ModelRunner> runner;
        const Overrides* active = nullptr;          // nullptr: the shared plan
        std::map<std::string, Tensor> unquantized;  // the run's fork activations before their rewrite
    };
    // Workers on other threads never touch the probe: one worker alone runs on this one.
    const auto probe_thread = std::this_thread::get_id();
    auto make_run = [&](int threads) -> AlgorithmContext::VariantRun {
        auto w = std::make_shared<Worker>();
        if (std::this_thread::get_id() == probe_thread) w->runner = std::move(probe);
        if (!w->runner) w->runner = context.forking_runner(simulated, kept, threads, true);
        return [&, w](const Feeds& feeds, const AlgorithmContext::VariantOutputs& give) {
            auto params_of = [&](const std::string& tensor) -> const QuantParams* {
                if (w->active)
                    if (const auto it = w->active->find(tensor); it != w->active->end())
                        return it->second ? &*it->second : nullptr;
                const auto it = base_params.find(tensor);
                return it == base_params.end() ? nullptr : it->second;
            };
            const RewriteFunction rewrite = [&](const std::string& tensor, Tensor& value) {
                if (!w->active && by_fork.count(tensor)) w->unquantized[tensor] = value;
                if (const auto* params = params_of(tensor); params && value.type() == DataType::Float)
                    value = fake_quantize(std::move(value), *params, tensor);
            };
            const ForkFunction fork = [&](const std::string& tensor, const Tensor&, const ResumeFunction& resume) {
                const auto it = w->unquantized.find(tensor);
                const auto value = it != w->unquantized.end() ? it->second : float_initializer(tensor);
                for (const size_t i : by_fork.at(tensor)) {
                    w->active = &overrides[i];
                    const auto* params = params_of(tensor);
                    give(variant_of[i],
                         resume(params && value.type() == DataType::Float ? fake_quantize(value, *params, tensor)
                                                                          : value));
                    w->active = nullptr;
                }
                w->unquantized.erase(tensor);
            };
            w->unquantized.clear();
            const auto outputs = w->runner->run_forking(feeds, forks, fork, rewritten, rewrite);
            for (const size_t i : unchanged) give(variant_of[i], outputs);
            give(base_variant, outputs);
        };
    };
    const auto measured = context.agreements(screened.size() + 1, simulated, make_run, output_index, batches);
    for (size_t v = 0; v < screened.size(); ++v) out.raised[screened[v]] = measured[v];
    out.base = measured[base_variant];
    log_debug("mixed precision: {} of {} candidates screened on a simulation, {} forks", screened.size(),
              candidates.size(), forks.size());
    return out;
}

}  // namespace vaiq
