// Automatic mixed precision (extra_options.AutoMixprecision) as an algorithm:
// raises the most harmful tensors until the output meets the target on the
// calibration data, then, where it still misses, tries the next lever. And the
// sensitivity analysis (sensitivity_analysis): that ranking in the report.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "mixed_precision.hpp"
#include "ranking.hpp"
#include "screening.hpp"
#include "vaiq/error.hpp"
#include "vaiq/log.hpp"

namespace {

std::optional<double> optional_float(const vaiq::Options& options, const std::string& name) {
    const auto& v = options.get(name);
    return v.is_null() ? std::nullopt : std::optional<double>(options.get_float(name));
}

vaiq::QuantType quant_type(const vaiq::Options& options, const std::string& name) {
    const auto value = options.get_string(name);
    const auto type = vaiq::parse_quant_type(value);
    if (!type) throw vaiq::InputError(fmt::format("extra_options.{} must be a QuantType, not '{}'", name, value));
    return *type;
}

// The ranking's settings (sensitivity_batches, sensitivity_tensors), read by both algorithms.
vaiq::RankingOptions ranking_options(const vaiq::Options& options) {
    vaiq::RankingOptions out;
    const auto batches = options.get_int("sensitivity_batches");
    if (batches < 0) throw vaiq::InputError("sensitivity_batches must be 0 (every batch) or more");
    out.batches = static_cast<size_t>(batches);
    if (!options.get("sensitivity_tensors").is_null()) {
        out.max_tensors = options.get_int("sensitivity_tensors");
        if (out.max_tensors < 0) throw vaiq::InputError("sensitivity_tensors must be 0 (every tensor) or more");
    }
    return out;
}

// The ranking as the report's sensitivity section holds it.
nlohmann::json ranking_section(const std::vector<vaiq::TensorSensitivity>& ranking, size_t batches) {
    return {{"kind", vaiq::kTensorRankingSection},
            {"data", "calibration_data"},
            {"batches", batches},
            {"tensors", vaiq::ranking_json(ranking)}};
}

// What a target missed within the budget tries: the weights fitted at the precisions chosen.
constexpr const char* kNextLever = "fast_finetune";

class MixedPrecision final : public vaiq::Algorithm {
  public:
    // Precisions first: the weights are fitted at them.
    vaiq::AlgorithmStage stage() const override { return vaiq::AlgorithmStage::Precision; }

    void configure(const vaiq::Options& options) override {
        const std::string p = "AutoMixprecision.";
        target_.sqnr_db = optional_float(options, p + "SQNRTarget");
        target_.l2 = optional_float(options, p + "L2Target");
        target_.top1_drop = optional_float(options, p + "Top1AccTarget");
        target_.output_index = static_cast<int>(options.get_int(p + "OutputIndex"));
        target_.precision.activation_type = quant_type(options, p + "ActTargetQuantType");
        target_.precision.weight_type = quant_type(options, p + "WeightTargetQuantType");
        target_.max_fraction = options.get_float(p + "MaxRaisedFraction");
        next_lever_ = options.get_bool(p + "NextLever") ? kNextLever : "";
        ranking_ = ranking_options(options);
        ranking_.output_index = target_.output_index;
        if (!(target_.max_fraction >= 0 && target_.max_fraction <= 1))
            throw vaiq::InputError(fmt::format("extra_options.AutoMixprecision.MaxRaisedFraction must be within [0, 1], "
                                               "not {}",
                                               target_.max_fraction));
        if (target_.output_index < vaiq::kEveryOutput)
            throw vaiq::InputError(
                "extra_options.AutoMixprecision.OutputIndex must be an output's index, or -1 for "
                "every output");
    }

