#include "pipeline/planner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "recipe/defaults.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/log.hpp"
#include "vaiq/text.hpp"

namespace vaiq {

const PlannedTensor* DraftPlan::find(const std::string& tensor) const {
    auto it = index.find(tensor);
    return it == index.end() ? nullptr : &tensors[it->second];
}

std::vector<std::string> DraftPlan::observed() const {
    std::set<std::string> out;
    for (const auto& t : tensors)
        if (t.observed() && t.share_with.empty()) out.insert(t.range_from.empty() ? t.tensor : t.range_from);
    return {out.begin(), out.end()};
}

namespace {

// Ops that move data without changing values: the output takes the input's
// parameters, and only when the input is quantized already (or forced).
const std::set<std::string, std::less<>> kSameAsInput = {
    "Reshape", "Transpose", "Squeeze", "Unsqueeze",      "Flatten", "AveragePool",  "MaxPool",     "Slice",
    "Resize",  "Split",     "Gather",  "GatherElements", "Pad",     "DepthToSpace", "SpaceToDepth"};
const std::set<std::string, std::less<>> kRemovableActivations = {"Relu", "Clip"};
const std::set<std::string, std::less<>> kNormalizations = {"InstanceNormalization", "LayerNormalization",
                                                            "BatchNormalization"};

// A node's settings, its overrides applied, typed once.
struct NodeSettings {
    QuantRequest request;          ///< what they ask of the target, power_of_two from the calibrator
    std::string calibrate_method;  ///< the calibrator plugin
    bool unsigned_relu = false;    ///< extra_options.UseUnsignedReLU
};

class Planner {
  public:
    Planner(const RunSettings& settings, const Model& model, const Target& target, CalibratorSet& calibrators)
        : settings_(settings), model_(model), target_(target), calibrators_(calibrators), index_(model) {
        for (const auto& [tensor, g] : settings.given_params)
            if (index_.producer(tensor) < 0 && !index_.initializer(tensor) && !index_.is_graph_input(tensor))
                throw InputError(
                    fmt::format("{}: {} names '{}', which the model does not have", g.origin, g.key, tensor));
    }

    DraftPlan run(const std::vector<NodeDecision>& decisions) {
        const auto& graph = model_.graph();
        std::vector<const NodeDecision*> by_node(graph.node_size(), nullptr);
        node_settings_.resize(graph.node_size());
        for (const auto& d : decisions) {
            by_node[d.node] = &d;
            if (d.quantized) node_settings_[d.node] = node_settings(d);
        }
        find_absorbed(by_node);
        for (int n : topological_order(graph)) {
            const auto* d = by_node[n];
            if (d && d->quantized) plan_node(graph.node(n), *d, node_settings_[n]);
        }
        for (const auto& [tensor, g] : settings_.given_params)
            if (!plan_.find(tensor) && g.origin != RunSettings::kSharedParamsOrigin)
                log_warn("{}: '{}' is given quantization parameters, but no quantized node reads or writes it",
                         g.origin, tensor);
        return std::move(plan_);
    }

  private:
    NodeSettings node_settings(const NodeDecision& d) const {
        Options config = settings_.node_defaults;
        for (const auto& [key, setting] : d.settings) config.set(key, setting.value);
        NodeSettings out;
        out.request = quant_request(config);
        out.calibrate_method = defaults::calibrator_plugin(config.get_string("calibrate_method"));
        out.request.power_of_two = calibrators_.get(out.calibrate_method).scale_form() == ScaleForm::PowerOfTwo;
        out.unsigned_relu = config.get_bool("extra_options.UseUnsignedReLU");
        return out;
    }

    // An initializer that is also a graph input can be fed a new value: not a constant.
    bool is_constant(const std::string& name) const {
        return index_.initializer(name) != nullptr && !index_.is_graph_input(name);
    }

