// percentile: the range keeps the given percentile of the values, cutting the
// rare outliers that would otherwise stretch the scale (ONNX Runtime's
// Percentile calibrator, streaming).
//
// Symmetric (the default, as in ONNX Runtime): t is where the histogram of |x|
// reaches the percentile, and the range is [-t, t] clipped to the observed
// [min, max]. Asymmetric: (100 - p) / 2 percent is cut from each tail.
//
// Unlike ONNX Runtime, the threshold is the upper edge of the bin where the
// cumulative count reaches the percentile: its lower edge, which ONNX Runtime
// takes, leaves up to a whole bin of the requested mass outside the range.
#include <vaiq/vaiq.hpp>

#include <algorithm>

namespace {

struct Settings {
    double percentile = 99.999;
    int bins = 2048;
    bool symmetric = true;
};

// First bin whose cumulative count reaches `fraction` of the total.
size_t bin_reaching(const std::vector<double>& counts, double total, double fraction) {
    double sum = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
        sum += counts[i];
        if (sum >= fraction * total) return i;
    }
    return counts.size() - 1;
}

class PercentileObserver final : public vaiq::RangeObserver {
  public:
    PercentileObserver(std::string tensor, Settings s)
        : tensor_(std::move(tensor)), s_(s), hist_(s.bins, s.symmetric) {}

    void observe(const vaiq::TensorView<float>& batch) override { hist_.add(batch.data, tensor_); }

    vaiq::Statistics statistics() const override {
        vaiq::Statistics out;
        hist_.save(out);
        return out;
    }

    void merge(const vaiq::Statistics& other) override {
        hist_.merge(vaiq::Histogram::restore(other, s_.bins, s_.symmetric, "tensor '" + tensor_ + "'"));
    }

    bool order_free() const override { return true; }  // extremes and histograms only

    vaiq::CalibrationResult result() const override {
        if (hist_.empty())
            throw vaiq::InputError(fmt::format("tensor '{}' was never observed during calibration", tensor_));
        const auto& counts = hist_.counts();
        double lo, hi;
        if (s_.symmetric) {
            hi = hist_.edge(bin_reaching(counts, hist_.total(), s_.percentile / 100.0) + 1);
            lo = -hi;
        } else {
            const double cut = (100.0 - s_.percentile) / 200.0;
            lo = hist_.edge(bin_reaching(counts, hist_.total(), cut));
            hi = hist_.edge(bin_reaching(counts, hist_.total(), 1.0 - cut) + 1);
        }
        vaiq::CalibrationResult r;
        r.range.min = static_cast<float>(std::max<double>(lo, hist_.min()));
        r.range.max = static_cast<float>(std::min<double>(hi, hist_.max()));
        return r;
    }

  private:
    std::string tensor_;
    Settings s_;
    vaiq::Histogram hist_;
};

class Percentile final : public vaiq::Calibrator {
  public:
    void configure(const vaiq::Options& options) override {
        s_.percentile = options.get_float("percentile");
        s_.bins = static_cast<int>(options.get_int("num_bins"));
        s_.symmetric = options.get_bool("CalibTensorRangeSymmetric");
        if (!(s_.percentile > 0.0 && s_.percentile <= 100.0))
            throw vaiq::InputError(fmt::format("percentile must be in (0, 100], not {}", s_.percentile));
        if (s_.bins < 2 || s_.bins > (1 << 24) || s_.bins % 2 != 0)
            throw vaiq::InputError(fmt::format("num_bins must be an even number from 2 to 16777216, not {}", s_.bins));
    }

    std::unique_ptr<vaiq::RangeObserver> make_observer(const std::string& tensor,
                                                       const vaiq::QuantSpec&) const override {
        return std::make_unique<PercentileObserver>(tensor, s_);
    }

  private:
    Settings s_;
};

const vaiq_option_descriptor kOptions[] = {
    {"percentile", VAIQ_OPTION_FLOAT, "99.999", "Percentage of the values the range keeps."},
    {"num_bins", VAIQ_OPTION_INT, "2048", "Histogram bins (the histogram grows at the same stride across batches)."},
    {"CalibTensorRangeSymmetric", VAIQ_OPTION_BOOL, "true",
     "Symmetric: threshold |x| and use [-t, t]; otherwise cut both tails."},
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<Percentile>("percentile", "0.1.0",
                                        "Range that keeps a percentile of the values (streaming histogram)", kOptions))