    void run(vaiq::AlgorithmContext& context) override {
        if (!target_.sqnr_db && !target_.l2 && !target_.top1_drop) {
            vaiq::log_warn("mixed precision has no target (extra_options.AutoMixprecision.SQNRTarget, L2Target or "
                           "Top1AccTarget): nothing is raised");
            return;
        }
        auto target = target_;
        const auto& wanted = target.precision;
        target.precision.keep_float = !context.target_runs(wanted.activation_type, wanted.weight_type);
        if (target.precision.keep_float)
            vaiq::log_info("mixed precision: raised tensors stay float: the target cannot run activations {} with "
                           "weights {}",
                           vaiq::quant_type_name(wanted.activation_type), vaiq::quant_type_name(wanted.weight_type));
        nlohmann::json ranked;  // the ranking, when the search asked for it: the report's sensitivity
        auto rank = [&] {
            auto ranking = vaiq::rank_tensors(context, ranking_);
            ranked = ranking_section(ranking, ranking_.batches);
            // A tensor whose channels differ in scale is raised first: its narrow channels
            // (a head's scores) can ruin what the output means while costing little SQNR.
            std::stable_partition(ranking.begin(), ranking.end(),
                                  [](const vaiq::TensorSensitivity& t) { return t.mixed_scales; });
            return ranking;
        };
        vaiq::Raising raising;
        std::map<std::set<std::string>, size_t> counted;  // the search asks again for the same sets
        raising.count = [&](const std::set<std::string>& raised) {
            if (const auto it = counted.find(raised); it != counted.end()) return it->second;
            size_t n = 0;
            context.raised_plan(raised, target.precision, &n);
            return counted[raised] = n;
        };
        raising.measure = [&](const std::set<std::string>& raised, vaiq::BatchSet batches) {
            return context.agreement(context.quantized(context.raised_plan(raised, target.precision), {}),
                                     target.output_index, batches);
        };
        raising.screen = [&](const std::set<std::string>& raised, const std::vector<std::string>& tensors,
                             vaiq::BatchSet batches) {
            return vaiq::screen_raisings(context, target.precision, target.output_index, raised, tensors, batches);
        };
        raising.output = context.measured_output(target.output_index);
        raising.progress = [&](std::string_view what, int64_t done, int64_t total) {
            context.progress(what, done, total);
        };
        size_t quantized = 0;
        for (const auto& t : context.plan().tensors) quantized += t.role != vaiq::TensorRole::Bias;
        const auto budget = static_cast<size_t>(std::floor(target.max_fraction * static_cast<double>(quantized)));
        auto result = vaiq::search_mixed_precision(target, rank, raising, budget);
        context.set_precision(result.raised, target.precision);
        result.report["raised_to"] =
            target.precision.keep_float
                ? "float"
                : fmt::format("activations {}, weights {}", vaiq::quant_type_name(wanted.activation_type),
                              vaiq::quant_type_name(wanted.weight_type));
        result.report["quantized_tensors"] = quantized;
        if (!ranked.is_null()) result.report["sensitivity"] = std::move(ranked);
        if (!result.report["met"].get<bool>()) try_next_lever(context, target, result.report);
        context.report(std::move(result.report));
    }

  private:
    // A target missed within the budget tries the next lever before giving up:
    // the weights fitted at the precisions chosen (fast finetune), kept only
    // where the output then agrees better.
    void try_next_lever(vaiq::AlgorithmContext& context, const vaiq::MixedPrecisionTarget& target,
                        nlohmann::json& report) {
        if (next_lever_.empty() || context.runs(next_lever_)) {
            vaiq::log_warn("mixed precision missed its target ({})", target.describe());
            return;
        }
        auto written = [&] { return context.quantized(context.plan(), context.fitted_weights()); };
        const auto before = context.agreement(written(), target.output_index);
        vaiq::log_info("mixed precision missed its target ({}): trying the next lever, {}", target.describe(),
                       next_lever_);
        vaiq::OutputAgreement after;
        bool better = false;
        context.try_algorithm(next_lever_, [&] {
            after = context.agreement(written(), target.output_index);
            better = target.score(after) > target.score(before) ||
                     (target.score(after) == target.score(before) && after.sqnr_db > before.sqnr_db);
            return better;
        });
        const bool met = better && target.met_by(after);
        report["next_lever"] = {{"tried", next_lever_},
                                {"before", vaiq::error_json(before)},
                                {"after", vaiq::error_json(after)},
                                {"kept", better},
                                {"met", met}};
        if (met) {
            vaiq::log_info("mixed precision: {} met the target (top-1 agreement {:.4f}, SQNR {:.2f} dB)", next_lever_,
                           after.top1_agreement, after.sqnr_db);
            return;
        }
        vaiq::log_warn("mixed precision: the target ({}) is out of reach within the budget even with {} "
                       "(top-1 agreement {:.4f} -> {:.4f}, SQNR {:.2f} -> {:.2f} dB; its result {}): to try, a larger "
                       "MaxRaisedFraction, another calibrate_method, more calibration data",
                       target.describe(), next_lever_, before.top1_agreement, after.top1_agreement, before.sqnr_db,
                       after.sqnr_db, better ? "kept" : "dropped");
    }

