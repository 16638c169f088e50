#include "pipeline/joined_reference.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

#include "vaiq/graph.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {

namespace {

// Values computed alike get the same number: graph inputs by name, initializers
// by value, node outputs by op, domain, attributes and the numbers of the inputs.
class ValueNumbers {
  public:
    int of_key(const std::string& key) { return ids_.emplace(key, static_cast<int>(ids_.size())).first->second; }
    int fresh() {  // equal to nothing else
        std::string key = "\x01";
        key += std::to_string(ids_.size());
        return of_key(key);
    }

    // An initializer's number: that of a prepared initializer of equal values, else a new one.
    int of_initializer(const onnx::TensorProto& t, bool prepared) {
        const auto key = shape_key(t);
        auto& candidates = initializers_[key];
        if (!prepared)
            for (const auto& [proto, id] : candidates)
                if (same_values(*proto, t)) return id;
        const int id = fresh();
        if (prepared) candidates.emplace_back(&t, id);
        return id;
    }

    // The key of a node's output `index` from the numbers of its inputs.
    static std::string output_key(const onnx::NodeProto& node, const std::vector<int>& inputs, int index) {
        std::vector<const onnx::AttributeProto*> attributes;
        for (const auto& a : node.attribute()) attributes.push_back(&a);
        std::sort(attributes.begin(), attributes.end(),
                  [](const auto* a, const auto* b) { return a->name() < b->name(); });
        const std::string domain = node.domain() == "ai.onnx" ? std::string() : node.domain();
        // Appended piece by piece: GCC 12 warns wrongly (-Wrestrict) on chained string additions.
        std::string key = node.op_type();
        key += '\0';
        key += domain;
        key += '\0';
        for (const auto* a : attributes) {
            key += a->SerializeAsString();
            key += '\0';
        }
        for (int id : inputs) {
            key += std::to_string(id);
            key += ',';
        }
        key += '#';
        key += std::to_string(index);
        return key;
    }

  private:
    // Type, dimensions and a hash of the values: equal values have equal keys. A
    // tensor left in its file (a large model's) is known by where it lies there:
    // reading every weight of both models to compare them would cost more than
    // the join saves.
    static std::string shape_key(const onnx::TensorProto& t) {
        std::string key = std::to_string(t.data_type());
        key += ':';
        for (const auto d : t.dims()) {
            key += std::to_string(d);
            key += ',';
        }
        if (is_deferred(t)) {
            key += "file:";
            for (const auto& entry : t.external_data()) key += entry.SerializeAsString();
            return key;
        }
        key += std::to_string(raw(t) ? sampled_hash(t.raw_data()) : sampled_hash(decoded(Tensor::from_proto(t))));
        return key;
    }
    // A hash of the start, middle and end of the bytes: equal values hash alike,
    // and same_values() compares the whole of those that do. Hashing every byte
    // of both models (200 MB for resnet50) was a visible part of a plain run.
    static size_t sampled_hash(std::string_view bytes) {
        constexpr size_t kSpan = 256;
        if (bytes.size() <= 3 * kSpan) return std::hash<std::string_view>{}(bytes);
        std::string sample(bytes.substr(0, kSpan));
        sample += bytes.substr(bytes.size() / 2, kSpan);
        sample += bytes.substr(bytes.size() - kSpan);
        return std::hash<std::string_view>{}(sample);
    }
    static bool raw(const onnx::TensorProto& t) {
        return !t.raw_data().empty() && t.data_location() != onnx::TensorProto::EXTERNAL;
    }
    static std::string_view decoded(const Tensor& t) {
        return {reinterpret_cast<const char*>(t.bytes().data()), t.bytes().size()};
    }
    // Equal keys, so equal types and dimensions (and for deferred tensors, the same place in the same file).
    static bool same_values(const onnx::TensorProto& a, const onnx::TensorProto& b) {
        if (is_deferred(a) || is_deferred(b)) return is_deferred(a) && is_deferred(b);
        if (raw(a) && raw(b)) return a.raw_data() == b.raw_data();
        const auto ta = Tensor::from_proto(a), tb = Tensor::from_proto(b);
        return decoded(ta) == decoded(tb);
    }

