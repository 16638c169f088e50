// The Cross Layer Equalization pass (include_cle), configured from the
// documented CLESteps, CLETotalLayerDiffThreshold and CLEScaleAppendBias.
#pragma once

#include "passes.hpp"

namespace prepare_passes {

class CrossLayerEqualization final : public vaiq::Pass {
  public:
    void configure(const vaiq::Options& options) override;
    bool run(vaiq::Model& model) override;

  private:
    int steps_ = 1;
    double threshold_ = 2e-7;
    bool append_bias_ = true;
};

}  // namespace prepare_passes
