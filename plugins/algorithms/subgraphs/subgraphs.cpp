// The `subgraphs` algorithm (EnableSubgraph): the bodies of If, Loop and Scan
// nodes quantized with the run's own recipe.
//
// A body reads values of the graph around it by name. Each body becomes a
// model of its own: those values are its inputs (constants among them are its
// initializers, so weights defined outside are quantized too), its outputs are
// the body's. The float model runs over the calibration data once more,
// tapping what each node reads: an If's branch calibrates on the batches that
// took it; a Loop's or Scan's body on its iterations, which the float body
// replays from the node's inputs (every iteration of a batch up to 256, else
// 256 drawn uniformly from its run). The body model is quantized by a nested
// run of the same recipe (its own control flow in turn) and put back in place
// of the float body, with every name it added made unique in the whole model.
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <set>
#include <vaiq/vaiq.hpp>

#include "loop_iterations.hpp"
#include "scopes.hpp"

namespace vaiq::subgraphs {

namespace {

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

// A graph that runs inside a node of the run's model: a branch of an If, or the
// body a Loop or Scan runs once an iteration; and the batches it calibrates on.
struct Body {
    const onnx::NodeProto* node = nullptr;
    std::string key;        // the node's name, or its first output's when it has none
    std::string attribute;  // then_branch, else_branch or body
    const onnx::GraphProto* graph = nullptr;
    std::vector<std::string> inputs;                     // the outer values it reads that the run computes or is fed
    std::vector<std::string> constants;                  // the outer values it reads that are the model's initializers
    std::vector<std::map<std::string, size_t>> batches;  // its inputs, by name, in the spool
    // A Loop's or Scan's: per calibration batch, the node's inputs (nullopt where omitted)
    std::vector<std::vector<std::optional<size_t>>> node_inputs;
    size_t runs = 0;  // calibration batches that ran it

