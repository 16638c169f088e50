// Simulation: the DPU computes some ops approximately; these passes make the
// float graph compute the same approximations, so calibration observes and
// evaluation measures what the device will do. Rescales are marked Muls the
// planner and the npu_cnn target treat as part of the op before them.
#include "passes.hpp"
#include "rewrite.hpp"

namespace dpu_passes {

bool convert_leaky_relu_to_dpu_version(vaiq::Model& model) {
    bool changed = false;
    for (auto& node : *model.graph().mutable_node()) {
        if (node.op_type() != "LeakyRelu" || !is_default_domain(node)) continue;
        const float alpha = float_attribute(node, "alpha", 0.01f);
        const float dpu = dpu::leaky_relu_alpha(alpha);
        if (dpu == alpha) continue;
        set_attribute(node, "alpha", dpu);
        changed = true;
    }
    return changed;
}

// A Sigmoid whose output leaves the model stays: it is a score its users
// threshold and rank, the fragile_inputs algorithm keeps it float, so it runs
// after the DPU, where HardSigmoid would only tie every score whose logit is
// below -3 at 0 (a keyword model's clips then ranked at chance).
bool convert_sigmoid_to_hard_sigmoid(vaiq::Model& model) {
    bool changed = false;
    const vaiq::GraphIndex index(model);
    for (auto& node : *model.graph().mutable_node()) {
        if (node.op_type() != "Sigmoid" || !is_default_domain(node) || index.is_graph_output(node.output(0))) continue;
        node.set_op_type("HardSigmoid");
        set_attribute(node, "alpha", 1.0f / 6.0f);
        set_attribute(node, "beta", 0.5f);
        changed = true;
    }
    return changed;
}

namespace {

// Inserts the DPU's rescale after every node `factor_of` gives a factor
// other than 1 (and that is not rescaled already).
template <typename FactorOf>
bool rescale_all(vaiq::Model& model, FactorOf&& factor_of) {
    auto& graph = model.graph();
    const vaiq::GraphIndex index(model);
    vaiq::UniqueNames names(graph);
    bool changed = false;
    const int count = graph.node_size();
    for (int n = 0; n < count; ++n) {
        const auto& node = graph.node(n);
        if (!is_default_domain(node) || node.output_size() == 0 || rescaled(node, graph, index)) continue;
        const auto factor = factor_of(node, index);
        if (!factor || *factor == 1.0) continue;
        insert_rescale(model, names, n, *factor);
        changed = true;
    }
    if (changed) vaiq::sort_nodes(graph);
    return changed;
}

}  // namespace

bool convert_hard_sigmoid_to_dpu_version(vaiq::Model& model) {
    return rescale_all(model, [](const onnx::NodeProto& node, const vaiq::GraphIndex&) -> std::optional<double> {
        if (!dpu::is_dpu_hard_sigmoid(node)) return std::nullopt;
        return dpu::kHardSigmoidScale;
    });
}

bool convert_avg_pool_to_dpu_version(vaiq::Model& model) {
    const auto shapes = vaiq::infer_shapes(model);
    return rescale_all(model, [&](const onnx::NodeProto& node, const vaiq::GraphIndex&) -> std::optional<double> {
        int64_t kh = 0, kw = 0;
        if (node.op_type() == "AveragePool") {
            const auto kernel = ints_attribute(node, "kernel_shape");
            if (!kernel || kernel->size() != 2) return std::nullopt;
            kh = (*kernel)[0], kw = (*kernel)[1];
        } else if (node.op_type() == "GlobalAveragePool") {
            const auto shape = shapes.find(node.input(0));
            if (shape == shapes.end() || shape->second.size() != 4) return std::nullopt;
            kh = shape->second[2], kw = shape->second[3];
        } else {
            return std::nullopt;
        }
        if (kh != kw || kh <= 0) {
            vaiq::log_info("convert_avg_pool_to_dpu_version: '{}' kept: the DPU version needs a known square window",
                           node.name());
            return std::nullopt;
        }
        return dpu::average_pool_factor(kh, kw);
    });
}

bool convert_reduce_mean_to_dpu_version(vaiq::Model& model) {
    const auto shapes = vaiq::infer_shapes(model);
    const auto layer_norm = layer_norm_means(model.graph());
    return rescale_all(model, [&](const onnx::NodeProto& node, const vaiq::GraphIndex& index) -> std::optional<double> {
        if (node.op_type() != "ReduceMean" || layer_norm.count(node.output(0))) return std::nullopt;
        const auto shape = shapes.find(node.input(0));
        if (shape == shapes.end()) return std::nullopt;
        const auto& dims = shape->second;
        auto axes = ints_from(node, index, "axes", 1);
        if (!axes) {  // every axis
            axes.emplace();
            for (size_t a = 0; a < dims.size(); ++a) axes->push_back(static_cast<int64_t>(a));
        }
        int64_t count = 1;
        for (auto a : normalized_axes(*axes, dims.size())) {
            if (a < 0 || a >= static_cast<int64_t>(dims.size()) || dims[a] <= 0) return std::nullopt;
            count *= dims[a];
        }
        return dpu::mean_factor(count);
    });
}

}  // namespace dpu_passes
