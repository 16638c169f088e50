#include "pipeline/run_settings.hpp"

#include <fmt/format.h>

#include <array>
#include <cmath>

#include "vaiq/error.hpp"

namespace vaiq {

namespace {

template <typename T>
std::optional<T> optional_value(const Recipe& recipe, std::string_view key) {
    const auto& v = recipe.value(key);
    return v.is_null() ? std::nullopt : std::optional<T>(v.get<T>());
}

}  // namespace

RunSettings RunSettings::of(const Recipe& recipe) {
    RunSettings s;
    auto flag = [&](std::string_view key) { return recipe.value(key).get<bool>(); };
    s.model_input = optional_value<std::string>(recipe, "model_input");
    s.model_output = optional_value<std::string>(recipe, "model_output");
    s.report = optional_value<std::string>(recipe, "report");
    s.use_external_data_format = flag("use_external_data_format");
    s.external_data_name = recipe.value("external_data_name").get<std::string>();
    s.external_data_size_threshold = recipe.value("external_data_size_threshold").get<int64_t>();
    s.dump_output_dir = optional_value<std::string>(recipe, "dump_output_dir");
    s.dump_float = flag("dump_float");

    s.calibration_data_reader = optional_value<std::string>(recipe, "calibration_data_reader");
    s.evaluation_data = optional_value<std::string>(recipe, "evaluation_data");
    s.evaluation_labels = optional_value<std::string>(recipe, "evaluation_labels");
    s.random_input_shapes = recipe.value("random_data_reader_input_shape");
    s.evaluation_batches = optional_value<int64_t>(recipe, "evaluation_batches");

    s.name = recipe.value("name").get<std::string>();
    s.target = recipe.value("target").get<std::string>();
    s.per_channel = flag("per_channel");
    s.remove_input_init = flag("extra_options.RemoveInputInit");
    s.include_cle = flag("include_cle");
    s.cle_guard = flag("cle_guard");
    s.weight_only = flag("weight_only");
    s.enable_subgraph = flag("extra_options.EnableSubgraph");
    s.weight_only_algorithm = recipe.value("weight_only_algorithm").get<std::string>();

    s.node_defaults = recipe.quantize_config();
    s.request = quant_request(s.node_defaults);
    for (const auto& t : recipe.value("extra_options.OpTypesToExcludeOutputQuantization"))
        s.ops_without_output_quantization.insert(t.get<std::string>());
    for (const auto& [op, axis] : recipe.value("extra_options.QDQOpTypePerChannelSupportToAxis").items())
        s.per_channel_axes[op] = axis.get<int>();
    s.force_quantize_no_input_check = flag("extra_options.ForceQuantizeNoInputCheck");
    s.matmul_const_b_only = flag("extra_options.MatMulConstBOnly");
    s.static_quantization = flag("static");
    for (const char* key : {"input_quantization_params", "output_quantization_params"})
        for (const auto& [tensor, p] : recipe.value(key).items())
            s.given_params[tensor] = {p[0].get<int64_t>(), p[1].get<float>(), key, recipe.setting(key).origin};

    s.warn_output_sqnr_db = recipe.value("warn_output_sqnr_db").get<double>();
    s.min_output_sqnr_db = optional_value<double>(recipe, "min_output_sqnr_db");
    if (s.external_data_size_threshold < 0)
        throw InputError(fmt::format("{}: external_data_size_threshold must not be negative",
                                     recipe.setting("external_data_size_threshold").origin));
    return s;
}

}  // namespace vaiq
