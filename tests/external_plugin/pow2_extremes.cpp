// pow2_extremes: a third-party power-of-two calibrator. It declares
// ScaleForm::PowerOfTwo and nothing else about scales: the host gives every
// integer tensor of its nodes a power-of-two scale, and weights their position
// through the SDK's default Calibrator::constant_params, as for the built-in
// power-of-two methods. Activations: the symmetric extremes, at the position
// of their float scale rounded to nearest (what nonoverflow does by default).
#include <vaiq/vaiq.hpp>

#include <algorithm>
#include <cmath>

namespace {

class ExtremesObserver final : public vaiq::RangeObserver {
  public:
    ExtremesObserver(std::string tensor, vaiq::QuantSpec spec) : tensor_(std::move(tensor)), spec_(spec) {}

    void observe(const vaiq::TensorView<float>& batch) override {
        for (float v : batch.data) absmax_ = std::max(absmax_, std::abs(v));
        seen_ = seen_ || !batch.data.empty();
    }

    vaiq::CalibrationResult result() const override {
        if (!seen_) throw vaiq::InputError("tensor '" + tensor_ + "' was never observed");
        vaiq::CalibrationResult r{{-absmax_, absmax_}, std::nullopt};
        auto float_spec = spec_;
        float_spec.power_of_two = false;
        r.position = vaiq::scale_to_position(vaiq::compute_quant_params(r.range, float_spec).scale[0]);
        return r;
    }

  private:
    std::string tensor_;
    vaiq::QuantSpec spec_;
    bool seen_ = false;
    float absmax_ = 0.0f;
};

class Pow2Extremes final : public vaiq::Calibrator {
  public:
    vaiq::ScaleForm scale_form() const override { return vaiq::ScaleForm::PowerOfTwo; }
    std::unique_ptr<vaiq::RangeObserver> make_observer(const std::string& tensor,
                                                       const vaiq::QuantSpec& spec) const override {
        return std::make_unique<ExtremesObserver>(tensor, spec);
    }
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<Pow2Extremes>("pow2_extremes", "1.0.0", "Power-of-two scales from the symmetric extremes"))
