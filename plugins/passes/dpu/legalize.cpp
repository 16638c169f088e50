// Legalisation: BatchNormalization, ReduceMean, large global pools and Split
// in the forms the DPU runs. Each rewrite computes the same function.
#include <cmath>

#include "passes.hpp"
#include "rewrite.hpp"

namespace dpu_passes {

namespace {

vaiq::Tensor float_tensor(std::vector<int64_t> shape, const std::vector<float>& values) {
    return vaiq::Tensor::from_values<float>(std::move(shape), values);
}

vaiq::Tensor int64_tensor(const std::vector<int64_t>& values) {
    return vaiq::Tensor::from_values<int64_t>({static_cast<int64_t>(values.size())}, values);
}

}  // namespace

bool convert_bn_to_conv(vaiq::Model& model) {
    auto& graph = model.graph();
    const auto shapes = vaiq::infer_shapes(model);
    const vaiq::GraphIndex index(graph);
    vaiq::UniqueNames names(graph);
    std::vector<int> folded_away;
    int converted = 0;
    for (int n = 0; n < graph.node_size(); ++n) {
        auto& bn = *graph.mutable_node(n);
        const auto affine = vaiq::batch_norm_affine(bn, index);
        if (!affine) continue;
        const int producer = index.producer(bn.input(0));
        if (producer >= 0 && vaiq::fold_affine_into_producer(graph, names, index, producer, bn, *affine)) {
            folded_away.push_back(n);
            continue;
        }
        const auto& w = affine->scale;
        const auto& b = affine->shift;
        const auto channels = w.size();
        // A BatchNormalization on its own: a depthwise 1x1 Conv.
        const auto shape = shapes.find(bn.input(0));
        const size_t rank = shape == shapes.end() ? 0 : shape->second.size();
        if (rank != 3 && rank != 4) {
            vaiq::log_info("convert_bn_to_conv: '{}' kept: its input's rank is not known to be 3 or 4", bn.name());
            continue;
        }
        const auto c = static_cast<int64_t>(channels);
        std::vector<int64_t> wshape{c, 1, 1, 1}, kernel{1, 1};
        if (rank == 3) wshape.pop_back(), kernel.pop_back();
        const auto wname = vaiq::add_initializer(graph, names, bn.name() + "_dw_weight", float_tensor(wshape, w));
        const auto bname = vaiq::add_initializer(graph, names, bn.name() + "_dw_bias", float_tensor({c}, b));
        const std::string x = bn.input(0), y = bn.output(0);
        bn.set_op_type("Conv");
        bn.clear_input();
        bn.clear_output();
        bn.clear_attribute();
        for (const auto& in : {x, wname, bname}) bn.add_input(in);
        bn.add_output(y);
        set_attribute(bn, "group", c);
        set_attribute(bn, "kernel_shape", kernel);
        ++converted;
    }
    if (folded_away.empty() && converted == 0) return false;
    vaiq::remove_nodes(graph, folded_away);
    vaiq::remove_unused_initializers(graph);
    return true;
}

bool convert_reduce_mean_to_global_avg_pool(vaiq::Model& model) {
    auto& graph = model.graph();
    const auto shapes = vaiq::infer_shapes(model);
    const vaiq::GraphIndex index(graph);
    vaiq::UniqueNames names(graph);
    const auto layer_norm = layer_norm_means(graph);
    bool changed = false;
    const int count = graph.node_size();
    for (int n = 0; n < count; ++n) {
        auto& node = *graph.mutable_node(n);
        if (node.op_type() != "ReduceMean" || !is_default_domain(node) || layer_norm.count(node.output(0))) continue;
        const auto axes = ints_from(node, index, "axes", 1);
        const auto shape = shapes.find(node.input(0));
        if (!axes || shape == shapes.end()) continue;
        const size_t rank = shape->second.size();
        const auto spatial = normalized_axes(*axes, rank);
        if (!((rank == 4 && spatial == std::vector<int64_t>{2, 3}) ||
              (rank == 3 && spatial == std::vector<int64_t>{2})))
            continue;
        const bool keepdims = int_attribute(node, "keepdims", 1) != 0;
        const std::string x = node.input(0), y = node.output(0);
        node.set_op_type("GlobalAveragePool");
        node.clear_attribute();
        node.clear_input();
        node.add_input(x);
        if (!keepdims) {
            const auto pooled = names.fresh(y + "_pooled");
            node.set_output(0, pooled);
            auto& squeeze = vaiq::make_node(graph, names, "Squeeze", {pooled}, {y}, y + "_squeeze");
            if (model.opset() >= 13)
                squeeze.add_input(vaiq::add_initializer(graph, names, y + "_axes", int64_tensor(spatial)));
            else
                set_attribute(squeeze, "axes", spatial);
        }
        changed = true;
    }
    if (changed) {
        vaiq::sort_nodes(graph);
        vaiq::remove_unused_initializers(graph);
    }
    return changed;
}

namespace {
int64_t largest_divisor_up_to_sqrt(int64_t n) {
    int64_t best = 1;
    for (int64_t d = 1; d * d <= n; ++d)
        if (n % d == 0) best = d;
    return best;
}
}  // namespace

bool split_large_kernel_pool(vaiq::Model& model) {
    constexpr int64_t kLargest = 512;  // elements the DPU averages in one window
    auto& graph = model.graph();
    const auto shapes = vaiq::infer_shapes(model);
    vaiq::UniqueNames names(graph);
    bool changed = false;
    const int count = graph.node_size();
    for (int n = 0; n < count; ++n) {
        if (graph.node(n).op_type() != "GlobalAveragePool" || !is_default_domain(graph.node(n))) continue;
        const auto shape = shapes.find(graph.node(n).input(0));
        if (shape == shapes.end() || shape->second.size() != 4) continue;
        const int64_t h = shape->second[2], w = shape->second[3];
        if (h <= 0 || w <= 0 || h * w <= kLargest) continue;
        // A first average over exact tiles, then the global one: the same mean.
        const int64_t kh = largest_divisor_up_to_sqrt(h), kw = largest_divisor_up_to_sqrt(w);
        if (kh * kw == 1 || (h / kh) * (w / kw) > kLargest) {
            vaiq::log_info("split_large_kernel_pool: '{}' ({}x{}) kept: no tiling brings it to {} elements",
                           graph.node(n).name(), h, w, kLargest);
            continue;
        }
        const std::string x = graph.node(n).input(0);
        const auto tiled = names.fresh(x + "_tiled_mean");
        auto& pool = vaiq::make_node(graph, names, "AveragePool", {x}, {tiled}, graph.node(n).name() + "_tiles");
        set_attribute(pool, "kernel_shape", std::vector<int64_t>{kh, kw});
        set_attribute(pool, "strides", std::vector<int64_t>{kh, kw});
        graph.mutable_node(n)->set_input(0, tiled);
        changed = true;
    }
    if (changed) vaiq::sort_nodes(graph);
    return changed;
}

bool convert_split_to_slice(vaiq::Model& model) {
    auto& graph = model.graph();
    const auto shapes = vaiq::infer_shapes(model);
    const vaiq::GraphIndex index(graph);
    vaiq::UniqueNames names(graph);
    std::vector<int> replaced;
    const int count = graph.node_size();
    for (int n = 0; n < count; ++n) {
        const onnx::NodeProto split = graph.node(n);
        if (split.op_type() != "Split" || !is_default_domain(split)) continue;
        const auto shape = shapes.find(split.input(0));
        if (shape == shapes.end()) continue;
        const auto rank = static_cast<int64_t>(shape->second.size());
        int64_t axis = int_attribute(split, "axis", 0);
        if (axis < 0) axis += rank;
        if (axis < 0 || axis >= rank) continue;
        auto sizes = ints_from(split, index, "split", 1);
        if (!sizes) {
            // Equal parts (the last one smaller when it does not divide).
            const int64_t dim = shape->second[axis], parts = split.output_size();
            if (dim < 0) continue;
            const int64_t chunk = (dim + parts - 1) / parts;
            sizes.emplace();
            for (int64_t i = 0; i < parts; ++i)
                sizes->push_back(std::max<int64_t>(0, std::min(chunk, dim - i * chunk)));
        }
        if (static_cast<int>(sizes->size()) != split.output_size()) continue;
        const auto axes = vaiq::add_initializer(graph, names, split.name() + "_axes", int64_tensor({axis}));
        int64_t offset = 0;
        for (int i = 0; i < split.output_size(); ++i) {
            const auto& out = split.output(i);
            const int64_t begin = offset;
            offset += (*sizes)[i];
            if (out.empty()) continue;
            const auto starts = vaiq::add_initializer(graph, names, out + "_starts", int64_tensor({begin}));
            const auto ends = vaiq::add_initializer(graph, names, out + "_ends", int64_tensor({offset}));
            vaiq::make_node(graph, names, "Slice", {split.input(0), starts, ends, axes}, {out}, out + "_slice");
        }
        replaced.push_back(n);
    }
    if (replaced.empty()) return false;
    vaiq::remove_nodes(graph, replaced);
    vaiq::sort_nodes(graph);
    vaiq::remove_unused_initializers(graph);
    return true;
}

}  // namespace dpu_passes
