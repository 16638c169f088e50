// Plugin guards: every call the host makes into a plugin goes through one, so
// that a plugin that fails or misbehaves is reported by name (registry.hpp).
#include <fmt/format.h>

#include "plugin/registry.hpp"
#include "vaiq/algorithm.hpp"
#include "vaiq/calibrator.hpp"
#include "vaiq/format.hpp"
#include "vaiq/pass.hpp"
#include "vaiq/reader.hpp"
#include "vaiq/report.hpp"
#include "vaiq/target.hpp"

#include <cmath>
#include <utility>

#include "vaiq/error.hpp"

namespace vaiq {

namespace {

// Who a guard speaks for, in messages: "calibrator plugin 'minmax'".
struct Who {
    std::string label;
    explicit Who(const PluginInfo& info) : label(fmt::format("{} plugin '{}'", kind_name(info.kind), info.name)) {}

    // Runs one call into the plugin; failures other than refusals get its name.
    template <typename Call>
    auto call(const char* method, Call&& body) const -> decltype(body()) {
        try {
            return body();
        } catch (const InputError&) {
            throw;
        } catch (const std::exception& e) {
            throw InternalError(fmt::format("{} failed in {}(): {}", label, method, e.what()));
        } catch (...) {
            throw InternalError(fmt::format("{} failed in {}() with an exception that is not a std::exception", label,
                                            method));
        }
    }

    [[noreturn]] void invalid(const std::string& what) const {
        throw InternalError(fmt::format("{} returned {}", label, what));
    }
};

// The plugin instance a guard forwards to, destroyed by its library.
template <typename T>
class Guarded : public T {
  protected:
    Guarded(PluginInstance<T> inner, const PluginInfo& info) : inner_(std::move(inner)), who_(info) {}
    PluginInstance<T> inner_;
    Who who_;
};

class GuardedTarget final : public Guarded<Target> {
  public:
    GuardedTarget(PluginInstance<Target> inner, const PluginInfo& info) : Guarded(std::move(inner), info) {}
    bool supports(const onnx::NodeProto& node) const override {
        return who_.call("supports", [&] { return inner_->supports(node); });
    }
    QuantSpec default_spec(TensorRole role, const QuantRequest& request) const override {
        return who_.call("default_spec", [&] { return inner_->default_spec(role, request); });
    }
    void check(const QuantRequest& run) const override {
        who_.call("check", [&] { inner_->check(run); });
    }
    std::vector<std::string> legalization_passes(const QuantRequest& run) const override {
        return who_.call("legalization_passes", [&] { return inner_->legalization_passes(run); });
    }
    bool fuses(const onnx::NodeProto& producer, const onnx::NodeProto& consumer, const GraphIndex& index,
               const QuantRequest& run) const override {
        return who_.call("fuses", [&] { return inner_->fuses(producer, consumer, index, run); });
    }
    std::vector<ConstraintCount> refine(const Model& model, QuantPlan& plan, const QuantRequest& run) const override {
        return who_.call("refine", [&] { return inner_->refine(model, plan, run); });
    }
    std::vector<ConstraintCount> verify(const Model& quantized, const QuantRequest& run) const override {
        return who_.call("verify", [&] { return inner_->verify(quantized, run); });
    }
};

class GuardedFormat final : public Guarded<Format> {
  public:
    GuardedFormat(PluginInstance<Format> inner, const PluginInfo& info) : Guarded(std::move(inner), info) {}
    void emit(Model& model, const QuantPlan& plan) const override {
        who_.call("emit", [&] { inner_->emit(model, plan); });
    }
    bool wrote(const Model& model) const override {
        return who_.call("wrote", [&] { return inner_->wrote(model); });
    }
    NativeConversion to_native(Model& model) const override {
        return who_.call("to_native", [&] { return inner_->to_native(model); });
    }
};

class GuardedPass final : public Guarded<Pass> {
  public:
    GuardedPass(PluginInstance<Pass> inner, const PluginInfo& info) : Guarded(std::move(inner), info) {}
    bool run(Model& model) override {
        return who_.call("run", [&] { return inner_->run(model); });
    }
    std::vector<ChannelRangeRequest> channel_ranges_wanted(const Model& model) const override {
        return who_.call("channel_ranges_wanted", [&] { return inner_->channel_ranges_wanted(model); });
    }
    void set_channel_ranges(ChannelRanges ranges) override {
        who_.call("set_channel_ranges", [&] { inner_->set_channel_ranges(std::move(ranges)); });
    }
    bool keeps_function() const override {
        return who_.call("keeps_function", [&] { return inner_->keeps_function(); });
    }
};

class GuardedObserver final : public RangeObserver {
  public:
    GuardedObserver(std::unique_ptr<RangeObserver> inner, const Who& who, std::string tensor)
        : inner_(std::move(inner)), who_(who), tensor_(std::move(tensor)) {}
    void observe(const TensorView<float>& batch) override {
        who_.call("observe", [&] { inner_->observe(batch); });
    }
    CalibrationResult result() const override {
        auto r = who_.call("result", [&] { return inner_->result(); });
        if (!std::isfinite(r.range.min) || !std::isfinite(r.range.max) || r.range.min > r.range.max)
            who_.invalid(fmt::format("the range [{}, {}] for tensor '{}': a range is finite, its minimum at most its "
                                     "maximum",
                                     r.range.min, r.range.max, tensor_));
        return r;
    }
    Statistics statistics() const override {
        return who_.call("statistics", [&] { return inner_->statistics(); });
    }
    void merge(const Statistics& other) override {
        who_.call("merge", [&] { inner_->merge(other); });
    }
    bool order_free() const override {
        return who_.call("order_free", [&] { return inner_->order_free(); });
    }