    // Relu/Clip inputs that Q makes redundant: with asymmetric activations the
    // quantized output range starts at the clip, so the producer's output needs
    // no pair of its own (ONNX Runtime removes the activation; keeping it is
    // equivalent and its kernels fuse DQ-Conv-Relu-Q all the same).
    // A device that computes an activation inside the op before it (the NPU's
    // Conv+Relu) needs no pair between them either, whatever the symmetry.
    void find_absorbed(const std::vector<const NodeDecision*>& by_node) {
        const auto& graph = model_.graph();
        for (int n = 0; n < graph.node_size(); ++n) {
            const auto& node = graph.node(n);
            const auto* d = by_node[n];
            if (!d || !d->quantized || node.input_size() == 0) continue;
            const auto& in = node.input(0);
            const int producer = index_.producer(in);
            if (producer < 0 || index_.consumers(in).size() != 1 || index_.is_graph_output(in)) continue;
            const auto* pd = by_node[producer];
            if (!pd || !pd->quantized ||
                settings_.ops_without_output_quantization.count(graph.node(producer).op_type()))
                continue;
            const auto& config = node_settings_[n];
            if (target_.fuses(graph.node(producer), node, index_, config.request)) {
                absorbed_.insert(in);
                continue;
            }
            if (!kRemovableActivations.count(node.op_type()) || kSameAsInput.count(graph.node(producer).op_type()))
                continue;
            const auto spec = activation_spec(node, config, true);
            if (!spec.symmetric)
                absorbed_.insert(in);
            else
                inherit_[in] = node.output(0);
        }
    }

    QuantSpec activation_spec(const onnx::NodeProto& node, const NodeSettings& config, bool output) const {
        auto spec = target_.default_spec(TensorRole::Activation, config.request);
        if (output && kRemovableActivations.count(node.op_type()) && config.unsigned_relu) spec.symmetric = false;
        return spec;
    }

    PlannedTensor* add(const std::string& tensor, const onnx::NodeProto& node, TensorRole role, const QuantSpec& spec,
                       const NodeSettings& config) {
        if (tensor.empty() || absorbed_.count(tensor)) return nullptr;
        if (auto it = plan_.index.find(tensor); it != plan_.index.end()) return nullptr;  // the first request wins
        // Shapes, indices, axes: not values to quantize; a float16 model's weights are, weight-only.
        if (const auto* init = index_.initializer(tensor);
            init && init->data_type() != onnx::TensorProto::FLOAT &&
            !(settings_.weight_only && init->data_type() == onnx::TensorProto::FLOAT16))
            return nullptr;
        PlannedTensor t;
        t.tensor = tensor;
        t.role = role;
        t.spec = spec;
        t.constant = is_constant(tensor);
        t.node = node.name().empty() ? node.op_type() : node.name();
        if (!is_integer(spec.type) && !is_float8(spec.type)) {
            // Float16 types round to their own precision: there is no range to calibrate.
            t.fixed_range = TensorRange{};
        } else {
            t.calibrate_method = config.calibrate_method;
            t.calibrator = &calibrators_.get(t.calibrate_method);
            // A power-of-two calibrator gives every tensor of the node a power-of-two
            // scale (an int32 bias gets one too: input scale x weight scale).
            if (t.calibrator->scale_form() == ScaleForm::PowerOfTwo &&
                !(role == TensorRole::Bias && spec.type == QuantType::QInt32))
                t.spec.power_of_two = true;
        }
        if (auto it = inherit_.find(tensor); it != inherit_.end()) t.range_from = it->second;
        if (role == TensorRole::Activation && !t.constant && is_integer(t.spec.type)) set_run_time_params(t);
        if (t.observed() && t.range_from.empty()) t.saturates_outside = saturation(tensor);
        plan_.index[tensor] = plan_.tensors.size();
        plan_.tensors.push_back(std::move(t));
        return &plan_.tensors.back();
    }

