// Algorithms that choose each block's grid of a weight-only MatMul weight from
// the weight alone (no data): hqq (weight_only_algorithm: hqq, float zero
// points, see hqq.hpp) and k_quant (weight_only_algorithm: k_quant, see
// k_quant.hpp). Both replace the parameters of the plan's weights quantized in
// blocks along K and report each weight's error before and after.
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "hqq.hpp"
#include "k_quant.hpp"
#include "vaiq/algorithm.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/log.hpp"

namespace {

// The loop both share: every weight of the plan that a MatMul reads as B, in blocks along K.
class BlockGrids : public vaiq::Algorithm {
  public:
    void run(vaiq::AlgorithmContext& context) override {
        const vaiq::GraphIndex index(context.model());
        nlohmann::json weights = nlohmann::json::array();
        double rtn_sum = 0, fitted_sum = 0;
        for (const auto& t : context.plan().tensors) {
            if (t.role != vaiq::TensorRole::Weight || !reads_as_matmul_b(context.model(), index, t.tensor)) continue;
            const auto& p = t.params;
            if (p.block_size <= 0 || p.axis != 0 || !vaiq::is_integer(p.type) || vaiq::quant_bits(p.type) > 8) continue;
            const auto* init = index.initializer(t.tensor);
            if (!init || init->dims_size() != 2) continue;  // a stacked weight keeps round to nearest
            const auto weight = vaiq::convert_float_type(vaiq::Tensor::from_proto(*init), vaiq::DataType::Float);
            const auto params = fit(weight, p);
            const double rtn = error(weight, p, t.tensor), fitted = error(weight, params, t.tensor);
            rtn_sum += rtn, fitted_sum += fitted;
            weights.push_back(
                {{"weight", t.tensor}, {error_name() + "_rtn", rtn}, {error_name() + "_" + name(), fitted}});
            context.set_parameters(t.tensor, params);
        }
        if (weights.empty())
            vaiq::log_warn(
                "{}: no MatMul weight is quantized in blocks along K: nothing changed (set weight_only: "
                "true and block_size)",
                name());
        else
            vaiq::log_info("{}: {} weights; {} {:.4g} (round to nearest) -> {:.4g}, averaged over them", name(),
                           weights.size(), error_name(), rtn_sum / static_cast<double>(weights.size()),
                           fitted_sum / static_cast<double>(weights.size()));
        auto section = settings();
        section["weights"] = std::move(weights);
        context.report(section);
    }

  private:
    virtual std::string name() const = 0;
    virtual vaiq::QuantParams fit(const vaiq::Tensor& weight, const vaiq::QuantParams& plan) const = 0;
    virtual std::string error_name() const = 0;  ///< the error it lowers, as the report names it
    virtual double error(const vaiq::Tensor& weight, const vaiq::QuantParams& params,
                         const std::string& tensor) const = 0;
    virtual nlohmann::json settings() const { return nlohmann::json::object(); }

    // The constant B of a MatMul (Gather tables keep round to nearest, as ONNX Runtime's).
    static bool reads_as_matmul_b(const vaiq::Model& model, const vaiq::GraphIndex& index, const std::string& tensor) {
        const auto& uses = index.consumers(tensor);
        return !uses.empty() && std::all_of(uses.begin(), uses.end(), [&](const vaiq::Use& use) {
            return use.node >= 0 && use.slot == 1 && model.graph().node(use.node).op_type() == "MatMul";
        });
    }
};

class Hqq final : public BlockGrids {
  public:
    void configure(const vaiq::Options& options) override {
        o_.lp_norm = options.get_float("lp_norm");
        o_.beta = options.get_float("beta");
        o_.kappa = options.get_float("kappa");
        o_.iterations = static_cast<int>(options.get_int("iterations"));
        if (!(o_.lp_norm > 0 && o_.lp_norm <= 1) || !(o_.beta > 0) || !(o_.kappa >= 1) || o_.iterations < 1)
            throw vaiq::InputError(
                fmt::format("hqq needs lp_norm in (0, 1], beta > 0, kappa >= 1 and iterations >= "
                            "1 (given {}, {}, {}, {})",
                            o_.lp_norm, o_.beta, o_.kappa, o_.iterations));
    }

  private:
    std::string name() const override { return "hqq"; }
    vaiq::QuantParams fit(const vaiq::Tensor& weight, const vaiq::QuantParams& plan) const override {
        return vaiq::hqq_params(weight, plan, o_);
    }
    std::string error_name() const override { return "mean_abs_error"; }
    double error(const vaiq::Tensor& weight, const vaiq::QuantParams& params,
                 const std::string& tensor) const override {
        return vaiq::mean_absolute_error(weight, params, tensor);
    }
    nlohmann::json settings() const override {
        return {{"lp_norm", o_.lp_norm}, {"beta", o_.beta}, {"kappa", o_.kappa}, {"iterations", o_.iterations}};
    }

    vaiq::HqqOptions o_;
};

class KQuant final : public BlockGrids {
  private:
    std::string name() const override { return "k_quant"; }
    vaiq::QuantParams fit(const vaiq::Tensor& weight, const vaiq::QuantParams& plan) const override {
        return vaiq::k_quant_params(weight, plan);
    }
    std::string error_name() const override { return "weighted_squared_error"; }
    double error(const vaiq::Tensor& weight, const vaiq::QuantParams& params,
                 const std::string& tensor) const override {
        return vaiq::importance_weighted_error(weight, params, tensor);
    }
};

constexpr vaiq_option_descriptor kHqqOptions[] = {
    {"lp_norm", VAIQ_OPTION_FLOAT, "0.7", "p of the lp norm of the weight error that the solver lowers (0 < p <= 1)."},
    {"beta", VAIQ_OPTION_FLOAT, "10", "The shrinkage's inverse threshold at the first iteration."},
    {"kappa", VAIQ_OPTION_FLOAT, "1.01", "beta's growth per iteration."},
    {"iterations", VAIQ_OPTION_INT, "20", "Solver iterations per block (the best zero point is kept)."},
};

}  // namespace

VAIQ_PLUGINS(vaiq::enabled_by(vaiq::describe<Hqq>("hqq", "1.0.0",
                                                  "HQQ: weight-only MatMul weights with each block's zero point a "
                                                  "float fitted by a half-quadratic solver (no data; MatMulNBits)",
                                                  kHqqOptions),
                              "weight_only_algorithm=hqq"),
             vaiq::enabled_by(vaiq::describe<KQuant>("k_quant", "1.0.0",
                                                     "k-quant: weight-only MatMul weights with each block's step and "
                                                     "zero point searched for the least importance-weighted error (no "
                                                     "data)"),
                              "weight_only_algorithm=k_quant"))
