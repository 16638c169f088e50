// vaiq/calibrator.hpp - the calibrator plugin interface.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "vaiq/plugin.hpp"
#include "vaiq/quant.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {

/// What calibration found for one tensor.
struct CalibrationResult {
    TensorRange range;
    /// For power-of-two calibrators: the position p of scale 2^-p.
    std::optional<int> position;
};

/// Watches one tensor, batch by batch. It keeps statistics (running extremes,
/// histograms), never the batches themselves: memory must not grow with the
/// number of batches.
class VAIQ_API RangeObserver {
  public:
    virtual ~RangeObserver();
    virtual void observe(const TensorView<float>& batch) = 0;
    /// Throws InputError when nothing was observed.
    virtual CalibrationResult result() const = 0;
};

class VAIQ_API Calibrator : public Plugin {
  public:
    using Interface = Calibrator;
    static constexpr PluginKind kKind = PluginKind::Calibrator;

    /// A fresh observer for one tensor that will be quantized as `spec`.
    virtual std::unique_ptr<RangeObserver> make_observer(const std::string& tensor, const QuantSpec& spec) const = 0;
};

}  // namespace vaiq
