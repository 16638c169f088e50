// The vaiq command line: parses arguments and calls libvaiq.
//
// Exit status: 0 success, 1 bad input or usage, 2 internal error.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <malloc.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <memory>

#include "pipeline/pipeline.hpp"
#include "pipeline/preprocess.hpp"
#include "plugin/registry.hpp"
#include "recipe/defaults.hpp"
#include "recipe/recipe.hpp"
#include "report/dump.hpp"
#include "runtime/infer.hpp"
#include "sdk/atomic_file.hpp"
#include "tune/tune.hpp"
#include "util/model_size.hpp"
#include "util/process_start.hpp"
#include "util/progress.hpp"
#include "vaiq/error.hpp"
#include "vaiq/model.hpp"
#include "vaiq/text.hpp"

namespace fs = std::filesystem;
using namespace vaiq;

namespace {

// How OpenMP's idle threads wait in this process, for infer's timings.
std::string openmp_wait() {
    if (const char* policy = std::getenv("OMP_WAIT_POLICY")) return fmt::format("OMP_WAIT_POLICY={}", policy);
    const char* spins = std::getenv("GOMP_SPINCOUNT");
    return fmt::format("GOMP_SPINCOUNT={}", spins ? spins : "default");
}

constexpr int kExitOk = 0;
constexpr int kExitBadInput = 1;
constexpr int kExitInternal = 2;
constexpr int kExitTargetNotMet = 3;  ///< `tune`: no candidate met the target (the best was written)

void setup_logging(const std::string& level, bool quiet) {
    install_stderr_logger();
    spdlog::set_level(quiet ? spdlog::level::err : spdlog::level::from_str(level));
}

nlohmann::json plugin_json(const PluginInfo& p) {
    nlohmann::json options = nlohmann::json::array();
    for (const auto& o : p.options)
        options.push_back(
            {{"name", o.name}, {"type", option_type_name(o.type)}, {"default", o.default_value}, {"doc", o.doc}});
    nlohmann::json out = {{"kind", kind_name(p.kind)},     {"name", p.name},
                          {"version", p.version},          {"summary", p.summary},
                          {"library", p.library.string()}, {"options", options}};
    if (!p.enabled_by.empty()) {
        out["enabled_by"] = nlohmann::json::array();
        for (const auto& sw : p.enabled_by) out["enabled_by"].push_back(sw.describe());
    }
    if (!p.may_try.empty()) out["may_try"] = p.may_try;
    return out;
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
        std::vector<std::string> switches;
        for (const auto& sw : p->enabled_by) switches.push_back(sw.describe());
        if (!switches.empty()) fmt::print("    enabled by {}\n", join(switches, ", "));
        if (!p->may_try.empty()) fmt::print("    may try {}\n", join(p->may_try, ", "));
        for (const auto& o : p->options)
            fmt::print("    {} ({}, default {}): {}\n", o.name, option_type_name(o.type), o.default_value.dump(),
                       o.doc);
    }
    if (plugins.empty())
        fmt::print("no plugins found (searched {} and VAIQ_PLUGIN_PATH)\n", builtin_plugin_dir().string());
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

// One subcommand: its arguments (registered on construction) and what it does.
class Command {
  public:
    virtual ~Command() = default;
    virtual int run() = 0;
    /// The log level to use given the one asked for (quant_pre_process has its own verbosity).
    virtual std::string log_level(const std::string& asked) const { return asked; }
    bool chosen() const { return app_->parsed(); }

  protected:
    explicit Command(CLI::App* app) : app_(app) {}
    CLI::App* app_;
};

// A recipe and the --set assignments every recipe command takes.
struct RecipeArgs {
    std::string file;
    std::vector<std::string> sets;

    void add_to(CLI::App* app) {
        app->add_option("recipe", file, "The recipe (YAML)")->required();
        app->add_option("--set", sets, "Override a recipe setting: key.path=value (repeatable)");
    }
};

// --model and --data: shorthands for the recipe's model_input and calibration_data_reader.
struct InputArgs {
    std::string model, data;