    // An activation with given parameters takes them; without, under `static:
    // false`, DynamicQuantizeLinear computes them at run time (uint8 only).
    void set_run_time_params(PlannedTensor& t) const {
        if (auto it = settings_.given_params.find(t.tensor); it != settings_.given_params.end()) {
            const auto& g = it->second;
            const auto [qmin, qmax] = integer_range(t.spec.type);
            if (g.zero_point < qmin || g.zero_point > qmax)
                throw InputError(fmt::format("{}: the zero point {} of '{}' is outside {}'s [{}, {}]", g.origin,
                                             g.zero_point, t.tensor, quant_type_name(t.spec.type), qmin, qmax));
            t.given = QuantParams{t.spec.type, {g.scale}, {g.zero_point}, -1};
            t.spec.power_of_two = false;
            return;
        }
        if (settings_.static_quantization) return;
        if (t.spec.type != QuantType::QUInt8)
            throw InputError(fmt::format("static: false quantizes activations at run time with DynamicQuantizeLinear, "
                                         "which writes uint8; '{}' is planned as {} (set activation_type: QUInt8)",
                                         t.tensor, quant_type_name(t.spec.type)));
        t.spec.dynamic = true;
        t.spec.symmetric = false;
        t.spec.power_of_two = false;
    }

    // The interval outside which the tensor's only reader saturates: a
    // HardSigmoid(alpha x + beta) clips to 0 below -beta/alpha and to 1 above
    // (1 - beta)/alpha, so values beyond them need no range.
    std::optional<TensorRange> saturation(const std::string& tensor) const {
        const auto& uses = index_.consumers(tensor);
        if (uses.size() != 1 || uses[0].slot != 0 || index_.is_graph_output(tensor)) return std::nullopt;
        const auto& reader = model_.graph().node(uses[0].node);
        if (reader.op_type() != "HardSigmoid" || !is_default_domain(reader)) return std::nullopt;
        const float alpha = float_attribute(reader, "alpha", 0.2f), beta = float_attribute(reader, "beta", 0.5f);
        if (!(alpha > 0.0f)) return std::nullopt;
        return TensorRange{-beta / alpha, (1.0f - beta) / alpha};
    }

    // An input read as an activation; an initializer there is stored quantized
    // with the activation type, per tensor.
    void add_activation(const std::string& tensor, const onnx::NodeProto& node, const NodeSettings& config) {
        const auto spec = activation_spec(node, config, false);
        add(tensor, node, is_constant(tensor) ? TensorRole::Weight : TensorRole::Activation, spec, config);
    }

    void add_outputs(const onnx::NodeProto& node, const NodeSettings& config) {
        if (settings_.ops_without_output_quantization.count(node.op_type())) return;
        for (const auto& out : node.output()) {
            auto* t = add(out, node, TensorRole::Activation, activation_spec(node, config, true), config);
            if (t && node.op_type() == "Softmax") t->fixed_range = TensorRange{0.0f, 1.0f};
        }
    }

    // `axis`: the channel axis for per-channel weights; `blocked_axis`: the axis
    // block_size runs along (-1: the op's weights are not quantized in blocks).
    PlannedTensor* add_weight(const std::string& tensor, const onnx::NodeProto& node, const NodeSettings& config,
                              int axis, int blocked_axis = -1) {
        if (!is_constant(tensor)) {
            add_activation(tensor, node, config);
            return nullptr;
        }
        auto spec = target_.default_spec(TensorRole::Weight, config.request);
        if (spec.block_size == -1 && blocked_axis >= 0) {
            // One block spanning the whole axis: a scale per channel (ModelOpt's and ONNX Runtime's -1).
            const auto* init = index_.initializer(tensor);
            spec.block_size = std::max<int64_t>(init->dims(blocked_axis), 1);
        } else if (spec.block_size < 0) {
            throw InputError(fmt::format("block_size {} is not a block size (-1: one block per channel)",
                                         spec.block_size));
        }
        if (spec.block_size > 0 && blocked_axis >= 0) {
            if (spec.block_size < 2)
                throw InputError(fmt::format("block_size {} is too small (16 to 256 are usual)", spec.block_size));
            spec.per_channel = false;
            spec.axis = blocked_axis;
            return add(tensor, node, TensorRole::Weight, spec, config);
        }
        spec.block_size = 0;
        if (quant_bits(spec.type) == 4 && is_integer(spec.type) && !settings_.weight_only)
            throw InputError(fmt::format("weight_type {} is for weight-only quantization of MatMul (weight_only: "
                                         "true, block_size)",
                                         quant_type_name(spec.type)));
        if (spec.per_channel) {
            if (axis < 0)
                spec.per_channel = false;
            else {
                if (model_.opset() < 13)
                    throw InputError(
                        fmt::format("per_channel needs opset 13 or later for DequantizeLinear's axis, and "
                                    "the model is opset {}; convert it first (vaiq convert-opset)",
                                    model_.opset()));
                spec.axis = axis;
            }
        }
        return add(tensor, node, TensorRole::Weight, spec, config);
    }

