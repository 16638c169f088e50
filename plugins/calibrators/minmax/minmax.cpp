// minmax: the range of a tensor is the extremes it takes over the calibration
// data, or their moving average across batches (CalibMovingAverage).
#include <vaiq/vaiq.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

namespace {

struct Settings {
    bool moving_average = false;
    double averaging_constant = 0.01;
    bool symmetric = false;
};

class MinMaxObserver final : public vaiq::RangeObserver {
  public:
    MinMaxObserver(std::string tensor, Settings settings) : tensor_(std::move(tensor)), settings_(settings) {}

    void observe(const vaiq::TensorView<float>& batch) override {
        if (batch.data.empty()) return;
        const auto [lo, hi, finite, not_finite] = vaiq::extremes(batch.data);
        if (!finite)
            throw vaiq::InputError(fmt::format("tensor '{}' holds {} in calibration batch {}; its range is undefined",
                                               tensor_, not_finite, batches_ + 1));
        if (batches_ == 0 || !settings_.moving_average) {
            min_ = batches_ == 0 ? lo : std::min(min_, lo);
            max_ = batches_ == 0 ? hi : std::max(max_, hi);
        } else {
            // ONNX Runtime's smoothing: the new extreme pulls the average by the constant.
            const double c = settings_.averaging_constant;
            min_ = static_cast<float>(min_ + c * (lo - min_));
            max_ = static_cast<float>(max_ + c * (hi - max_));
        }
        ++batches_;
    }

    vaiq::Statistics statistics() const override { return {{"min", {min_}}, {"max", {max_}}, {"batches", {double(batches_)}}}; }

    void merge(const vaiq::Statistics& other) override {
        const std::string what = "tensor '" + tensor_ + "'";
        const auto batches = static_cast<int64_t>(vaiq::statistic(other, "batches", what));
        if (batches <= 0) return;
        const auto lo = static_cast<float>(vaiq::statistic(other, "min", what));
        const auto hi = static_cast<float>(vaiq::statistic(other, "max", what));
        if (!(lo <= hi)) throw vaiq::InputError(fmt::format("the statistics of {}: min {} above max {}", what, lo, hi));
        if (batches_ > 0 && settings_.moving_average)
            throw vaiq::InputError(fmt::format(
                "{}: a moving average (CalibMovingAverage) depends on the order of all batches, so statistics of "
                "separate shards cannot be merged; calibrate in one process or without CalibMovingAverage",
                what));
        min_ = batches_ == 0 ? lo : std::min(min_, lo);
        max_ = batches_ == 0 ? hi : std::max(max_, hi);
        batches_ += batches;
    }

    bool order_free() const override { return true; }  // extremes and histograms only

    vaiq::CalibrationResult result() const override {
        if (batches_ == 0)
            throw vaiq::InputError(fmt::format("tensor '{}' was never observed during calibration", tensor_));
        vaiq::CalibrationResult r{{min_, max_}, std::nullopt};
        if (settings_.symmetric) {
            const float absmax = std::max(std::abs(min_), std::abs(max_));
            r.range = {-absmax, absmax};
        }
        return r;
    }

  private:
    std::string tensor_;
    Settings settings_;
    int64_t batches_ = 0;
    float min_ = 0.0f;
    float max_ = 0.0f;
};

class MinMax final : public vaiq::Calibrator {
  public:
    void configure(const vaiq::Options& options) override {
        settings_.moving_average = options.get_bool("CalibMovingAverage");
        settings_.averaging_constant = options.get_float("CalibMovingAverageConstant");
        settings_.symmetric = options.get_bool("CalibTensorRangeSymmetric");
        if (settings_.averaging_constant <= 0.0 || settings_.averaging_constant > 1.0)
            throw vaiq::InputError(
                fmt::format("CalibMovingAverageConstant must be in (0, 1], not {}", settings_.averaging_constant));
    }

    std::unique_ptr<vaiq::RangeObserver> make_observer(const std::string& tensor,
                                                       const vaiq::QuantSpec&) const override {
        return std::make_unique<MinMaxObserver>(tensor, settings_);
    }

  private:
    Settings settings_;
};

const vaiq_option_descriptor kOptions[] = {
    {"CalibMovingAverage", VAIQ_OPTION_BOOL, "false", "Moving average of the per-batch minimum and maximum."},
    {"CalibMovingAverageConstant", VAIQ_OPTION_FLOAT, "0.01", "Smoothing constant of the moving average."},
    {"CalibTensorRangeSymmetric", VAIQ_OPTION_BOOL, "false", "Make the range symmetric around 0."},
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<MinMax>("minmax", "0.1.0",
                                    "Range from the extremes (or their moving average) of each tensor", kOptions))