    void add_to(CLI::App* app) {
        app->add_option("--model", model, "The float model (overrides model_input)");
        app->add_option("--data", data, "Calibration data folder or file (overrides calibration_data_reader)");
    }
    void append_to(std::vector<std::string>& assignments) const {
        if (!model.empty()) assignments.push_back("model_input=" + fs::absolute(model).string());
        if (!data.empty()) assignments.push_back("calibration_data_reader=" + fs::absolute(data).string());
    }
};

// A command that runs the pipeline on a recipe: the recipe with --model,
// --data and --set, the installed plugins and the run options they share.
class PipelineCommand : public Command {
  protected:
    PipelineCommand(CLI::App* app, const bool& quiet) : Command(app), quiet_(quiet) {
        recipe_.add_to(app_);
        inputs_.add_to(app_);
    }

    void add_calibration_option(const std::string& help) {
        app_->add_option("--calibration", calibration_, help)->check(CLI::ExistingFile);
    }

    // The flags are shorthands for --set (`shorthands` after --model and --data); an
    // explicit --set of the same key comes later and wins. Loads the plugins too.
    Recipe load(const std::vector<std::string>& shorthands = {}) {
        auto recipe = load_recipe(recipe_.file, assignments(shorthands));
        registry_.load_default_paths();
        return recipe;
    }

    // --model and --data, then `shorthands`, then --set.
    std::vector<std::string> assignments(const std::vector<std::string>& shorthands) const {
        std::vector<std::string> out;
        inputs_.append_to(out);
        out.insert(out.end(), shorthands.begin(), shorthands.end());
        out.insert(out.end(), recipe_.sets.begin(), recipe_.sets.end());
        return out;
    }

    const std::string& recipe_file() const { return recipe_.file; }

    RunOptions run_options() const {
        RunOptions options;
        options.progress = !quiet_ && stderr_is_terminal();
        options.calibration_files.assign(calibration_.begin(), calibration_.end());
        return options;
    }

    PluginRegistry registry_;

  private:
    const bool& quiet_;
    RecipeArgs recipe_;
    InputArgs inputs_;
    std::vector<std::string> calibration_;
};

class RunCommand final : public PipelineCommand {
  public:
    RunCommand(CLI::App& parent, const bool& quiet)
        : PipelineCommand(parent.add_subcommand("run", "Quantize a model as a recipe says"), quiet) {
        app_->add_option("--output", output_, "The quantized model to write (overrides model_output)");
        app_->add_option("--report", report_, "The JSON report to write (overrides report)");
        add_calibration_option(
            "Statistics files of `vaiq calibrate` to calibrate from instead of the data (one per shard: merged)");
        app_->add_option("--stop-after", stop_after_, "Stop after this phase and write the model as it is then")
            ->check(CLI::IsMember({"load", "prepare", "plan", "calibrate", "parameters", "emit"}));
    }

    int run() override {
        std::vector<std::string> shorthands;
        if (!output_.empty()) shorthands.push_back("model_output=" + fs::absolute(output_).string());
        if (!report_.empty()) shorthands.push_back("report=" + fs::absolute(report_).string());
        const Recipe recipe = load(shorthands);
        auto options = run_options();
        if (!stop_after_.empty()) options.stop_after = parse_phase(stop_after_);
        const auto result = run_pipeline(recipe, registry_, options);
        std::vector<std::string> written = {result.output.string(), result.report.string()};
        for (const auto& d : result.documents) written.push_back(d.string());
        spdlog::info("wrote {} and {}", join({written.begin(), written.end() - 1}, ", "), written.back());
        if (!result.report_json["quantized"].get<bool>())
            spdlog::warn("the output is not quantized: the run stopped after the {} phase",
                         result.report_json["stopped_after"].get<std::string>());
        return kExitOk;
    }

