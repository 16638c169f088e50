// vaiq/calibrator.hpp - the calibrator plugin interface.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "vaiq/plugin.hpp"
#include "vaiq/quant.hpp"
#include "vaiq/statistics.hpp"
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
/// number of batches. The host calls observe() with one batch at a time and in
/// the data's order, but observers of different tensors may observe at once on
/// different threads (batches run several at a time): they must not share
/// mutable state.
class VAIQ_API RangeObserver {
  public:
    virtual ~RangeObserver();
    virtual void observe(const TensorView<float>& batch) = 0;
    /// Throws InputError when nothing was observed.
    virtual CalibrationResult result() const = 0;

    /// The statistics kept so far, for a statistics file. Empty (the default)
    /// when this observer cannot save them; `vaiq calibrate` then refuses.
    virtual Statistics statistics() const;
    /// Takes in the statistics another observer of the same calibrator, options
    /// and tensor spec saved on other data, as if this one had seen that data
    /// too (after its own). Throws InputError when that cannot be done exactly
    /// enough (e.g. a moving average, which depends on the order of batches).
    /// The default throws.
    virtual void merge(const Statistics& other);
    /// True when observe() depends only on the batch's values, not on their
    /// order or its shape (extremes, histograms): the host may then hand it
    /// the tensor as the executor holds it (NHWC, say) instead of transposing
    /// it back first. The default is false.
    virtual bool order_free() const;
};

/// The scales a calibrator gives.
enum class ScaleForm {
    Any,         ///< any positive float
    PowerOfTwo,  ///< 2^-p: every integer tensor of the nodes it calibrates gets one
};

class VAIQ_API Calibrator : public Plugin {
  public:
    using Interface = Calibrator;
    static constexpr PluginKind kKind = PluginKind::Calibrator;

    /// A fresh observer for one tensor that will be quantized as `spec`.
    virtual std::unique_ptr<RangeObserver> make_observer(const std::string& tensor, const QuantSpec& spec) const = 0;

    /// The scales this calibrator gives. With PowerOfTwo the host plans every
    /// integer tensor of the nodes it calibrates (weights, activations, biases
    /// stored on their own) with QuantSpec::power_of_two, and an observer's
    /// result should carry the position. The default is Any.
    virtual ScaleForm scale_form() const;

    /// Parameters for a constant of a node this calibrator calibrates (a weight,
    /// or a bias quantized on its own): per channel along spec.axis when
    /// spec.per_channel. The default is vaiq::constant_params (the extremes, or
    /// the power-of-two search when spec.power_of_two).
    virtual QuantParams constant_params(const Tensor& data, const QuantSpec& spec) const;
};

}  // namespace vaiq
