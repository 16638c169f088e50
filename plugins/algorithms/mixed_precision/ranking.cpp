#include "ranking.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/log.hpp"

namespace vaiq {

namespace {

// Each planned activation's own error after quantize-dequantize, tapped from the
// float model's run over the measured batches, and how many values they hold.
struct OwnErrors {
    std::map<std::string, ErrorSums> sums;
    double tapped_values = 0;  // what a measurement costs, roughly
    size_t batches = 0;        // measured
};

OwnErrors own_errors(AlgorithmContext& context, const std::vector<std::string>& taps, size_t batches) {
    const QuantPlan& plan = context.plan();
    OwnErrors out;
    auto runner = context.runner(context.model(), false, {taps.begin(), taps.end()});
    auto& data = context.data();
    data.rewind();
    size_t read = 0;
    for (auto feeds = data.next(); feeds && (batches == 0 || read < batches); feeds = data.next(), ++read)
        runner->run(*feeds, taps, [&](const std::string& name, const Tensor& value) {
            const auto* t = plan.find(name);
            if (!t || value.type() != DataType::Float) return;
            out.tapped_values += static_cast<double>(value.size());
            const auto quantized = fake_quantize(value, t->params, name);
            out.sums[name].add(value.data<float>(), quantized.data<float>());
        });
    data.rewind();
    if (read == 0) throw InputError("the data holds no batches");
    out.batches = read;
    return out;
}

// Counts measurements, from any worker, for the log and the progress bar.
class Progress {
  public:
    Progress(AlgorithmContext& context, size_t total) : context_(context), total_(total) {}
    void measured() {
        std::lock_guard lock(mutex_);
        context_.progress("measurement", static_cast<int64_t>(++done_), static_cast<int64_t>(total_));
        if (done_ * 10 / total_ == logged_) return;
        logged_ = done_ * 10 / total_;
        log_info("sensitivity analysis: {} of {} measurements (a tensor on a batch)", done_, total_);
    }