    void add_bias(const onnx::NodeProto& node, int slot, const NodeSettings& config) {
        if (node.input_size() <= slot || node.input(slot).empty()) return;
        const auto& bias = node.input(slot);
        const auto* weight = plan_.find(node.input(1));
        // Block float weights keep a float bias: it is added to the wide sum, and has no block.
        if (!config.request.quantize_bias || !is_constant(bias) || is_block_float(config.request.weight_type)) return;
        if (!plan_.find(node.input(0)) || !weight || !weight->constant) {
            add_activation(bias, node, config);
            return;
        }
        // A scale known only at run time cannot make an int32 bias: it stays float.
        if (plan_.find(node.input(0))->spec.dynamic) return;
        // An int32 bias takes input scale x weight scale; other types are quantized from their data.
        auto* t = add(bias, node, TensorRole::Bias, target_.default_spec(TensorRole::Bias, config.request), config);
        if (t && t->spec.type == QuantType::QInt32) {
            t->bias_input = node.input(0);
            t->bias_weight = node.input(1);
        }
    }

    int per_channel_axis(const std::string& op, int fallback) const {
        auto it = settings_.per_channel_axes.find(op);
        return it == settings_.per_channel_axes.end() ? fallback : it->second;
    }

    int rank_of(const std::string& tensor) const {
        const auto* init = index_.initializer(tensor);
        return init ? init->dims_size() : 0;
    }