    std::unordered_map<std::string, int> ids_;
    std::map<std::string, std::vector<std::pair<const onnx::TensorProto*, int>>> initializers_;
};

bool has_subgraph(const onnx::NodeProto& node) {
    return std::any_of(node.attribute().begin(), node.attribute().end(), [](const auto& a) {
        return a.type() == onnx::AttributeProto::GRAPH || a.type() == onnx::AttributeProto::GRAPHS;
    });
}

// `given` imports nothing that `prepared` imports at another version or not at all.
bool same_opsets(const Model& prepared, const Model& given) {
    for (const auto& op : given.proto().opset_import()) {
        const auto domain = op.domain() == "ai.onnx" ? std::string() : op.domain();
        if (prepared.opset(domain) != op.version()) return false;
    }
    return true;
}

std::set<std::string> output_names(const onnx::GraphProto& graph) {
    std::set<std::string> out;
    for (const auto& o : graph.output()) out.insert(o.name());
    return out;
}

}  // namespace

void remove_joined(Model& model, const JoinedReference& joined) {
    auto& graph = model.graph();
    graph.mutable_node()->DeleteSubrange(joined.nodes_before, graph.node_size() - joined.nodes_before);
    graph.mutable_initializer()->DeleteSubrange(joined.initializers_before,
                                                graph.initializer_size() - joined.initializers_before);
    graph.mutable_output()->DeleteSubrange(joined.outputs_before, graph.output_size() - joined.outputs_before);
}

