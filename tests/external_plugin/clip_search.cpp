// clip_search: a third-party algorithm that searches each per-tensor weight's
// clip ratio: the scale max|w| / qmax shrunk by the ratio, among 1, 1 - step,
// ..., min_ratio, with the least squared error over the weight's values.
// One outlier no longer spreads the grid over every other value. A recipe
// names it, or switches it on as a documented option would be:
// extra_options: {ClipSearch: {Enable: true, MinRatio: 0.8}}.
#include <vaiq/vaiq.hpp>

#include <cmath>

namespace {

double squared_error(const vaiq::Tensor& w, const vaiq::QuantParams& params, const std::string& name) {
    const auto q = vaiq::fake_quantize(w, params, name);
    double e = 0;
    for (size_t i = 0; i < w.size(); ++i) {
        const double d = static_cast<double>(w.data<float>()[i]) - q.data<float>()[i];
        e += d * d;
    }
    return e;
}

class ClipSearch final : public vaiq::Algorithm {
  public:
    void configure(const vaiq::Options& options) override {
        min_ratio_ = options.get_float("ClipSearch.MinRatio");
        steps_ = options.get_int("ClipSearch.Steps");
        if (!(min_ratio_ > 0 && min_ratio_ <= 1) || steps_ < 1)
            throw vaiq::InputError("clip_search needs 0 < ClipSearch.MinRatio <= 1 and ClipSearch.Steps >= 1");
    }

    void run(vaiq::AlgorithmContext& context) override {
        const vaiq::GraphIndex index(context.model());
        nlohmann::json ratios = nlohmann::json::object();
        int searched = 0;
        for (const auto& t : context.plan().tensors) {
            const auto* init = index.initializer(t.tensor);
            if (t.role != vaiq::TensorRole::Weight || !init || t.params.scale.size() != 1 || t.params.block_size > 0)
                continue;
            const auto w = vaiq::Tensor::from_proto(*init);
            if (w.type() != vaiq::DataType::Float) continue;
            ++searched;
            double best_ratio = 1, best_error = squared_error(w, t.params, t.tensor);
            for (int64_t k = 1; k <= steps_; ++k) {
                const double ratio = 1 - (1 - min_ratio_) * static_cast<double>(k) / static_cast<double>(steps_);
                auto clipped = t.params;
                clipped.scale[0] = static_cast<float>(t.params.scale[0] * ratio);
                const double e = squared_error(w, clipped, t.tensor);
                if (e < best_error) best_error = e, best_ratio = ratio;
            }
            if (best_ratio == 1) continue;
            auto chosen = t.params;
            chosen.scale[0] = static_cast<float>(t.params.scale[0] * best_ratio);
            context.set_parameters(t.tensor, chosen);
            ratios[t.tensor] = best_ratio;
        }
        context.report({{"searched", searched}, {"clipped", ratios.size()}, {"ratios", ratios}});
        vaiq::log_info("clip_search: {} of {} weights clipped", ratios.size(), searched);
    }

  private:
    double min_ratio_ = 0.5;
    int64_t steps_ = 10;
};

const vaiq_option_descriptor kOptions[] = {
    {"ClipSearch.MinRatio", VAIQ_OPTION_FLOAT, "0.5", "The smallest clip ratio tried."},
    {"ClipSearch.Steps", VAIQ_OPTION_INT, "10", "Ratios tried below 1, evenly down to MinRatio."},
};

}  // namespace

VAIQ_PLUGINS(vaiq::enabled_by(vaiq::describe<ClipSearch>("clip_search", "1.0.0",
                                                         "Clip each per-tensor weight where it rounds best", kOptions),
                              "extra_options.ClipSearch.Enable"))