  private:
    AlgorithmContext& context_;
    std::mutex mutex_;
    size_t total_, done_ = 0, logged_ = 0;
};

// The output SQNR of each of `forked` quantized alone: one forking run a batch,
// resumed at each with its quantized value, measured against the run's own
// outputs (variant 0). A tensor no run reached is left out.
std::map<std::string, double> forked_output_sqnr(AlgorithmContext& context, const RankingOptions& options,
                                                 const std::vector<std::string>& forked,
                                                 const std::set<std::string>& kept, std::unique_ptr<ModelRunner> probe,
                                                 const std::map<std::string, Tensor>& fitted, Progress& progress) {
    const QuantPlan& plan = context.plan();
    std::map<std::string, size_t> variant_of;
    for (size_t i = 0; i < forked.size(); ++i) variant_of[forked[i]] = i + 1;
    std::mutex reaching;
    std::set<std::string> reached;
    // The probe serves the worker on this thread when it may use the run's threads.
    const auto probe_thread = std::this_thread::get_id();
    auto make_run = [&](int threads) -> AlgorithmContext::VariantRun {
        std::shared_ptr<ModelRunner> runner;
        if (std::this_thread::get_id() == probe_thread && threads == context.threads()) runner = std::move(probe);
        if (!runner) runner = context.forking_runner(context.model(), kept, threads);
        return [&, runner](const Feeds& feeds, const AlgorithmContext::VariantOutputs& give) {
            const auto own = runner->run(feeds);
            give(0, own);
            std::vector<bool> given(forked.size() + 1, false);
            runner->run_forking(feeds, forked,
                                [&](const std::string& name, const Tensor& value, const ResumeFunction& resume) {
                                    const auto weight = fitted.find(name);
                                    const size_t v = variant_of.at(name);
                                    give(v, resume(fake_quantize(weight != fitted.end() ? weight->second : value,
                                                                 plan.find(name)->params, name)));
                                    given[v] = true;
                                    {
                                        std::lock_guard lock(reaching);
                                        reached.insert(name);
                                    }
                                    progress.measured();
                                });
            for (size_t v = 1; v < given.size(); ++v)
                if (!given[v]) give(v, own);  // not reached on this batch: left out below unless another reached it
        };
    };
    const auto measured = context.agreements(forked.size() + 1, context.model(), make_run, options.output_index,
                                             Batches(BatchSet::All, options.batches), /*reference_variant=*/0);
    std::map<std::string, double> out;
    for (size_t i = 0; i < forked.size(); ++i)
        if (reached.count(forked[i])) out[forked[i]] = measured[i + 1].sqnr_db;
    return out;
}

}  // namespace

std::vector<TensorSensitivity> rank_tensors(AlgorithmContext& context, const RankingOptions& options) {
    const Model& model = context.model();
    const QuantPlan& plan = context.plan();
    const auto fitted = context.fitted_weights();
    const GraphIndex index(model);
    log_info("sensitivity analysis: {} tensors, each on {} batches", plan.tensors.size(),
             options.batches > 0 ? std::to_string(options.batches) : "all");
    std::vector<std::string> taps;
    for (const auto& t : plan.tensors)
        if (!index.initializer(t.tensor)) taps.push_back(t.tensor);
    const auto own = own_errors(context, taps, options.batches);
    // Each tensor's own SQNR after quantize-dequantize (weights: their fitted values).
    std::map<std::string, std::optional<double>> own_sqnr;
    for (const auto& t : plan.tensors) {
        if (const auto* init = index.initializer(t.tensor)) {
            const auto value = Tensor::from_proto(*init);
            if (value.type() != DataType::Float) continue;
            ErrorSums sums;
            const auto quantized = fake_quantize(value, t.params, t.tensor);
            sums.add(value.data<float>(), quantized.data<float>());
            own_sqnr[t.tensor] = sums.sqnr_db();
        } else if (auto it = own.sums.find(t.tensor); it != own.sums.end()) {
            own_sqnr[t.tensor] = it->second.sqnr_db();
        }
    }
    const double inf = std::numeric_limits<double>::infinity();
    auto own_of = [&](const std::string& tensor) {
        const auto it = own_sqnr.find(tensor);
        return it != own_sqnr.end() && it->second ? *it->second : inf;
    };
    // Which tensors are measured: every one, or, where that costs too much (a
    // large model at a large input), those whose own error is largest.
    std::vector<const TensorQuant*> candidates;
    for (const auto& t : plan.tensors)
        if (t.role != TensorRole::Bias) candidates.push_back(&t);
    size_t limit = candidates.size();
    if (options.max_tensors > 0) limit = std::min(limit, static_cast<size_t>(options.max_tensors));
    if (options.max_tensors < 0 && own.tapped_values > 0)
        limit = std::min(limit, static_cast<size_t>(std::max(1.0, kSensitivityBudgetValues / own.tapped_values)));
    if (limit < candidates.size()) {
        std::stable_sort(candidates.begin(), candidates.end(),
                         [&](const auto* a, const auto* b) { return own_of(a->tensor) < own_of(b->tensor); });
        candidates.resize(limit);
        log_info("sensitivity analysis: the {} tensors whose own error is largest are measured, of {}{}", limit,
                 plan.tensors.size(), options.max_tensors < 0 ? " (sensitivity_tensors: 0 measures every one)" : "");
    }
    // Float tensors the float model's run can fork at are measured that way;
    // the others (a constant only folded steps read) on the written model, a
    // whole inference per batch.
    const std::set<std::string> kept(taps.begin(), taps.end());
    auto probe = context.forking_runner(model, kept);
    std::vector<std::string> forked;
    std::vector<const TensorQuant*> written;
    for (const auto* t : candidates) {
        const auto* init = index.initializer(t->tensor);
        const bool is_float = init ? init->data_type() == onnx::TensorProto::FLOAT : own.sums.count(t->tensor) > 0;
        if (is_float && probe->can_fork(t->tensor))
            forked.push_back(t->tensor);
        else
            written.push_back(t);
    }
    Progress progress(context, std::max<size_t>(1, forked.size() * own.batches + written.size()));
    auto output_sqnr = forked_output_sqnr(context, options, forked, kept, std::move(probe), fitted, progress);
    for (const auto* t : written) {
        QuantPlan alone;
        alone.tensors.push_back(*t);
        std::map<std::string, Tensor> weights;
        if (const auto it = fitted.find(t->tensor); it != fitted.end()) weights.insert(*it);
        output_sqnr[t->tensor] = context
                                     .agreement(context.quantized(alone, weights), options.output_index,
                                                Batches(BatchSet::All, options.batches))
                                     .sqnr_db;
        progress.measured();
    }
    const auto mixed = context.mixed_scale_tensors();
    std::vector<TensorSensitivity> out;
    for (const auto& t : plan.tensors) {
        TensorSensitivity s{t.tensor, t.role, t.params.type, std::nullopt, std::nullopt, mixed.count(t.tensor) > 0};
        if (auto it = own_sqnr.find(t.tensor); it != own_sqnr.end()) s.tensor_sqnr_db = it->second;
        if (auto it = output_sqnr.find(t.tensor); it != output_sqnr.end()) s.output_sqnr_db = it->second;
        out.push_back(std::move(s));
    }
    // Measured tensors by their cost to the output; those not measured after, by their own error.
    std::stable_sort(out.begin(), out.end(), [&](const auto& a, const auto& b) {
        if (a.output_sqnr_db.has_value() != b.output_sqnr_db.has_value()) return a.output_sqnr_db.has_value();
        if (a.output_sqnr_db) return *a.output_sqnr_db < *b.output_sqnr_db;
        return a.tensor_sqnr_db.value_or(inf) < b.tensor_sqnr_db.value_or(inf);
    });
    return out;
}

nlohmann::json ranking_json(const std::vector<TensorSensitivity>& tensors) {
    auto db = [](const std::optional<double>& v) -> nlohmann::json {
        if (!v) return nullptr;
        return std::isinf(*v) ? nlohmann::json("inf") : nlohmann::json(*v);
    };
    nlohmann::json out = nlohmann::json::array();
    for (const auto& t : tensors)
        out.push_back({{"tensor", t.tensor},
                       {"role", role_name(t.role)},
                       {"type", quant_type_name(t.type)},
                       {"tensor_sqnr_db", db(t.tensor_sqnr_db)},
                       {"output_sqnr_db", db(t.output_sqnr_db)}});
    return out;
}

}  // namespace vaiq
