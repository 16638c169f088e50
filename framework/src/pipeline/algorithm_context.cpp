#include "pipeline/algorithm_context.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pipeline/channel_ranges.hpp"
#include "runtime/executor.hpp"
#include "util/progress.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/error.hpp"

namespace vaiq {

namespace {

class ExecutorRunner final : public ModelRunner {
  public:
    ExecutorRunner(const Model& model, runtime::ExecutorOptions options) : executor_(model, std::move(options)) {}
    std::vector<Tensor> run(const Feeds& feeds, const std::vector<std::string>& taps, const TapFunction& tap) override {
        return executor_.run(feeds, taps, tap);
    }
    void run_taps(const Feeds& feeds, const std::vector<std::string>& taps, const TapFunction& tap) override {
        executor_.run_taps(feeds, taps, tap);
    }
    std::vector<Tensor> run_forking(const Feeds& feeds, const std::vector<std::string>& forks, const ForkFunction& fork,
                                    const std::vector<std::string>& rewritten,
                                    const RewriteFunction& rewrite) override {
        return executor_.run_forking(feeds, forks, fork, rewritten, rewrite);
    }
    bool can_fork(const std::string& tensor) const override { return executor_.can_fork(tensor); }

  private:
    runtime::Executor executor_;
};

}  // namespace

// The run's reader seen as the SDK's stream (batches without their file names).
// An algorithm reads the data many times (fast finetune a few passes a layer),
// so the first whole pass from a rewind is kept when it fits in `budget` bytes,
// and the passes after it are replayed from memory: the files are neither read
// nor decoded again. Larger data is read from its files every pass.
class HostAlgorithmContext::Stream final : public DataStream {
  public:
    Stream(DataReader& reader, size_t budget) : reader_(reader), budget_(budget) {}
    std::optional<Feeds> next() override {
        if (complete_) return at_ < kept_.size() ? std::optional(kept_[at_++]) : std::nullopt;
        auto batch = reader_.next();
        if (!batch) {
            complete_ = keeping_;
            keeping_ = false;
            return std::nullopt;
        }
        if (keeping_) {
            for (const auto& [name, value] : batch->feeds) bytes_ += value.bytes().size();
            outgrown_ = bytes_ > budget_;
            keeping_ = !outgrown_;
            if (keeping_)
                kept_.push_back(batch->feeds);
            else
                kept_ = {};
        }
        return std::move(batch->feeds);
    }
    void rewind() override {
        at_ = 0;
        if (complete_) return;
        reader_.rewind();
        kept_.clear();  // a pass left unfinished
        bytes_ = 0;
        keeping_ = !outgrown_;
    }

