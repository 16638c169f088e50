// The mixed_scales algorithm (Plan stage; mixed_scale_ratio, mixed_scale_batches).
// Tensors whose channels live on different scales: a detector head that packs
// score logits of a few units next to box offsets of hundreds in one tensor,
// a Concat of differently ranged branches. One per-tensor grid is sized by the
// widest channel, and the narrow ones keep only a few of its steps (M-LSD's
// centre scores on the grid of its ±480 displacements: every pixel a "peak").
// Found from the float model's per-channel ranges on the first calibration
// batches; where the graph already splits such a tensor (every reader is a
// Slice or Split), each piece is quantized on its own grid and the tensor stays
// float; elsewhere the tensor is named with what to do.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <set>

#include "vaiq/algorithm.hpp"
#include "vaiq/error.hpp"
#include "vaiq/fold.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/log.hpp"
#include "vaiq/plugin.hpp"

namespace vaiq {

namespace {

/// One tensor whose channel ranges differ by more than the threshold.
struct MixedScaleTensor {
    std::string tensor;
    std::string role = "activation";  ///< or "weight": a head's weight planned per tensor
    std::string node;                 ///< its producer (for a weight: the layer reading it)
    int axis = 1;                     ///< the channel axis measured
    double widest = 0;                ///< the largest |value| of its widest channel
    double narrowest = 0;             ///< that of its narrowest channel that is not constant zero
    std::vector<int> narrow;          ///< channels below widest / threshold
    /// What was done: "split" (each Slice/Split reading it quantized on its own range,
    /// the tensor float), "per_channel" (a weight), or "" (named, with `advice`).
    std::string action;
    std::string advice;