  private:
    std::unique_ptr<RangeObserver> inner_;
    Who who_;
    std::string tensor_;
};

class GuardedCalibrator final : public Guarded<Calibrator> {
  public:
    GuardedCalibrator(PluginInstance<Calibrator> inner, const PluginInfo& info) : Guarded(std::move(inner), info) {}
    std::unique_ptr<RangeObserver> make_observer(const std::string& tensor, const QuantSpec& spec) const override {
        auto observer = who_.call("make_observer", [&] { return inner_->make_observer(tensor, spec); });
        if (!observer) who_.invalid(fmt::format("no observer for tensor '{}'", tensor));
        return std::make_unique<GuardedObserver>(std::move(observer), who_, tensor);
    }
    ScaleForm scale_form() const override {
        return who_.call("scale_form", [&] { return inner_->scale_form(); });
    }
    QuantParams constant_params(const Tensor& data, const QuantSpec& spec) const override {
        auto p = who_.call("constant_params", [&] { return inner_->constant_params(data, spec); });
        for (float s : p.scale)
            if (!std::isfinite(s) || !(s > 0))
                who_.invalid(fmt::format("a scale of {} for a constant: scales are finite and positive", s));
        if (!p.zero_point.empty() && p.zero_point.size() != p.scale.size())
            who_.invalid(fmt::format("{} zero points for {} scales of a constant", p.zero_point.size(), p.scale.size()));
        return p;
    }
};

template <typename G, typename T>
PluginInstance<T> wrap(PluginInstance<T> inner, const PluginInfo& info) {
    return PluginInstance<T>(new G(std::move(inner), info), [](T* p) { delete p; });
}

class GuardedAlgorithm final : public Guarded<Algorithm> {
  public:
    GuardedAlgorithm(PluginInstance<Algorithm> inner, const PluginInfo& info) : Guarded(std::move(inner), info) {}
    AlgorithmStage stage() const override {
        const auto stage = who_.call("stage", [&] { return inner_->stage(); });
        if (algorithm_stage_name(stage).empty())
            who_.invalid(fmt::format("stage {}, which is none of vaiq::AlgorithmStage", static_cast<uint32_t>(stage)));
        return stage;
    }
    void run(AlgorithmContext& context) override {
        who_.call("run", [&] { inner_->run(context); });
    }
};

class GuardedReader final : public Guarded<Reader> {
  public:
    GuardedReader(PluginInstance<Reader> inner, const PluginInfo& info) : Guarded(std::move(inner), info) {}
    int claim(const std::filesystem::path& path) const override {
        return who_.call("claim", [&] { return inner_->claim(path); });
    }
    std::unique_ptr<DataReader> open(const std::filesystem::path& path, const Model& model,
                                     const std::string& what) const override {
        auto reader = who_.call("open", [&] { return inner_->open(path, model, what); });
        if (!reader) who_.invalid(fmt::format("no reader for {} {}", what, path.string()));
        return reader;
    }
};

class GuardedReportWriter final : public Guarded<ReportWriter> {
  public:
    GuardedReportWriter(PluginInstance<ReportWriter> inner, const PluginInfo& info) : Guarded(std::move(inner), info) {}
    std::string extension() const override {
        auto extension = who_.call("extension", [&] { return inner_->extension(); });
        // It names a file beside the JSON report: ".html", not a path or the report itself.
        if (extension.size() < 2 || extension[0] != '.' || extension == ".json" ||
            extension.find_first_of("/\\", 1) != std::string::npos)
            who_.invalid(fmt::format("extension '{}' is not a file name extension such as \".html\"", extension));
        return extension;
    }
    std::string render(const nlohmann::json& report) const override {
        return who_.call("render", [&] { return inner_->render(report); });
    }
};
}  // namespace

PluginInstance<Target> guard_plugin(PluginInstance<Target> inner, const PluginInfo& info) {
    return wrap<GuardedTarget>(std::move(inner), info);
}
PluginInstance<Format> guard_plugin(PluginInstance<Format> inner, const PluginInfo& info) {
    return wrap<GuardedFormat>(std::move(inner), info);
}
PluginInstance<Calibrator> guard_plugin(PluginInstance<Calibrator> inner, const PluginInfo& info) {
    return wrap<GuardedCalibrator>(std::move(inner), info);
}
PluginInstance<Pass> guard_plugin(PluginInstance<Pass> inner, const PluginInfo& info) {
    return wrap<GuardedPass>(std::move(inner), info);
}
PluginInstance<Algorithm> guard_plugin(PluginInstance<Algorithm> inner, const PluginInfo& info) {
    return wrap<GuardedAlgorithm>(std::move(inner), info);
}
PluginInstance<Reader> guard_plugin(PluginInstance<Reader> inner, const PluginInfo& info) {
    return wrap<GuardedReader>(std::move(inner), info);
}
PluginInstance<ReportWriter> guard_plugin(PluginInstance<ReportWriter> inner, const PluginInfo& info) {
    return wrap<GuardedReportWriter>(std::move(inner), info);
}

}  // namespace vaiq