    void plan_node(const onnx::NodeProto& node, const NodeDecision& d, const NodeSettings& config) {
        const auto& op = node.op_type();
        if (settings_.weight_only) {
            // Only constant weights, activations stay float: MatMul's B blocked along K (its rows), an
            // embedding table (Gather's data, gathered along axis 0) blocked along its rows' values.
            if (op == "MatMul" && is_constant(node.input(1))) {
                const int rank = rank_of(node.input(1));
                add_weight(node.input(1), node, config, std::max(rank - 1, 0), std::max(rank - 2, 0));
            } else if (op == "Gather" && is_constant(node.input(0)) && rank_of(node.input(0)) >= 2 &&
                       int_attribute(node, "axis", 0) == 0) {
                const int rank = rank_of(node.input(0));
                add_weight(node.input(0), node, config, 0, rank - 1);
            } else {
                plan_.skipped.emplace_back(d.name, "weight_only quantizes the constant weights of MatMul and the "
                                                   "tables of Gather along axis 0 only");
            }
            return;
        }
        if (op == "Conv" || op == "ConvTranspose") {
            add_activation(node.input(0), node, config);
            add_weight(node.input(1), node, config, per_channel_axis(op, op == "Conv" ? 0 : 1));
            add_bias(node, 2, config);
            add_outputs(node, config);
        } else if (op == "Gemm") {
            add_activation(node.input(0), node, config);
            add_weight(node.input(1), node, config, per_channel_axis(op, int_attribute(node, "transB", 0) ? 0 : 1));
            if (float_attribute(node, "beta", 1.0f) == 1.0f)
                add_bias(node, 2, config);
            else if (node.input_size() > 2)
                add_activation(node.input(2), node, config);
            add_outputs(node, config);
        } else if (op == "MatMul") {
            if (settings_.matmul_const_b_only && !is_constant(node.input(1))) {
                plan_.skipped.emplace_back(d.name, "MatMulConstBOnly and B is not a constant");
                return;
            }
            add_activation(node.input(0), node, config);
            const int rank = rank_of(node.input(1));
            add_weight(node.input(1), node, config, per_channel_axis(op, std::max(rank - 1, 0)), std::max(rank - 2, 0));
            add_outputs(node, config);
        } else if (op == "LSTM") {
            // Only ONNX Runtime's DynamicQuantizeLSTM runs an LSTM on integers: its input is
            // quantized inside, at run time, and its outputs are float.
            if (settings_.static_quantization) {
                plan_.skipped.emplace_back(d.name, "an LSTM is quantized only dynamically (static: false)");
                return;
            }
            add_activation(node.input(0), node, config);
            for (int slot : {1, 2}) add_weight(node.input(slot), node, config, per_channel_axis(op, 1));
        } else if (op == "Attention" && node.domain() == "com.microsoft") {
            // QAttention, as ONNX Runtime's dynamic quantizer writes it: the input quantized at
            // run time, the packed weights per tensor or per column, in 7 bits (reduce_range) as
            // it forces for this op; the output is float.
            if (settings_.static_quantization) {
                plan_.skipped.emplace_back(d.name, "an Attention is quantized only dynamically (static: false)");
                return;
            }
            add_activation(node.input(0), node, config);
            if (auto* w = add_weight(node.input(1), node, config, per_channel_axis(op, 1))) w->spec.reduce_range = true;
        } else if (kNormalizations.count(op)) {
            add_activation(node.input(0), node, config);
            if (node.input_size() > 1) add_weight(node.input(1), node, config, -1);
            if (op != "BatchNormalization") add_bias(node, 2, config);
            add_outputs(node, config);
        } else if (index_.marked(node, kDeviceRescale)) {
            // A device's own rescale of the op before it: its factor is not a weight.
            add_activation(node.input(0), node, config);
            add_outputs(node, config);
        } else if (kRemovableActivations.count(op)) {
            add_activation(node.input(0), node, config);  // not Clip's min and max
            add_outputs(node, config);
        } else if (kSameAsInput.count(op)) {
            const auto& in = node.input(0);
            if (!plan_.find(in) && !settings_.force_quantize_no_input_check) {
                plan_.skipped.emplace_back(d.name, fmt::format("its input '{}' is not quantized (set "
                                                               "ForceQuantizeNoInputCheck to quantize it anyway)",
                                                               in));
                return;
            }
            add_activation(in, node, config);
            if (!plan_.find(in)) return;
            if (settings_.ops_without_output_quantization.count(op)) return;
            for (const auto& out : node.output()) {
                auto* t = add(out, node, TensorRole::Activation, plan_.find(in)->spec, config);
                if (t) t->share_with = in;
            }
        } else {
            // Every other op: each float input and output on its own parameters.
            for (const auto& in : node.input()) add_activation(in, node, config);
            add_outputs(node, config);
        }
    }

