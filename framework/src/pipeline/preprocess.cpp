#include "pipeline/preprocess.hpp"

#include <fmt/format.h>

#include <chrono>

#include "recipe/defaults.hpp"
#include "util/model_size.hpp"
#include "vaiq/error.hpp"
#include "vaiq/log.hpp"
#include "vaiq/pass.hpp"

namespace vaiq {

bool run_passes(const std::vector<PluginChoice>& passes, PluginRegistry& registry, Model& model, nlohmann::json& report,
                const ChannelMeasurer& measure) {
    bool kept = true;
    for (const auto& choice : passes) {
        const auto start = std::chrono::steady_clock::now();
        auto pass = registry.create<Pass>(choice.info->name, choice.options);
        if (const auto wanted = pass->channel_ranges_wanted(model); !wanted.empty()) {
            if (measure)
                pass->set_channel_ranges(measure(model, wanted));
            else
                log_info("pass {}: no calibration data here: it runs without the {} channel ranges it asks for",
                         choice.info->name, wanted.size());
        }
        const bool changed = pass->run(model);
        if (changed) {
            try {
                check_model(model);
            } catch (const InputError& e) {
                throw InternalError(fmt::format("pass '{}' left an invalid model: {}", choice.info->name, e.what()));
            }
        }
        const bool keeps = pass->keeps_function();
        kept = kept && (keeps || !changed);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        report.push_back(
            {{"name", choice.info->name}, {"changed", changed}, {"keeps_function", keeps}, {"seconds", seconds}});
        log_info("pass {}: {}", choice.info->name, changed ? "changed the model" : "no change");
    }
    return kept;
}

PluginChoice pass_choice(PluginRegistry& registry, const std::string& name, const nlohmann::json& options,
                         const std::string& origin) {
    const auto& info = registry.require(PluginKind::Pass, name, origin);
    return {&info, registry.resolve_options(info, options), {}};
}

Model convert_opset_with_shapes(const Model& model, int64_t opset, PluginRegistry& registry) {
    return convert_opset(model, opset, [&](Model& m) {
        nlohmann::json report = nlohmann::json::array();
        run_passes({pass_choice(registry, "infer_symbolic_shapes", nullptr, "opset conversion")}, registry, m, report);
    });
}

Model load_model_to_quantize(const std::filesystem::path& path, PluginRegistry& registry, nlohmann::json* converted) {
    Model model = load_model(path, {.check_opset = false});
    const int64_t opset = model.opset();
    if (opset == 0 || opset >= kMinimumOpset) return model;
    if (opset < kOldestConvertedOpset)
        throw InputError(fmt::format(
            "{} uses opset {} of the default domain; vaiq converts models of opset {} to {} itself and needs {} or "
            "newer otherwise. Re-export the model from its framework with opset 10 or above (13 recommended)",
            path.string(), opset, kOldestConvertedOpset, kMinimumOpset - 1, kMinimumOpset));
    model = convert_opset_with_shapes(model, kConvertedOpset, registry);
    log_warn("{} uses opset {}: converted to opset {} to quantize it (as vaiq convert-opset does; the input is "
             "unchanged)",
             path.string(), opset, kConvertedOpset);
    if (converted) *converted = {{"from", opset}, {"to", kConvertedOpset}, {"why", "opset below 10"}};
    return model;
}

nlohmann::json preprocess(const std::filesystem::path& input, const std::filesystem::path& output,
                          const PreprocessOptions& options, PluginRegistry& registry) {
    if (options.int_max <= 0) throw InputError(fmt::format("int_max must be positive, not {}", options.int_max));
    nlohmann::json converted;
    Model model = load_model_to_quantize(input, registry, &converted);
    std::vector<PluginChoice> passes;
    const std::string origin = "vaiq preprocess";
    for (const auto& p : defaults::preprocess_passes_before(options))
        passes.push_back(pass_choice(registry, p.name, p.options, origin));
    for (const auto& name : options.passes) passes.push_back(pass_choice(registry, name, nullptr, origin));
    for (const auto& p : defaults::preprocess_passes_after(options))
        passes.push_back(pass_choice(registry, p.name, p.options, origin));

    nlohmann::json report = {
        {"input", input.string()}, {"output", output.string()}, {"passes", nlohmann::json::array()}};
    run_passes(passes, registry, model, report["passes"]);
    SaveOptions save;
    save.use_external_data_format = options.save_as_external_data;
    save.all_tensors_to_one_file = options.all_tensors_to_one_file;
    save.external_data_location = options.external_data_location;
    save.external_data_size_threshold = options.external_data_size_threshold;
    store_externally_if_oversize(model, save, output, "save_as_external_data");
    save_model(model, output, save, input);
    report["nodes"] = model.graph().node_size();
    if (!converted.is_null()) report["opset_converted"] = converted;
    return report;
}

}  // namespace vaiq
