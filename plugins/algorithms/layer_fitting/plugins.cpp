// Algorithms that fit what a layer writes to the float layer's output on the
// calibration data: fast finetune (each weight's grid value) on the plan, and
// bias correction (each bias, for the mean its quantized weight moves) after
// every other algorithm.
#include <fmt/format.h>

#include <optional>

#include "bias_correction.hpp"
#include "fast_finetune.hpp"
#include "vaiq/error.hpp"
#include "vaiq/log.hpp"

namespace {

// The model a fit writes: its weights and, with bias correction, the biases corrected for them.
vaiq::Model written_model(vaiq::AlgorithmContext& context, const std::map<std::string, vaiq::Tensor>& rounded,
                          bool correct_biases) {
    vaiq::Model quantized = context.quantized(context.plan(), rounded);
    if (!correct_biases) return quantized;
    auto initializers = rounded;
    initializers.merge(vaiq::corrected_biases(context, quantized, rounded).biases);
    return context.quantized(context.plan(), initializers);
}

// include_fast_ft: each layer's weights fitted to reproduce the float layer (scales stay).
// With Trials, whole fits from successive seeds compete on the calibration data:
// each layer's fit depends on the roundings before it, so one draw can land
// far from another on the model's task while their layer losses agree.
class FastFinetune final : public vaiq::Algorithm {
  public:
    void configure(const vaiq::Options& options) override {
        const std::string p = "FastFinetune.";
        o_.algorithm = options.get_string(p + "OptimAlgorithm");
        o_.iterations = static_cast<int>(options.get_int(p + "NumIterations"));
        const bool lr_set = !options.get(p + "LearningRate").is_null();
        const double lr = lr_set ? options.get_float(p + "LearningRate") : 0.0;
        o_.learning_rate = lr_set ? lr : (o_.algorithm == "adaround" ? 0.1 : 1e-5);
        o_.batch_columns = static_cast<int>(options.get_int(p + "ColumnsPerStep"));
        o_.reg_param = options.get_float(p + "RegParam");
        o_.warm_start = options.get_float(p + "WarmStart");
        o_.memory_bytes = static_cast<size_t>(std::max<int64_t>(0, options.get_int(p + "MemoryMB"))) << 20;
        o_.drop_ratio = options.get_float(p + "DropRatio");
        o_.selective_update = options.get_bool(p + "SelectiveUpdate");
        o_.fits = static_cast<int>(options.get_int(p + "Fits"));
        seed_ = options.get_int(p + "FixedSeed");
        trials_ = options.get_int(p + "Trials");
        metric_ = options.get_string(p + "TrialMetric");
        correct_biases_ = options.get_bool("BiasCorrection");
        if (o_.algorithm != "adaround" && o_.algorithm != "adaquant")
            throw vaiq::InputError(fmt::format(
                "extra_options.FastFinetune.OptimAlgorithm must be adaround or adaquant, not '{}'", o_.algorithm));
        if (metric_ != "top1" && metric_ != "sequence" && metric_ != "sqnr")
            throw vaiq::InputError(fmt::format(
                "extra_options.FastFinetune.TrialMetric must be top1, sequence or sqnr, not '{}'", metric_));
        if (o_.iterations < 0 || o_.batch_columns < 1 || o_.fits < 1 || trials_ < 1 ||
            !(o_.warm_start >= 0 && o_.warm_start <= 1) || !(o_.drop_ratio >= 0 && o_.drop_ratio <= 1) ||
            !(lr > 0 || !lr_set) || seed_ < 0)
            throw vaiq::InputError(
                "extra_options.FastFinetune needs NumIterations >= 0, ColumnsPerStep >= 1, Fits >= 1, Trials >= 1, "
                "WarmStart and DropRatio within [0, 1], LearningRate > 0 and FixedSeed >= 0");
    }

