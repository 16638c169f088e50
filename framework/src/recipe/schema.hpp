// The recipe schema: every key a recipe may carry.
#pragma once

#include <string_view>
#include <vector>

namespace vaiq {

/// The pipeline phases, in order (docs/quantizing.md). A key belongs to the phase that reads it.
enum class Phase { Setup, Load, Prepare, Plan, Calibrate, Parameters, Emit, Check, Evaluate, Save };
std::string_view phase_name(Phase phase);

enum class ValueKind {
    SchemaVersion,  ///< the integer 1
    Bool,
    Int,
    Float,
    String,
    Path,             ///< a file path, relative to the recipe that names it
    OptionalPath,     ///< a path or null
    PathList,         ///< a list of paths, each relative to the recipe that names it
    StringList,       ///< a list of strings; null means empty
    NumberList,       ///< a list of finite numbers; null means empty
    QuantType,        ///< QInt8, QUInt8, ... (documented prefixes accepted)
    QuantFormat,      ///< QDQ, QOperator, VitisQuantFormat.QDQ, VitisQuantFormat.FixNeuron, or a format plugin
    CalibrateMethod,  ///< MinMax, Entropy, Percentile, NonOverflow, MinMSE, or a calibrator plugin
    PluginName,       ///< [a-z][a-z0-9_]*
    Choice,           ///< one of KeySpec::choices
    ShapeSpec,        ///< [d, ...] | [[d, ...], ...] | {input: [d, ...]}
    IntMap,           ///< {string: int}
    RangeMap,         ///< null | {input: [low, high]}
    ParamsMap,        ///< {tensor: [zero_point, scale]}
    Providers,        ///< execution providers: only CPUExecutionProvider
    Passes,           ///< [name | {name, options}]
    Overrides,        ///< [{match: {name, op_type, optional}, exclude | set}]
};

struct KeySpec {
    std::string_view path;  ///< "per_channel", "extra_options.ActivationSymmetric"
    ValueKind kind;
    std::string_view default_yaml;  ///< the documented default, as YAML
    Phase phase;                    ///< the phase that reads it
    bool implemented;               ///< false: "not supported yet" when set explicitly
    std::string_view doc;
    std::string_view enabled_by = {};  ///< a bool key this one only matters under
    std::vector<std::string_view> choices = {};
    /// A documented argument a plugin reads, not the host: a chosen plugin that
    /// declares an option of the same name takes the recipe's value.
    bool read_by_plugin = false;
};

const std::vector<KeySpec>& recipe_keys();

/// Whether `name` is spelled like a documented extra option (ActivationSymmetric,
/// AlignConcat: a capital first), or one of a nested extra_options section
/// (FastFinetune.NumIterations). A plugin option spelled so is set under
/// extra_options, and an extra option the schema does not have is a plugin's.
bool is_extra_option_name(std::string_view name);
const KeySpec* find_key(std::string_view path);

/// Maps whose keys are checked one by one and deep-merged by `extends:`.
bool is_section(std::string_view path);
/// Sections whose keys are a plugin's options, checked against its schema later.
bool is_plugin_options_section(std::string_view path);
/// Whether `path` is a key of a section plugins declare the keys of
/// (image_preprocess.size: an option of the images reader).
bool in_plugin_section(std::string_view path);
/// Every key and section directly under `section` ("" for the top level).
std::vector<std::string> keys_in_section(std::string_view section);

/// Keys an override's `set:` may change, with the recipe key each stands for.
struct OverrideKey {
    std::string_view name;
    std::string_view recipe_key;
};
const std::vector<OverrideKey>& override_keys();

}  // namespace vaiq