  private:
    std::string output_, report_, stop_after_;
};

class TuneCommand final : public PipelineCommand {
  public:
    TuneCommand(CLI::App& parent, const bool& quiet)
        : PipelineCommand(parent.add_subcommand("tune",
                                                "Run candidate recipes, cheapest first, until one's model meets a "
                                                "target measure; keep that one"),
                          quiet) {
        app_->add_option("--space", space_,
                         "The candidates (YAML: candidates and/or dimensions), or a shipped space: cpu.yaml, "
                         "cnn_npu.yaml, transformer_npu.yaml")
            ->required();
        app_->add_option("--target", target_,
                         "MEASURE>=VALUE or MEASURE<=VALUE: accuracy, accuracy_drop, perplexity, "
                         "perplexity_increase, sqnr_db, cosine, top1_agreement")
            ->required();
        app_->add_option("--output", output_, "The quantized model to write (overrides model_output)");
        app_->add_option("--report", report_, "The kept model's JSON report (overrides report)");
    }

    int run() override {
        const auto target = TuneTarget::parse(target_);
        const auto candidates = load_tune_space(space_);
        std::vector<std::string> shorthands;
        if (!output_.empty()) shorthands.push_back("model_output=" + fs::absolute(output_).string());
        if (!report_.empty()) shorthands.push_back("report=" + fs::absolute(report_).string());
        registry_.load_default_paths();
        const auto result = tune(recipe_file(), assignments(shorthands), candidates, target, registry_, run_options());
        const auto& kept = result.trials[*result.kept];
        if (!result.met) {
            spdlog::warn("no candidate met {}: wrote the best, '{}' ({} {:.6g}); every trial is in {}", target.text(),
                         kept.name, target.measure, *kept.score, result.tune_report.string());
            return kExitTargetNotMet;
        }
        spdlog::info("'{}' meets {} ({} {:.6g}) after {} trials: wrote {}, {} and {}", kept.name, target.text(),
                     target.measure, *kept.score, result.trials.size(), result.output.string(), result.report.string(),
                     result.tune_report.string());
        return kExitOk;
    }

  private:
    std::string space_, target_, output_, report_;
};

class CalibrateCommand final : public PipelineCommand {
  public:
    CalibrateCommand(CLI::App& parent, const bool& quiet)
        : PipelineCommand(parent.add_subcommand("calibrate",
                                                "Calibrate as a recipe says and write the statistics (to quantize "
                                                "from later, or to merge with those of other data shards)"),
                          quiet) {
        app_->add_option("--output", output_, "The statistics file to write (JSON)")->required();
        add_calibration_option("Statistics files to merge instead of reading data");
        app_->add_option("--ort-tables", ort_dir_,
                         "Also write the calibrated ranges as calibration.json and calibration.cache (TensorRT) "
                         "into this folder");
    }

    int run() override {
        const Recipe recipe = load();
        const auto tables = calibrate_pipeline(recipe, registry_, run_options());
        write_file_atomically(output_, [&](std::ostream& out) { out << tables.statistics.dump() << '\n'; });
        spdlog::info("wrote the statistics of {} tensors over {} batches to {}", tables.statistics["tensors"].size(),
                     tables.statistics["batches"].get<int>(), output_);
        if (!ort_dir_.empty()) {
            fs::create_directories(ort_dir_);
            write_file_atomically(fs::path(ort_dir_) / "calibration.json",
                                  [&](std::ostream& out) { out << tables.ort_json.dump() << '\n'; });
            write_file_atomically(fs::path(ort_dir_) / "calibration.cache",
                                  [&](std::ostream& out) { out << tables.tensorrt_cache; });
            spdlog::info("wrote calibration.json and calibration.cache to {}", ort_dir_);
        }
        return kExitOk;
    }

