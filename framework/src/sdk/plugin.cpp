#include "vaiq/plugin.hpp"

#include <fmt/format.h>

#include "vaiq/algorithm.hpp"
#include "vaiq/calibrator.hpp"
#include "vaiq/error.hpp"
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
        case PluginKind::Algorithm: return "algorithm";
        case PluginKind::Reader: return "reader";
        case PluginKind::Report: return "report";
    }
    return "unknown";
}

std::optional<PluginKind> parse_kind(std::string_view name) {
    for (auto kind : {PluginKind::Calibrator, PluginKind::Format, PluginKind::Target, PluginKind::Pass,
                      PluginKind::Algorithm, PluginKind::Reader, PluginKind::Report}) {
        if (kind_name(kind) == name) return kind;
    }
    return std::nullopt;
}

std::string_view version() { return VAIQ_VERSION_STRING; }

Plugin::~Plugin() = default;

DataStream::~DataStream() = default;
ModelRunner::~ModelRunner() = default;
AlgorithmContext::~AlgorithmContext() = default;
void Plugin::configure(const Options&) {}

RangeObserver::~RangeObserver() = default;
Statistics RangeObserver::statistics() const { return {}; }
bool RangeObserver::order_free() const { return false; }
void RangeObserver::merge(const Statistics&) {
    throw InputError("this calibrator cannot merge statistics saved by vaiq calibrate");
}

bool Format::wrote(const Model&) const { return false; }
NativeConversion Format::to_native(Model&) const {
    throw InputError("this format has no conversion to ONNX Runtime's native form");
}

ScaleForm Calibrator::scale_form() const { return ScaleForm::Any; }
QuantParams Calibrator::constant_params(const Tensor& data, const QuantSpec& spec) const {
    return vaiq::constant_params(data, spec);
}

QuantSpec spec_from_request(TensorRole role, const QuantRequest& request) {
    QuantSpec spec;
    switch (role) {
        case TensorRole::Activation:
            spec.type = request.activation_type;
            spec.symmetric = request.activation_symmetric;
            break;
        case TensorRole::Weight:
            spec.type = request.weight_type;
            spec.symmetric = request.weight_symmetric;
            spec.per_channel = request.per_channel;
            spec.reduce_range = request.reduce_range;
            spec.block_size = request.block_size;
            break;
        case TensorRole::Bias:
            // Float weights keep a float bias of their type; integer ones an int32 bias.
            spec.type = is_integer(request.weight_type) ? QuantType::QInt32 : request.weight_type;
            spec.symmetric = true;
            break;
    }
    spec.int16_scale = request.int16_scale;
    if (is_block_float(spec.type))
        spec.shared_exponent = spec.type == QuantType::QBFP16 ? request.bfp_blocks : request.mx_blocks;
    return spec;
}

void Target::check(const QuantRequest&) const {}
bool Target::fuses(const onnx::NodeProto&, const onnx::NodeProto&, const GraphIndex&, const QuantRequest&) const {
    return false;
}
std::vector<ConstraintCount> Target::refine(const Model&, QuantPlan&, const QuantRequest&) const { return {}; }
std::vector<ConstraintCount> Target::verify(const Model&, const QuantRequest&) const { return {}; }
std::vector<std::string> Target::legalization_passes(const QuantRequest&) const { return {}; }

void require_float32_weights(const Model& model, std::string_view algorithm) {
    for (const auto& init : model.graph().initializer())
        if (init.data_type() == onnx::TensorProto::FLOAT16)
            throw InputError(
                fmt::format("{} needs float32 weights and '{}' is float16: convert the model first "
                            "(convert_fp16_to_fp32: true), or use weight_only_algorithm rtn",
                            algorithm, init.name()));
}

}  // namespace vaiq
