#include "pipeline/subgraphs.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <optional>
#include <set>

#include "runtime/executor.hpp"
#include "sdk/text.hpp"
#include "util/spool.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/log.hpp"

namespace fs = std::filesystem;

namespace vaiq::phases {

namespace {

// Every value a graph and the graphs inside it define.
void collect_defined(const onnx::GraphProto& graph, std::set<std::string>& defined) {
    for (const auto& i : graph.input()) defined.insert(i.name());
    for (const auto& i : graph.initializer()) defined.insert(i.name());
    for (const auto& i : graph.sparse_initializer()) defined.insert(i.values().name());
    for (const auto& node : graph.node())
        for (const auto& o : node.output())
            if (!o.empty()) defined.insert(o);
    for_each_subgraph(graph, [&](const onnx::GraphProto& g) { collect_defined(g, defined); });
}

void collect_read(const onnx::GraphProto& graph, std::set<std::string>& read) {
    for (const auto& node : graph.node())
        for (const auto& i : node.input())
            if (!i.empty()) read.insert(i);
    for (const auto& o : graph.output()) read.insert(o.name());
    for_each_subgraph(graph, [&](const onnx::GraphProto& g) { collect_read(g, read); });
}

// Every name a graph and the graphs inside it use, node names included.
void collect_names(const onnx::GraphProto& graph, std::set<std::string>& names) {
    collect_defined(graph, names);
    collect_read(graph, names);
    for (const auto& v : graph.value_info()) names.insert(v.name());
    for (const auto& node : graph.node()) names.insert(node.name());
    for_each_subgraph(graph, [&](const onnx::GraphProto& g) { collect_names(g, names); });
}

void rename_values(onnx::GraphProto& graph, const std::map<std::string, std::string>& renames) {
    auto rename = [&](std::string* name) {
        if (const auto it = renames.find(*name); it != renames.end()) *name = it->second;
    };
    for (auto& i : *graph.mutable_input()) rename(i.mutable_name());
    for (auto& o : *graph.mutable_output()) rename(o.mutable_name());
    for (auto& v : *graph.mutable_value_info()) rename(v.mutable_name());
    for (auto& i : *graph.mutable_initializer()) rename(i.mutable_name());
    for (auto& node : *graph.mutable_node()) {
        rename(node.mutable_name());
        for (auto& i : *node.mutable_input()) rename(&i);
        for (auto& o : *node.mutable_output()) rename(&o);
    }
    for_each_subgraph(graph, [&](onnx::GraphProto& g) { rename_values(g, renames); });
}

// One branch of an If node of the run's model, and the batches that took it.
struct Branch {
    std::string node;       // the If node's name, or its first output's when it has none
    std::string attribute;  // then_branch or else_branch
    std::string condition;
    bool taken_when = true;
    const onnx::GraphProto* graph = nullptr;
    std::vector<std::string> inputs;                     // the outer values it reads that the run computes or is fed
    std::vector<std::string> constants;                  // the outer values it reads that are the model's initializers
    std::vector<std::map<std::string, size_t>> batches;  // its inputs, by name, in the spool
};

std::string node_key(const onnx::NodeProto& node) { return node.name().empty() ? node.output(0) : node.name(); }

// A branch's inputs as the model declares them; where it does not, the
// recorded type with every dimension left open, so that no pass of the
// nested run folds a shape that other data would change.
onnx::ValueInfoProto declared_input(const onnx::GraphProto& parent, const std::string& name, const Tensor& sample) {
    for (const auto* list : {&parent.input(), &parent.value_info(), &parent.output()})
        for (const auto& v : *list)
            if (v.name() == name && v.type().has_tensor_type() && v.type().tensor_type().elem_type() != 0) return v;
    onnx::ValueInfoProto v;
    v.set_name(name);
    auto* type = v.mutable_type()->mutable_tensor_type();
    type->set_elem_type(static_cast<int>(sample.type()));
    auto* shape = type->mutable_shape();
    for (size_t d = 0; d < sample.shape().size(); ++d) shape->add_dim()->set_dim_param(fmt::format("{}_d{}", name, d));
    return v;
}

// A branch may leave its outputs' types to the If; a model declares them:
// the element type and rank of a run on its first batch, every dimension open.
void declare_outputs(Model& model, const Branch& branch, const TensorSpool& spool) {
    auto& outputs = *model.graph().mutable_output();
    const bool declared = std::all_of(outputs.begin(), outputs.end(), [](const onnx::ValueInfoProto& o) {
        return o.type().has_tensor_type() && o.type().tensor_type().has_shape();
    });
    if (declared) return;
    std::map<std::string, Tensor> feeds;
    for (const auto& [name, index] : branch.batches.front()) feeds.emplace(name, spool.get(index));
    runtime::Executor executor(model, {.threads = 1});
    const auto values = executor.run(feeds);
    for (int i = 0; i < outputs.size(); ++i) {
        auto& o = outputs[i];
        if (o.type().has_tensor_type() && o.type().tensor_type().has_shape()) continue;
        auto* type = o.mutable_type()->mutable_tensor_type();
        type->set_elem_type(static_cast<int>(values[i].type()));
        auto* shape = type->mutable_shape();
        for (size_t d = 0; d < values[i].shape().size(); ++d)
            shape->add_dim()->set_dim_param(fmt::format("{}_d{}", o.name(), d));
    }
}

// The branch as a model: its outer values are inputs or initializers.
Model branch_model(const Model& parent, const Branch& branch, TensorSpool& spool) {
    onnx::ModelProto proto;
    proto.set_ir_version(parent.proto().ir_version());
    *proto.mutable_opset_import() = parent.proto().opset_import();
    *proto.mutable_functions() = parent.proto().functions();
    auto& graph = *proto.mutable_graph();
    graph = *branch.graph;
    graph.set_name(fmt::format("{}.{}", branch.node, branch.attribute));
    // A value info without a type says nothing, and the checker of a model refuses it.
    auto& infos = *graph.mutable_value_info();
    for (int i = infos.size() - 1; i >= 0; --i)
        if (infos[i].type().value_case() == onnx::TypeProto::VALUE_NOT_SET) infos.DeleteSubrange(i, 1);
    for (const auto& name : branch.constants)
        for (const auto& init : parent.graph().initializer())
            if (init.name() == name) *graph.add_initializer() = init;
    const auto& first = branch.batches.front();
    for (const auto& name : branch.inputs)
        *graph.add_input() = declared_input(parent.graph(), name, spool.get(first.at(name)));
    Model model(std::move(proto), parent.source());
    declare_outputs(model, branch, spool);
    return model;
}

// Reads a branch's recorded batches.
class RecordedReader final : public DataReader {
  public:
    RecordedReader(const Branch& branch, const TensorSpool& spool) : branch_(branch), spool_(spool) {}
    std::optional<Batch> next() override {
        if (at_ >= branch_.batches.size()) return std::nullopt;
        Batch batch;
        for (const auto& [name, index] : branch_.batches[at_]) batch.feeds.emplace(name, spool_.get(index));
        batch.source = fmt::format("{} (batch {} of the calibration data that took it)", branch_.graph->name(), at_);
        ++at_;
        return batch;
    }
    void rewind() override { at_ = 0; }
    size_t items() const override { return branch_.batches.size(); }

