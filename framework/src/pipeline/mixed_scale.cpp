#include "pipeline/mixed_scale.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "sdk/text.hpp"
#include "vaiq/fold.hpp"
#include "vaiq/graph.hpp"

namespace vaiq {

namespace {

bool is_split(const onnx::NodeProto& node) {
    return is_default_domain(node) && (node.op_type() == "Slice" || node.op_type() == "Split");
}

// The axis a Slice or Split cuts along; nullopt where the graph does not say it
// with constants (a Slice over several axes, or with computed axes).
std::optional<int64_t> cut_axis(const GraphIndex& index, const onnx::NodeProto& node) {
    if (node.op_type() == "Split") return int_attribute(node, "axis", 0);
    if (node.input_size() > 3 && !node.input(3).empty()) {
        const auto axes = constant_tensor(index, node.input(3));
        if (!axes || axes->size() != 1) return std::nullopt;
        if (axes->type() == DataType::Int64) return axes->data<int64_t>()[0];
        if (axes->type() == DataType::Int32) return axes->data<int32_t>()[0];
        return std::nullopt;
    }
    if (node.input_size() < 2) return std::nullopt;  // opset < 10: attributes
    const auto starts = constant_tensor(index, node.input(1));
    if (starts && starts->size() == 1) return 0;
    return std::nullopt;
}

// The one axis every reader of `tensor` cuts along, when all of them are Slice/Split.
std::optional<int64_t> split_axis(const Model& model, const GraphIndex& index, const std::string& tensor) {
    const auto& uses = index.consumers(tensor);
    if (uses.empty() || index.is_graph_output(tensor)) return std::nullopt;
    std::optional<int64_t> axis;
    for (const auto& use : uses) {
        const auto& reader = model.graph().node(use.node);
        if (!is_split(reader) || use.slot != 0) return std::nullopt;
        const auto a = cut_axis(index, reader);
        if (!a || (axis && *axis != *a)) return std::nullopt;
        axis = a;
    }
    return axis;
}

// A graph output a Conv or ConvTranspose computes: a head.
bool is_conv_head(const Model& model, const GraphIndex& index, const std::string& tensor) {
    const int producer = index.producer(tensor);
    if (producer < 0 || !index.is_graph_output(tensor)) return false;
    const auto& node = model.graph().node(producer);
    return is_default_domain(node) && (node.op_type() == "Conv" || node.op_type() == "ConvTranspose");
}

std::string channel_list(const std::vector<int>& channels) {
    std::vector<std::string> shown;
    for (size_t i = 0; i < channels.size() && i < 8; ++i) shown.push_back(std::to_string(channels[i]));
    return join(shown, ", ") + (channels.size() > 8 ? fmt::format(" and {} more", channels.size() - 8) : "");
}

// Leaves `tensor` float and quantizes every Slice/Split output reading it on
// its own range: those outputs (and what shares their parameters) come back
// into the plan from the entries dropping `tensor` took away.
void split_at_readers(DraftPlan& draft, const std::string& tensor) {
    const auto before = draft.tensors;
    drop_tensors(draft, {tensor});
    for (auto t : before) {
        if (t.tensor == tensor || draft.find(t.tensor)) continue;
        if (t.share_with == tensor) t.share_with.clear();
        draft.index[t.tensor] = draft.tensors.size();
        draft.tensors.push_back(std::move(t));
    }
}

}  // namespace

nlohmann::json MixedScaleTensor::to_json() const {
    nlohmann::json j = {{"tensor", tensor},
                        {"role", role},
                        {"node", node},
                        {"axis", axis},
                        {"widest", widest},
                        {"narrowest", narrowest},
                        {"narrow_channels", narrow},
                        {"action", action.empty() ? "named" : action}};
    if (!advice.empty()) j["advice"] = advice;
    return j;
}

namespace {

// Fills in the ranges of `m` from per-channel maxima; false when they do not differ by `ratio`.
bool differ(MixedScaleTensor& m, const std::vector<float>& r, double ratio) {
    if (r.size() < 2) return false;
    m.widest = *std::max_element(r.begin(), r.end());
    m.narrowest = m.widest;
    for (float v : r)
        if (v > 0) m.narrowest = std::min<double>(m.narrowest, v);
    if (!(m.widest > ratio * m.narrowest)) return false;
    for (size_t c = 0; c < r.size(); ++c)
        if (r[c] > 0 && r[c] * ratio < m.widest) m.narrow.push_back(static_cast<int>(c));
    return true;
}

// Fills in the ranges of `m`, a Concat's output, from its branches' largest
// values (each measured along the axis): false when they do not differ by
// `ratio` or a branch was not measured. The narrow channels are those of the
// narrow branches.
bool branches_differ(const onnx::NodeProto& concat, const ChannelRanges& ranges, MixedScaleTensor& m, double ratio) {
    std::vector<float> maxima;
    std::vector<size_t> widths;
    for (const auto& input : concat.input()) {
        const auto it = ranges.find(input);
        if (it == ranges.end() || it->second.empty()) return false;
        maxima.push_back(*std::max_element(it->second.begin(), it->second.end()));
        widths.push_back(it->second.size());
    }
    MixedScaleTensor branches;
    if (!differ(branches, maxima, ratio)) return false;
    m.widest = branches.widest, m.narrowest = branches.narrowest;
    size_t first = 0;
    for (size_t b = 0; b < maxima.size(); first += widths[b], ++b)
        if (std::find(branches.narrow.begin(), branches.narrow.end(), static_cast<int>(b)) != branches.narrow.end())
            for (size_t c = 0; c < widths[b]; ++c) m.narrow.push_back(static_cast<int>(first + c));
    return true;
}

// The output-channel axis of a layer's weight (input 1); -1 for other ops.
int output_channel_axis(const onnx::NodeProto& node, const Tensor& weight) {
    if (!is_default_domain(node)) return -1;
    const auto& op = node.op_type();
    if (op == "Conv") return 0;
    if (op == "ConvTranspose") return 1;
    if (op == "Gemm") return int_attribute(node, "transB", 0) ? 0 : 1;
    if (op == "MatMul") return static_cast<int>(weight.shape().size()) - 1;
    return -1;
}

// The per-tensor weights of the layers computing the heads: one grid sized by
// the widest output channel can round a narrow channel's weights (a score's,
// next to an offset's) to a few steps or to zero.
void check_head_weights(const Model& model, const GraphIndex& index, DraftPlan& draft, double ratio,
                        bool per_channel_weights, std::vector<MixedScaleTensor>& out) {
    std::set<int> layers;
    auto add_producer = [&](const std::string& tensor) {
        if (const int p = index.producer(tensor); p >= 0) layers.insert(p);
    };
    for (const auto& m : out) add_producer(m.tensor);
    for (const auto& [tensor, why] : draft.kept_float) add_producer(tensor);
    for (const auto& o : model.graph().output()) add_producer(o.name());
    for (int n : layers) {
        const auto& node = model.graph().node(n);
        if (node.input_size() < 2) continue;
        const auto planned = draft.index.find(node.input(1));
        if (planned == draft.index.end()) continue;
        auto* t = &draft.tensors[planned->second];
        if (!t->constant || t->role != TensorRole::Weight || t->spec.per_channel || t->spec.block_size > 0) continue;
        const auto weight = constant_tensor(index, node.input(1));
        if (!weight || weight->type() != DataType::Float) continue;
        const int axis = output_channel_axis(node, *weight);
        if (axis < 0 || axis >= static_cast<int>(weight->shape().size())) continue;
        std::vector<float> maxima;
        for (const auto& r : channel_ranges(*weight, axis)) maxima.push_back(std::max(-r.min, r.max));
        MixedScaleTensor m;
        m.tensor = t->tensor;
        m.role = "weight";
        m.node = node_label(node);
        m.axis = axis;
        if (!differ(m, maxima, ratio)) continue;
        if (per_channel_weights && model.opset() >= 13) {
            t->spec.per_channel = true;
            t->spec.axis = axis;
            m.action = "per_channel";
        } else {
            m.advice = fmt::format(
                "output channels {} of the weight '{}' of '{}' reach at most {:.3g} where the widest reaches {:.3g}: "
                "one per-tensor grid rounds them to a few steps. To try: per_channel: true where the target allows "
                "it (opset 13 or later), or leave '{}' float (nodes_to_exclude)",
                channel_list(m.narrow), m.tensor, m.node, m.narrowest, m.widest, m.node);
        }
        out.push_back(std::move(m));
    }
}

}  // namespace

std::vector<ChannelRangeRequest> mixed_scale_candidates(const Model& model, const DraftPlan& draft) {
    const GraphIndex index(model);
    std::vector<ChannelRangeRequest> out;
    for (const auto& t : draft.tensors) {
        if (!t.observed() || !t.share_with.empty() || !t.range_from.empty()) continue;
        if (const auto axis = split_axis(model, index, t.tensor)) {
            out.push_back({t.tensor, static_cast<int>(*axis)});
            continue;
        }
        const int producer = index.producer(t.tensor);
        if (producer < 0) continue;
        const auto& node = model.graph().node(producer);
        if (!is_default_domain(node)) continue;
        if (node.op_type() == "Concat") {
            // Its branches, each measured along the concatenation's axis.
            const int axis = static_cast<int>(int_attribute(node, "axis", 1));
            out.push_back({t.tensor, axis});
            for (const auto& input : node.input())
                if (!input.empty() && !index.initializer(input) && !constant_tensor(index, input))
                    out.push_back({input, axis});
        } else if (is_conv_head(model, index, t.tensor)) {
            out.push_back({t.tensor, 1});
        }
    }
    std::set<std::string> seen;
    std::erase_if(out, [&](const ChannelRangeRequest& r) { return !seen.insert(r.tensor).second; });
    return out;
}

std::vector<MixedScaleTensor> split_mixed_scales(const Model& model, DraftPlan& draft,
                                                 const std::vector<ChannelRangeRequest>& measured,
                                                 const ChannelRanges& ranges, double ratio, bool per_channel_weights) {
    const GraphIndex index(model);
    std::vector<MixedScaleTensor> out;
    for (const auto& request : measured) {
        const auto it = ranges.find(request.tensor);
        if (it == ranges.end()) continue;
        MixedScaleTensor m;
        m.tensor = request.tensor;
        m.axis = request.axis;
        const int producer = index.producer(m.tensor);
        m.node = producer < 0 ? m.tensor : node_label(model.graph().node(producer));
        const bool concat = producer >= 0 && model.graph().node(producer).op_type() == "Concat";
        if (!concat && !is_conv_head(model, index, m.tensor) && !split_axis(model, index, m.tensor))
            continue;  // measured as a Concat's branch only
        if (concat) {
            // Channels of one feature map differ anyway (a ReLU's nearly dead ones): a
            // concatenation is mixed where its branches are.
            if (!branches_differ(model.graph().node(producer), ranges, m, ratio)) continue;
        } else if (!differ(m, it->second, ratio)) {
            continue;
        }
        const auto steps = std::max(1.0, std::round(255.0 * m.narrowest / m.widest));
        if (split_axis(model, index, m.tensor) == request.axis) {
            m.action = "split";
            split_at_readers(draft, m.tensor);
            draft.kept_float.emplace_back(
                m.tensor, fmt::format("its channels differ in scale by {:.0f}x (channels {} reach {:.3g}, the widest "
                                      "{:.3g}): each Slice/Split reading it is quantized on its own range instead",
                                      m.widest / m.narrowest, channel_list(m.narrow), m.narrowest, m.widest));
        } else {
            m.advice = fmt::format(
                "channels {} of '{}' reach at most {:.3g} where the widest reaches {:.3g}: one 8-bit grid leaves them "
                "about {:.0f} steps. To try: give it 16 bits (overrides: [{{match: {{name: \"{}\"}}, set: "
                "{{activation_type: QInt16}}}}]) or leave it float (nodes_to_exclude: [\"{}\"]), or cut it with a "
                "Slice per group of channels, which vaiq then quantizes each on its own; the accurate recipes "
                "raise it first",
                channel_list(m.narrow), m.tensor, m.narrowest, m.widest, steps, m.node, m.node);
        }
        out.push_back(std::move(m));
    }
    check_head_weights(model, index, draft, ratio, per_channel_weights, out);
    return out;
}

}  // namespace vaiq
