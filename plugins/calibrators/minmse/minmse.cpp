// minmse: the power-of-two scale that minimises the squared quantization error
// (PowerOfTwoMethod.MinMSE), searched over positions pos0 - 1 .. pos0 + 3 around
// the position pos0 of the range's float scale (one larger scale, as Quark
// allows, since rounding pos0 can pick a scale that is too small).
//
// MinMSEMode:
//  - All (default): one streaming histogram over every batch; the error of a
//    candidate is summed over bin centres weighted by their counts.
//  - MostCommon: each batch picks its own best position; the most frequent wins
//    (ties: the smaller position, i.e. the larger scale).
//  - Percentile: values beyond the `percentile` of |x| are left out first.
// The range is symmetric by default (CalibTensorRangeSymmetric), as the
// documented PowerOfTwoMethod default says.
#include <vaiq/vaiq.hpp>

#include <algorithm>
#include <cmath>
#include <map>

namespace {

enum class Mode { All, MostCommon, Percentile };

struct Settings {
    Mode mode = Mode::All;
    bool symmetric = true;
    int bins = 2048;
    double percentile = 99.999;
};

// Squared error of quantizing `value` (count times) with the candidate parameters.
double squared_error(double value, double count, const vaiq::QuantParams& p, int64_t qmin, int64_t qmax) {
    return count * vaiq::round_trip_error(value, p.scale[0], static_cast<double>(p.zero_point[0]), qmin, qmax);
}

class MinMseObserver final : public vaiq::RangeObserver {
  public:
    MinMseObserver(std::string tensor, vaiq::QuantSpec spec, Settings s)
        : tensor_(std::move(tensor)), spec_(spec), s_(s), hist_(s.bins, false) {
        spec_.power_of_two = false;
        if (!vaiq::is_integer(spec_.type))
            throw vaiq::InputError(
                fmt::format("tensor '{}' is {}: MinMSE searches an integer grid; use MinMax, "
                            "Percentile or Entropy",
                            tensor_, vaiq::quant_type_name(spec_.type)));
        std::tie(qmin_, qmax_) = vaiq::integer_range(spec_.type, spec_.symmetric, spec_.reduce_range);
    }

    void observe(const vaiq::TensorView<float>& batch) override {
        hist_.add(batch.data, tensor_);
        if (s_.mode != Mode::MostCommon || batch.data.empty()) return;
        // This batch's own best position, from its raw values (not kept).
        const auto e = vaiq::extremes(batch.data);  // finite: add() checked
        const auto lo = e.lo, hi = e.hi;
        const auto range = ranged(lo, hi);
        ++votes_[best_position(range, [&](const vaiq::QuantParams& p) {
            double e = 0;
            for (float v : batch.data) e += squared_error(v, 1.0, p, qmin_, qmax_);
            return e;
        })];
    }

    // The votes (MostCommon) are saved as position, count pairs.
    vaiq::Statistics statistics() const override {
        vaiq::Statistics out;
        hist_.save(out);
        auto& votes = out["votes"];
        for (const auto& [pos, n] : votes_) votes.insert(votes.end(), {double(pos), double(n)});
        return out;
    }

    void merge(const vaiq::Statistics& other) override {
        const std::string what = "tensor '" + tensor_ + "'";
        hist_.merge(vaiq::Histogram::restore(other, s_.bins, false, what));
        const auto& votes = vaiq::statistic_array(other, "votes", what);
        if (votes.size() % 2 != 0) throw vaiq::InputError(fmt::format("the votes of {} are not pairs", what));
        for (size_t i = 0; i < votes.size(); i += 2) votes_[static_cast<int>(votes[i])] += static_cast<int>(votes[i + 1]);
    }

    bool order_free() const override { return true; }  // extremes and histograms only

    vaiq::CalibrationResult result() const override {
        if (hist_.empty())
            throw vaiq::InputError(fmt::format("tensor '{}' was never observed during calibration", tensor_));
        vaiq::CalibrationResult r;
        if (s_.mode == Mode::MostCommon) {
            int best = 0, most = -1;
            for (const auto& [pos, n] : votes_)
                if (n > most) {
                    best = pos;
                    most = n;
                }
            r.position = best;
            r.range = ranged(hist_.min(), hist_.max());
            return r;
        }
        // All and Percentile: the histogram, optionally cut at the percentile of |x|.
        double limit = std::numeric_limits<double>::infinity();
        if (s_.mode == Mode::Percentile) limit = percentile_of_abs(s_.percentile / 100.0);
        const auto& counts = hist_.counts();
        auto centre = [&](size_t i) {
            return static_cast<double>(static_cast<float>(hist_.edge(i) + hist_.stride() / 2));
        };
        const float lo = static_cast<float>(std::max<double>(hist_.min(), -limit));
        const float hi = static_cast<float>(std::min<double>(hist_.max(), limit));
        r.range = ranged(lo, hi);
        r.position = best_position(r.range, [&](const vaiq::QuantParams& p) {
            double e = 0;
            for (size_t i = 0; i < counts.size(); ++i)
                if (counts[i] > 0 && std::abs(centre(i)) <= limit)
                    e += squared_error(centre(i), counts[i], p, qmin_, qmax_);
            return e;
        });
        return r;
    }

