// The recipe's settings that the run reads, parsed once and typed: a phase reads
// a member, never a key by its name. The plugins' options and the recipe's
// structure (passes, algorithms, overrides) are read where they are resolved;
// the planner types each node's settings, overrides applied, once per node.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "recipe/recipe.hpp"

namespace vaiq {

struct RunSettings {
    // Files
    std::optional<std::string> model_input, model_output, report;
    bool use_external_data_format = false;
    std::string external_data_name;
    int64_t external_data_size_threshold = 0;
    std::optional<std::string> dump_output_dir;
    bool dump_float = false;

    // Data
    std::optional<std::string> calibration_data_reader, evaluation_data, evaluation_labels;
    nlohmann::json random_input_shapes;  ///< random_data_reader_input_shape
    std::optional<int64_t> evaluation_batches;

    // What the run does
    std::string name, target;
    bool per_channel = false, remove_input_init = true, include_cle = false, cle_guard = true;
    bool weight_only = false;
    bool enable_subgraph = false;  ///< extra_options.EnableSubgraph: If, Loop and Scan bodies quantized too
    std::string weight_only_algorithm;

    // Planning
    Options node_defaults;  ///< every node's settings before its overrides (Recipe::quantize_config)
    QuantRequest request;   ///< what node_defaults ask of the target
    std::set<std::string> ops_without_output_quantization;  ///< extra_options.OpTypesToExcludeOutputQuantization
    std::map<std::string, int> per_channel_axes;            ///< extra_options.QDQOpTypePerChannelSupportToAxis
    bool force_quantize_no_input_check = false, matmul_const_b_only = false, static_quantization = true;
    struct GivenParams {
        int64_t zero_point = 0;
        float scale = 0;
        std::string key, origin;  ///< the recipe key and line that gave them
    };
    std::map<std::string, GivenParams> given_params;  ///< input_ and output_quantization_params by tensor
    /// The origin of parameters a body's run takes from its enclosing graph (EnableSubgraph).
    static constexpr std::string_view kSharedParamsOrigin = "the enclosing graph's parameters";

    // Judging the result
    double warn_output_sqnr_db = 0;
    std::optional<double> min_output_sqnr_db;

    /// Reads them from a recipe whose values the schema has checked; throws
    /// InputError at the recipe line for what only makes sense together (an
    /// image size, a negative count).
    static RunSettings of(const Recipe& recipe);
};

}  // namespace vaiq
