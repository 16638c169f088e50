#include "vaiq/graph.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <queue>

#include "vaiq/error.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {

namespace {
const std::vector<Use> kNoUses;

// Names a subgraph reads from its enclosing scope (If/Loop/Scan bodies):
// they count as uses of the outer tensors. What a nested subgraph reads
// counts only where this graph does not define it (a branch's own values
// read by an If inside the branch stay the branch's).
void collect_outer_reads(const onnx::GraphProto& graph, std::unordered_set<std::string>& reads) {
    std::unordered_set<std::string> local;
    for (const auto& i : graph.input()) local.insert(i.name());
    for (const auto& i : graph.initializer()) local.insert(i.name());
    for (const auto& node : graph.node())
        for (const auto& out : node.output()) local.insert(out);
    auto outer = [&](const std::string& name) {
        if (!name.empty() && !local.count(name)) reads.insert(name);
    };
    for (const auto& node : graph.node()) {
        for (const auto& in : node.input()) outer(in);
        std::unordered_set<std::string> nested;
        for_each_subgraph(node, [&](const onnx::GraphProto& g) { collect_outer_reads(g, nested); });
        for (const auto& name : nested) outer(name);
    }
    for (const auto& o : graph.output()) outer(o.name());
}

std::unordered_set<std::string> subgraph_reads(const onnx::NodeProto& node) {
    std::unordered_set<std::string> reads;
    for_each_subgraph(node, [&](const onnx::GraphProto& g) { collect_outer_reads(g, reads); });
    return reads;
}
}  // namespace

const onnx::AttributeProto* find_attribute(const onnx::NodeProto& node, std::string_view name) {
    for (const auto& a : node.attribute())
        if (a.name() == name) return &a;
    return nullptr;
}

std::string node_label(const onnx::NodeProto& node) {
    return node.name().empty() && node.output_size() > 0 ? node.output(0) : node.name();
}

std::string describe_node(const onnx::NodeProto& node) {
    return fmt::format("{} '{}'", node.op_type(), node_label(node));
}

int64_t int_attribute(const onnx::NodeProto& node, std::string_view name, int64_t fallback) {
    const auto* a = find_attribute(node, name);
    return a ? a->i() : fallback;
}

float float_attribute(const onnx::NodeProto& node, std::string_view name, float fallback) {
    const auto* a = find_attribute(node, name);
    return a ? a->f() : fallback;
}

std::optional<std::vector<int64_t>> ints_attribute(const onnx::NodeProto& node, std::string_view name) {
    const auto* a = find_attribute(node, name);
    if (!a) return std::nullopt;
    return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}

std::vector<std::string> outer_scope_reads(const onnx::NodeProto& node) {
    const auto reads = subgraph_reads(node);
    std::vector<std::string> out(reads.begin(), reads.end());
    std::sort(out.begin(), out.end());
    return out;
}

GraphIndex::GraphIndex(const Model& model) : GraphIndex(model.graph()) { model_ = &model; }

bool GraphIndex::marked(const onnx::NodeProto& node, std::string_view mark) const {
    return model_ != nullptr && model_->marked(node, mark);
}

GraphIndex::GraphIndex(const onnx::GraphProto& graph) {
    for (int n = 0; n < graph.node_size(); ++n) {
        const auto& node = graph.node(n);
        for (const auto& out : node.output())
            if (!out.empty()) producer_[out] = n;
        for (int s = 0; s < node.input_size(); ++s)
            if (!node.input(s).empty()) consumers_[node.input(s)].push_back({n, s});
        // A subgraph's reads of outer tensors count as uses (slot -1).
        for (const auto& name : subgraph_reads(node)) consumers_[name].push_back({n, -1});
    }
    for (const auto& init : graph.initializer()) initializers_[init.name()] = &init;
    for (const auto& in : graph.input()) inputs_.insert(in.name());
    for (const auto& out : graph.output()) outputs_.insert(out.name());
}

