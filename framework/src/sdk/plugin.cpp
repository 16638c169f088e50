#include "vaiq/plugin.hpp"

#include "vaiq/calibrator.hpp"
#include "vaiq/format.hpp"
#include "vaiq/pass.hpp"
#include "vaiq/target.hpp"

namespace vaiq {

std::string_view kind_name(PluginKind kind) {
    switch (kind) {
        case PluginKind::Calibrator: return "calibrator";
        case PluginKind::Format: return "format";
        case PluginKind::Target: return "target";
        case PluginKind::Pass: return "pass";
    }
    return "unknown";
}

std::optional<PluginKind> parse_kind(std::string_view name) {
    for (auto kind : {PluginKind::Calibrator, PluginKind::Format, PluginKind::Target, PluginKind::Pass}) {
        if (kind_name(kind) == name) return kind;
    }
    return std::nullopt;
}

std::string_view version() {
    return VAIQ_VERSION_STRING;
}

Plugin::~Plugin() = default;
void Plugin::configure(const Options&) {}

RangeObserver::~RangeObserver() = default;

ScaleForm Calibrator::scale_form() const { return ScaleForm::Any; }
QuantParams Calibrator::constant_params(const Tensor& data, const QuantSpec& spec) const {
    return vaiq::constant_params(data, spec);
}

QuantSpec spec_from_config(TensorRole role, const Options& config) {
    QuantSpec spec;
    switch (role) {
        case TensorRole::Activation:
            spec.type = *parse_quant_type(config.get_string("activation_type"));
            spec.symmetric = config.get_bool("extra_options.ActivationSymmetric");
            break;
        case TensorRole::Weight:
            spec.type = *parse_quant_type(config.get_string("weight_type"));
            spec.symmetric = config.get_bool("extra_options.WeightSymmetric");
            spec.per_channel = config.get_bool("per_channel");
            spec.reduce_range = config.get_bool("reduce_range");
            break;
        case TensorRole::Bias: {
            // Float weights keep a float bias of their type; integer ones an int32 bias.
            const auto weight = *parse_quant_type(config.get_string("weight_type"));
            spec.type = is_integer(weight) ? QuantType::QInt32 : weight;
            spec.symmetric = true;
            break;
        }
    }
    spec.int16_scale = config.get_bool("extra_options.Int16Scale");
    return spec;
}

void Target::check(const Options&) const {}
bool Target::fuses(const onnx::NodeProto&, const onnx::NodeProto&, const GraphIndex&, const Options&) const {
    return false;
}

std::vector<ConstraintCount> Target::refine(const Model&, QuantPlan&, const Options&) const { return {}; }

std::vector<ConstraintCount> Target::verify(const Model&, const Options&) const { return {}; }

std::vector<std::string> Target::legalization_passes(const Options&) const {
    return {};
}

}  // namespace vaiq
