// The hqq algorithm (weight_only_algorithm: hqq): HQQ's scales and float zero
// points for every weight-only MatMul weight of the plan (see hqq.hpp). Needs
// no data; MatMulNBits stores the float zero points, DequantizeLinear cannot.
#include <fmt/format.h>

#include <algorithm>

#include "hqq.hpp"
#include "vaiq/algorithm.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/log.hpp"

namespace {

class Hqq final : public vaiq::Algorithm {
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

    void run(vaiq::AlgorithmContext& context) override {
        const vaiq::GraphIndex index(context.model());
        nlohmann::json weights = nlohmann::json::array();
        double rtn_sum = 0, hqq_sum = 0;
        for (const auto& t : context.plan().tensors) {
            if (t.role != vaiq::TensorRole::Weight || !reads_as_matmul_b(context.model(), index, t.tensor)) continue;
            const auto& p = t.params;
            if (p.block_size <= 0 || p.axis != 0 || !vaiq::is_integer(p.type) || vaiq::quant_bits(p.type) > 8) continue;
            const auto* init = index.initializer(t.tensor);
            if (!init || init->dims_size() != 2) continue;  // a stacked weight keeps round to nearest
            const auto weight = vaiq::convert_float_type(vaiq::Tensor::from_proto(*init), vaiq::DataType::Float);
            auto params = vaiq::hqq_params(weight, p, o_);
            const double rtn = vaiq::mean_absolute_error(weight, p, t.tensor);
            const double hqq = vaiq::mean_absolute_error(weight, params, t.tensor);
            rtn_sum += rtn, hqq_sum += hqq;
            weights.push_back({{"weight", t.tensor}, {"mean_abs_error_rtn", rtn}, {"mean_abs_error_hqq", hqq}});
            context.set_parameters(t.tensor, params);
        }
        if (weights.empty())
            vaiq::log_warn(
                "hqq: no MatMul weight is quantized in blocks along K: nothing changed (set weight_only: "
                "true and block_size)");
        else
            vaiq::log_info("hqq: {} weights; mean absolute weight error {:.4g} (round to nearest) -> {:.4g}",
                           weights.size(), rtn_sum / static_cast<double>(weights.size()),
                           hqq_sum / static_cast<double>(weights.size()));
        context.report({{"lp_norm", o_.lp_norm},
                        {"beta", o_.beta},
                        {"kappa", o_.kappa},
                        {"iterations", o_.iterations},
                        {"weights", weights}});
    }

  private:
    // The constant B of a MatMul (HQQ leaves Gather tables to round to nearest, as ONNX Runtime does).
    static bool reads_as_matmul_b(const vaiq::Model& model, const vaiq::GraphIndex& index, const std::string& tensor) {
        const auto& uses = index.consumers(tensor);
        return !uses.empty() && std::all_of(uses.begin(), uses.end(), [&](const vaiq::Use& use) {
            return use.node >= 0 && use.slot == 1 && model.graph().node(use.node).op_type() == "MatMul";
        });
    }

    vaiq::HqqOptions o_;
};

constexpr vaiq_option_descriptor kOptions[] = {
    {"lp_norm", VAIQ_OPTION_FLOAT, "0.7", "p of the lp norm of the weight error that the solver lowers (0 < p <= 1)."},
    {"beta", VAIQ_OPTION_FLOAT, "10", "The shrinkage's inverse threshold at the first iteration."},
    {"kappa", VAIQ_OPTION_FLOAT, "1.01", "beta's growth per iteration."},
    {"iterations", VAIQ_OPTION_INT, "20", "Solver iterations per block (the best zero point is kept)."},
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<Hqq>("hqq", "1.0.0",
                                 "HQQ: weight-only MatMul weights with each block's zero point a float fitted by a "
                                 "half-quadratic solver (no data; MatMulNBits)",
                                 kOptions))
