// nonoverflow: power-of-two scales from the observed extremes
// (PowerOfTwoMethod.NonOverflow). The range is symmetric by default, as the
// documented PowerOfTwoMethod default of CalibTensorRangeSymmetric says.
//
// Default (strict: false): the position is the float scale's -log2 rounded to
// the nearest integer, as vai_q_onnx and Quark compute it. That can pick a scale
// up to sqrt(2) smaller than the range needs, so the largest values clip - the
// name notwithstanding. It is the default so that vaiq's models match the
// anchors'. strict: true rounds the position down instead: the scale is never
// smaller than the range needs, and nothing overflows.
#include <vaiq/vaiq.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

namespace {

struct Settings {
    bool symmetric = true;
    bool strict = false;
};

class NonOverflowObserver final : public vaiq::RangeObserver {
  public:
    NonOverflowObserver(std::string tensor, vaiq::QuantSpec spec, Settings s)
        : tensor_(std::move(tensor)), spec_(spec), s_(s) {}

    void observe(const vaiq::TensorView<float>& batch) override {
        if (batch.data.empty()) return;
        const auto [lo, hi, finite, not_finite] = vaiq::extremes(batch.data);
        if (!finite)
            throw vaiq::InputError(
                fmt::format("tensor '{}' holds {} during calibration; its range is undefined", tensor_, not_finite));
        min_ = std::min(min_, lo);
        max_ = std::max(max_, hi);
        seen_ = true;
    }

    vaiq::Statistics statistics() const override {
        if (!seen_) return {{"min", {}}, {"max", {}}};
        return {{"min", {min_}}, {"max", {max_}}};
    }

    void merge(const vaiq::Statistics& other) override {
        const std::string what = "tensor '" + tensor_ + "'";
        if (vaiq::statistic_array(other, "min", what).empty()) return;  // saw nothing
        const auto lo = static_cast<float>(vaiq::statistic(other, "min", what));
        const auto hi = static_cast<float>(vaiq::statistic(other, "max", what));
        if (!(lo <= hi)) throw vaiq::InputError(fmt::format("the statistics of {}: min {} above max {}", what, lo, hi));
        min_ = std::min(min_, lo);
        max_ = std::max(max_, hi);
        seen_ = true;
    }

    bool order_free() const override { return true; }  // extremes and histograms only

    vaiq::CalibrationResult result() const override {
        if (!seen_) throw vaiq::InputError(fmt::format("tensor '{}' was never observed during calibration", tensor_));
        vaiq::CalibrationResult r{{min_, max_}, std::nullopt};
        if (s_.symmetric) {
            const float t = std::max(std::abs(min_), std::abs(max_));
            r.range = {-t, t};
        }
        auto float_spec = spec_;
        float_spec.power_of_two = false;
        const double scale = vaiq::compute_quant_params(r.range, float_spec).scale[0];
        r.position = s_.strict ? static_cast<int>(std::clamp(std::floor(-std::log2(scale)), -127.0, 127.0))
                               : vaiq::scale_to_position(scale);
        return r;
    }

  private:
    std::string tensor_;
    vaiq::QuantSpec spec_;
    Settings s_;
    bool seen_ = false;
    float min_ = std::numeric_limits<float>::infinity();
    float max_ = -std::numeric_limits<float>::infinity();
};

class NonOverflow final : public vaiq::Calibrator {
  public:
    vaiq::ScaleForm scale_form() const override { return vaiq::ScaleForm::PowerOfTwo; }

    void configure(const vaiq::Options& options) override {
        s_.symmetric = options.get_bool("CalibTensorRangeSymmetric");
        s_.strict = options.get_bool("strict");
    }
    std::unique_ptr<vaiq::RangeObserver> make_observer(const std::string& tensor,
                                                       const vaiq::QuantSpec& spec) const override {
        return std::make_unique<NonOverflowObserver>(tensor, spec, s_);
    }

  private:
    Settings s_;
};

const vaiq_option_descriptor kOptions[] = {
    {"CalibTensorRangeSymmetric", VAIQ_OPTION_BOOL, "true", "Make the range symmetric around 0."},
    {"strict", VAIQ_OPTION_BOOL, "false",
     "Round the position down so that no value overflows (the anchors round to nearest)."},
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<NonOverflow>("nonoverflow", "0.1.0",
                                         "Power-of-two scale from the extremes (PowerOfTwoMethod.NonOverflow)",
                                         kOptions))
