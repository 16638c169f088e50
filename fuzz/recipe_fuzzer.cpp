// Recipes: YAML, `extends:` (a parent sits in the scratch folder), ${VAR}
// expansion, every key's normalisation, and a --set assignment taken from the
// input's first line. A recipe that loads must also resolve into the settings
// targets and formats read, and into the run's typed settings.
#include <fstream>
#include <string>

#include "fuzz_support.hpp"
#include "pipeline/pipeline.hpp"
#include "pipeline/run_settings.hpp"
#include "recipe/recipe.hpp"

using namespace vaiq;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const bool setup = [] {
        std::ofstream(fuzz::scratch() / "parent.yaml")
            << "recipe_version: 1\nname: parent\ncalibrate_method: MinMax\nextra_options:\n  ActivationSymmetric: true\n"
               "overrides:\n  - match: {op_type: Conv}\n    set: {per_channel: true}\n";
        ::setenv("VAIQ_FUZZ_VALUE", "QInt8", 1);
        return true;
    }();
    (void)setup;
    const std::string text(reinterpret_cast<const char*>(data), size);
    fuzz::expect_only_input_errors([&] {
        Recipe recipe = load_recipe_text(text, "fuzz", fuzz::scratch());
        if (const auto eol = text.find('\n'); eol != std::string::npos && eol > 0)
            apply_setting(recipe, text.substr(0, eol), fuzz::scratch());
        (void)unsupported_settings(recipe, Phase::Save);
        (void)quant_request(recipe.quantize_config());
        (void)recipe.format_plugin();
        (void)recipe.calibrator_plugin();
        (void)recipe.explicit_keys();
        (void)RunSettings::of(recipe);
    });
    return 0;
}