  private:
    std::string output_, ort_dir_;
};

class AnalyzeCommand final : public PipelineCommand {
  public:
    AnalyzeCommand(CLI::App& parent, const bool& quiet)
        : PipelineCommand(parent.add_subcommand("analyze",
                                                "Quantize in memory and rank the quantized tensors by the error each "
                                                "adds (nothing is written but --report)"),
                          quiet) {
        app_->add_option("--report", report_,
                         "Write the whole report, with every tensor's figures, as JSON here, and its page beside "
                         "it (.html)");
        app_->add_option("--html", html_, "Write the report's page here (the sensitivity ranking, per-tensor error, "
                                          "histograms, what to try)");
        app_->add_option("--top", top_, "Print this many tensors, most harmful first")->capture_default_str();
    }

    int run() override {
        const Recipe recipe = load();
        const auto report = analyze_pipeline(recipe, registry_, run_options());
        if (!report_.empty()) write_file_atomically(report_, [&](std::ostream& out) { out << report.dump(2) << '\n'; });
        std::string page_path = html_;
        if (page_path.empty() && !report_.empty()) page_path = fs::path(report_).replace_extension(".html").string();
        if (!page_path.empty()) {
            const auto page = render_report(registry_, defaults::kHtmlReport, report);
            write_file_atomically(page_path, [&](std::ostream& out) { out << page; });
        }
        for (const auto& o : report["evaluation"]["outputs"])
            fmt::print("output {}: SQNR {} dB with every tensor quantized\n", o["name"].get<std::string>(),
                       o["sqnr_db"].dump());
        if (!report.contains("sensitivity"))  // the run logged why
            throw std::runtime_error("the sensitivity analysis could not be computed");
        const auto& tensors = report["sensitivity"]["tensors"];
        fmt::print("{:>4}  {:<48} {:<10} {:<7} {:>12} {:>12}\n", "rank", "tensor", "role", "type", "tensor dB",
                   "output dB");
        auto db = [](const nlohmann::json& v) {
            return v.is_number() ? fmt::format("{:.2f}", v.get<double>()) : v.is_null() ? "-" : v.get<std::string>();
        };
        for (size_t i = 0; i < tensors.size() && static_cast<int>(i) < top_; ++i) {
            const auto& t = tensors[i];
            fmt::print("{:>4}  {:<48} {:<10} {:<7} {:>12} {:>12}\n", i + 1, t["tensor"].get<std::string>(),
                       t["role"].get<std::string>(), t["type"].get<std::string>(), db(t["tensor_sqnr_db"]),
                       db(t["output_sqnr_db"]));
        }
        fmt::print("output dB: the output's SQNR with only that tensor quantized; tensor dB: the tensor's own\n");
        return kExitOk;
    }

  private:
    std::string report_, html_;
    int top_ = 20;
};

class ValidateCommand final : public Command {
  public:
    explicit ValidateCommand(CLI::App& parent)
        : Command(parent.add_subcommand("validate", "Check a recipe and the plugins it names")) {
        recipe_.add_to(app_);
    }

    int run() override {
        const Recipe recipe = load_recipe(recipe_.file, recipe_.sets);
        PluginRegistry registry;
        registry.load_default_paths();
        const auto resolved = resolve_plugins(recipe, registry);
        for (const auto& s : unsupported_settings(recipe, Phase::Save))
            spdlog::warn("not supported yet by vaiq run: {}", s);
        fmt::print("{}: valid (target {}, format {}, calibrator {}, {} pass{})\n", recipe_.file,
                   resolved.target.info->name, resolved.format.info->name, resolved.calibrator.info->name,
                   resolved.passes.size(), resolved.passes.size() == 1 ? "" : "es");
        return kExitOk;
    }

  private:
    RecipeArgs recipe_;
};

class ExplainCommand final : public Command {
  public:
    explicit ExplainCommand(CLI::App& parent)
        : Command(parent.add_subcommand("explain",
                                        "Print the resolved recipe and, with a model, what applies to each node")) {
        recipe_.add_to(app_);
        app_->add_option("--model", model_, "A model to explain the recipe against");
    }

