// entropy: the range whose int8 rendering loses the least information, by the
// KL divergence between the histogram clipped to a candidate threshold and the
// same histogram merged into `num_quantized_bins` levels (ONNX Runtime's
// Entropy calibrator, after TensorRT's).
//
// Bins: ONNX Runtime defaults to 128 histogram bins and 128 quantized bins,
// which leaves one candidate window - the full range - so its Entropy is MinMax
// in disguise. vaiq defaults to 2048 bins, giving (2048 - 128) / 2 + 1 = 961
// candidates. Two details differ from ONNX Runtime on purpose: the last merged
// level includes the final bin (ONNX Runtime's slice stops one short), and the
// expanded distribution q is spread only over the bins where p is non-zero, as
// TensorRT defines it, so that empty bins do not count as quantization error.
#include <vaiq/vaiq.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

namespace {

struct Settings {
    int bins = 2048;
    int quantized_bins = 128;
    bool symmetric = false;
};

// Adds eps to empty bins and takes it evenly from the others (ONNX Runtime's
// smooth_distribution); false when every bin is empty.
bool smooth(std::vector<double>& p, double eps = 1e-4) {
    size_t zeros = 0;
    for (double v : p) zeros += v == 0;
    const size_t nonzeros = p.size() - zeros;
    if (nonzeros == 0) return false;
    const double eps1 = eps * static_cast<double>(zeros) / static_cast<double>(nonzeros);
    for (double& v : p) v = v == 0 ? eps : v - eps1;
    return std::all_of(p.begin(), p.end(), [](double v) { return v > 0; });
}

// KL(p || q) after normalising both, as scipy.stats.entropy computes it.
double kl_divergence(const std::vector<double>& p, const std::vector<double>& q) {
    double sp = 0, sq = 0;
    for (size_t i = 0; i < p.size(); ++i) {
        sp += p[i];
        sq += q[i];
    }
    double kl = 0;
    for (size_t i = 0; i < p.size(); ++i) {
        const double a = p[i] / sp, b = q[i] / sq;
        if (a > 0) kl += a * std::log(a / b);
    }
    return kl;
}

class EntropyObserver final : public vaiq::RangeObserver {
  public:
    EntropyObserver(std::string tensor, Settings s) : tensor_(std::move(tensor)), s_(s), hist_(s.bins, false) {}

    void observe(const vaiq::TensorView<float>& batch) override { hist_.add(batch.data, tensor_); }

    vaiq::Statistics statistics() const override {
        vaiq::Statistics out;
        hist_.save(out);
        return out;
    }

    void merge(const vaiq::Statistics& other) override {
        hist_.merge(vaiq::Histogram::restore(other, s_.bins, false, "tensor '" + tensor_ + "'"));
    }

    bool order_free() const override { return true; }  // extremes and histograms only

    vaiq::CalibrationResult result() const override {
        if (hist_.empty())
            throw vaiq::InputError(fmt::format("tensor '{}' was never observed during calibration", tensor_));
        const auto& hist = hist_.counts();
        const size_t bins = hist.size();
        const size_t zero = bins / 2;
        const size_t nq = static_cast<size_t>(s_.quantized_bins);
        const size_t half_q = nq / 2;
        double best = std::numeric_limits<double>::infinity();
        std::pair<double, double> threshold{hist_.edge(0), hist_.edge(bins)};
        std::vector<double> prefix(bins + 1, 0.0);
        for (size_t i = 0; i < bins; ++i) prefix[i + 1] = prefix[i] + hist[i];
        // A histogram that grew past the requested bins is searched at the requested resolution.
        const size_t step = std::max<size_t>(1, bins / static_cast<size_t>(s_.bins));
        for (size_t i = half_q; i <= zero; i += step) {
            const size_t start = zero - i;
            const size_t end = std::min(zero + i + 1, bins);
            const size_t width = end - start;
            if (width < nq) continue;
            // p: the window, with everything outside it folded into its end bins.
            std::vector<double> p(hist.begin() + static_cast<long>(start), hist.begin() + static_cast<long>(end));
            p.front() += prefix[start];
            p.back() += prefix[bins] - prefix[end];
            // q: the window merged into nq levels, spread back over p's non-empty bins.
            std::vector<double> q(width, 0.0);
            const size_t merged = width / nq;
            for (size_t level = 0; level < nq; ++level) {
                const size_t a = level * merged;
                const size_t b = level + 1 == nq ? width : a + merged;
                double sum = 0, nonzero = 0;
                for (size_t j = a; j < b; ++j) {
                    sum += hist[start + j];
                    nonzero += p[j] != 0;
                }
                if (nonzero == 0) continue;
                for (size_t j = a; j < b; ++j)
                    if (p[j] != 0) q[j] = sum / nonzero;
            }
            if (!smooth(p) || !smooth(q)) continue;
            const double kl = kl_divergence(p, q);
            if (kl < best) {
                best = kl;
                threshold = {hist_.edge(start), hist_.edge(end)};
            }
        }
        vaiq::CalibrationResult r;
        r.range.min = static_cast<float>(std::max<double>(threshold.first, hist_.min()));
        r.range.max = static_cast<float>(std::min<double>(threshold.second, hist_.max()));
        if (s_.symmetric) {
            const float t = std::max(std::abs(r.range.min), std::abs(r.range.max));
            r.range = {-t, t};
        }
        return r;
    }

  private:
    std::string tensor_;
    Settings s_;
    vaiq::Histogram hist_;
};

class Entropy final : public vaiq::Calibrator {
  public:
    void configure(const vaiq::Options& options) override {
        s_.bins = static_cast<int>(options.get_int("num_bins"));
        s_.quantized_bins = static_cast<int>(options.get_int("num_quantized_bins"));
        s_.symmetric = options.get_bool("CalibTensorRangeSymmetric");
        if (s_.quantized_bins < 2 || s_.quantized_bins % 2 != 0)
            throw vaiq::InputError(
                fmt::format("num_quantized_bins must be an even number of at least 2, not {}", s_.quantized_bins));
        if (s_.bins < s_.quantized_bins || s_.bins % 2 != 0 || s_.bins > (1 << 20))
            throw vaiq::InputError(
                fmt::format("num_bins must be even, at least num_quantized_bins ({}) and at most "
                            "1048576, not {}",
                            s_.quantized_bins, s_.bins));
    }

    std::unique_ptr<vaiq::RangeObserver> make_observer(const std::string& tensor,
                                                       const vaiq::QuantSpec&) const override {
        return std::make_unique<EntropyObserver>(tensor, s_);
    }

  private:
    Settings s_;
};

const vaiq_option_descriptor kOptions[] = {
    {"num_bins", VAIQ_OPTION_INT, "2048", "Histogram bins over [-max|x|, max|x|] (ONNX Runtime: 128)."},
    {"num_quantized_bins", VAIQ_OPTION_INT, "128", "Levels each candidate window is merged into."},
    {"CalibTensorRangeSymmetric", VAIQ_OPTION_BOOL, "false", "Make the range symmetric around 0."},
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<Entropy>("entropy", "0.1.0",
                                     "Range of least KL divergence between the float and quantized histograms",
                                     kOptions))
