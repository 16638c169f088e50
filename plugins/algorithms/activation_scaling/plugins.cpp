// Algorithms that scale an activation's channels into the weights that read
// it, keeping the float function: SmoothQuant and AWQ-lite on the float model
// before calibration, and AWQ-clip's per-block clip search on the plan.
#include <fmt/format.h>

#include "awq.hpp"
#include "smooth_quant.hpp"
#include "vaiq/error.hpp"
#include "vaiq/log.hpp"

namespace {

class SmoothQuant final : public vaiq::Algorithm {
  public:
    void configure(const vaiq::Options& options) override {
        options_.alpha = options.get_float("SmoothQuantAlpha");
        options_.folding = options.get_bool("SmoothQuantFolding");
        options_.alpha_search = options.get_bool("alpha_search");
        options_.sample_rows = static_cast<int>(options.get_int("sample_rows"));
        if (options_.sample_rows < 1) throw vaiq::InputError("smooth_quant: sample_rows must be at least 1");
        if (!(options_.alpha >= 0 && options_.alpha <= 1))
            throw vaiq::InputError(
                fmt::format("extra_options.SmoothQuantAlpha must be within [0, 1], not {}", options_.alpha));
    }
    vaiq::AlgorithmStage stage() const override { return vaiq::AlgorithmStage::Prepare; }

    void run(vaiq::AlgorithmContext& context) override {
        vaiq::Model model = context.model();
        auto options = options_;
        options.activation_spec = context.default_spec(vaiq::TensorRole::Activation);
        options.weight_spec = context.default_spec(vaiq::TensorRole::Weight);
        options.weight_spec.axis = 1;  // the search holds every weight as [K, N]: its output channels along 1
        options.weight_spec.block_size = 0;
        // An activation that stays float, or is quantized at run time, has no grid to search against.
        options.alpha_search =
            options.alpha_search && vaiq::is_integer(options.activation_spec.type) && !options.activation_spec.dynamic;
        const auto r = vaiq::smooth_quant(model, context, options);
        context.set_model(std::move(model));
        nlohmann::json section = {{"activations", r.activations}, {"weights", r.weights}, {"folded", r.folded}};
        if (options.alpha_search) {
            section["alphas"] = nlohmann::json::object();
            for (const auto& [x, alpha] : r.alphas) section["alphas"][x] = alpha ? nlohmann::json(*alpha) : nullptr;
            section["judged_on"] = "a quarter of the sampled token rows, held out of the search";
        }
        context.report(section);
        vaiq::log_info("SmoothQuant: {} activations smoothed ({} folded into their producer), {} weights scaled",
                       r.activations, r.folded, r.weights);
    }

  private:
    vaiq::SmoothQuantOptions options_;
};

class AwqLite final : public vaiq::Algorithm {
  public:
    void configure(const vaiq::Options& options) override {
        sample_rows_ = static_cast<int>(options.get_int("sample_rows"));
        if (sample_rows_ < 1) throw vaiq::InputError("awq_lite: sample_rows must be at least 1");
    }
    vaiq::AlgorithmStage stage() const override { return vaiq::AlgorithmStage::Prepare; }

    void run(vaiq::AlgorithmContext& context) override {
        vaiq::require_float32_weights(context.model(), "awq_lite");
        vaiq::AwqOptions options;
        options.sample_rows = sample_rows_;
        options.spec = context.default_spec(vaiq::TensorRole::Weight);
        // B [K, N]: blocks along K, or channels along N.
        if (options.spec.block_size > 0) options.spec.per_channel = false;
        options.spec.axis = options.spec.block_size > 0 ? 0 : 1;
        vaiq::Model model = context.model();
        const auto r = vaiq::awq_lite(model, context, options, context.quantized_nodes());
        context.set_model(std::move(model));
        context.report({{"activations", r.activations},
                        {"scaled", r.scaled},
                        {"folded", r.folded},
                        {"output_error_rtn", r.error_rtn},
                        {"output_error_awq", r.error_awq},
                        {"judged_on", "every fourth sampled token row, held out of the search"}});
        vaiq::log_info(
            "AWQ-lite: {} of {} activations scaled ({} folded into their producer); output error {:.4g} -> {:.4g}",
            r.scaled, r.activations, r.folded, r.error_rtn, r.error_awq);
    }

  private:
    int sample_rows_ = 256;
};

class AwqClip final : public vaiq::Algorithm {
  public:
    void configure(const vaiq::Options& options) override {
        sample_rows_ = static_cast<int>(options.get_int("sample_rows"));
        if (sample_rows_ < 1) throw vaiq::InputError("awq_clip: sample_rows must be at least 1");
    }

    void run(vaiq::AlgorithmContext& context) override {
        vaiq::require_float32_weights(context.model(), "awq_clip");
        const auto r = vaiq::awq_clip(context, sample_rows_);
        context.report({{"weights", r.weights},
                        {"blocks", r.blocks},
                        {"clipped", r.clipped},
                        {"rejected_weights", r.rejected},
                        {"judged_on", "every fourth sampled token row, held out of the search"}});
        vaiq::log_info("AWQ-clip: {} of {} blocks clipped in {} weights ({} weights' clipping lost on held-out rows)",
                       r.clipped, r.blocks, r.weights, r.rejected);
    }

  private:
    int sample_rows_ = 64;
};

constexpr vaiq_option_descriptor kSmoothQuantOptions[] = {
    {"SmoothQuantAlpha", VAIQ_OPTION_FLOAT, "0.5",
     "How much of the difficulty moves: s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)."},
    {"SmoothQuantFolding", VAIQ_OPTION_BOOL, "true",
     "Fold 1/s into the producer of X where X has no other reader; else a Mul is inserted."},
    {"alpha_search", VAIQ_OPTION_BOOL, "false",
     "Search each input's alpha (0.1 to 0.9, or none) for the least error of the quantized product on sampled "
     "token rows, instead of SmoothQuantAlpha; smoothing is kept where it beats none on held-out rows."},
    {"sample_rows", VAIQ_OPTION_INT, "256",
     "With alpha_search: token rows per input the search weighs (reservoir-sampled), and a third as many to "
     "judge it."},
};
constexpr vaiq_option_descriptor kAwqLiteOptions[] = {
    {"sample_rows", VAIQ_OPTION_INT, "256",
     "Token rows per activation kept for the search (reservoir-sampled), and a third as many to judge it."},
};
// ModelOpt subsamples the clip search's token rows the same way.
constexpr vaiq_option_descriptor kAwqClipOptions[] = {
    {"sample_rows", VAIQ_OPTION_INT, "64",
     "Token rows per activation the clip search weighs (reservoir-sampled), and a third as many to judge it."},
};

}  // namespace

VAIQ_PLUGINS(vaiq::enabled_by(vaiq::describe<SmoothQuant>("smooth_quant", "1.0.0",
                                                          "SmoothQuant: activation outliers moved into the weights of "
                                                          "MatMul/Gemm before calibration",
                                                          kSmoothQuantOptions),
                              "extra_options.SmoothQuant"),
             vaiq::enabled_by(vaiq::describe<AwqLite>("awq_lite", "1.0.0",
                                                      "AWQ-lite: per-channel activation-aware scales searched for "
                                                      "weight-only MatMuls",
                                                      kAwqLiteOptions),
                              "weight_only_algorithm=awq_lite|awq_full"),
             vaiq::enabled_by(vaiq::describe<AwqClip>("awq_clip", "1.0.0",
                                                      "AWQ-clip: each block's clip ratio searched for the least output "
                                                      "error",
                                                      kAwqClipOptions),
                              "weight_only_algorithm=awq_clip|awq_full"))