    int run() override {
        const Recipe recipe = load_recipe(recipe_.file, recipe_.sets);
        PluginRegistry registry;
        registry.load_default_paths();
        const auto resolved = resolve_plugins(recipe, registry);
        std::optional<Model> model;
        if (!model_.empty()) model = load_model_to_quantize(model_, registry);
        std::cout << explain(recipe, resolved, registry, model ? &*model : nullptr);
        return kExitOk;
    }

  private:
    RecipeArgs recipe_;
    std::string model_;
};

class PluginsCommand final : public Command {
  public:
    explicit PluginsCommand(CLI::App& parent)
        : Command(parent.add_subcommand("plugins", "List the installed plugins and their options")) {
        app_->add_flag("--json", as_json_, "Print JSON");
    }

    int run() override {
        PluginRegistry registry;
        registry.load_default_paths();
        return list_plugins(registry, as_json_);
    }

  private:
    bool as_json_ = false;
};

class ConvertOpsetCommand final : public Command {
  public:
    explicit ConvertOpsetCommand(CLI::App& parent)
        : Command(parent.add_subcommand("convert-opset", "Convert a model to another default-domain opset")) {
        app_->add_option("input", input_, "The model to convert")->required();
        app_->add_option("output", output_, "Where to write the converted model")->required();
        app_->add_option("--opset", opset_, "The target opset (13 recommended)")->required();
    }

    int run() override {
        const Model model = load_model(input_, {.check_opset = false});
        PluginRegistry registry;
        registry.load_default_paths();
        const Model converted = convert_opset_with_shapes(model, opset_, registry);
        SaveOptions save;
        store_externally_if_oversize(converted, save, output_, "");
        save_model(converted, output_, save, input_);
        spdlog::info("wrote {} (opset {} -> {})", output_, model.opset(), converted.opset());
        return kExitOk;
    }

  private:
    std::string input_, output_;
    int64_t opset_ = 0;
};

class ConvertFormatCommand final : public Command {
  public:
    explicit ConvertFormatCommand(CLI::App& parent)
        : Command(parent.add_subcommand(
              "convert-format",
              "Rewrite a VitisQuantFormat.QDQ or FixNeuron model in the native QDQ form ONNX Runtime runs")) {
        app_->add_option("input", input_, "The model to convert")->required();
        app_->add_option("output", output_, "Where to write the converted model")->required();
    }

    // The format whose ops the model holds converts it.
    int run() override {
        Model model = load_model(input_);
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
        SaveOptions save;
        store_externally_if_oversize(model, save, output_, "");
        save_model(model, output_, save, input_);
        spdlog::info("wrote {} ({} custom-op node{} rewritten)", output_, r.converted, r.converted == 1 ? "" : "s");
        return kExitOk;
    }

  private:
    std::string input_, output_;
};

class PreprocessCommand final : public Command {
  public:
    explicit PreprocessCommand(CLI::App& parent)
        : Command(parent.add_subcommand("preprocess",
                                        "Prepare a float model for quantization (quant_pre_process): symbolic shape "
                                        "inference, optimization, ONNX shape inference")) {
        app_->add_option("input", input_, "The model to prepare")->required();
        app_->add_option("output", output_, "Where to write the prepared model")->required();
        app_->add_flag("--skip_optimization", pre_.skip_optimization, "Do not optimize the model");
        app_->add_flag("--skip_onnx_shape", pre_.skip_onnx_shape, "Do not run ONNX shape inference");
        app_->add_flag("--skip_symbolic_shape", pre_.skip_symbolic_shape, "Do not run symbolic shape inference");
        app_->add_flag("--auto_merge", pre_.auto_merge,
                       "On a shape conflict keep the declared dimension instead of failing");
        app_->add_option("--int_max", pre_.int_max, "The integer taken as unbounded (accepted; see docs)");
        app_->add_flag("--guess_output_rank", pre_.guess_output_rank,
                       "Shape outputs of ops without a schema like their first input");
        app_->add_option("--verbose", pre_.verbose, "0 warnings only, 1 each step, 3 details")
            ->check(CLI::IsMember({0, 1, 2, 3}));
        app_->add_flag("--save_as_external_data", pre_.save_as_external_data, "Store tensors in external files");
        app_->add_flag("--all_tensors_to_one_file", pre_.all_tensors_to_one_file,
                       "With external data: one file for every tensor");
        app_->add_option("--external_data_location", pre_.external_data_location,
                         "With external data: the folder, relative to the output's");
        app_->add_option("--external_data_size_threshold", pre_.external_data_size_threshold,
                         "With external data: smaller tensors stay inline");
        app_->add_option("--pass", pre_.passes,
                         "A further pass plugin to run after optimization (repeatable), e.g. "
                         "cross_layer_equalization, convert_fp16_to_fp32, convert_nchw_to_nhwc");
    }