  private:
    DataReader& reader_;
    const size_t budget_;
    std::vector<Feeds> kept_;
    size_t bytes_ = 0, at_ = 0;
    bool keeping_ = false;   // a pass from a rewind, kept as it is read
    bool complete_ = false;  // kept_ holds every batch
    bool outgrown_ = false;  // the data is larger than the budget: read every pass
};

HostAlgorithmContext::HostAlgorithmContext(AlgorithmInputs inputs)
    : in_(std::move(inputs)), stream_(std::make_unique<Stream>(in_.data, in_.data_kept_bytes)) {}

HostAlgorithmContext::~HostAlgorithmContext() = default;

DataStream& HostAlgorithmContext::data() { return *stream_; }

const std::map<std::string, Tensor>& HostAlgorithmContext::fitted_weights() const {
    fitted_ = in_.fitted_weights ? in_.fitted_weights() : std::map<std::string, Tensor>();
    return fitted_;
}

Model HostAlgorithmContext::quantized(const QuantPlan& plan, const std::map<std::string, Tensor>& weights) {
    return in_.emit(plan, weights);
}

std::unique_ptr<ModelRunner> HostAlgorithmContext::runner(const Model& model, bool float_values,
                                                          const std::set<std::string>& taps) {
    runtime::ExecutorOptions options;
    options.threads = in_.threads;
    options.fuse_qdq = !float_values;
    options.taps = taps;
    return std::make_unique<ExecutorRunner>(model, std::move(options));
}

std::unique_ptr<ModelRunner> HostAlgorithmContext::forking_runner(const Model& model,
                                                                  const std::set<std::string>& forks, int threads,
                                                                  bool rewrites) {
    return std::make_unique<ExecutorRunner>(
        model, runtime::forking_options(threads > 0 ? threads : in_.threads, forks, !rewrites));
}

template <typename F>
const F& HostAlgorithmContext::service(const F& f, const char* what) const {
    if (!f) throw InternalError(fmt::format("{} is not offered in this stage of the run", what));
    return f;
}

Model& HostAlgorithmContext::written() { return service(in_.written, "written()")(); }

std::optional<NestedQuantization> HostAlgorithmContext::quantize_nested(const Model& model, DataReader& data,
                                                                        const nlohmann::json& shared_inputs,
                                                                        const nlohmann::json& shared_outputs) {
    return service(in_.quantize_nested, "quantize_nested()")(model, data, shared_inputs, shared_outputs);
}

OutputAgreement HostAlgorithmContext::agreement(const Model& quantized, int output_index, Batches batches) {
    return service(in_.agreement, "agreement()")(quantized, output_index, batches);
}

std::vector<OutputAgreement> HostAlgorithmContext::agreements(size_t variants, const Model& compiled,
                                                              const std::function<VariantRun(int threads)>& make_run,
                                                              int output_index, Batches batches,
                                                              std::optional<size_t> reference_variant) {
    return service(in_.agreements, "agreements()")(variants, compiled, make_run, output_index, batches,
                                                   reference_variant);
}

MeasuredOutput HostAlgorithmContext::measured_output(int output_index) {
    return service(in_.measured_output, "measured_output()")(output_index);
}

bool HostAlgorithmContext::target_runs(QuantType activation_type, QuantType weight_type) {
    return service(in_.target_runs, "target_runs()")(activation_type, weight_type);
}

QuantPlan HostAlgorithmContext::raised_plan(const std::set<std::string>& tensors, const Precision& precision,
                                            size_t* count) {
    return service(in_.raised_plan, "raised_plan()")(tensors, precision, count);
}

void HostAlgorithmContext::set_precision(const std::set<std::string>& tensors, const Precision& precision) {
    service(in_.set_precision, "set_precision()")(tensors, precision);
}

bool HostAlgorithmContext::try_algorithm(const std::string& name, const std::function<bool()>& keep) {
    return service(in_.try_algorithm, "try_algorithm()")(name, keep);
}

void HostAlgorithmContext::for_each_tapped(const Model& model, const std::vector<std::string>& tensors,
                                           const TapFunction& observe) {
    vaiq::for_each_tapped(model, in_.data, tensors, in_.threads, observe);
}

ChannelRanges HostAlgorithmContext::channel_ranges(const Model& model, const std::vector<ChannelRangeRequest>& requests,
                                                   size_t batches) {
    if (!in_.measurable) return {};
    if (batches == 0) return measure_channel_ranges(model, in_.data, requests, in_.threads);
    auto first = first_batches(in_.data, batches);
    auto ranges = measure_channel_ranges(model, *first, requests, in_.threads);
    in_.data.rewind();
    return ranges;
}

void HostAlgorithmContext::progress(std::string_view what, int64_t done, int64_t total) {
    report_progress(what, done, total);
}

void HostAlgorithmContext::set_fitted_weights(std::map<std::string, Tensor> weights) {
    in_.keep_fitted(std::move(weights));
}

void HostAlgorithmContext::set_parameters(const std::string& tensor, const QuantParams& params) {
    in_.keep_parameters(tensor, params);
}

void HostAlgorithmContext::set_initializers(std::map<std::string, Tensor> values) {
    service(in_.replace_initializers, "set_initializers()");
    const GraphIndex index(in_.model);
    for (const auto& [name, value] : values) {
        const auto* init = index.initializer(name);
        if (!init) throw InputError(fmt::format("set_initializers(): the model has no initializer '{}'", name));
        const Tensor old = Tensor::from_proto(*init);
        if (old.type() != value.type() || old.shape() != value.shape())
            throw InputError(fmt::format("set_initializers(): '{}' is {} [{}], not {} [{}]", name,
                                         data_type_name(old.type()), fmt::join(old.shape(), ", "),
                                         data_type_name(value.type()), fmt::join(value.shape(), ", ")));
    }
    in_.replace_initializers(std::move(values));
}

Draft HostAlgorithmContext::draft() const { return service(in_.draft, "draft()")(); }

void HostAlgorithmContext::keep_float(const std::string& tensor, const std::string& reason, bool sharers_on_own_range) {
    service(in_.keep_float, "keep_float()")(tensor, reason, sharers_on_own_range);
}

bool HostAlgorithmContext::set_per_channel(const std::string& tensor, int axis) {
    return service(in_.set_per_channel, "set_per_channel()")(tensor, axis);
}

void HostAlgorithmContext::mark_mixed_scales(const std::string& tensor) {
    service(in_.mark_mixed_scales, "mark_mixed_scales()")(tensor);
}

void HostAlgorithmContext::set_model(Model model) {
    service(in_.replace_model, "set_model()")(std::move(model));
}

void HostAlgorithmContext::report(nlohmann::json section) { in_.report(std::move(section)); }

}  // namespace vaiq