    const RunSettings& settings_;
    const Model& model_;
    const Target& target_;
    CalibratorSet& calibrators_;
    GraphIndex index_;
    std::vector<NodeSettings> node_settings_;  ///< by node, for the quantized ones
    std::set<std::string> absorbed_;
    std::map<std::string, std::string> inherit_;
    DraftPlan plan_;
};

}  // namespace

const Calibrator& CalibratorSet::get(const std::string& method) {
    auto it = instances_.find(method);
    if (it == instances_.end()) it = instances_.emplace(method, factory_(method)).first;
    return *it->second;
}

DraftPlan plan_tensors(const RunSettings& settings, const Model& model, const Target& target,
                       const std::vector<NodeDecision>& decisions, CalibratorSet& calibrators) {
    return Planner(settings, model, target, calibrators).run(decisions);
}

void keep_float(DraftPlan& plan, const std::string& tensor, const std::string& reason, bool sharers_on_own_range) {
    plan.kept_float.emplace_back(tensor, reason);
    if (!plan.find(tensor)) return;
    const auto before = plan.tensors;
    drop_tensors(plan, {tensor});
    if (!sharers_on_own_range) return;
    // Those that shared its parameters come back from what dropping it took away.
    for (auto t : before) {
        if (t.tensor == tensor || plan.find(t.tensor)) continue;
        if (t.share_with == tensor) t.share_with.clear();
        plan.index[t.tensor] = plan.tensors.size();
        plan.tensors.push_back(std::move(t));
    }
}

void drop_tensors(DraftPlan& plan, const std::vector<std::string>& tensors, bool ranges_observed) {
    std::set<std::string> dropped(tensors.begin(), tensors.end());
    // Anything that takes its parameters from a dropped tensor goes too.
    for (bool changed = true; changed;) {
        changed = false;
        for (const auto& t : plan.tensors) {
            if (dropped.count(t.tensor)) continue;
            for (const auto* dep : {&t.share_with, &t.bias_input, &t.bias_weight})
                if (!dep->empty() && dropped.count(*dep)) {
                    dropped.insert(t.tensor);
                    changed = true;
                }
        }
    }
    std::vector<PlannedTensor> kept;
    for (auto& t : plan.tensors) {
        if (dropped.count(t.tensor)) continue;
        if (!ranges_observed && !t.range_from.empty() && dropped.count(t.range_from)) t.range_from.clear();
        kept.push_back(std::move(t));
    }
    plan.tensors = std::move(kept);
    plan.index.clear();
    for (size_t i = 0; i < plan.tensors.size(); ++i) plan.index[plan.tensors[i].tensor] = i;
}

namespace {

// ONNX Runtime quantizes a float weight itself (int8, per tensor: its
// WeightBiasQuantization optimization) when the Conv, ConvTranspose or Gemm
// reading it takes a dequantized input and feeds, through Relu/Clip only, a
// QuantizeLinear. A weight left float keeps its values there only when the
// layer's output is left float too: these are the tensors on that path.
std::vector<std::string> outputs_of_float_weight_layers(const Model& model, const std::set<std::string>& weights) {
    std::vector<std::string> out;
    const GraphIndex index(model);
    for (const auto& node : model.graph().node()) {
        const auto& op = node.op_type();
        if (!is_default_domain(node) || (op != "Conv" && op != "ConvTranspose" && op != "Gemm") ||
            node.input_size() < 2 || !weights.count(node.input(1)) || node.output_size() < 1)
            continue;
        for (std::string t = node.output(0);;) {
            out.push_back(t);
            const auto& uses = index.consumers(t);
            if (uses.size() != 1) break;
            const auto& next = model.graph().node(uses[0].node);
            if (next.op_type() != "Relu" && next.op_type() != "Clip") break;
            t = next.output(0);
        }
    }
    return out;
}

}  // namespace

// Changes the types of the raised groups, then drops them when they are to stay float.
DraftPlan raise_tensors(const Model& model, const DraftPlan& draft, const std::set<std::string>& raised,
                        const Precision& precision, size_t* count) {
    const bool to_float = precision.keep_float;
    auto root = [&](std::string t) {
        for (const PlannedTensor* p = draft.find(t); p && !p->share_with.empty(); p = draft.find(t)) t = p->share_with;
        return t;
    };
    std::set<std::string> roots;
    for (const auto& t : raised) roots.insert(root(t));
    if (to_float) {
        std::set<std::string> weights;
        for (const auto& t : draft.tensors)
            if (t.role == TensorRole::Weight && roots.count(root(t.tensor))) weights.insert(t.tensor);
        for (const auto& t : outputs_of_float_weight_layers(model, weights))
            if (draft.find(t)) roots.insert(root(t));
    }
    DraftPlan out = draft;
    std::vector<std::string> group;
    for (auto& t : out.tensors) {
        if (t.role == TensorRole::Bias || !roots.count(root(t.tensor))) continue;
        group.push_back(t.tensor);
        t.spec.type = t.role == TensorRole::Weight ? precision.weight_type : precision.activation_type;
    }
    if (count) *count = group.size();
    if (to_float) drop_tensors(out, group, /*ranges_observed=*/true);
    return out;
}

}  // namespace vaiq