    vaiq::MixedPrecisionTarget target_;
    vaiq::RankingOptions ranking_;
    std::string next_lever_;
};

// The ranking in the report: mixed precision's where it ranked (on the plan
// before it raised anything: what explains its choice), else one over every output.
class Sensitivity final : public vaiq::Algorithm {
  public:
    vaiq::AlgorithmStage stage() const override { return vaiq::AlgorithmStage::Corrections; }
    void configure(const vaiq::Options& options) override { ranking_ = ranking_options(options); }
    void run(vaiq::AlgorithmContext& context) override {
        const auto earlier = context.reported("mixed_precision");
        auto section = earlier.is_object() ? earlier.value("sensitivity", nlohmann::json()) : nlohmann::json();
        try {
            if (section.is_null()) section = ranking_section(vaiq::rank_tensors(context, ranking_), ranking_.batches);
        } catch (const vaiq::InputError& e) {  // a diagnosis never fails the run
            vaiq::log_warn("the sensitivity analysis could not be computed, and is left out of the report: {}",
                           e.what());
            return;
        }
        context.report(std::move(section));
    }

  private:
    vaiq::RankingOptions ranking_;
};

constexpr vaiq_option_descriptor kRankingOptions[] = {
    {"sensitivity_batches", VAIQ_OPTION_INT, "4",
     "The first calibration batches the ranking measures (0: all): each tensor costs one run a batch."},
    {"sensitivity_tensors", VAIQ_OPTION_INT, "null",
     "Tensors the ranking measures (0: every one): those whose own error is largest; the others follow by that "
     "error, unmeasured. Default: every tensor, unless the activations times the tensors exceed 5e10 values."},
};

constexpr vaiq_option_descriptor kOptions[] = {
    {"AutoMixprecision.SQNRTarget", VAIQ_OPTION_FLOAT, "null",
     "Raise tensors until the output's SQNR on the calibration data reaches this many dB."},
    {"AutoMixprecision.L2Target", VAIQ_OPTION_FLOAT, "null",
     "Raise tensors until the output's relative L2 error ||f - q|| / ||f|| is at most this."},
    {"AutoMixprecision.Top1AccTarget", VAIQ_OPTION_FLOAT, "null",
     "Raise tensors until agreement with the float model by what the output means (each position's class along a "
     "Softmax's axis, else the last axis; a Sigmoid's decisions at 0.5, as the IoU of the positives in maps; a "
     "masked peak map's nonzero elements; feature values within 5 % of the output's range) is at most this much "
     "below 1."},
    {"AutoMixprecision.OutputIndex", VAIQ_OPTION_INT, "-1",
     "The model output the targets are measured on; -1: every float output, each by what it means, the worst "
     "counting (a detector's scores and boxes)."},
    {"AutoMixprecision.ActTargetQuantType", VAIQ_OPTION_STRING, "QInt16",
     "Type a raised activation gets (a target that cannot run it leaves the tensor float)."},
    {"AutoMixprecision.WeightTargetQuantType", VAIQ_OPTION_STRING, "QInt16", "Type a raised weight gets."},
    {"AutoMixprecision.MaxRaisedFraction", VAIQ_OPTION_FLOAT, "0.1",
     "Raise at most this fraction of the quantized activations and weights."},
    kRankingOptions[0],
    kRankingOptions[1],
    {"AutoMixprecision.NextLever", VAIQ_OPTION_BOOL, "true",
     "When the target is out of reach within the budget (or fails on the held-out batches): fit the weights at "
     "their precisions (fast finetune with FastFinetune's settings, unless the run has it anyway) and keep the fit "
     "where the output then agrees better; a warning says whether the target was met. false: the warning only."},
};

}  // namespace

VAIQ_PLUGINS(vaiq::enabled_by(vaiq::describe<MixedPrecision>("mixed_precision", "1.0.0",
                                                             "Automatic mixed precision: the most harmful tensors "
                                                             "raised to 16 bits (or float) until the output meets a "
                                                             "target on the calibration data",
                                                             kOptions),
                              "extra_options.AutoMixprecision.SQNRTarget, extra_options.AutoMixprecision.L2Target, "
                              "extra_options.AutoMixprecision.Top1AccTarget",
                              kNextLever),
             vaiq::enabled_by(vaiq::describe<Sensitivity>("sensitivity", "1.0.0",
                                                          "Every quantized tensor's cost to the output, most harmful "
                                                          "first, in the report (vaiq analyze)",
                                                          kRankingOptions),
                              "sensitivity_analysis"))
