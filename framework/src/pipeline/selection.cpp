#include "pipeline/selection.hpp"

#include <fmt/format.h>

#include <regex>
#include <set>
#include <unordered_set>

#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/patterns.hpp"
#include "vaiq/text.hpp"

namespace vaiq {

namespace {

std::string display_name(const onnx::NodeProto& node, int index) {
    return node.name().empty() ? fmt::format("{}#{}", node.op_type(), index) : node.name();
}

bool name_matches(const std::string& pattern, const std::string& name) {
    if (pattern.rfind("re:", 0) == 0) return std::regex_match(name, std::regex(pattern.substr(3)));
    return pattern == name;
}

bool override_matches(const nlohmann::json& match, const onnx::NodeProto& node, const std::string& name) {
    auto any = [](const nlohmann::json& list, auto&& pred) {
        if (list.empty()) return true;
        for (const auto& item : list)
            if (pred(item.get<std::string>())) return true;
        return false;
    };
    return any(match["name"], [&](const std::string& p) { return name_matches(p, name); }) &&
           any(match["op_type"], [&](const std::string& t) { return t == node.op_type(); });
}

std::set<std::string> name_set(const Recipe& recipe, std::string_view key, const std::vector<std::string>& names) {
    std::set<std::string> out;
    for (const auto& n : recipe.value(key)) {
        const auto s = n.get<std::string>();
        if (std::find(names.begin(), names.end(), s) == names.end())
            throw InputError(fmt::format("{}: {} names '{}', which is not a node of the model{}",
                                         recipe.setting(key).origin, key, s, did_you_mean(s, names)));
        out.insert(s);
    }
    return out;
}

// The nodes of the graphs inside a graph's nodes (If branches, Loop bodies), at every depth.
void collect_nested_nodes(const onnx::GraphProto& graph, std::vector<const onnx::NodeProto*>& out) {
    for_each_subgraph(graph, [&](const onnx::GraphProto& g) {
        for (const auto& node : g.node()) out.push_back(&node);
        collect_nested_nodes(g, out);
    });
}

// Nodes downstream of `starts` (inclusive) or, with `upstream`, the nodes they depend on.
std::vector<bool> reachable(const onnx::GraphProto& graph, const std::vector<std::string>& names,
                            const std::set<std::string>& starts, bool upstream) {
    const GraphIndex index(graph);
    std::vector<bool> seen(graph.node_size(), false);
    std::vector<int> work;
    for (int n = 0; n < graph.node_size(); ++n)
        if (starts.count(names[n])) work.push_back(n);
    while (!work.empty()) {
        const int n = work.back();
        work.pop_back();
        if (seen[n]) continue;
        seen[n] = true;
        const auto& node = graph.node(n);
        if (upstream) {
            for (const auto& in : node.input())
                if (int p = index.producer(in); p >= 0) work.push_back(p);
        } else {
            for (const auto& out : node.output())
                for (const auto& use : index.consumers(out)) work.push_back(use.node);
        }
    }
    return seen;
}

// The nodes of each spelled-out LayerNorm up to its division (mean, centring,
// square, variance, + epsilon, square root, division): not its scale and shift.
std::vector<bool> layer_norm_statistics(const onnx::GraphProto& graph) {
    std::vector<bool> out(graph.node_size(), false);
    for (const auto& match : find_layer_norms(graph)) {
        std::set<std::string> after_division;
        for (int n : match.nodes)
            if (graph.node(n).op_type() == "Div") after_division.insert(graph.node(n).output(0));
        // The scale and shift follow the division in the match's order.
        for (int n : match.nodes) {
            const auto& node = graph.node(n);
            const bool scale_or_shift = std::any_of(node.input().begin(), node.input().end(),
                                                    [&](const std::string& in) { return after_division.count(in); });
            if (scale_or_shift)
                after_division.insert(node.output(0));
            else
                out[n] = true;
        }
    }
    return out;
}

}  // namespace

std::vector<NodeDecision> decide_nodes(const Recipe& recipe, const Model& model, const Target& target) {
    const auto& graph = model.graph();
    std::vector<std::string> names;
    for (int n = 0; n < graph.node_size(); ++n) names.push_back(display_name(graph.node(n), n));
    // With EnableSubgraph the settings may name the nodes of branches, which their own runs decide.
    std::vector<const onnx::NodeProto*> nested;
    if (recipe.value("extra_options.EnableSubgraph").get<bool>()) collect_nested_nodes(graph, nested);
    auto known = names;
    for (const auto* node : nested)
        if (!node->name().empty()) known.push_back(node->name());

    const auto to_quantize = name_set(recipe, "nodes_to_quantize", known);
    const auto to_exclude = name_set(recipe, "nodes_to_exclude", known);
    const auto inputs = name_set(recipe, "input_nodes", known);
    const auto outputs = name_set(recipe, "output_nodes", known);
    const auto after_inputs = reachable(graph, names, inputs, false);
    const auto before_outputs = reachable(graph, names, outputs, true);
    std::set<std::string> op_types;
    for (const auto& t : recipe.value("op_types_to_quantize")) op_types.insert(t.get<std::string>());
    const auto statistics = recipe.value("extra_options.FloatLayerNormStatistics").get<bool>()
                                ? layer_norm_statistics(graph)
                                : std::vector<bool>(graph.node_size(), false);

    const auto& overrides = recipe.value("overrides");
    std::vector<int> match_count(overrides.size(), 0);
    std::vector<NodeDecision> decisions;
    for (int n = 0; n < graph.node_size(); ++n) {
        const auto& node = graph.node(n);
        NodeDecision d{n, names[n], node.op_type(), false, "", {}};
        for (const auto& k : override_keys()) d.settings[std::string(k.recipe_key)] = recipe.setting(k.recipe_key);
        std::string excluded_by;
        std::vector<std::string> applied;
        for (size_t i = 0; i < overrides.size(); ++i) {
            const auto& o = overrides[i];
            if (!override_matches(o["match"], node, names[n])) continue;
            ++match_count[i];
            const std::string tag = fmt::format("overrides[{}] ({})", i, o["origin"].get<std::string>());
            if (o["exclude"].get<bool>()) {
                excluded_by = tag;
                continue;
            }
            applied.push_back(fmt::format("overrides[{}]", i));
            for (const auto& [key, value] : o["set"].items()) d.settings[key] = {value, tag};
        }
        if (model.marked(node, kFloatOnly))
            d.reason = "it simulates device arithmetic in float";
        else if (!inputs.empty() && !after_inputs[n])
            d.reason = "before input_nodes";
        else if (!outputs.empty() && !before_outputs[n])
            d.reason = "after output_nodes";
        else if (!op_types.empty() && !op_types.count(node.op_type()))
            d.reason = "op type not in op_types_to_quantize";
        else if (!to_quantize.empty() && !to_quantize.count(names[n]))
            d.reason = "not in nodes_to_quantize";
        else if (to_exclude.count(names[n]))
            d.reason = "in nodes_to_exclude";
        else if (!excluded_by.empty())
            d.reason = "excluded by " + excluded_by;
        else if (statistics[n])
            d.reason = "it computes a LayerNorm's statistics (extra_options.FloatLayerNormStatistics)";
        else if (!target.supports(node))
            d.reason = fmt::format("the target does not quantize {}", node.op_type());
        else {
            d.quantized = true;
            d.reason = applied.empty() ? "" : "settings from " + join(applied);
        }
        decisions.push_back(std::move(d));
    }
    for (const auto* node : nested)
        for (size_t i = 0; i < overrides.size(); ++i)
            match_count[i] += override_matches(overrides[i]["match"], *node, node->name());
    for (size_t i = 0; i < overrides.size(); ++i) {
        const auto& o = overrides[i];
        if (match_count[i] == 0 && !o["match"]["optional"].get<bool>()) {
            std::vector<std::string> wanted;
            for (const auto& v : o["match"]["name"]) wanted.push_back(v.get<std::string>());
            std::string hint = wanted.size() == 1 ? did_you_mean(wanted[0], names) : std::string();
            throw InputError(
                fmt::format("{}: overrides[{}] matches no node of the model{} (add optional: true to "
                            "allow that)",
                            o["origin"].get<std::string>(), i, hint));
        }
    }
    return decisions;
}

}  // namespace vaiq
