// The gptq algorithm: weight-only MatMul weights rounded by GPTQ (see
// gptq_rounding.hpp) with the plan's scales, kept as the run's fitted weights.
#include <fmt/format.h>

#include "gptq_rounding.hpp"
#include "vaiq/error.hpp"
#include "vaiq/log.hpp"

namespace {

class Gptq final : public vaiq::Algorithm {
  public:
    void configure(const vaiq::Options& options) override {
        options_.damping = options.get_float("GPTQDamping");
        options_.act_order = options.get_bool("GPTQActOrder");
        if (!(options_.damping >= 0))
            throw vaiq::InputError(fmt::format("extra_options.GPTQDamping must be >= 0, not {}", options_.damping));
    }

    void run(vaiq::AlgorithmContext& context) override {
        vaiq::require_float32_weights(context.model(), "gptq");
        auto result = vaiq::gptq(context, options_);
        nlohmann::json layers = nlohmann::json::array();
        int kept = 0;
        for (const auto& l : result.layers) {
            layers.push_back({{"weight", l.weight},
                              {"output_error_rtn", l.error_rtn},
                              {"output_error_gptq", l.error_gptq},
                              {"fitted_rows", l.fitted_rows},
                              {"held_out_rows", l.held_out_rows},
                              {"kept", l.kept ? "gptq" : "rtn"}});
            kept += l.kept;
        }
        context.report({{"damping", options_.damping},
                        {"act_order", options_.act_order},
                        {"judged_on",
                         "a quarter of the token rows, held out of the fit; the kept weights then fitted on every row"},
                        {"layers", layers}});
        vaiq::log_info(
            "GPTQ: {} weights; {} keep GPTQ's rounding, the others round to nearest (judged on held-out "
            "tokens)",
            result.layers.size(), kept);
        context.set_fitted_weights(std::move(result.rounded));
    }

  private:
    vaiq::GptqOptions options_;
};

constexpr vaiq_option_descriptor kOptions[] = {
    {"GPTQDamping", VAIQ_OPTION_FLOAT, "0.01",
     "GPTQ's damping (percdamp): this fraction of the Hessian's mean diagonal is added to it."},
    {"GPTQActOrder", VAIQ_OPTION_BOOL, "false",
     "GPTQ's act-order (desc_act): round the input channels in order of falling Hessian diagonal; each weight "
     "keeps its own block's scale."},
};

}  // namespace

VAIQ_PLUGINS(vaiq::enabled_by(vaiq::describe<Gptq>("gptq", "1.0.0",
                                                   "GPTQ: weight-only MatMul weights rounded with the error pushed "
                                                   "into the rows not yet rounded, through the inputs' Hessian",
                                                   kOptions),
                              "weight_only_algorithm=gptq"))