    std::string log_level(const std::string& asked) const override {
        if (asked != "info") return asked;
        return pre_.verbose >= 3 ? "debug" : pre_.verbose >= 1 ? "info" : "warn";
    }

    int run() override {
        PluginRegistry registry;
        registry.load_default_paths();
        const auto r = preprocess(input_, output_, pre_, registry);
        int changed = 0;
        for (const auto& p : r["passes"]) changed += p["changed"].get<bool>();
        fmt::print("wrote {} ({} nodes; {} of {} steps changed the model)\n", output_, r["nodes"].get<int>(), changed,
                   r["passes"].size());
        return kExitOk;
    }

  private:
    std::string input_, output_;
    PreprocessOptions pre_;
};

class DumpCommand final : public Command {
  public:
    explicit DumpCommand(CLI::App& parent)
        : Command(parent.add_subcommand("dump",
                                        "Write the integer values of every quantized tensor (and with --dump-float "
                                        "every node's float output) on one batch")) {
        app_->add_option("model", model_, "The quantized model")->required();
        app_->add_option("--data", data_, "Data whose first batch is the input (default: random inputs)");
        app_->add_option("--random-input-shape", random_shapes_, "NAME=D0,D1,... for a random input (repeatable)");
        app_->add_flag("--dump-float", dump_.dump_float, "Also every node's float output (*_float.bin/.txt)");
        app_->add_option("--output-dir", dir_, "Where to write the files");
    }

    int run() override {
        if (!data_.empty()) dump_.data = data_;
        dump_.output_dir = dir_;
        for (const auto& spec : random_shapes_) dump_.random_input_shapes.update(parse_shape_assignment(spec));
        const auto r = dump_model(model_, dump_);
        fmt::print("dumped {} quantized and {} float tensors to {}\n", r.quantized, r.floats, dir_);
        return kExitOk;
    }

  private:
    std::string model_, data_, dir_ = "dump_results";
    std::vector<std::string> random_shapes_;
    DumpOptions dump_;
};

class InferCommand final : public Command {
  public:
    explicit InferCommand(CLI::App& parent)
        : Command(parent.add_subcommand("infer", "Run a model on inputs from .npy or .pb files and time it")) {
        app_->add_option("model", model_, "The model")->required();
        app_->add_option("-i,--input", inputs_, "NAME=FILE, or FILE for the next input in order (repeatable)");
        app_->add_option("--output-dir", output_dir_, "Write output i as DIR/output_<i>.npy");
        app_->add_option("--repeat", repeat_, "Runs to time")->check(CLI::PositiveNumber);
        app_->add_option("--threads", threads_, "Threads (0: every core)")->check(CLI::NonNegativeNumber);
        app_->add_flag("--json", as_json_, "Print the timings as one JSON object");
        app_->add_flag("--profile", profile_, "Report the time spent per op type");
    }