  private:
    vaiq::TensorRange ranged(float lo, float hi) const {
        if (!s_.symmetric) return {lo, hi};
        const float t = std::max(std::abs(lo), std::abs(hi));
        return {-t, t};
    }

    template <typename Error>
    int best_position(vaiq::TensorRange range, Error&& error) const {
        const int pos0 = vaiq::scale_to_position(vaiq::compute_quant_params(range, spec_).scale[0]);
        int best = pos0;
        double best_error = std::numeric_limits<double>::infinity();
        for (int p = pos0 - 1; p <= pos0 + 3; ++p) {
            const double e = error(vaiq::power_of_two_params(range, p, spec_));
            if (e < best_error) {
                best_error = e;
                best = p;
            }
        }
        return best;
    }

    // The smallest bin edge below which `fraction` of |x| lies.
    double percentile_of_abs(double fraction) const {
        const auto& counts = hist_.counts();
        const size_t zero = counts.size() / 2;
        std::vector<double> by_distance(zero, 0.0);  // |x| bins, from 0 outwards
        for (size_t i = 0; i < counts.size(); ++i) by_distance[i < zero ? zero - 1 - i : i - zero] += counts[i];
        double sum = 0;
        for (size_t k = 0; k < by_distance.size(); ++k) {
            sum += by_distance[k];
            if (sum >= fraction * hist_.total()) return static_cast<double>(k + 1) * hist_.stride();
        }
        return static_cast<double>(by_distance.size()) * hist_.stride();
    }

    std::string tensor_;
    vaiq::QuantSpec spec_;
    Settings s_;
    vaiq::Histogram hist_;
    int64_t qmin_ = 0, qmax_ = 0;
    std::map<int, int> votes_;
};

class MinMse final : public vaiq::Calibrator {
  public:
    vaiq::ScaleForm scale_form() const override { return vaiq::ScaleForm::PowerOfTwo; }

    void configure(const vaiq::Options& options) override {
        const auto mode = options.get_string("MinMSEMode");
        if (mode == "All")
            s_.mode = Mode::All;
        else if (mode == "MostCommon")
            s_.mode = Mode::MostCommon;
        else if (mode == "Percentile")
            s_.mode = Mode::Percentile;
        else
            throw vaiq::InputError(fmt::format("MinMSEMode must be All, MostCommon or Percentile, not '{}'", mode));
        s_.symmetric = options.get_bool("CalibTensorRangeSymmetric");
        s_.bins = static_cast<int>(options.get_int("num_bins"));
        s_.percentile = options.get_float("percentile");
        if (s_.bins < 2 || s_.bins % 2 != 0 || s_.bins > (1 << 20))
            throw vaiq::InputError(fmt::format("num_bins must be an even number from 2 to 1048576, not {}", s_.bins));
        if (!(s_.percentile > 0.0 && s_.percentile <= 100.0))
            throw vaiq::InputError(fmt::format("percentile must be in (0, 100], not {}", s_.percentile));
    }
    std::unique_ptr<vaiq::RangeObserver> make_observer(const std::string& tensor,
                                                       const vaiq::QuantSpec& spec) const override {
        return std::make_unique<MinMseObserver>(tensor, spec, s_);
    }

  private:
    Settings s_;
};

const vaiq_option_descriptor kOptions[] = {
    {"MinMSEMode", VAIQ_OPTION_STRING, "All", "All, MostCommon or Percentile."},
    {"CalibTensorRangeSymmetric", VAIQ_OPTION_BOOL, "true", "Make the range symmetric around 0."},
    {"num_bins", VAIQ_OPTION_INT, "2048", "Histogram bins (All and Percentile)."},
    {"percentile", VAIQ_OPTION_FLOAT, "99.999", "Percentile of |x| kept (Percentile mode)."},
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<MinMse>("minmse", "0.1.0",
                                    "Power-of-two scale of least squared error (PowerOfTwoMethod.MinMSE)", kOptions))
