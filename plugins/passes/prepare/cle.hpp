// The Cross Layer Equalization pass (include_cle), configured from the
// documented CLESteps, CLETotalLayerDiffThreshold and CLEScaleAppendBias,
// and vaiq's CLEActivationAware.
#pragma once

#include "passes.hpp"

namespace prepare_passes {

class CrossLayerEqualization final : public vaiq::Pass {
  public:
    void configure(const vaiq::Options& options) override;
    bool run(vaiq::Model& model) override;
    std::vector<vaiq::ChannelRangeRequest> channel_ranges_wanted(const vaiq::Model& model) const override;
    void set_channel_ranges(vaiq::ChannelRanges ranges) override { activations_ = std::move(ranges); }

  private:
    int steps_ = 1;
    double threshold_ = 2e-7;
    bool append_bias_ = true;
    bool activation_aware_ = false;
    vaiq::ChannelRanges activations_;  ///< max |x| per channel of the tensors between layers, as scaled so far
};

}  // namespace prepare_passes
