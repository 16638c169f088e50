// The host's side of an algorithm plugin's context: what the run gives it and
// where its changes go.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "pipeline/data_reader.hpp"
#include "vaiq/algorithm.hpp"

namespace vaiq {

/// What one algorithm works on, taken from the run: read-only views, the
/// data, and callbacks that apply its changes to the run.
struct AlgorithmInputs {
    const Model& model;
    const QuantPlan& plan;
    const std::map<std::string, Tensor>& fitted_weights;
    DataReader& data;
    int threads = 0;
    /// The model as the run's format writes a plan, some weights in place of the float ones.
    std::function<Model(const QuantPlan&, const std::map<std::string, Tensor>&)> emit;
    /// Keeps fitted weights (in place of earlier fits of the same weights).
    std::function<void(std::map<std::string, Tensor>)> keep_fitted;
    /// Keeps a tensor's chosen parameters (checked) for the rest of the run.
    std::function<void(const std::string&, const QuantParams&)> keep_parameters;
    /// Takes the algorithm's report section.
    std::function<void(nlohmann::json)> report;
    /// The nodes the recipe quantizes, and the target's spec for a role.
    std::function<std::set<std::string>()> quantized_nodes;
    std::function<QuantSpec(TensorRole)> default_spec;
    /// Takes a rewritten float model (Prepare stage); null in the other stages.
    std::function<void(Model)> replace_model;
    /// Measures a quantized model's output against the float model's; null before calibration.
    std::function<OutputAgreement(const Model&, int output_index)> agreement;
    /// Takes new float initializer values (Corrections stage); null in the other stages.
    std::function<void(std::map<std::string, Tensor>)> replace_initializers;
};

class HostAlgorithmContext final : public AlgorithmContext {
  public:
    explicit HostAlgorithmContext(AlgorithmInputs inputs);
    ~HostAlgorithmContext() override;

    const Model& model() const override { return in_.model; }
    const QuantPlan& plan() const override { return in_.plan; }
    const std::map<std::string, Tensor>& fitted_weights() const override { return in_.fitted_weights; }
    std::set<std::string> quantized_nodes() const override { return in_.quantized_nodes(); }
    QuantSpec default_spec(TensorRole role) const override { return in_.default_spec(role); }
    DataStream& data() override;
    int threads() const override { return in_.threads; }

    Model quantized(const QuantPlan& plan, const std::map<std::string, Tensor>& weights) override;
    std::unique_ptr<ModelRunner> runner(const Model& model, bool float_values,
                                        const std::set<std::string>& taps) override;
    OutputAgreement agreement(const Model& quantized, int output_index) override;
    void for_each_tapped(const Model& model, const std::vector<std::string>& tensors,
                         const TapFunction& observe) override;
    ChannelRanges channel_ranges(const Model& model, const std::vector<ChannelRangeRequest>& requests) override;
    void progress(std::string_view what, int64_t done, int64_t total) override;

    void set_fitted_weights(std::map<std::string, Tensor> weights) override;
    void set_parameters(const std::string& tensor, const QuantParams& params) override;
    void set_initializers(std::map<std::string, Tensor> values) override;
    void set_model(Model model) override;
    void report(nlohmann::json section) override;

  private:
    class Stream;
    AlgorithmInputs in_;
    std::unique_ptr<Stream> stream_;
};

}  // namespace vaiq
