#include "pipeline/run_settings.hpp"

#include <fmt/format.h>

#include <array>
#include <cmath>

#include "vaiq/error.hpp"

namespace vaiq {

namespace {

// How images in a data folder become inputs: the data_preprocess preset, with
// the image_preprocess keys set explicitly in its place.
ImagePipeline image_pipeline(const Recipe& recipe, const std::string& preset) {
    auto p = preset_image_pipeline(preset);
    auto given = [&](const char* key) -> const nlohmann::json* {
        const auto& setting = recipe.setting(key);
        return setting.is_default() ? nullptr : &setting.value;
    };
    auto fail = [&](const char* key, const std::string& what) {
        throw InputError(fmt::format("{}: {} {}", recipe.setting(key).origin, key, what));
    };
    if (const auto* size = given("image_preprocess.size"); size && !size->empty()) {
        const auto& v = *size;
        constexpr double kLargestSide = 1 << 16;
        auto side = [&](const nlohmann::json& x) {
            const double d = x.get<double>();
            return d >= 1 && d <= kLargestSide && d == std::floor(d);
        };
        if (v.size() != 2 || !side(v[0]) || !side(v[1]))
            fail("image_preprocess.size", "must be [height, width], two integers from 1 to 65536");
        p.size = std::array<int64_t, 2>{v[0].get<int64_t>(), v[1].get<int64_t>()};
    }
    if (const auto* v = given("image_preprocess.resize"))
        p.resize = *v == "keep_aspect" ? ImagePipeline::Resize::KeepAspect : ImagePipeline::Resize::Stretch;
    if (const auto* v = given("image_preprocess.crop_fraction")) {
        p.crop_fraction = v->get<double>();
        if (!(p.crop_fraction > 0 && p.crop_fraction <= 1)) fail("image_preprocess.crop_fraction", "must be in (0, 1]");
    }
    if (const auto* v = given("image_preprocess.interpolation"))
        p.interpolation = *v == "area" ? ImagePipeline::Interpolation::Area : ImagePipeline::Interpolation::Bilinear;
    for (const char* key : {"image_preprocess.mean", "image_preprocess.std"}) {
        const auto* v = given(key);
        if (!v) continue;
        if (v->size() != 1 && v->size() != 3) fail(key, "takes one value or one per channel");
        auto& values = std::string(key) == "image_preprocess.mean" ? p.mean : p.std;
        values = v->get<std::vector<float>>();
    }
    for (float s : p.std)
        if (!(s > 0)) fail("image_preprocess.std", "values must be positive");
    if (const auto* v = given("image_preprocess.channel_order")) p.bgr = *v == "BGR";
    if (const auto* v = given("image_preprocess.layout")) p.nhwc = *v == "NHWC";
    return p;
}

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
    s.report_html = flag("report_html");
    s.use_external_data_format = flag("use_external_data_format");
    s.external_data_name = recipe.value("external_data_name").get<std::string>();
    s.external_data_size_threshold = recipe.value("external_data_size_threshold").get<int64_t>();
    s.dump_output_dir = optional_value<std::string>(recipe, "dump_output_dir");
    s.dump_float = flag("dump_float");

    s.calibration_data_reader = optional_value<std::string>(recipe, "calibration_data_reader");
    s.evaluation_data = optional_value<std::string>(recipe, "evaluation_data");
    s.evaluation_labels = optional_value<std::string>(recipe, "evaluation_labels");
    s.random_input_shapes = recipe.value("random_data_reader_input_shape");
    s.random_input_ranges = recipe.value("extra_options.RandomDataReaderInputDataRange");
    s.images = image_pipeline(recipe, recipe.value("data_preprocess").get<std::string>());
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
