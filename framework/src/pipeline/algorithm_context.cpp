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

  private:
    runtime::Executor executor_;
};

}  // namespace

// The run's reader seen as the SDK's stream (batches without their file names).
class HostAlgorithmContext::Stream final : public DataStream {
  public:
    explicit Stream(DataReader& reader) : reader_(reader) {}
    std::optional<Feeds> next() override {
        auto batch = reader_.next();
        if (!batch) return std::nullopt;
        return std::move(batch->feeds);
    }
    void rewind() override { reader_.rewind(); }

  private:
    DataReader& reader_;
};

HostAlgorithmContext::HostAlgorithmContext(AlgorithmInputs inputs)
    : in_(std::move(inputs)), stream_(std::make_unique<Stream>(in_.data)) {}

HostAlgorithmContext::~HostAlgorithmContext() = default;

DataStream& HostAlgorithmContext::data() { return *stream_; }

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

OutputAgreement HostAlgorithmContext::agreement(const Model& quantized, int output_index) {
    if (!in_.agreement) throw InternalError("agreement() needs the calibrated plan: not in the Prepare stage");
    return in_.agreement(quantized, output_index);
}

void HostAlgorithmContext::for_each_tapped(const Model& model, const std::vector<std::string>& tensors,
                                           const TapFunction& observe) {
    vaiq::for_each_tapped(model, in_.data, tensors, in_.threads, observe);
}

ChannelRanges HostAlgorithmContext::channel_ranges(const Model& model,
                                                   const std::vector<ChannelRangeRequest>& requests) {
    return measure_channel_ranges(model, in_.data, requests, in_.threads);
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
    if (!in_.replace_initializers) throw InternalError("set_initializers() is for algorithms of the Corrections stage");
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

void HostAlgorithmContext::set_model(Model model) {
    if (!in_.replace_model) throw InternalError("set_model() is for algorithms of the Prepare stage");
    in_.replace_model(std::move(model));
}

void HostAlgorithmContext::report(nlohmann::json section) { in_.report(std::move(section)); }

}  // namespace vaiq