std::optional<JoinedReference> join_given_model(Model& prepared, const Model& given) {
    const auto& g = given.graph();
    if (given.proto().functions_size() > 0 || !same_opsets(prepared, given) ||
        output_names(g) != output_names(prepared.graph()) ||
        std::any_of(g.node().begin(), g.node().end(), has_subgraph))
        return std::nullopt;
    ValueNumbers numbers;
    auto& joined = prepared.graph();
    JoinedReference out;
    out.nodes_before = joined.node_size();
    out.initializers_before = joined.initializer_size();
    out.outputs_before = joined.output_size();
    // The prepared model's values by number; the first of equal ones stands for all.
    std::unordered_map<int, std::string> joined_name;
    std::unordered_map<std::string, int> prepared_id;
    auto number_prepared = [&](const std::string& name, int id) {
        prepared_id[name] = id;
        joined_name.emplace(id, name);
    };
    std::set<std::string> prepared_initializers;
    for (const auto& init : joined.initializer()) {
        number_prepared(init.name(), numbers.of_initializer(init, true));
        prepared_initializers.insert(init.name());
    }
    for (const auto& in : joined.input())
        if (!prepared_initializers.count(in.name())) number_prepared(in.name(), numbers.of_key("in:" + in.name()));
    auto input_ids = [&](const onnx::NodeProto& node, const std::unordered_map<std::string, int>& ids) {
        std::vector<int> out_ids;
        for (const auto& in : node.input()) {
            const auto it = ids.find(in);
            out_ids.push_back(in.empty() ? -1 : it != ids.end() ? it->second : numbers.fresh());
        }
        return out_ids;
    };
    for (int n : topological_order(joined)) {
        const auto& node = joined.node(n);
        const auto inputs = input_ids(node, prepared_id);
        for (int i = 0; i < node.output_size(); ++i)
            if (!node.output(i).empty())
                number_prepared(node.output(i), has_subgraph(node)
                                                    ? numbers.fresh()
                                                    : numbers.of_key(ValueNumbers::output_key(node, inputs, i)));
    }

    // The given model's values: the prepared ones where the numbers agree, else added.
    UniqueNames names(joined);
    std::unordered_map<std::string, int> given_id;
    std::unordered_map<std::string, std::string> in_joined;  // given tensor -> joined tensor
    std::map<std::string, const onnx::TensorProto*> unshared_initializers;
    for (const auto& init : g.initializer()) {
        const int id = numbers.of_initializer(init, false);
        given_id[init.name()] = id;
        if (const auto it = joined_name.find(id); it != joined_name.end())
            in_joined[init.name()] = it->second;
        else
            unshared_initializers[init.name()] = &init;
    }
    std::set<std::string> given_is_data;  // initializers and graph inputs
    for (const auto& init : g.initializer()) given_is_data.insert(init.name());
    for (const auto& in : g.input()) given_is_data.insert(in.name());
    for (const auto& in : g.input())
        if (!given_id.count(in.name())) {
            given_id[in.name()] = numbers.of_key("in:" + in.name());
            in_joined[in.name()] = in.name();
        }
    // A given tensor's name in the joined graph; an initializer only added nodes read is added once.
    auto joined_tensor = [&](const std::string& name) -> std::string {
        if (name.empty()) return name;
        if (const auto it = in_joined.find(name); it != in_joined.end()) return it->second;
        const auto init = unshared_initializers.find(name);
        if (init == unshared_initializers.end()) return name;  // read from nowhere: the executor says so
        auto& added = *joined.add_initializer();
        added = *init->second;
        added.set_name(names.fresh("given/" + name));
        joined_name.emplace(given_id.at(name), added.name());
        return in_joined[name] = added.name();
    };
    for (int n : topological_order(g)) {
        const auto& node = g.node(n);
        const auto inputs = input_ids(node, given_id);
        bool shared = true;
        for (int i = 0; i < node.output_size(); ++i) {
            if (node.output(i).empty()) continue;
            const int id = numbers.of_key(ValueNumbers::output_key(node, inputs, i));
            given_id[node.output(i)] = id;
            shared = shared && joined_name.count(id) > 0;
        }
        if (shared) {
            for (const auto& o : node.output())
                if (!o.empty()) in_joined[o] = joined_name.at(given_id.at(o));
            ++out.shared_nodes;
            continue;
        }
        onnx::NodeProto added = node;
        added.set_name(names.fresh("given/" + node.name()));
        for (int i = 0; i < added.input_size(); ++i) added.set_input(i, joined_tensor(node.input(i)));
        for (int i = 0; i < added.output_size(); ++i) {
            if (node.output(i).empty()) continue;
            const auto name = names.fresh("given/" + node.output(i));
            added.set_output(i, name);
            in_joined[node.output(i)] = name;
            joined_name.emplace(given_id.at(node.output(i)), name);
        }
        *joined.add_node() = std::move(added);
        ++out.added_nodes;
    }

    // Each prepared output's counterpart among the joined graph's outputs.
    std::map<std::string, int> output_index;
    for (int i = 0; i < joined.output_size(); ++i) output_index.emplace(joined.output(i).name(), i);
    std::map<std::string, const onnx::ValueInfoProto*> given_outputs;
    for (const auto& o : g.output()) given_outputs[o.name()] = &o;
    const int prepared_outputs = joined.output_size();
    for (int k = 0; k < prepared_outputs; ++k) {
        const auto& declared = *given_outputs.at(joined.output(k).name());
        // Only node outputs: an output that is a constant or an input has nothing to gain.
        const auto computed = in_joined.find(declared.name());
        if (computed == in_joined.end() || given_is_data.count(declared.name())) {
            remove_joined(prepared, out);
            return std::nullopt;
        }
        auto [it, added] = output_index.emplace(computed->second, joined.output_size());
        if (added) {
            auto& value = *joined.add_output();
            value = declared;
            value.set_name(computed->second);
        }
        out.given_outputs.push_back(it->second);
    }
    if (out.added_nodes > out.shared_nodes) {  // little shared: running the given model apart costs the same
        remove_joined(prepared, out);
        return std::nullopt;
    }
    return out;
}

}  // namespace vaiq