    int run() override {
        const auto r = runtime::infer(model_, {inputs_, output_dir_, repeat_, threads_, profile_});
        if (as_json_) {
            nlohmann::json outputs = nlohmann::json::array(), ops = nlohmann::json::array();
            for (size_t i = 0; i < r.outputs.size(); ++i)
                outputs.push_back({{"name", r.output_names[i]},
                                   {"shape", r.outputs[i].shape()},
                                   {"type", data_type_name(r.outputs[i].type())}});
            for (const auto& p : r.profile)
                ops.push_back({{"op_type", p.op_type}, {"calls", p.calls}, {"ms", p.milliseconds}});
            nlohmann::json j{{"min_ms", r.min_ms},
                             {"median_ms", r.median_ms},
                             {"runs", repeat_},
                             {"outputs", outputs},
                             {"openmp_wait", openmp_wait()}};
            if (profile_) j["profile"] = ops;
            std::cout << j.dump() << '\n';
            return kExitOk;
        }
        for (size_t i = 0; i < r.outputs.size(); ++i)
            fmt::print("output {} '{}': {} {}\n", i, r.output_names[i], data_type_name(r.outputs[i].type()),
                       nlohmann::json(r.outputs[i].shape()).dump());
        fmt::print("{} run{}: min {:.3f} ms, median {:.3f} ms\n", repeat_, repeat_ == 1 ? "" : "s", r.min_ms,
                   r.median_ms);
        for (const auto& p : r.profile)
            fmt::print("  {:<24} {:>6} calls {:>10.3f} ms\n", p.op_type, p.calls, p.milliseconds);
        return kExitOk;
    }

  private:
    std::string model_, output_dir_;
    std::vector<std::string> inputs_;
    int repeat_ = 1, threads_ = 0;
    bool as_json_ = false, profile_ = false;
};

}  // namespace

int main(int argc, char** argv) {
    restart_tuned(argv);
    // Every run allocates and frees the same activations; served from the heap and
    // never handed back, they are reused instead of being faulted in page by page
    // on each run (glibc maps blocks over 32 MB afresh every time otherwise).
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
    // Calibration and evaluation run batches on several threads. With an arena per
    // thread, what one thread freed could not serve another, and the peak grew with
    // the number of batches (mobilenet_v2: 220 MB for 100, 339 MB for 1000).
    mallopt(M_ARENA_MAX, 1);
    CLI::App app{"vaiq: post-training quantization of ONNX models", "vaiq"};
    app.set_version_flag("--version", std::string(vaiq::version()));
    app.require_subcommand(1);
    std::string log_level = "info";
    bool quiet = false;
    app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
        ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))
        ->capture_default_str();
    app.add_flag("-q,--quiet", quiet, "Only print errors");

    std::vector<std::unique_ptr<Command>> commands;
    commands.push_back(std::make_unique<RunCommand>(app, quiet));
    commands.push_back(std::make_unique<TuneCommand>(app, quiet));
    commands.push_back(std::make_unique<CalibrateCommand>(app, quiet));
    commands.push_back(std::make_unique<AnalyzeCommand>(app, quiet));
    commands.push_back(std::make_unique<ValidateCommand>(app));
    commands.push_back(std::make_unique<ExplainCommand>(app));
    commands.push_back(std::make_unique<PluginsCommand>(app));
    commands.push_back(std::make_unique<ConvertOpsetCommand>(app));
    commands.push_back(std::make_unique<ConvertFormatCommand>(app));
    commands.push_back(std::make_unique<PreprocessCommand>(app));
    commands.push_back(std::make_unique<DumpCommand>(app));
    commands.push_back(std::make_unique<InferCommand>(app));
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int code = app.exit(e);
        return code == 0 ? kExitOk : kExitBadInput;
    }
    auto& command = **std::find_if(commands.begin(), commands.end(), [](const auto& c) { return c->chosen(); });
    setup_logging(command.log_level(log_level), quiet);
    try {
        return command.run();
    } catch (const InputError& e) {
        spdlog::error("{}", e.what());
        return kExitBadInput;
    } catch (const std::exception& e) {
        spdlog::error("internal error: {}", e.what());
        return kExitInternal;
    }
}
