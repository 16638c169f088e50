// Which nodes a recipe quantizes, and with which settings.
#pragma once

#include <string>
#include <vector>

#include "recipe/recipe.hpp"
#include "vaiq/model.hpp"
#include "vaiq/target.hpp"

namespace vaiq {

/// The recipe's verdict on one node.
struct NodeDecision {
    int node = 0;
    std::string name;  ///< the node's name, or "<op_type>#<index>" when it has none
    std::string op_type;
    bool quantized = false;
    std::string reason;  ///< why not, or which overrides applied
    /// Effective per-node settings (activation_type, weight_type, ...), recipe key -> value.
    std::map<std::string, Setting> settings;
};

/// Decides every node of the main graph, in graph order. Throws InputError when
/// a node list (nodes_to_quantize, nodes_to_exclude, input_nodes, output_nodes)
/// names a node the model lacks, or an override matches nothing (unless optional).
std::vector<NodeDecision> decide_nodes(const Recipe& recipe, const Model& model, const Target& target);

}  // namespace vaiq
