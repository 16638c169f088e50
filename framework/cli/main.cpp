// The vaiq command line: parses arguments and calls libvaiq.
//
// Exit status: 0 success, 1 bad input or usage, 2 internal error.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <malloc.h>

#include <iostream>
#include <limits>

#include "pipeline/dump.hpp"
#include "pipeline/pipeline.hpp"
#include "pipeline/preprocess.hpp"
#include "plugin/registry.hpp"
#include "recipe/recipe.hpp"
#include "runtime/infer.hpp"
#include "util/progress.hpp"
#include "vaiq/error.hpp"
#include "vaiq/model.hpp"

namespace fs = std::filesystem;
using namespace vaiq;

namespace {

constexpr int kExitOk = 0;
constexpr int kExitBadInput = 1;
constexpr int kExitInternal = 2;

void setup_logging(const std::string& level, bool quiet) {
    auto logger = spdlog::stderr_color_mt("vaiq");
    logger->set_pattern("%^%l%$: %v");
    spdlog::set_default_logger(logger);
    spdlog::set_level(quiet ? spdlog::level::err : spdlog::level::from_str(level));
}

nlohmann::json plugin_json(const PluginInfo& p) {
    nlohmann::json options = nlohmann::json::array();
    for (const auto& o : p.options)
        options.push_back({{"name", o.name}, {"type", option_type_name(o.type)}, {"default", o.default_value}, {"doc", o.doc}});
    return {{"kind", kind_name(p.kind)}, {"name", p.name},       {"version", p.version},
            {"summary", p.summary},      {"library", p.library.string()}, {"options", options}};
}

int list_plugins(const PluginRegistry& registry, bool as_json) {
    const auto plugins = registry.list();
    if (as_json) {
        nlohmann::json out = nlohmann::json::array();
        for (const auto* p : plugins) out.push_back(plugin_json(*p));
        std::cout << out.dump(2) << '\n';
        return kExitOk;
    }
    for (const auto* p : plugins) {
        fmt::print("{:<11} {:<20} {:<8} {}\n", kind_name(p->kind), p->name, p->version, p->summary);
        for (const auto& o : p->options)
            fmt::print("    {} ({}, default {}): {}\n", o.name, option_type_name(o.type), o.default_value.dump(), o.doc);
    }
    if (plugins.empty()) fmt::print("no plugins found (searched {} and VAIQ_PLUGIN_PATH)\n", builtin_plugin_dir().string());
    return kExitOk;
}

// NAME=D0,D1,... as {NAME: [D0, D1, ...]}.
nlohmann::json parse_shape_assignment(const std::string& spec) {
    const auto eq = spec.find('=');
    if (eq == std::string::npos || eq == 0)
        throw InputError(fmt::format("--random-input-shape '{}': expected NAME=D0,D1,...", spec));
    nlohmann::json dims = nlohmann::json::array();
    std::string rest = spec.substr(eq + 1);
    for (size_t start = 0; start <= rest.size();) {
        const auto comma = std::min(rest.find(',', start), rest.size());
        const auto text = rest.substr(start, comma - start);
        size_t used = 0;
        long long d = -1;
        try {
            d = std::stoll(text, &used);
        } catch (const std::exception&) {
        }
        if (text.empty() || used != text.size() || d <= 0)
            throw InputError(fmt::format("--random-input-shape '{}': '{}' is not a positive dimension", spec, text));
        dims.push_back(d);
        start = comma + 1;
    }
    return {{spec.substr(0, eq), dims}};
}

std::optional<Phase> parse_phase(const std::string& name) {
    for (Phase p : {Phase::Load, Phase::Prepare, Phase::Plan, Phase::Calibrate, Phase::Parameters, Phase::Emit,
                    Phase::Check, Phase::Evaluate})
        if (phase_name(p) == name) return p;
    return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
    // Every run allocates and frees the same activations; served from the heap and
    // never handed back, they are reused instead of being faulted in page by page
    // on each run (glibc maps blocks over 32 MB afresh every time otherwise).
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
    CLI::App app{"vaiq: post-training quantization of ONNX models", "vaiq"};
    app.set_version_flag("--version", std::string(vaiq::version()));
    app.require_subcommand(1);
    std::string log_level = "info";
    bool quiet = false;
    app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
        ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))
        ->capture_default_str();
    app.add_flag("-q,--quiet", quiet, "Only print errors");

    std::string recipe_file, model_in, model_out, data, report, stop_after;
    std::vector<std::string> sets;
    bool as_json = false;
    int64_t opset = 0;

    auto* run = app.add_subcommand("run", "Quantize a model as a recipe says");
    run->add_option("recipe", recipe_file, "The recipe (YAML)")->required();
    run->add_option("--model", model_in, "The float model (overrides model_input)");
    run->add_option("--output", model_out, "The quantized model to write (overrides model_output)");
    run->add_option("--data", data, "Calibration data folder (overrides calibration_data_reader)");
    run->add_option("--report", report, "The JSON report to write (overrides report)");
    run->add_option("--set", sets, "Override a recipe setting: key.path=value (repeatable)");
    run->add_option("--stop-after", stop_after, "Stop after this phase and write the model as it is then")
        ->check(CLI::IsMember({"load", "prepare", "plan", "calibrate", "parameters", "emit"}));

    auto* validate = app.add_subcommand("validate", "Check a recipe and the plugins it names");
    validate->add_option("recipe", recipe_file, "The recipe (YAML)")->required();
    validate->add_option("--set", sets, "Override a recipe setting: key.path=value (repeatable)");

    auto* explain_cmd = app.add_subcommand("explain", "Print the resolved recipe and, with a model, what applies to each node");
    explain_cmd->add_option("recipe", recipe_file, "The recipe (YAML)")->required();
    explain_cmd->add_option("--model", model_in, "A model to explain the recipe against");
    explain_cmd->add_option("--set", sets, "Override a recipe setting: key.path=value (repeatable)");

    auto* plugins = app.add_subcommand("plugins", "List the installed plugins and their options");
    plugins->add_flag("--json", as_json, "Print JSON");

    auto* convert = app.add_subcommand("convert-opset", "Convert a model to another default-domain opset");
    convert->add_option("input", model_in, "The model to convert")->required();
    convert->add_option("output", model_out, "Where to write the converted model")->required();
    convert->add_option("--opset", opset, "The target opset (13 recommended)")->required();

    auto* convert_format = app.add_subcommand(
        "convert-format", "Rewrite a VitisQuantFormat.QDQ or FixNeuron model in the native QDQ form ONNX Runtime runs");
    convert_format->add_option("input", model_in, "The model to convert")->required();
    convert_format->add_option("output", model_out, "Where to write the converted model")->required();

    PreprocessOptions pre;
    auto* preprocess_cmd = app.add_subcommand(
        "preprocess", "Prepare a float model for quantization (quant_pre_process): symbolic shape inference, "
                      "optimization, ONNX shape inference");
    preprocess_cmd->add_option("input", model_in, "The model to prepare")->required();
    preprocess_cmd->add_option("output", model_out, "Where to write the prepared model")->required();
    preprocess_cmd->add_flag("--skip_optimization", pre.skip_optimization, "Do not optimize the model");
    preprocess_cmd->add_flag("--skip_onnx_shape", pre.skip_onnx_shape, "Do not run ONNX shape inference");
    preprocess_cmd->add_flag("--skip_symbolic_shape", pre.skip_symbolic_shape, "Do not run symbolic shape inference");
    preprocess_cmd->add_flag("--auto_merge", pre.auto_merge,
                             "On a shape conflict keep the declared dimension instead of failing");
    preprocess_cmd->add_option("--int_max", pre.int_max, "The integer taken as unbounded (accepted; see docs)");
    preprocess_cmd->add_flag("--guess_output_rank", pre.guess_output_rank,
                             "Shape outputs of ops without a schema like their first input");
    preprocess_cmd->add_option("--verbose", pre.verbose, "0 warnings only, 1 each step, 3 details")
        ->check(CLI::IsMember({0, 1, 2, 3}));
    preprocess_cmd->add_flag("--save_as_external_data", pre.save_as_external_data, "Store tensors in external files");
    preprocess_cmd->add_flag("--all_tensors_to_one_file", pre.all_tensors_to_one_file,
                             "With external data: one file for every tensor");
    preprocess_cmd->add_option("--external_data_location", pre.external_data_location,
                               "With external data: the folder, relative to the output's");
    preprocess_cmd->add_option("--external_data_size_threshold", pre.external_data_size_threshold,
                               "With external data: smaller tensors stay inline");
    preprocess_cmd->add_option("--pass", pre.passes,
                               "A further pass plugin to run after optimization (repeatable), e.g. "
                               "cross_layer_equalization, convert_fp16_to_fp32, convert_nchw_to_nhwc");

    DumpOptions dump;
    std::string dump_data, dump_dir = "dump_results";
    std::vector<std::string> random_shapes;
    auto* dump_cmd = app.add_subcommand(
        "dump", "Write the integer values of every quantized tensor (and with --dump-float every node's float "
                "output) on one batch");
    dump_cmd->add_option("model", model_in, "The quantized model")->required();
    dump_cmd->add_option("--data", dump_data, "Data whose first batch is the input (default: random inputs)");
    dump_cmd->add_option("--random-input-shape", random_shapes, "NAME=D0,D1,... for a random input (repeatable)");
    dump_cmd->add_flag("--dump-float", dump.dump_float, "Also every node's float output (*_float.bin/.txt)");
    dump_cmd->add_option("--output-dir", dump_dir, "Where to write the files");

    std::vector<std::string> infer_inputs;
    std::string output_dir;
    int repeat = 1, threads = 0;
    bool profile = false;
    auto* infer_cmd = app.add_subcommand("infer", "Run a model on inputs from .npy or .pb files and time it");
    infer_cmd->add_option("model", model_in, "The model")->required();
    infer_cmd->add_option("-i,--input", infer_inputs, "NAME=FILE, or FILE for the next input in order (repeatable)");
    infer_cmd->add_option("--output-dir", output_dir, "Write output i as DIR/output_<i>.npy");
    infer_cmd->add_option("--repeat", repeat, "Runs to time")->check(CLI::PositiveNumber);
    infer_cmd->add_option("--threads", threads, "Threads (0: every core)")->check(CLI::NonNegativeNumber);
    infer_cmd->add_flag("--json", as_json, "Print the timings as one JSON object");
    infer_cmd->add_flag("--profile", profile, "Report the time spent per op type");

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int code = app.exit(e);
        return code == 0 ? kExitOk : kExitBadInput;
    }
    if (*preprocess_cmd && log_level == "info")  // quant_pre_process's verbose levels
        log_level = pre.verbose >= 3 ? "debug" : pre.verbose >= 1 ? "info" : "warn";
    setup_logging(log_level, quiet);

    try {
        PluginRegistry registry;
        if (*plugins) {
            registry.load_default_paths();
            return list_plugins(registry, as_json);
        }
        if (*infer_cmd) {
            const auto r = runtime::infer(model_in, {infer_inputs, output_dir, repeat, threads, profile});
            nlohmann::json ops = nlohmann::json::array();
            for (const auto& p : r.profile)
                ops.push_back({{"op_type", p.op_type}, {"calls", p.calls}, {"ms", p.milliseconds}});
            if (as_json) {
                nlohmann::json outputs = nlohmann::json::array();
                for (size_t i = 0; i < r.outputs.size(); ++i)
                    outputs.push_back({{"name", r.output_names[i]}, {"shape", r.outputs[i].shape()},
                                       {"type", data_type_name(r.outputs[i].type())}});
                nlohmann::json j{{"min_ms", r.min_ms}, {"median_ms", r.median_ms}, {"runs", repeat}, {"outputs", outputs}};
                if (profile) j["profile"] = ops;
                std::cout << j.dump() << '\n';
            } else {
                for (size_t i = 0; i < r.outputs.size(); ++i)
                    fmt::print("output {} '{}': {} {}\n", i, r.output_names[i], data_type_name(r.outputs[i].type()),
                               nlohmann::json(r.outputs[i].shape()).dump());
                fmt::print("{} run{}: min {:.3f} ms, median {:.3f} ms\n", repeat, repeat == 1 ? "" : "s", r.min_ms, r.median_ms);
                for (const auto& p : r.profile)
                    fmt::print("  {:<24} {:>6} calls {:>10.3f} ms\n", p.op_type, p.calls, p.milliseconds);
            }
            return kExitOk;
        }
        if (*preprocess_cmd) {
            registry.load_default_paths();
            const auto r = preprocess(model_in, model_out, pre, registry);
            int changed = 0;
            for (const auto& p : r["passes"]) changed += p["changed"].get<bool>();
            fmt::print("wrote {} ({} nodes; {} of {} steps changed the model)\n", model_out, r["nodes"].get<int>(),
                       changed, r["passes"].size());
            return kExitOk;
        }
        if (*dump_cmd) {
            if (!dump_data.empty()) dump.data = dump_data;
            dump.output_dir = dump_dir;
            for (const auto& spec : random_shapes) dump.random_input_shapes.update(parse_shape_assignment(spec));
            const auto r = dump_model(model_in, dump);
            fmt::print("dumped {} quantized and {} float tensors to {}\n", r.quantized, r.floats, dump_dir);
            return kExitOk;
        }
        if (*convert_format) {
            // The format whose ops the model holds converts it.
            Model model = load_model(model_in);
            PluginRegistry registry;
            registry.load_default_paths();
            NativeConversion r;
            for (const auto* info : registry.list(PluginKind::Format)) {
                auto format = registry.create<Format>(info->name, registry.resolve_options(*info, nullptr));
                if (!format->wrote(model)) continue;
                r = format->to_native(model);
                spdlog::debug("converted as format '{}' writes it", info->name);
                break;
            }
            for (const auto& w : r.warnings) spdlog::warn("{}", w);
            save_model(model, model_out, {}, model_in);
            spdlog::info("wrote {} ({} custom-op node{} rewritten)", model_out, r.converted, r.converted == 1 ? "" : "s");
            return kExitOk;
        }
        if (*convert) {
            const Model model = load_model(model_in, {.check_opset = false});
            const Model converted = convert_opset(model, opset);
            save_model(converted, model_out, {}, model_in);
            spdlog::info("wrote {} (opset {} -> {})", model_out, model.opset(), converted.opset());
            return kExitOk;
        }

        // The flags are shorthands for --set; an explicit --set of the same key comes later and wins.
        std::vector<std::string> assignments;
        auto flag = [&](const std::string& value, const char* key) {
            if (!value.empty()) assignments.push_back(fmt::format("{}={}", key, fs::absolute(value).string()));
        };
        flag(model_in, "model_input");
        flag(model_out, "model_output");
        flag(data, "calibration_data_reader");
        flag(report, "report");
        assignments.insert(assignments.end(), sets.begin(), sets.end());
        const Recipe recipe = load_recipe(recipe_file, assignments);
        registry.load_default_paths();

        if (*validate) {
            const auto resolved = resolve_plugins(recipe, registry);
            for (const auto& s : unsupported_settings(recipe, Phase::Save))
                spdlog::warn("not supported yet by vaiq run: {}", s);
            fmt::print("{}: valid (target {}, format {}, calibrator {}, {} pass{})\n", recipe_file,
                       resolved.target.info->name, resolved.format.info->name, resolved.calibrator.info->name,
                       resolved.passes.size(), resolved.passes.size() == 1 ? "" : "es");
            return kExitOk;
        }
        if (*explain_cmd) {
            const auto resolved = resolve_plugins(recipe, registry);
            std::optional<Model> model;
            if (!model_in.empty()) model = load_model(model_in);
            std::cout << explain(recipe, resolved, registry, model ? &*model : nullptr);
            return kExitOk;
        }
        RunOptions options;
        options.progress = !quiet && stderr_is_terminal();
        if (!stop_after.empty()) options.stop_after = parse_phase(stop_after);
        const auto result = run_pipeline(recipe, registry, options);
        spdlog::info("wrote {} and {}", result.output.string(), result.report.string());
        if (!result.report_json["quantized"].get<bool>())
            spdlog::warn("the output is not quantized: the run stopped after the {} phase",
                         result.report_json["stopped_after"].get<std::string>());
        return kExitOk;
    } catch (const InputError& e) {
        spdlog::error("{}", e.what());
        return kExitBadInput;
    } catch (const std::exception& e) {
        spdlog::error("internal error: {}", e.what());
        return kExitInternal;
    }
}
