// The host's side of an algorithm plugin's context: what the run gives it and
// where its changes go.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "data/data_reader.hpp"
#include "vaiq/algorithm.hpp"

namespace vaiq {

/// What one algorithm works on, taken from the run: read-only views, the
/// data, and callbacks that apply its changes to the run. A callback left
/// empty is a service its stage does not offer (the context says so).
struct AlgorithmInputs {
    AlgorithmInputs(const Model& model, const QuantPlan& plan, DataReader& data, int threads)
        : model(model), plan(plan), data(data), threads(threads) {}

    const Model& model;
    const QuantPlan& plan;
    DataReader& data;
    int threads = 0;
    /// false: data() yields nothing and channel_ranges() measures nothing (a Plan stage without
    /// data to decide by, a Written stage of a run calibrated from statistics files only).
    bool measurable = true;
    /// The data an algorithm's passes replay from memory after the first, when it fits (bytes).
    size_t data_kept_bytes = size_t{256} << 20;
    /// The fitted weights the plan still applies to.
    std::function<std::map<std::string, Tensor>()> fitted_weights;
    /// The model as the run's format writes a plan, some weights in place of the float ones.
    std::function<Model(const QuantPlan&, const std::map<std::string, Tensor>&)> emit;
    /// Keeps fitted weights (in place of earlier fits of the same weights).
    std::function<void(std::map<std::string, Tensor>)> keep_fitted;
    /// Keeps a tensor's chosen parameters (checked) for the rest of the run.
    std::function<void(const std::string&, const QuantParams&)> keep_parameters;
    /// Takes the algorithm's report section, and its notes on tensors.
    std::function<void(nlohmann::json)> report;
    std::function<void(const std::string&, std::string)> note;
    /// The nodes the recipe quantizes, and the target's spec for a role.
    std::function<std::set<std::string>()> quantized_nodes;
    std::function<QuantSpec(TensorRole)> default_spec;
    /// Takes a rewritten float model (Prepare stage).
    std::function<void(Model)> replace_model;
    /// Plan stage: the draft, and its changes.
    std::function<Draft()> draft;
    std::function<void(const std::string&, const std::string&, bool)> keep_float;
    std::function<bool(const std::string&, int)> set_per_channel;
    std::function<void(const std::string&)> mark_mixed_scales;
    /// The tensors marked so, and the report's sections so far.
    std::function<std::set<std::string>()> mixed_scale_tensors;
    std::function<nlohmann::json(const std::string&)> reported;
    /// After calibration: a quantized model's output against the float model's, the output measured.
    std::function<OutputAgreement(const Model&, int output_index, Batches)> agreement;
    std::function<std::vector<OutputAgreement>(size_t, const Model&,
                                               const std::function<AlgorithmContext::VariantRun(int)>&,
                                               int output_index, Batches, std::optional<size_t> reference_variant)>
        agreements;
    std::function<MeasuredOutput(int output_index)> measured_output;
    /// Parameters stage: the target's types, raised plans and precisions kept, another algorithm tried.
    std::function<bool(QuantType activation, QuantType weight)> target_runs;
    std::function<QuantPlan(const std::set<std::string>&, const Precision&, size_t*)> raised_plan;
    std::function<void(const std::set<std::string>&, const Precision&)> set_precision;
    std::function<bool(const std::string&, const std::function<bool()>&)> try_algorithm;
    /// Whether the run runs an algorithm in its own turn.
    std::function<bool(const std::string&)> runs;
    /// Takes new float initializer values (Corrections stage).
    std::function<void(std::map<std::string, Tensor>)> replace_initializers;
    /// Written stage: the written model and nested runs.
    std::function<Model&()> written;
    std::function<std::optional<NestedQuantization>(const Model&, DataReader&, const nlohmann::json&,
                                                    const nlohmann::json&)>
        quantize_nested;
};

class HostAlgorithmContext final : public AlgorithmContext {
  public:
    explicit HostAlgorithmContext(AlgorithmInputs inputs);
    ~HostAlgorithmContext() override;

    const Model& model() const override { return in_.model; }
    const QuantPlan& plan() const override { return in_.plan; }
    const std::map<std::string, Tensor>& fitted_weights() const override;
    std::set<std::string> quantized_nodes() const override { return in_.quantized_nodes(); }
    QuantSpec default_spec(TensorRole role) const override { return in_.default_spec(role); }
    DataStream& data() override;
    int threads() const override { return in_.threads; }

    Model quantized(const QuantPlan& plan, const std::map<std::string, Tensor>& weights) override;
    std::unique_ptr<ModelRunner> runner(const Model& model, bool float_values,
                                        const std::set<std::string>& taps) override;
    std::unique_ptr<ModelRunner> forking_runner(const Model& model, const std::set<std::string>& forks, int threads = 0,
                                                bool rewrites = false) override;
    OutputAgreement agreement(const Model& quantized, int output_index, Batches batches) override;
    std::vector<OutputAgreement> agreements(size_t variants, const Model& compiled,
                                            const std::function<VariantRun(int threads)>& make_run, int output_index,
                                            Batches batches, std::optional<size_t> reference_variant) override;
    MeasuredOutput measured_output(int output_index) override;
    bool target_runs(QuantType activation_type, QuantType weight_type) override;
    QuantPlan raised_plan(const std::set<std::string>& tensors, const Precision& precision, size_t* count) override;
    void for_each_tapped(const Model& model, const std::vector<std::string>& tensors,
                         const TapFunction& observe) override;
    ChannelRanges channel_ranges(const Model& model, const std::vector<ChannelRangeRequest>& requests,
                                 size_t batches) override;
    void progress(std::string_view what, int64_t done, int64_t total) override;

    void set_fitted_weights(std::map<std::string, Tensor> weights) override;
    void set_parameters(const std::string& tensor, const QuantParams& params) override;
    void set_precision(const std::set<std::string>& tensors, const Precision& precision) override;
    bool try_algorithm(const std::string& name, const std::function<bool()>& keep) override;
    bool runs(const std::string& name) const override { return in_.runs(name); }
    void set_initializers(std::map<std::string, Tensor> values) override;
    void set_model(Model model) override;
    void report(nlohmann::json section) override;
    void note(const std::string& tensor, std::string text) override { in_.note(tensor, std::move(text)); }
    Draft draft() const override;
    void keep_float(const std::string& tensor, const std::string& reason, bool sharers_on_own_range) override;
    bool set_per_channel(const std::string& tensor, int axis) override;
    void mark_mixed_scales(const std::string& tensor) override;
    std::set<std::string> mixed_scale_tensors() const override {
        return in_.mixed_scale_tensors ? in_.mixed_scale_tensors() : std::set<std::string>{};
    }
    nlohmann::json reported(const std::string& algorithm) const override {
        return in_.reported ? in_.reported(algorithm) : nlohmann::json();
    }
    bool has_data() const override { return in_.measurable; }
    Model& written() override;
    std::optional<NestedQuantization> quantize_nested(const Model& model, DataReader& data,
                                                      const nlohmann::json& shared_inputs,
                                                      const nlohmann::json& shared_outputs) override;

  private:
    /// The callback, or an InternalError saying that `what` is not offered in this stage.
    template <typename F>
    const F& service(const F& f, const char* what) const;
    class Stream;
    AlgorithmInputs in_;
    std::unique_ptr<Stream> stream_;
    mutable std::map<std::string, Tensor> fitted_;  ///< as fitted_weights() last read them
};

}  // namespace vaiq