    nlohmann::json to_json() const;
};

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
    return fmt::format("{}", fmt::join(shown, ", ")) +
           (channels.size() > 8 ? fmt::format(" and {} more", channels.size() - 8) : "");
}

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
// next to an offset's) to a few steps or to zero. Quantized per channel where
// the run allows it, else named.
void check_head_weights(AlgorithmContext& context, const GraphIndex& index, double ratio,
                        std::vector<MixedScaleTensor>& out) {
    const Model& model = context.model();
    const auto draft = context.draft();
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
        const auto t = std::find_if(draft.tensors.begin(), draft.tensors.end(),
                                    [&](const DraftTensor& d) { return d.tensor == node.input(1); });
        if (t == draft.tensors.end() || !t->constant || t->role != TensorRole::Weight || t->spec.per_channel ||
            t->spec.block_size > 0)
            continue;
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
        if (context.set_per_channel(m.tensor, axis)) {
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

// The planned activations worth measuring: those the graph splits (every
// reader a Slice or Split), the outputs of Concat, and graph outputs computed
// by a Conv or ConvTranspose (a head), each with its channel axis.
std::vector<ChannelRangeRequest> mixed_scale_candidates(const Model& model, const GraphIndex& index,
                                                        const Draft& draft) {
    std::vector<ChannelRangeRequest> out;
    for (const auto& t : draft.tensors) {
        if (!t.own_range) continue;
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

// Of the `measured` candidates, those whose widest channel exceeds `ratio` times
// their narrowest non-zero one. Those the graph splits leave the plan: each
// Slice/Split output is then quantized on its own range, and whatever took its
// parameters from them keeps taking them. Then the heads' weights.
std::vector<MixedScaleTensor> split_mixed_scales(AlgorithmContext& context, const GraphIndex& index,
                                                 const std::vector<ChannelRangeRequest>& measured,
                                                 const ChannelRanges& ranges, double ratio) {
    const Model& model = context.model();
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
            context.keep_float(
                m.tensor,
                fmt::format("its channels differ in scale by {:.0f}x (channels {} reach {:.3g}, the widest "
                            "{:.3g}): each Slice/Split reading it is quantized on its own range instead",
                            m.widest / m.narrowest, channel_list(m.narrow), m.narrowest, m.widest),
                /*sharers_on_own_range=*/true);
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
    check_head_weights(context, index, ratio, out);
    return out;
}

class MixedScales final : public Algorithm {
  public:
    AlgorithmStage stage() const override { return AlgorithmStage::Plan; }
    void configure(const Options& options) override {
        ratio_ = options.get_float("mixed_scale_ratio");
        batches_ = options.get_int("mixed_scale_batches");
        if (batches_ < 0) throw InputError("mixed_scale_batches must be 0 or more");
    }
    void run(AlgorithmContext& context) override {
        if (!(ratio_ > 0)) return;
        const GraphIndex index(context.model());
        const auto requests = batches_ > 0 ? mixed_scale_candidates(context.model(), index, context.draft())
                                           : std::vector<ChannelRangeRequest>{};
        nlohmann::json section = {{"tensors", nlohmann::json::array()}};
        ChannelRanges ranges;
        try {
            if (!requests.empty())
                ranges = context.channel_ranges(context.model(), requests, static_cast<size_t>(batches_));
        } catch (const InputError& e) {  // a check, like a diagnosis, never fails the run
            if (std::string(e.what()).find("input '") != std::string::npos) {
                log_debug("the channel-scale check is skipped: {}", e.what());  // calibration reports the data
            } else {
                log_warn("the channel-scale check could not measure the model, and is skipped: {}", e.what());
                section["unavailable"] = e.what();
            }
        }
        report(context, split_mixed_scales(context, index, requests, ranges, ratio_), section);
    }

  private:
    // Logs, notes and reports what was found; marks the activations left on one grid.
    void report(AlgorithmContext& context, const std::vector<MixedScaleTensor>& found, nlohmann::json& section) {
        constexpr size_t kWarned = 3;  // a network of many concatenations names the rest in one line
        size_t warned = 0;
        std::vector<std::string> unwarned;
        for (const auto& m : found) {
            section["tensors"].push_back(m.to_json());
            const double apart = m.widest / m.narrowest;
            if (m.action == "split") {  // plan.kept_float says why
                log_info(
                    "'{}' holds channels on scales {:.0f}x apart: it stays float and each Slice/Split reading it is "
                    "quantized on its own range",
                    m.tensor, apart);
                continue;
            }
            std::string what;
            if (m.action == "per_channel") {
                what = fmt::format("holds output channels on scales {:.0f}x apart: quantized per channel", apart);
                log_info("the weight '{}' of '{}' {}", m.tensor, m.node, what);
            } else {
                what = fmt::format("holds channels on scales {:.0f}x apart: {}", apart, m.advice);
                if (warned++ < kWarned)
                    log_warn("'{}' {}", m.tensor, what);
                else
                    unwarned.push_back(m.tensor);
                if (m.role == "activation") context.mark_mixed_scales(m.tensor);
            }
            context.note(m.tensor, what);
        }
        if (!unwarned.empty())
            log_warn(
                "{} more tensors hold channels on scales {}x or more apart, each with what to try in the report's "
                "notes: {}{}",
                unwarned.size(), ratio_,
                fmt::join(unwarned.begin(), unwarned.begin() + std::min<std::ptrdiff_t>(6, std::ssize(unwarned)), ", "),
                unwarned.size() > 6 ? ", ..." : "");
        context.report(std::move(section));
    }

    double ratio_ = 16;
    int64_t batches_ = 4;
};

constexpr vaiq_option_descriptor kOptions[] = {
    {"mixed_scale_ratio", VAIQ_OPTION_FLOAT, "16",
     "A tensor whose widest channel exceeds this many times its narrowest is on mixed scales; 0 turns the check "
     "off."},
    {"mixed_scale_batches", VAIQ_OPTION_INT, "4", "Calibration batches measured (one float run of each)."},
};

}  // namespace

}  // namespace vaiq

VAIQ_PLUGINS(vaiq::enabled_by(
    vaiq::describe<vaiq::MixedScales>("mixed_scales", "1.0.0",
                                      "Tensors whose channels live on scales far apart: split where the graph splits "
                                      "them, heads' weights per channel, the rest named with what to do",
                                      vaiq::kOptions),
    "mixed_scale_ratio"))