int GraphIndex::producer(std::string_view tensor) const {
    auto it = producer_.find(std::string(tensor));
    return it == producer_.end() ? -1 : it->second;
}

const std::vector<Use>& GraphIndex::consumers(std::string_view tensor) const {
    auto it = consumers_.find(std::string(tensor));
    return it == consumers_.end() ? kNoUses : it->second;
}

const onnx::TensorProto* GraphIndex::initializer(std::string_view tensor) const {
    auto it = initializers_.find(std::string(tensor));
    return it == initializers_.end() ? nullptr : it->second;
}

bool GraphIndex::is_graph_input(std::string_view tensor) const { return inputs_.count(std::string(tensor)) > 0; }

bool GraphIndex::is_graph_output(std::string_view tensor) const { return outputs_.count(std::string(tensor)) > 0; }

std::vector<int> topological_order(const onnx::GraphProto& graph) {
    const int count = graph.node_size();
    std::unordered_map<std::string, int> producer;
    for (int n = 0; n < count; ++n)
        for (const auto& out : graph.node(n).output())
            if (!out.empty()) producer[out] = n;

    std::vector<int> pending(count, 0);
    std::vector<std::vector<int>> dependents(count);
    for (int n = 0; n < count; ++n) {
        std::unordered_set<int> deps;
        const auto& node = graph.node(n);
        for (const auto& in : node.input())
            if (auto it = producer.find(in); it != producer.end()) deps.insert(it->second);
        for (const auto& name : subgraph_reads(node))
            if (auto it = producer.find(name); it != producer.end()) deps.insert(it->second);
        deps.erase(n);
        pending[n] = static_cast<int>(deps.size());
        for (int d : deps) dependents[d].push_back(n);
    }
    // Lowest index first keeps the original order where it is already valid.
    std::priority_queue<int, std::vector<int>, std::greater<>> ready;
    for (int n = 0; n < count; ++n)
        if (pending[n] == 0) ready.push(n);
    std::vector<int> order;
    order.reserve(count);
    while (!ready.empty()) {
        int n = ready.top();
        ready.pop();
        order.push_back(n);
        for (int d : dependents[n])
            if (--pending[d] == 0) ready.push(d);
    }
    if (static_cast<int>(order.size()) != count) {
        for (int n = 0; n < count; ++n)
            if (pending[n] > 0)
                throw InputError(fmt::format("the graph has a cycle through node '{}' ({})", graph.node(n).name(),
                                             graph.node(n).op_type()));
    }
    return order;
}

UniqueNames::UniqueNames(const onnx::GraphProto& graph) {
    for (const auto& node : graph.node()) {
        used_.insert(node.name());
        for (const auto& o : node.output()) used_.insert(o);
        // ONNX names are unique across scopes: a branch's names are taken too.
        for_each_subgraph(node, [&](const onnx::GraphProto& g) { used_.merge(UniqueNames(g).used_); });
    }
    for (const auto& i : graph.input()) used_.insert(i.name());
    for (const auto& i : graph.initializer()) used_.insert(i.name());
    for (const auto& v : graph.value_info()) used_.insert(v.name());
}

std::string UniqueNames::fresh(std::string_view base) {
    std::string name(base);
    for (int k = 1; used_.count(name); ++k) name = fmt::format("{}_{}", base, k);
    used_.insert(name);
    return name;
}

namespace {
void rename_reads(onnx::GraphProto& graph, std::string_view from, std::string_view to) {
    for (auto& node : *graph.mutable_node()) {
        for (auto& in : *node.mutable_input())
            if (in == from) in = std::string(to);
        // ONNX names are unique across scopes, so a subgraph naming `from` reads ours.
        for_each_subgraph(node, [&](onnx::GraphProto& g) { rename_reads(g, from, to); });
    }
}
}  // namespace