    void run(vaiq::AlgorithmContext& context) override {
        auto o = o_;
        const auto first = static_cast<uint64_t>(seed_);
        o.seed = first;
        vaiq::FastFinetuneResult result;
        uint64_t chosen = first;
        nlohmann::json trials = nlohmann::json::array();
        // The model a fit would write, against the float model, and its entry in the report.
        auto agreement = [&](const vaiq::FastFinetuneResult& fit) {
            return context.agreement(written_model(context, fit.rounded, correct_biases_));
        };
        auto trial_json = [](uint64_t seed, const vaiq::OutputAgreement& e) {
            return nlohmann::json{{"seed", seed},
                                  {"top1_agreement", e.top1_agreement},
                                  {"sequence_agreement", e.sequence_agreement},
                                  {"sqnr_db", e.sqnr_db}};
        };
        bool one_fit = trials_ == 1;
        if (!one_fit && metric_ == "sequence") {
            // Known before any fit: an output that decodes no samples leaves the
            // trials nothing to compare (nothing_to_compare), so one fit runs.
            one_fit = vaiq::nothing_to_compare(context.measured_output(vaiq::kEveryOutput), metric_);
            if (one_fit)
                vaiq::log_info(
                    "fast finetune: the output decodes no samples for TrialMetric sequence to compare "
                    "trials by: one fit (seed {}), not {}",
                    first, trials_);
        }
        if (one_fit) {
            result = vaiq::fast_finetune(context, o);
            if (trials_ > 1) trials.push_back(trial_json(first, agreement(result)));
        } else {
            // A first fit whose model agrees on every sample and row cannot be
            // beaten on what the trials compare (only on SQNR): the others are not run.
            std::optional<vaiq::OutputAgreement> first_agreement;
            auto enough = [&](const vaiq::FastFinetuneResult& fit) {
                first_agreement = agreement(fit);
                return vaiq::agrees_fully(*first_agreement, metric_);
            };
            std::vector<uint64_t> seeds;
            for (uint64_t t = 0; t < static_cast<uint64_t>(trials_); ++t) seeds.push_back(first + t);
            auto fitted = vaiq::fast_finetune(context, o, seeds, enough);
            vaiq::OutputAgreement best;
            for (size_t t = 0; t < fitted.size(); ++t) {
                const auto e = t == 0 && first_agreement ? *first_agreement : agreement(fitted[t]);
                vaiq::log_info(
                    "fast finetune trial {} (seed {}): top-1 agreement {:.2f}%, sequence agreement {:.2f}%, "
                    "SQNR {:.2f} dB",
                    t + 1, seeds[t], 100 * e.top1_agreement, 100 * e.sequence_agreement, e.sqnr_db);
                trials.push_back(trial_json(seeds[t], e));
                if (t == 0 || vaiq::agrees_better(e, best, metric_)) {  // a full tie keeps the earlier
                    best = e, chosen = seeds[t];
                    result = std::move(fitted[t]);
                }
            }
            if (fitted.size() < seeds.size())
                vaiq::log_info(
                    "fast finetune: seed {} agrees with the float model on every sample of the calibration "
                    "data: the other {} trials are not run",
                    first, trials_ - 1);
            else
                vaiq::log_info("fast finetune: seed {} kept (best {} of {} trials on the calibration data)", chosen,
                               metric_, trials_);
        }
        context.set_fitted_weights(result.rounded);
        nlohmann::json report = {{"algorithm", o.algorithm},   {"iterations", o.iterations},
                                 {"drop_ratio", o.drop_ratio}, {"seed", chosen},
                                 {"selective_update", o.selective_update}, {"fits", o.fits},
                                 {"layers", result.to_json()}};
        if (trials_ > 1) report["trials"] = {{"metric", metric_}, {"asked", trials_}, {"runs", trials}};
        context.report(std::move(report));
    }

  private:
    vaiq::FastFinetuneOptions o_;
    int64_t seed_ = 0, trials_ = 1;
    std::string metric_ = "top1";
    bool correct_biases_ = false;
};

// extra_options.BiasCorrection: each Conv/Gemm bias takes back the mean shift
// its quantized weight causes, measured through the model as it will be written;
// the layers fast finetune fitted keep their bias.
class BiasCorrection final : public vaiq::Algorithm {
  public:
    vaiq::AlgorithmStage stage() const override { return vaiq::AlgorithmStage::Corrections; }

