// The names a graph defines and reads, its bodies' included: what a body
// takes from the scopes around it.
#pragma once

#include <onnx/onnx_pb.h>

#include <set>
#include <string>
#include <vector>

namespace vaiq::subgraphs {

/// Every value a graph and the graphs inside it define.
void collect_defined(const onnx::GraphProto& graph, std::set<std::string>& defined);
/// Every value a graph and the graphs inside it read, its outputs included.
void collect_read(const onnx::GraphProto& graph, std::set<std::string>& read);
/// The names a graph reads that neither it nor a graph inside it defines: the
/// values of enclosing scopes it uses, sorted.
std::vector<std::string> outer_references(const onnx::GraphProto& graph);

}  // namespace vaiq::subgraphs