bool replace_all_uses(onnx::GraphProto& graph, std::string_view from, std::string_view to) {
    if (std::any_of(graph.output().begin(), graph.output().end(), [&](const auto& o) { return o.name() == from; }))
        return false;
    rename_reads(graph, from, to);
    return true;
}

void remove_nodes(onnx::GraphProto& graph, std::vector<int> indices) {
    std::sort(indices.begin(), indices.end());
    indices.erase(std::unique(indices.begin(), indices.end()), indices.end());
    auto* nodes = graph.mutable_node();
    for (auto it = indices.rbegin(); it != indices.rend(); ++it) {
        if (*it < 0 || *it >= nodes->size()) throw InternalError(fmt::format("no node at index {}", *it));
        nodes->erase(nodes->begin() + *it);
    }
}

int remove_unused_initializers(onnx::GraphProto& graph) {
    std::unordered_set<std::string> used;
    for (const auto& node : graph.node()) {
        for (const auto& in : node.input()) used.insert(in);
        for (const auto& name : subgraph_reads(node)) used.insert(name);
    }
    for (const auto& o : graph.output()) used.insert(o.name());
    auto* inits = graph.mutable_initializer();
    const int before = inits->size();
    inits->erase(std::remove_if(inits->begin(), inits->end(), [&](const auto& t) { return !used.count(t.name()); }),
                 inits->end());
    return before - inits->size();
}

void sort_nodes(onnx::GraphProto& graph) {
    const auto order = topological_order(graph);
    google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
    for (int n : order) *nodes.Add() = graph.node(n);
    graph.mutable_node()->Swap(&nodes);
}

namespace {

// The node's attribute `name`, emptied and typed `type`; appended when missing.
onnx::AttributeProto& attribute_slot(onnx::NodeProto& node, const std::string& name,
                                     onnx::AttributeProto::AttributeType type) {
    onnx::AttributeProto* slot = nullptr;
    for (auto& a : *node.mutable_attribute())
        if (a.name() == name) slot = &a;
    if (!slot) slot = node.add_attribute();
    slot->Clear();
    slot->set_name(name);
    slot->set_type(type);
    return *slot;
}

}  // namespace

void set_attribute(onnx::NodeProto& node, const std::string& name, int64_t value) {
    attribute_slot(node, name, onnx::AttributeProto::INT).set_i(value);
}

void set_attribute(onnx::NodeProto& node, const std::string& name, float value) {
    attribute_slot(node, name, onnx::AttributeProto::FLOAT).set_f(value);
}

void set_attribute(onnx::NodeProto& node, const std::string& name, const std::vector<int64_t>& values) {
    auto& a = attribute_slot(node, name, onnx::AttributeProto::INTS);
    for (auto v : values) a.add_ints(v);
}

void set_attribute(onnx::NodeProto& node, const std::string& name, const std::string& value) {
    attribute_slot(node, name, onnx::AttributeProto::STRING).set_s(value);
}

bool remove_attribute(onnx::NodeProto& node, std::string_view name) {
    auto* attrs = node.mutable_attribute();
    bool removed = false;
    for (int i = attrs->size() - 1; i >= 0; --i)
        if (attrs->Get(i).name() == name) {
            attrs->DeleteSubrange(i, 1);
            removed = true;
        }
    return removed;
}

std::string add_initializer(onnx::GraphProto& graph, UniqueNames& names, std::string_view base, const Tensor& value) {
    const auto name = names.fresh(base);
    *graph.add_initializer() = value.to_proto(name);
    return name;
}

onnx::NodeProto& make_node(onnx::GraphProto& graph, UniqueNames& names, const std::string& op,
                           std::vector<std::string> inputs, std::vector<std::string> outputs, std::string_view name,
                           const std::optional<std::string>& domain) {
    auto* n = graph.add_node();
    n->set_op_type(op);
    if (domain) n->set_domain(*domain);
    n->set_name(names.fresh(name));
    for (auto& i : inputs) n->add_input(std::move(i));
    for (auto& o : outputs) n->add_output(std::move(o));
    return *n;
}

