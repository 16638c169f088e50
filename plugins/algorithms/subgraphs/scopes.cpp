#include "scopes.hpp"

#include <vaiq/graph.hpp>

namespace vaiq::subgraphs {

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

std::vector<std::string> outer_references(const onnx::GraphProto& graph) {
    std::set<std::string> defined, read;
    collect_defined(graph, defined);
    collect_read(graph, read);
    std::vector<std::string> out;
    for (const auto& name : read)
        if (!defined.count(name)) out.push_back(name);
    return out;
}

}  // namespace vaiq::subgraphs