  private:
    const Branch& branch_;
    const TensorSpool& spool_;
    size_t at_ = 0;
};

// Runs the float model over the calibration data, keeping what each branch
// reads on the batches where its If takes it.
void record(RunState& s, std::vector<Branch>& branches, TensorSpool& spool) {
    std::set<std::string> wanted;
    for (const auto& b : branches) {
        wanted.insert(b.inputs.begin(), b.inputs.end());
        wanted.insert(b.condition);
    }
    const std::vector<std::string> taps(wanted.begin(), wanted.end());
    runtime::Executor executor(s.model, {.threads = s.threads});
    const auto reader = calibration_reader(s.settings, s.options, s.model);
    while (auto batch = reader->next()) {
        std::map<std::string, size_t> stored;
        std::map<std::string, bool> conditions;
        executor.run_taps(batch->feeds, taps, [&](const std::string& name, const Tensor& value) {
            stored[name] = spool.put(value);
            if (value.type() == DataType::Bool && value.size() == 1)
                conditions[name] = value.bytes()[0] != std::byte{0};
        });
        for (auto& b : branches) {
            const auto c = conditions.find(b.condition);
            if (c == conditions.end() || c->second != b.taken_when) continue;
            std::map<std::string, size_t> feeds;
            for (const auto& name : b.inputs)
                if (const auto it = stored.find(name); it != stored.end()) feeds[name] = it->second;
            if (feeds.size() == b.inputs.size()) b.batches.push_back(std::move(feeds));
        }
    }
}

// Makes the names the quantized branch added unique in the whole model, and
// removes what became outer values again: its inputs, and copies of the
// model's initializers it left as they were.
void fit_into(onnx::GraphProto& quantized, const Branch& branch, const Model& parent, std::set<std::string>& taken) {
    quantized.clear_input();
    std::map<std::string, const onnx::TensorProto*> outer;
    for (const auto& init : parent.graph().initializer()) outer[init.name()] = &init;
    std::set<std::string> original;
    collect_names(*branch.graph, original);
    std::map<std::string, std::string> renames;
    auto& inits = *quantized.mutable_initializer();
    for (int i = inits.size() - 1; i >= 0; --i) {
        const auto it = outer.find(inits[i].name());
        if (it == outer.end()) continue;
        if (inits[i].SerializeAsString() == it->second->SerializeAsString())
            inits.DeleteSubrange(i, 1);
        else  // changed in place (a weight stored rounded): the branch's own, under a name of its own
            renames[inits[i].name()] = "";
    }
    std::set<std::string> added;
    collect_names(quantized, added);
    for (const auto& name : added)
        if (!original.count(name) && taken.count(name)) renames[name] = "";
    for (auto& [from, to] : renames) {
        to = from;
        for (int k = 1; taken.count(to) || added.count(to); ++k) to = fmt::format("{}_{}", from, k);
        taken.insert(to);
    }
    rename_values(quantized, renames);
    collect_names(quantized, taken);
    // Shapes the nested run inferred hold for its data only: the branch keeps the value infos it had.
    std::set<std::string> present;
    collect_defined(quantized, present);
    quantized.clear_value_info();
    for (const auto& v : branch.graph->value_info())
        if (present.count(v.name())) *quantized.add_value_info() = v;
}

// Takes the domains the quantized branch imports into the model; false when an
// opset differs.
bool merge_opsets(Model& model, const Model& branch, std::string& why) {
    for (const auto& o : branch.proto().opset_import()) {
        const std::string domain = o.domain() == "ai.onnx" ? "" : o.domain();
        const int64_t have = model.opset(domain);
        if (have == 0) {
            auto* added = model.proto().add_opset_import();
            added->set_domain(domain);
            added->set_version(o.version());
        } else if (have != o.version()) {
            why = fmt::format("the quantized branch needs opset {} of '{}', the model has {}", o.version(),
                              domain.empty() ? "ai.onnx" : domain, have);
            return false;
        }
    }
    return true;
}

onnx::NodeProto* find_node(Model& model, const std::string& key) {
    for (auto& node : *model.graph().mutable_node())
        if (node.op_type() == "If" && node_key(node) == key) return &node;
    return nullptr;
}

onnx::GraphProto* branch_attribute(onnx::NodeProto& node, const std::string& name) {
    for (auto& attr : *node.mutable_attribute())
        if (attr.name() == name && attr.has_g()) return attr.mutable_g();
    return nullptr;
}

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
    return fs::temp_directory_path() / fmt::format("vaiq-branch-{}-{}.onnx", getpid(), counter++);
}

void collect_node_names(const onnx::GraphProto& graph, std::set<std::string>& names) {
    for (const auto& node : graph.node()) names.insert(node.name());
    for_each_subgraph(graph, [&](const onnx::GraphProto& g) { collect_node_names(g, names); });
}

// The recipe for a branch: the run's, reading the branch model and the data
// given to it, writing nothing. Its node lists keep the nodes the branch has
// (the run checked them against the whole model); nullopt when
// nodes_to_quantize names none of them.
std::optional<Recipe> branch_recipe(const Recipe& recipe, const fs::path& model, const onnx::GraphProto& branch) {
    Recipe nested = recipe;
    nested.settings["model_input"] = {model.string(), "a branch of the model"};
    for (const char* key : {"model_output", "report", "calibration_data_reader", "evaluation_data", "evaluation_labels",
                            "dump_output_dir"})
        nested.settings[key] = {nullptr, "default"};
    std::set<std::string> nodes;
    collect_node_names(branch, nodes);
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

}  // namespace

std::vector<std::string> outer_references(const onnx::GraphProto& graph) {
    std::set<std::string> defined, read;
    collect_defined(graph, defined);
    collect_read(graph, read);
    std::vector<std::string> out;
    for (const auto& name : read)
        if (!defined.count(name)) out.push_back(name);
    return out;
}

void quantize_subgraphs(RunState& s, const NestedRun& nested) {
    auto& out = s.report["subgraphs"] = nlohmann::json::array();
    std::set<std::string> initializers;
    for (const auto& init : s.model.graph().initializer()) initializers.insert(init.name());
    std::vector<Branch> branches;
    for (const auto& node : s.model.graph().node()) {
        bool has_body = false;
        for (const auto& attr : node.attribute()) has_body = has_body || attr.has_g() || attr.graphs_size() > 0;
        if (!has_body) continue;
        if (node.op_type() != "If") {
            log_info("EnableSubgraph: the body of {} '{}' stays float (a Loop's or Scan's body is not quantized yet)",
                     node.op_type(), node_key(node));
            out.push_back({{"node", node_key(node)},
                           {"op_type", node.op_type()},
                           {"quantized", false},
                           {"why", "Loop and Scan bodies are not quantized yet"}});
            continue;
        }
        for (const auto& attr : node.attribute()) {
            if (!attr.has_g()) continue;
            Branch b{node_key(node), attr.name(), node.input(0), attr.name() == "then_branch", &attr.g(), {}, {}, {}};
            for (const auto& name : outer_references(attr.g()))
                (initializers.count(name) ? b.constants : b.inputs).push_back(name);
            branches.push_back(std::move(b));
        }
    }
    if (branches.empty()) return;
    if (!has_calibration_data(s.settings, s.options) && !s.options.calibration_files.empty()) {
        log_warn(
            "EnableSubgraph: the If branches stay float: they calibrate on data, and this run has statistics "
            "files only");
        for (const auto& b : branches)
            out.push_back({{"node", b.node},
                           {"branch", b.attribute},
                           {"quantized", false},
                           {"why", "no calibration data (statistics files only)"}});
        return;
    }
    TensorSpool spool;
    record(s, branches, spool);
    std::set<std::string> taken;
    collect_names(s.quantized.graph(), taken);
    for (const auto& b : branches) {
        nlohmann::json entry = {{"node", b.node}, {"branch", b.attribute}, {"batches", b.batches.size()}};
        auto leave_float = [&](const std::string& why) {
            log_info("EnableSubgraph: {} of '{}' stays float: {}", b.attribute, b.node, why);
            entry["quantized"] = false;
            entry["why"] = why;
            out.push_back(entry);
        };
        if (b.batches.empty()) {
            leave_float("no calibration batch took it");
            continue;
        }
        TemporaryFile file{temporary_model_path()};
        try {
            save_model(branch_model(s.model, b, spool), file.path);
        } catch (const InputError& e) {
            leave_float(fmt::format("it cannot stand as a model: {}", e.what()));
            continue;
        }
        RunOptions options;
        options.stop_after = Phase::Emit;
        options.calibration_reader = [&](const Model&) { return std::make_unique<RecordedReader>(b, spool); };
        log_info("EnableSubgraph: quantizing {} of '{}' on the {} batches that took it", b.attribute, b.node,
                 b.batches.size());
        const auto recipe = branch_recipe(s.recipe, file.path, *b.graph);
        if (!recipe) {
            leave_float("nodes_to_quantize names none of its nodes");
            continue;
        }
        QuantizedRun run;
        try {
            run = nested(*recipe, options);
        } catch (const InputError& e) {
            leave_float(e.what());
            continue;
        }
        std::string why;
        onnx::NodeProto* node = find_node(s.quantized, b.node);
        onnx::GraphProto* target = node ? branch_attribute(*node, b.attribute) : nullptr;
        if (!target) {
            leave_float("the written model no longer has the node");
            continue;
        }
        if (run.quantized.opset() != s.quantized.opset() || !merge_opsets(s.quantized, run.quantized, why)) {
            leave_float(why.empty() ? fmt::format("its run converted it to opset {}", run.quantized.opset()) : why);
            continue;
        }
        auto graph = std::move(run.quantized.graph());
        fit_into(graph, b, s.model, taken);
        graph.set_name(target->name());
        *target = std::move(graph);
        entry["quantized"] = true;
        entry["quantized_tensors"] = run.report["model"].value("quantized_tensors", 0);
        entry["nodes_after"] = target->node_size();
        if (!run.report.value("subgraphs", nlohmann::json::array()).empty())
            entry["subgraphs"] = run.report["subgraphs"];
        out.push_back(entry);
    }
    // The weights the quantized branches now hold themselves are no longer read where they were defined.
    std::set<std::string> constants, read;
    for (const auto& b : branches) constants.insert(b.constants.begin(), b.constants.end());
    collect_read(s.quantized.graph(), read);
    auto& inits = *s.quantized.graph().mutable_initializer();
    for (int i = inits.size() - 1; i >= 0; --i)
        if (constants.count(inits[i].name()) && !read.count(inits[i].name())) inits.DeleteSubrange(i, 1);
}

}  // namespace vaiq::phases