void fuse_nodes(onnx::GraphProto& graph, const std::vector<int>& nodes, int at, onnx::NodeProto fused) {
    *graph.mutable_node(at) = std::move(fused);
    std::vector<int> rest;
    for (int n : nodes)
        if (n != at) rest.push_back(n);
    remove_nodes(graph, rest);
}

std::optional<QLinearForm> qlinear_form(std::string_view op) {
    static constexpr std::string_view kMicrosoft = "com.microsoft";
    static const std::map<std::string_view, QLinearForm, std::less<>> kForms = {
        {"Conv", {"QLinearConv", ""}},
        {"MatMul", {"QLinearMatMul", ""}},
        {"Gemm", {"QGemm", kMicrosoft}},
        {"Add", {"QLinearAdd", kMicrosoft}},
        {"Mul", {"QLinearMul", kMicrosoft}},
        {"Concat", {"QLinearConcat", kMicrosoft}},
        {"GlobalAveragePool", {"QLinearGlobalAveragePool", kMicrosoft}},
        {"AveragePool", {"QLinearAveragePool", kMicrosoft}},
        {"Softmax", {"QLinearSoftmax", kMicrosoft}},
        {"LeakyRelu", {"QLinearLeakyRelu", kMicrosoft}},
        {"Sigmoid", {"QLinearSigmoid", kMicrosoft}},
    };
    auto it = kForms.find(op);
    if (it == kForms.end()) return std::nullopt;
    return it->second;
}

const GraphIndex& RewriteContext::index() {
    if (!index_) index_.emplace(model_);
    return *index_;
}

const std::map<std::string, std::vector<int64_t>>& RewriteContext::shapes() {
    if (!shapes_) shapes_ = infer_shapes(model_);
    return *shapes_;
}

void RewriteContext::changed() {
    index_.reset();
    shapes_.reset();
}

void import_opset(onnx::ModelProto& model, const std::string& domain, int64_t version) {
    for (const auto& o : model.opset_import())
        if (o.domain() == domain) return;
    auto* o = model.add_opset_import();
    o->set_domain(domain);
    o->set_version(version);
}

std::optional<std::pair<float, float>> clip_bounds(const onnx::NodeProto& node, const GraphIndex& index) {
    float lo = -std::numeric_limits<float>::infinity(), hi = std::numeric_limits<float>::infinity();
    for (const auto& a : node.attribute()) {
        if (a.name() == "min") lo = a.f();
        if (a.name() == "max") hi = a.f();
    }
    for (int slot = 1; slot <= 2 && slot < node.input_size(); ++slot) {
        if (node.input(slot).empty()) continue;
        const auto* init = index.initializer(node.input(slot));
        if (!init || index.is_graph_input(node.input(slot))) return std::nullopt;
        const auto t = Tensor::from_proto(*init);
        if (t.type() != DataType::Float || t.size() != 1) return std::nullopt;
        (slot == 1 ? lo : hi) = t.data<float>()[0];
    }
    return std::make_pair(lo, hi);
}

bool pads_with_zeros(const onnx::NodeProto& pad, const GraphIndex& index) {
    if (pad.op_type() != "Pad") return false;
    const auto* mode = find_attribute(pad, "mode");
    if (mode && mode->s() != "constant") return false;
    if (float_attribute(pad, "value", 0.0f) != 0.0f) return false;  // opset < 11
    if (pad.input_size() < 3 || pad.input(2).empty()) return true;
    const auto* init = index.initializer(pad.input(2));
    if (!init || index.is_graph_input(pad.input(2))) return false;
    const auto t = Tensor::from_proto(*init);
    return t.type() == DataType::Float && t.size() == 1 && t.data<float>()[0] == 0.0f;
}

}  // namespace vaiq