    void run(vaiq::AlgorithmContext& context) override {
        const auto& fitted = context.fitted_weights();
        auto corrections = vaiq::corrected_biases(context, context.quantized(context.plan(), fitted), fitted);
        const auto layers = corrections.biases.size();
        context.set_initializers(std::move(corrections.biases));
        context.report({{"layers", layers}, {"left_as_fitted", corrections.fitted_left}});
        vaiq::log_info("bias correction: {} Conv/Gemm biases corrected{}", layers,
                       corrections.fitted_left > 0
                           ? fmt::format("; {} left as fast finetune fitted them", corrections.fitted_left)
                           : "");
    }
};

constexpr vaiq_option_descriptor kFastFinetuneOptions[] = {
    {"FastFinetune.OptimAlgorithm", VAIQ_OPTION_STRING, "adaround",
     "adaround (learn each weight's rounding) or adaquant (move the weights through their quantization)."},
    {"FastFinetune.NumIterations", VAIQ_OPTION_INT, "1000",
     "Steps per layer at most: a fit ends sooner once its held-out loss stops improving, or (AdaRound) once a "
     "rounding comes within 0.1 % of the loss its relaxed weights reached by the warm start's end."},
    {"FastFinetune.LearningRate", VAIQ_OPTION_FLOAT, "null",
     "Adam's learning rate (default: 0.1 for adaround, 1e-5 for adaquant)."},
    {"FastFinetune.ColumnsPerStep", VAIQ_OPTION_INT, "256",
     "Output positions (pixels of a Conv, rows of a Gemm/MatMul) per step, drawn from the samples, for layers with "
     "more than twice as many inputs per group, with fewer positions than half their inputs, or with DropRatio "
     "below 1. The other layers take every position in every step, through the sums of their inputs' products "
     "(k x k values a group), which cost less."},
    {"FastFinetune.RegParam", VAIQ_OPTION_FLOAT, "0.01", "Weight of AdaRound's rounding regulariser."},
    {"FastFinetune.WarmStart", VAIQ_OPTION_FLOAT, "0.2",
     "Fraction of the steps before the regulariser starts (its beta then falls from 20 to 2)."},
    {"FastFinetune.MemoryMB", VAIQ_OPTION_INT, "512",
     "Memory for the sampled input columns and float outputs of the layer being fitted, one at a time "
     "(reservoir-sampled from the data; a layer fitted through its sums keeps none)."},
    {"FastFinetune.DropRatio", VAIQ_OPTION_FLOAT, "1.0",
     "The chance that each value of a layer's input in a step is the quantized model's rather than the float "
     "model's (QDrop): 1 fits on the quantized inputs only, 0 on the float ones only."},
    {"FastFinetune.SelectiveUpdate", VAIQ_OPTION_BOOL, "false",
     "Drop a layer's fit (back to nearest rounding) when it moves the model's output away from the float model's "
     "over the data (measured in the pass that samples the next layer; one more pass per fit dropped)."},
    {"FastFinetune.Fits", VAIQ_OPTION_INT, "1",
     "Fits per layer from different draws; each weight takes the median of their values (with an odd number of "
     "AdaRound fits, the rounding most of them chose). Costs that many times the fitting."},
    {"FastFinetune.FixedSeed", VAIQ_OPTION_INT, "0",
     "Seed of the column sampling, the held-out folds and DropRatio's draws."},
    {"FastFinetune.Trials", VAIQ_OPTION_INT, "1",
     "Whole fast finetunes from seeds FixedSeed, FixedSeed + 1, ...; the one whose model agrees best with the "
     "float model on the calibration data (TrialMetric) is kept. They run in step, the float model once for all "
     "and their fits of each layer side by side on the run's threads; each holds its own samples of the layer "
     "(MemoryMB each). When the float model's layer inputs all fit its cache, the first runs alone, and if its "
     "model agrees on every sample and row (TrialMetric top1 or sequence), the others are not run. With "
     "TrialMetric sequence, an output that decodes no samples (a map, feature values) gives the trials nothing to "
     "compare: one fit runs."},
    {"FastFinetune.TrialMetric", VAIQ_OPTION_STRING, "top1",
     "What Trials compares, on every float output (the worst counting): top1 (what the output means agrees: "
     "rows whose argmax does, decisions, masks), sequence (samples whose CTC greedy decoding, class 0 the blank, "
     "agrees; a classifier's top-1) or sqnr."},
    {"BiasCorrection", VAIQ_OPTION_BOOL, "false",
     "Trials compare each fit's model with its biases corrected, as bias correction will write them."},
};

}  // namespace

VAIQ_PLUGINS(vaiq::enabled_by(vaiq::describe<FastFinetune>("fast_finetune", "1.0.0",
                                                           "AdaRound or AdaQuant: each layer's weights fitted to "
                                                           "reproduce the float layer's output on the calibration data",
                                                           kFastFinetuneOptions),
                              "include_fast_ft"),
             vaiq::enabled_by(vaiq::describe<BiasCorrection>("bias_correction", "1.0.0",
                                                             "Conv/Gemm biases corrected for the mean shift their "
                                                             "quantized weights cause, after every other algorithm"),
                              "extra_options.BiasCorrection"))
