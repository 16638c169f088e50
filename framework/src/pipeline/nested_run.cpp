#include "pipeline/nested_run.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <set>

#include "pipeline/run_state.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"

namespace fs = std::filesystem;

namespace vaiq::phases {

namespace {

// Removes a file when it goes out of scope.
struct TemporaryFile {
    fs::path path;
    ~TemporaryFile() {
        std::error_code ec;
        fs::remove(path, ec);
    }
};

fs::path temporary_model_path() {
    static std::atomic<int> counter{0};
    return fs::temp_directory_path() / fmt::format("vaiq-body-{}-{}.onnx", getpid(), counter++);
}

void collect_node_names(const onnx::GraphProto& graph, std::set<std::string>& names) {
    for (const auto& node : graph.node()) names.insert(node.name());
    for_each_subgraph(graph, [&](const onnx::GraphProto& g) { collect_node_names(g, names); });
}

// The run's recipe for another model: reading `model` and the data given to
// it, writing nothing. Its node lists keep the nodes the model has (the run
// checked them against the whole model); nullopt when nodes_to_quantize names
// none of them.
std::optional<Recipe> nested_recipe(const Recipe& recipe, const fs::path& file, const onnx::GraphProto& graph,
                                    const nlohmann::json& shared_inputs, const nlohmann::json& shared_outputs) {
    Recipe nested = recipe;
    // The enclosing graph's parameters where the model shares values with it; the recipe's own stay.
    for (const auto& [key, given] : {std::pair{"input_quantization_params", &shared_inputs},
                                     std::pair{"output_quantization_params", &shared_outputs}}) {
        auto& setting = nested.settings.at(key);
        if (!given->is_object() || given->empty()) continue;
        if (setting.value.empty()) setting.origin = std::string(RunSettings::kSharedParamsOrigin);
        for (const auto& [tensor, p] : given->items())
            if (!setting.value.contains(tensor)) setting.value[tensor] = p;
    }
    nested.settings["model_input"] = {file.string(), "a body of the model"};
    for (const char* key : {"model_output", "report", "calibration_data_reader", "evaluation_data", "evaluation_labels",
                            "dump_output_dir"})
        nested.settings[key] = {nullptr, "default"};
    std::set<std::string> nodes;
    collect_node_names(graph, nodes);
    for (const char* key : {"nodes_to_quantize", "nodes_to_exclude", "input_nodes", "output_nodes"}) {
        auto& listed = nested.settings.at(key).value;
        auto kept = nlohmann::json::array();
        for (const auto& name : listed)
            if (nodes.count(name.get<std::string>())) kept.push_back(name);
        if (std::string_view(key) == "nodes_to_quantize" && !listed.empty() && kept.empty()) return std::nullopt;
        listed = kept;
    }
    for (auto& o : nested.settings.at("overrides").value) o["match"]["optional"] = true;
    return nested;
}

// The caller's data, from its first batch each time the nested run opens it.
class Borrowed final : public DataReader {
  public:
    explicit Borrowed(DataReader& data) : data_(data) { data_.rewind(); }
    std::optional<Batch> next() override { return data_.next(); }
    void rewind() override { data_.rewind(); }
    size_t items() const override { return data_.items(); }

  private:
    DataReader& data_;
};

}  // namespace

std::optional<NestedQuantization> quantize_nested(const Recipe& recipe, const NestedRun& run, const Model& model,
                                                  DataReader& data, const nlohmann::json& shared_inputs,
                                                  const nlohmann::json& shared_outputs) {
    // The nested run reads its model from a file, as a run does.
    TemporaryFile file{temporary_model_path()};
    try {
        save_model(model, file.path);
    } catch (const InputError& e) {
        throw InputError(fmt::format("it cannot stand as a model: {}", e.what()));
    }
    const auto nested = nested_recipe(recipe, file.path, model.graph(), shared_inputs, shared_outputs);
    if (!nested) return std::nullopt;
    RunOptions options;
    options.stop_after = Phase::Emit;
    options.calibration_reader = [&data](const Model&) { return std::make_unique<Borrowed>(data); };
    auto written = run(*nested, options);
    return NestedQuantization{std::move(written.quantized), std::move(written.report)};
}

}  // namespace vaiq::phases