    bool iterates() const { return node->op_type() != "If"; }
};

std::string node_key(const onnx::NodeProto& node) { return node.name().empty() ? node.output(0) : node.name(); }

// An input with the recorded type and every dimension left open, so that no
// pass of the nested run folds a shape that other data would change.
onnx::ValueInfoProto open_input(const std::string& name, const Tensor& sample) {
    onnx::ValueInfoProto v;
    v.set_name(name);
    auto* type = v.mutable_type()->mutable_tensor_type();
    type->set_elem_type(static_cast<int>(sample.type()));
    auto* shape = type->mutable_shape();
    for (size_t d = 0; d < sample.shape().size(); ++d) shape->add_dim()->set_dim_param(fmt::format("{}_d{}", name, d));
    return v;
}

// An outer value as the model declares it; where it does not, open_input.
onnx::ValueInfoProto declared_input(const onnx::GraphProto& parent, const std::string& name, const Tensor& sample) {
    for (const auto* list : {&parent.input(), &parent.value_info(), &parent.output()})
        for (const auto& v : *list)
            if (v.name() == name && v.type().has_tensor_type() && v.type().tensor_type().elem_type() != 0) return v;
    return open_input(name, sample);
}

// A body may leave its outputs' types to its node; a model declares them:
// the element type and rank of a run on its first batch, every dimension open.
void declare_outputs(AlgorithmContext& c, Model& model, const Body& body, const TensorSpool& spool) {
    auto& outputs = *model.graph().mutable_output();
    const bool declared = std::all_of(outputs.begin(), outputs.end(), [](const onnx::ValueInfoProto& o) {
        return o.type().has_tensor_type() && o.type().tensor_type().has_shape();
    });
    if (declared) return;
    std::map<std::string, Tensor> feeds;
    for (const auto& [name, index] : body.batches.front()) feeds.emplace(name, spool.get(index));
    const auto values = c.runner(model)->run(feeds);
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

// The body as a model: its outer values are inputs or initializers.
Model body_model(AlgorithmContext& c, const Model& parent, const Body& body, TensorSpool& spool) {
    onnx::ModelProto proto;
    proto.set_ir_version(parent.proto().ir_version());
    *proto.mutable_opset_import() = parent.proto().opset_import();
    *proto.mutable_functions() = parent.proto().functions();
    auto& graph = *proto.mutable_graph();
    graph = *body.graph;
    graph.set_name(fmt::format("{}.{}", body.key, body.attribute));
    // A value info without a type says nothing, and the checker of a model refuses it.
    auto& infos = *graph.mutable_value_info();
    for (int i = infos.size() - 1; i >= 0; --i)
        if (infos[i].type().value_case() == onnx::TypeProto::VALUE_NOT_SET) infos.DeleteSubrange(i, 1);
    for (const auto& name : body.constants)
        for (const auto& init : parent.graph().initializer())
            if (init.name() == name) *graph.add_initializer() = init;
    const auto& first = body.batches.front();
    // A Loop's or Scan's own inputs: what the iterations were fed, every
    // dimension open (a loop-carried value may change shape as it goes).
    for (auto& input : *graph.mutable_input()) input = open_input(input.name(), spool.get(first.at(input.name())));
    for (const auto& name : body.inputs)
        *graph.add_input() = declared_input(parent.graph(), name, spool.get(first.at(name)));
    Model model(std::move(proto), parent.source());
    declare_outputs(c, model, body, spool);
    return model;
}

// Reads a body's recorded batches.
class RecordedReader final : public DataReader {
  public:
    RecordedReader(const Body& body, const TensorSpool& spool) : body_(body), spool_(spool) {}
    std::optional<Batch> next() override {
        if (at_ >= body_.batches.size()) return std::nullopt;
        Batch batch;
        for (const auto& [name, index] : body_.batches[at_]) batch.feeds.emplace(name, spool_.get(index));
        batch.source = fmt::format("{} (its calibration batch {})", body_.graph->name(), at_);
        ++at_;
        return batch;
    }
    void rewind() override { at_ = 0; }
    size_t items() const override { return body_.batches.size(); }

  private:
    const Body& body_;
    const TensorSpool& spool_;
    size_t at_ = 0;
};

// Runs the float model over the calibration data, keeping what each body
// reads on the batches that run it: where an If takes the branch, and every
// batch for a Loop's or Scan's body, with the node's own inputs.
void record(AlgorithmContext& c, std::vector<Body>& bodies, TensorSpool& spool) {
    std::set<std::string> wanted;
    for (const auto& b : bodies) {
        wanted.insert(b.inputs.begin(), b.inputs.end());
        for (const auto& name : b.node->input())
            if (!name.empty()) wanted.insert(name);
    }
    const std::vector<std::string> taps(wanted.begin(), wanted.end());
    const auto runner = c.runner(c.model());
    auto& data = c.data();
    data.rewind();
    while (auto batch = data.next()) {
        std::map<std::string, size_t> stored;
        runner->run_taps(*batch, taps,
                         [&](const std::string& name, const Tensor& value) { stored[name] = spool.put(value); });
        for (auto& b : bodies) {
            if (!b.iterates()) {
                const auto at = stored.find(b.node->input(0));
                if (at == stored.end()) continue;
                const auto condition = spool.get(at->second);
                if (condition.type() != DataType::Bool || condition.size() != 1) continue;
                if ((condition.bytes()[0] != std::byte{0}) != (b.attribute == "then_branch")) continue;
            }
            std::map<std::string, size_t> feeds;
            for (const auto& name : b.inputs)
                if (const auto it = stored.find(name); it != stored.end()) feeds[name] = it->second;
            if (feeds.size() != b.inputs.size()) continue;
            if (b.iterates()) {
                std::vector<std::optional<size_t>> in;
                for (const auto& name : b.node->input()) {
                    const auto it = stored.find(name);
                    if (!name.empty() && it == stored.end()) break;  // not seen: this batch does not count
                    in.push_back(name.empty() ? std::nullopt : std::optional(it->second));
                }
                if (in.size() != static_cast<size_t>(b.node->input_size())) continue;
                b.node_inputs.push_back(std::move(in));
            }
            b.batches.push_back(std::move(feeds));
        }
    }
    for (auto& b : bodies) b.runs = b.batches.size();
}

// Replaces a Loop's or Scan's recorded batches by its iterations': the float
// body runs them (the model it returns, built on the first one's types).
Model record_iterations(AlgorithmContext& c, Body& b, TensorSpool& spool) {
    const Model& parent = c.model();
    const auto outer = std::move(b.batches);
    b.batches.clear();
    std::optional<Model> model;
    std::unique_ptr<ModelRunner> runner;
    for (size_t k = 0; k < outer.size(); ++k) {
        std::vector<std::optional<Tensor>> in;
        for (const auto& index : b.node_inputs[k])
            in.push_back(index ? std::optional(spool.get(*index)) : std::nullopt);
        IterationSample<std::map<std::string, size_t>> sample;
        iterate(*b.node, parent.opset(), *b.graph, in, [&](int64_t i, std::map<std::string, Tensor> feeds) {
            sample.offer(
                i,
                [&] {
                    auto kept = outer[k];
                    for (const auto& [name, value] : feeds) kept[name] = spool.put(value);
                    return kept;
                },
                [&](const std::map<std::string, size_t>& replaced) {  // its own values, not the shared outer ones
                    for (const auto& [name, index] : replaced)
                        if (!outer[k].count(name)) spool.drop(index);
                });
            if (!model) {  // the body as a model, typed by its first iteration (always kept)
                b.batches = {sample.first()};
                model = body_model(c, parent, b, spool);
                b.batches.clear();
                runner = c.runner(*model);
            }
            for (const auto& [name, index] : outer[k]) feeds.emplace(name, spool.get(index));
            return runner->run(feeds);
        });
        for (auto& kept : sample.take()) b.batches.push_back(std::move(kept));
    }
    if (!model) throw InputError("no calibration batch ran an iteration");
    return std::move(*model);
}

// Makes the names the quantized body added unique in the whole model, and
// removes what became outer values again: the inputs it was given for them
// (a Loop's or Scan's own inputs stay, as declared), and copies of the model's
// initializers it left as they were.
void fit_into(onnx::GraphProto& quantized, const Body& body, const Model& parent, std::set<std::string>& taken) {
    *quantized.mutable_input() = body.graph->input();
    std::map<std::string, const onnx::TensorProto*> outer;
    for (const auto& init : parent.graph().initializer()) outer[init.name()] = &init;
    std::set<std::string> original;
    collect_names(*body.graph, original);
    std::map<std::string, std::string> renames;
    auto& inits = *quantized.mutable_initializer();
    for (int i = inits.size() - 1; i >= 0; --i) {
        const auto it = outer.find(inits[i].name());
        if (it == outer.end()) continue;
        if (inits[i].SerializeAsString() == it->second->SerializeAsString())
            inits.DeleteSubrange(i, 1);
        else  // changed in place (a weight stored rounded): the body's own, under a name of its own
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
    // Shapes the nested run inferred hold for its data only: the body keeps the value infos it had.
    std::set<std::string> present;
    collect_defined(quantized, present);
    quantized.clear_value_info();
    for (const auto& v : body.graph->value_info())
        if (present.count(v.name())) *quantized.add_value_info() = v;
}

// Takes the domains the quantized body imports into the model; false when an
// opset differs.
bool merge_opsets(Model& model, const Model& body, std::string& why) {
    for (const auto& o : body.proto().opset_import()) {
        const std::string domain = o.domain() == "ai.onnx" ? "" : o.domain();
        const int64_t have = model.opset(domain);
        if (have == 0) {
            auto* added = model.proto().add_opset_import();
            added->set_domain(domain);
            added->set_version(o.version());
        } else if (have != o.version()) {
            why = fmt::format("the quantized body needs opset {} of '{}', the model has {}", o.version(),
                              domain.empty() ? "ai.onnx" : domain, have);
            return false;
        }
    }
    return true;
}

onnx::NodeProto* find_node(Model& model, const onnx::NodeProto& original) {
    for (auto& node : *model.graph().mutable_node())
        if (node.op_type() == original.op_type() && node_key(node) == node_key(original)) return &node;
    return nullptr;
}

onnx::GraphProto* body_attribute(onnx::NodeProto& node, const std::string& name) {
    for (auto& attr : *node.mutable_attribute())
        if (attr.name() == name && attr.has_g()) return attr.mutable_g();
    return nullptr;
}

// The enclosing plan's parameters of the values a body shares with it, as
// input_ and output_quantization_params of the body's run: the outer values it
// reads, and its outputs that are the node's own (an If's outputs; a Loop's or
// Scan's scanned outputs, which hold every iteration's), where the enclosing
// plan quantizes them per tensor to integers.
std::pair<nlohmann::json, nlohmann::json> shared_params(const QuantPlan& plan, const Body& b) {
    auto params = [&](const std::string& name) -> std::optional<nlohmann::json> {
        const auto* t = plan.find(name);
        if (!t || t->role != TensorRole::Activation || !is_integer(t->spec.type) || t->params.scale.size() != 1 ||
            t->params.zero_point.size() != 1)
            return std::nullopt;
        return nlohmann::json::array({t->params.zero_point[0], t->params.scale[0]});
    };
    auto inputs = nlohmann::json::object(), outputs = nlohmann::json::object();
    for (const auto& name : b.inputs)
        if (auto p = params(name)) inputs[name] = *p;
    const auto& node = *b.node;
    // The node's first output that a body output is, and that body output.
    int from = 0, offset = 0;
    if (node.op_type() == "Loop") {
        from = node.input_size() - 2;  // after the loop-carried values' last ones
        offset = 1;                    // the body's condition comes first
    } else if (node.op_type() == "Scan") {
        from = node.input_size() - static_cast<int>(int_attribute(node, "num_scan_inputs", 0));
    }
    for (int j = std::max(from, 0); j < node.output_size() && j + offset < b.graph->output_size(); ++j)
        if (auto p = params(node.output(j))) outputs[b.graph->output(j + offset).name()] = *p;
    return {inputs, outputs};
}

}  // namespace

namespace {

// Quantizes the If, Loop and Scan bodies of the prepared float model into the
// written one, and says in `out` what it did with each.
void quantize_bodies(AlgorithmContext& c, nlohmann::json& out) {
    const Model& model = c.model();
    std::set<std::string> initializers;
    for (const auto& init : model.graph().initializer()) initializers.insert(init.name());
    std::vector<Body> bodies;
    for (const auto& node : model.graph().node()) {
        const bool control_flow =
            is_default_domain(node) && (node.op_type() == "If" || node.op_type() == "Loop" || node.op_type() == "Scan");
        for (const auto& attr : node.attribute()) {
            if (!attr.has_g() && attr.graphs_size() == 0) continue;
            if (!control_flow || !attr.has_g()) {
                log_info("EnableSubgraph: the {} of {} '{}' stays float: only If, Loop and Scan bodies are quantized",
                         attr.name(), node.op_type(), node_key(node));
                out.push_back({{"node", node_key(node)},
                               {"op_type", node.op_type()},
                               {"branch", attr.name()},
                               {"quantized", false},
                               {"why", "only If, Loop and Scan bodies are quantized"}});
                continue;
            }
            Body b{&node, node_key(node), attr.name(), &attr.g(), {}, {}, {}, {}, 0};
            for (const auto& name : outer_references(attr.g()))
                (initializers.count(name) ? b.constants : b.inputs).push_back(name);
            bodies.push_back(std::move(b));
        }
    }
    if (bodies.empty()) return;
    if (!c.has_data()) {
        log_warn(
            "EnableSubgraph: the If, Loop and Scan bodies stay float: they calibrate on data, and this run has "
            "statistics files only");
        for (const auto& b : bodies)
            out.push_back({{"node", b.key},
                           {"op_type", b.node->op_type()},
                           {"branch", b.attribute},
                           {"quantized", false},
                           {"why", "no calibration data (statistics files only)"}});
        return;
    }
    TensorSpool spool;
    record(c, bodies, spool);
    Model& quantized = c.written();
    std::set<std::string> taken;
    collect_names(quantized.graph(), taken);
    for (auto& b : bodies) {
        nlohmann::json entry = {
            {"node", b.key}, {"op_type", b.node->op_type()}, {"branch", b.attribute}, {"batches", b.runs}};
        auto leave_float = [&](const std::string& why) {
            log_info("EnableSubgraph: {} of '{}' stays float: {}", b.attribute, b.key, why);
            entry["quantized"] = false;
            entry["why"] = why;
            out.push_back(entry);
        };
        if (b.batches.empty()) {
            leave_float(b.iterates() ? "no calibration batch ran it" : "no calibration batch took it");
            continue;
        }
        std::optional<Model> body;
        try {
            body = b.iterates() ? record_iterations(c, b, spool) : body_model(c, model, b, spool);
        } catch (const InputError& e) {
            leave_float(fmt::format("it cannot stand as a model: {}", e.what()));
            continue;
        }
        if (b.iterates()) entry["iterations"] = b.batches.size();
        if (b.iterates())
            log_info("EnableSubgraph: quantizing the body of {} '{}' on {} of its iterations over {} batches",
                     b.node->op_type(), b.key, b.batches.size(), b.runs);
        else
            log_info("EnableSubgraph: quantizing {} of '{}' on the {} batches that took it", b.attribute, b.key,
                     b.batches.size());
        const auto shared = shared_params(c.plan(), b);
        std::optional<NestedQuantization> run;
        try {
            RecordedReader data(b, spool);
            run = c.quantize_nested(*body, data, shared.first, shared.second);
        } catch (const InputError& e) {
            leave_float(e.what());
            continue;
        }
        if (!run) {
            leave_float("nodes_to_quantize names none of its nodes");
            continue;
        }
        std::string why;
        onnx::NodeProto* node = find_node(quantized, *b.node);
        onnx::GraphProto* target = node ? body_attribute(*node, b.attribute) : nullptr;
        if (!target) {
            leave_float("the written model no longer has the node");
            continue;
        }
        if (run->quantized.opset() != quantized.opset() || !merge_opsets(quantized, run->quantized, why)) {
            leave_float(why.empty() ? fmt::format("its run converted it to opset {}", run->quantized.opset()) : why);
            continue;
        }
        auto graph = std::move(run->quantized.graph());
        fit_into(graph, b, model, taken);
        graph.set_name(target->name());
        *target = std::move(graph);
        entry["quantized"] = true;
        entry["quantized_tensors"] = run->report["model"].value("quantized_tensors", 0);
        if (!shared.first.empty() || !shared.second.empty()) {
            std::vector<std::string> names;
            for (const auto* given : {&shared.first, &shared.second})
                for (const auto& [tensor, p] : given->items()) names.push_back(tensor);
            entry["shared_parameters"] = names;
        }
        entry["nodes_after"] = target->node_size();
        if (!run->report.value("subgraphs", nlohmann::json::array()).empty())
            entry["subgraphs"] = run->report["subgraphs"];
        out.push_back(entry);
    }
    // The weights the quantized bodies now hold themselves are no longer read where they were defined.
    std::set<std::string> constants, read;
    for (const auto& b : bodies) constants.insert(b.constants.begin(), b.constants.end());
    collect_read(quantized.graph(), read);
    auto& inits = *quantized.graph().mutable_initializer();
    for (int i = inits.size() - 1; i >= 0; --i)
        if (constants.count(inits[i].name()) && !read.count(inits[i].name())) inits.DeleteSubrange(i, 1);
}

class Subgraphs final : public Algorithm {
  public:
    AlgorithmStage stage() const override { return AlgorithmStage::Written; }
    void run(AlgorithmContext& context) override {
        auto out = nlohmann::json::array();
        quantize_bodies(context, out);
        context.report(std::move(out));
    }
};

}  // namespace

}  // namespace vaiq::subgraphs

VAIQ_PLUGINS(
    vaiq::enabled_by(vaiq::describe<vaiq::subgraphs::Subgraphs>(
                         "subgraphs", "1.0.0",
                         "EnableSubgraph: the bodies of If, Loop and Scan nodes quantized by nested runs of the "
                         "recipe, each calibrated on the batches or iterations that run it"),
                     "extra_options.EnableSubgraph"))
