#include "runtime/layout.hpp"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "runtime/qdq_fusion.hpp"
#include "vaiq/fold.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/patterns.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq::runtime {

namespace {

const std::vector<int64_t> kToNhwc{0, 2, 3, 1};
const std::vector<int64_t> kToNchw{0, 3, 1, 2};

// Elementwise ops whose data input 0 may be in any layout (other inputs must
// be scalars or absent).
const std::set<std::string> kUnary = {
    "Relu",     "Clip",     "LeakyRelu",      "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu",
    "Selu",     "Softplus", "Softsign",       "Exp",     "Neg",         "Abs",       "Sqrt", "Erf",
    "Identity", "Celu",     "ThresholdedRelu"};
// Elementwise binary ops: fine when both inputs share a layout, or one is a scalar.
const std::set<std::string> kBinary = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Sum"};

// The data inputs of an elementwise op that runs in any layout when its other
// inputs are scalars (per-tensor quantization parameters); empty for other ops.
std::vector<int> elementwise_inputs(const onnx::NodeProto& node) {
    const auto& op = node.op_type();
    if (is_default_domain(node)) {
        if (kUnary.count(op) || op == "QuantizeLinear" || op == "DequantizeLinear") return {0};
        if (kBinary.count(op) && node.input_size() == 2) return {0, 1};
    } else if (node.domain() == "com.microsoft") {
        if ((op == "QLinearAdd" || op == "QLinearMul") && node.input_size() >= 7) return {0, 3};
        if (op == "QLinearLeakyRelu" || op == "QLinearSigmoid") return {0};
    } else if (node.domain() == kInternalDomain && op == "HardSwish") {
        return {0};
    } else if (node.domain() == kInternalDomain && op == "PowerOfTwoQLinearAdd") {
        return {0, 3};
    } else if (node.domain() == kInternalDomain && op == "LookupTable" && int_attribute(node, "rank", 0) <= 4) {
        return {0};  // a least rank of up to 4 leaves the 4-D tensors layouts move as they are
    }
    return {};
}

std::vector<int64_t> perm_of(const onnx::NodeProto& node) {
    for (const auto& a : node.attribute())
        if (a.name() == "perm") return {a.ints().begin(), a.ints().end()};
    return {};
}

bool is_transpose(const onnx::NodeProto& node, const std::vector<int64_t>& perm) {
    return node.op_type() == "Transpose" && is_default_domain(node) && perm_of(node) == perm;
}

int64_t attribute_count(const onnx::NodeProto& node, const std::string& name) {
    for (const auto& a : node.attribute())
        if (a.name() == name) return a.ints_size();
    return -1;
}

onnx::NodeProto make_transpose(const std::string& in, const std::string& out, const std::vector<int64_t>& perm,
                               const std::string& name) {
    onnx::NodeProto t;
    t.set_op_type("Transpose");
    t.set_name(name);
    t.add_input(in);
    t.add_output(out);
    set_attribute(t, "perm", perm);
    return t;
}

// Tensors known to hold one element: scalar initializers and Constant nodes.
std::set<std::string> scalar_constants(const onnx::GraphProto& graph) {
    std::set<std::string> out;
    auto one_element = [](const onnx::TensorProto& t) {
        int64_t n = 1;
        for (auto d : t.dims()) n *= d;
        return n == 1;
    };
    for (const auto& init : graph.initializer())
        if (one_element(init)) out.insert(init.name());
    for (const auto& node : graph.node()) {
        if (node.op_type() != "Constant" || !is_default_domain(node) || node.output_size() != 1) continue;
        for (const auto& a : node.attribute())
            if ((a.name() == "value" && one_element(a.t())) || a.name() == "value_float" || a.name() == "value_int")
                out.insert(node.output(0));
    }
    return out;
}

// Step 1: Conv and 2-D pools run in NHWC between a pair of transposes.
bool wrap_nhwc_ops(onnx::GraphProto& graph, UniqueNames& names) {
    const GraphIndex index(graph);
    google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
    bool changed = false;
    for (const auto& node : graph.node()) {
        bool wrap = false;
        if (is_default_domain(node) && node.op_type() == "Conv" && node.input_size() >= 2) {
            // A 2-D convolution with constant weights: stored, or the DequantizeLinear of
            // stored ones (a QDQ Conv left in float, as int8 pairs are on x86).
            const auto* w = index.initializer(node.input(1));
            const int p = index.producer(node.input(1));
            if (!w && p >= 0 && graph.node(p).op_type() == "DequantizeLinear" && is_default_domain(graph.node(p)))
                w = index.initializer(graph.node(p).input(0));
            wrap = w && w->dims_size() == 4;
        } else if (is_default_domain(node) && node.op_type() == "QLinearConv" && node.input_size() >= 8) {
            // Channels-last, as oneDNN's kernels work (int8 ones, or float ones on CPUs without exact int8).
            const auto* w = index.initializer(node.input(3));
            wrap = w && w->dims_size() == 4;
        } else if (is_default_domain(node) && (node.op_type() == "MaxPool" || node.op_type() == "AveragePool")) {
            wrap = attribute_count(node, "kernel_shape") == 2 && (node.output_size() < 2 || node.output(1).empty());
        }
        if (!wrap) {
            *nodes.Add() = node;
            continue;
        }
        const std::string in_nhwc = names.fresh(node.input(0) + "_nhwc");
        const std::string out_nhwc = names.fresh(node.output(0) + "_nhwc");
        *nodes.Add() = make_transpose(node.input(0), in_nhwc, kToNhwc, names.fresh(node.name() + "_to_nhwc"));
        onnx::NodeProto inner = node;
        inner.set_op_type("Nhwc" + node.op_type());
        inner.set_domain(kInternalDomain);
        inner.set_input(0, in_nhwc);
        inner.set_output(0, out_nhwc);
        *nodes.Add() = inner;
        *nodes.Add() = make_transpose(out_nhwc, node.output(0), kToNchw, names.fresh(node.name() + "_to_nchw"));
        changed = true;
    }
    graph.mutable_node()->Swap(&nodes);
    return changed;
}

// An op that runs on channels-last values as it runs on channels-first ones
// once `adapt` has rewritten it: which inputs are its data, whether all of them
// must come channels-last, and whether its other inputs may be any constants
// that mean the same in either layout (one value per channel, pads of 0) rather
// than scalars.
struct ChannelsLastForm {
    std::vector<int> data;
    bool every_data_input = false;
    bool layout_free_constants = false;
    std::function<void(onnx::NodeProto&)> adapt = [](onnx::NodeProto&) {};
};

// A Pad that pads nothing (an exporter's AveragePool), with constant pads.
bool pads_nothing(const onnx::NodeProto& node, const GraphIndex& index) {
    if (node.input_size() < 2 || node.input_size() > 3 || find_attribute(node, "pads")) return false;
    const auto pads = constant_tensor(index, node.input(1));
    if (!pads || pads->type() != DataType::Int64) return false;
    const auto v = pads->data<int64_t>();
    return std::all_of(v.begin(), v.end(), [](int64_t p) { return p == 0; });
}

// A Resize that copies the nearest input element (an FPN's upsampling), with
// scales or sizes (opset 11 and later) and none of opset 18's options: the
// same copies channels-last.
bool nearest_resize(const onnx::NodeProto& node) {
    auto text = [&](std::string_view name, std::string_view fallback) {
        const auto* a = find_attribute(node, name);
        return a ? std::string_view(a->s()) : fallback;
    };
    return node.input_size() >= 3 && text("mode", "nearest") == "nearest" &&
           text("coordinate_transformation_mode", "half_pixel") != "tf_crop_and_resize" &&
           int_attribute(node, "antialias", 0) == 0 && !find_attribute(node, "axes") &&
           text("keep_aspect_ratio_policy", "stretch") == "stretch";
}

ChannelsLastForm channels_last_form(const onnx::NodeProto& node, const GraphIndex& index) {
    const auto& op = node.op_type();
    // A 4-D axis of the channels-first value, as an axis of its channels-last form.
    auto nhwc_axis = [](onnx::NodeProto& moved) {
        int64_t axis = int_attribute(moved, "axis", 0);
        if (axis < 0) axis += 4;
        if (axis >= 0 && axis < 4) set_attribute(moved, "axis", kToNchw[axis]);
    };
    ChannelsLastForm form;
    if (node.domain() == "com.microsoft" && (op == "QLinearGlobalAveragePool" || op == "QLinearAveragePool") &&
        int_attribute(node, "channels_last", 0) == 0) {
        form.data = {0};
        form.adapt = [](onnx::NodeProto& moved) { set_attribute(moved, "channels_last", int64_t{1}); };
    } else if (is_default_domain(node) && op == "Concat") {
        for (int i = 0; i < node.input_size(); ++i) form.data.push_back(i);
        form.every_data_input = true;
        form.adapt = nhwc_axis;
    } else if (node.domain() == "com.microsoft" && op == "QLinearConcat" && node.input_size() >= 5) {
        for (int i = 2; i < node.input_size(); i += 3) form.data.push_back(i);
        form.every_data_input = true;
        form.adapt = nhwc_axis;
    } else if (node.domain() == kInternalDomain && op == "ChannelLookupTable" && int_attribute(node, "axis", 1) == 1) {
        form.data = {0};
        form.adapt = nhwc_axis;
    } else if (is_default_domain(node) && op == "Pad" && pads_nothing(node, index)) {
        form.data = {0};
        form.layout_free_constants = true;
    } else if (is_default_domain(node) && op == "Resize" && nearest_resize(node)) {
        form.data = {0};
        form.layout_free_constants = true;  // roi, scales, sizes: NhwcResize reads them as the channels-first axes'
        form.adapt = [](onnx::NodeProto& moved) {
            moved.set_op_type("NhwcResize");
            moved.set_domain(kInternalDomain);
        };
    } else if (is_default_domain(node) && (op == "GlobalAveragePool" || op == "GlobalMaxPool")) {
        form.data = {0};
        form.adapt = [](onnx::NodeProto& moved) {
            moved.set_op_type("Nhwc" + moved.op_type());
            moved.set_domain(kInternalDomain);
        };
    } else if (is_default_domain(node) && op == "BatchNormalization" && node.input_size() == 5 &&
               int_attribute(node, "training_mode", 0) == 0) {
        form.data = {0};
        form.layout_free_constants = true;
        form.adapt = [](onnx::NodeProto& moved) {
            moved.set_op_type("NhwcBatchNormalization");
            moved.set_domain(kInternalDomain);
        };
    } else {
        form.data = elementwise_inputs(node);
    }
    return form;
}

// Step 2, one pass over the nodes; returns false when nothing applies. One index
// serves the pass: a rewrite replaces its node in place, appends a node, or renames
// the reads of a cancelled transpose (removed after the pass). What the index then
// says is still true, or names a node that is no longer a transpose, so nothing
// applies; the rewrites that waited on this pass's changes come in the next one.
// A cancelled transpose whose output a tap wants stays, read by nothing: the
// executor computes it only for that tap.
bool push_or_cancel_pass(onnx::GraphProto& graph, const std::set<std::string>& scalars, UniqueNames& names,
                         const std::set<std::string>& tapped) {
    const GraphIndex index(graph);
    const int count = graph.node_size();  // appended nodes wait for the next pass
    std::vector<int> cancelled;
    bool changed = false;
    for (int n = 0; n < count; ++n) {
        const auto& node = graph.node(n);
        // Transpose(NCHW->NHWC) of Transpose(NHWC->NCHW)(z): read z directly.
        if (is_transpose(node, kToNhwc)) {
            const int p = index.producer(node.input(0));
            if (p >= 0 && is_transpose(graph.node(p), kToNchw) && !index.is_graph_output(node.output(0)) &&
                !index.consumers(node.output(0)).empty()) {
                if (replace_all_uses(graph, node.output(0), graph.node(p).input(0))) {
                    if (!tapped.count(node.output(0))) cancelled.push_back(n);
                    changed = true;
                    continue;
                }
            }
        }
        if (node.output_size() != 1) continue;
        const auto movable = channels_last_form(node, index);
        if (movable.data.empty()) continue;
        // Which data inputs come through a to-NCHW transpose, and are the other inputs scalars?
        std::vector<int> transposed;
        bool ok = true;
        for (int i = 0; i < node.input_size(); ++i) {
            const int p = index.producer(node.input(i));
            const bool is_data = std::find(movable.data.begin(), movable.data.end(), i) != movable.data.end();
            if (is_data && p >= 0 && is_transpose(graph.node(p), kToNchw)) {
                transposed.push_back(i);
            } else if (is_data && movable.every_data_input) {
                ok = false;
            } else if (!is_data && movable.layout_free_constants && node.input(i).empty()) {
                // an optional input left out
            } else if (!is_data && movable.layout_free_constants) {
                // A constant, or a quantized weight's DequantizeLinear (ONNX Runtime's tool quantizes a
                // BatchNormalization's scale).
                const bool dequantized = p >= 0 && graph.node(p).op_type() == "DequantizeLinear" &&
                                         index.initializer(graph.node(p).input(0));
                ok = ok && (dequantized || constant_tensor(index, node.input(i)).has_value());
            } else if (!node.input(i).empty() && !scalars.count(node.input(i))) {
                ok = false;
            }
        }
        if (!ok || transposed.empty()) continue;
        // op(T(a), ...) -> T(op(a, ...)): the op runs in NHWC, the transpose moves below it.
        onnx::NodeProto moved = node;
        movable.adapt(moved);
        for (int i : transposed) moved.set_input(i, graph.node(index.producer(node.input(i))).input(0));
        const std::string nhwc_out = names.fresh(node.output(0) + "_nhwc");
        moved.set_output(0, nhwc_out);
        moved.set_name(names.fresh(node.name() + "_nhwc"));
        const auto back = make_transpose(nhwc_out, node.output(0), kToNchw, names.fresh(node.name() + "_to_nchw"));
        *graph.mutable_node(n) = moved;
        *graph.add_node() = back;
        changed = true;
    }
    remove_nodes(graph, cancelled);
    return changed;
}

}  // namespace

namespace {

// The value of a one-element float constant (an initializer or a Constant node's output).
std::optional<float> scalar_value(const onnx::GraphProto& graph, const GraphIndex& index, const std::string& name) {
    const auto v = constant_value(graph, index, name);
    if (!v || v->type() != DataType::Float || v->size() != 1) return std::nullopt;
    return v->data<float>()[0];
}

// A transpose back to NCHW that nothing reads: there only so that the NHWC
// value before it can be tapped.
bool is_tap_transpose(const onnx::NodeProto& node, const GraphIndex& index) {
    return is_transpose(node, kToNchw) && index.consumers(node.output(0)).empty() &&
           !index.is_graph_output(node.output(0));
}

// The one non-tap reader of `tensor` (an NHWC value), or -1 when there are
// others or a known tap wants it (through the transpose back to NCHW).
int only_reader(const onnx::GraphProto& graph, const GraphIndex& index, const std::string& tensor,
                const std::set<std::string>& tapped) {
    if (index.is_graph_output(tensor)) return -1;
    int reader = -1;
    for (const auto& use : index.consumers(tensor)) {
        const auto& n = graph.node(use.node);
        const bool tap_only = is_tap_transpose(n, index);
        if (tap_only && !tapped.count(n.output(0))) continue;
        if (tap_only || reader >= 0) return -1;
        reader = use.node;
    }
    return reader;
}

// A copy of `base` to take `replaced`'s place: its name and (first) output.
onnx::NodeProto in_place_of(const onnx::NodeProto& base, const onnx::NodeProto& replaced) {
    onnx::NodeProto fused = base;
    fused.set_name(replaced.name());
    fused.set_output(0, replaced.output(0));
    return fused;
}

// Add(NhwcConv(...), r) — a residual connection — becomes the convolution with
// r as a fourth input, added to its result in the same pass (and in r's buffer
// when nothing else reads r later). The plain convolution stays for taps.
void fuse_residual_adds(onnx::GraphProto& graph, const std::set<std::string>& tapped) {
    const GraphIndex index(graph);
    for (int i = 0; i < graph.node_size(); ++i) {
        const auto& add = graph.node(i);
        if (add.op_type() != "Add" || !is_default_domain(add) || add.input_size() != 2 || add.input(0) == add.input(1))
            continue;
        for (int k = 0; k < 2; ++k) {
            const int p = index.producer(add.input(k));
            if (p < 0) continue;
            const auto& conv = graph.node(p);
            if (conv.op_type() != "NhwcConv" || conv.domain() != kInternalDomain || conv.input_size() > 3 ||
                find_attribute(conv, "activation_min") || only_reader(graph, index, conv.output(0), tapped) != i)
                continue;
            onnx::NodeProto fused = in_place_of(conv, add);
            while (fused.input_size() < 3) fused.add_input("");
            fused.add_input(add.input(1 - k));
            *graph.mutable_node(i) = std::move(fused);
            break;
        }
    }
}

// An NhwcConv whose output is read by a Relu or constant-bound Clip computes the
// activation too (a oneDNN post-op, the same arithmetic): the Relu/Clip becomes
// a copy of the convolution with the activation attached. The plain convolution
// stays for whoever else wants the value before the activation (a tap: it then
// runs on demand); when nobody does, it never runs.
void fuse_activations(onnx::GraphProto& graph, const std::set<std::string>& tapped) {
    const GraphIndex index(graph);
    for (int i = 0; i < graph.node_size(); ++i) {
        const auto& conv = graph.node(i);
        if (conv.op_type() != "NhwcConv" || conv.domain() != kInternalDomain || find_attribute(conv, "activation_min"))
            continue;  // a convolution that already carries its activation fuses no second one
        std::vector<int> activations;
        bool conv_tapped = false;
        for (const auto& use : index.consumers(conv.output(0))) {
            const auto& n = graph.node(use.node);
            if (is_default_domain(n) && (n.op_type() == "Relu" || n.op_type() == "Clip")) activations.push_back(use.node);
            conv_tapped = conv_tapped || (is_transpose(n, kToNchw) && tapped.count(n.output(0)));
        }
        if (activations.size() != 1 || conv_tapped) continue;
        const auto& act = graph.node(activations[0]);
        float lo = 0.0f, hi = std::numeric_limits<float>::infinity();
        if (act.op_type() == "Clip") {
            lo = -std::numeric_limits<float>::infinity();
            for (const auto& a : act.attribute()) {  // opset < 11
                if (a.name() == "min") lo = a.f();
                if (a.name() == "max") hi = a.f();
            }
            auto bound = [&](int slot, float& value) {
                if (act.input_size() <= slot || act.input(slot).empty()) return true;
                const auto v = scalar_value(graph, index, act.input(slot));
                if (v) value = *v;
                return v.has_value();
            };
            if (!bound(1, lo) || !bound(2, hi)) continue;
        }
        onnx::NodeProto fused = in_place_of(conv, act);
        set_attribute(fused, "activation_min", lo);
        set_attribute(fused, "activation_max", hi);
        *graph.mutable_node(activations[0]) = std::move(fused);
    }
}

// The INTS attribute `name` of `node`, or `fallback` when absent.
std::vector<int64_t> ints_or(const onnx::NodeProto& node, const std::string& name, std::vector<int64_t> fallback) {
    const auto* a = find_attribute(node, name);
    return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : fallback;
}

// Explicit or no pads, unit dilations.
bool plain_geometry(const onnx::NodeProto& conv) {
    const auto* pad = find_attribute(conv, "auto_pad");
    return (!pad || pad->s() == "NOTSET") && ints_or(conv, "dilations", {1, 1}) == std::vector<int64_t>{1, 1};
}

// A 1x1, stride-1, ungrouped NhwcConv with constant weights (and a fused
// residual, the fourth input, only when `residual_allowed`).
bool is_pointwise(const onnx::NodeProto& conv, const GraphIndex& index, bool residual_allowed = false) {
    if (conv.op_type() != "NhwcConv" || conv.domain() != kInternalDomain || !plain_geometry(conv) ||
        conv.input_size() > (residual_allowed ? 4 : 3))
        return false;
    const auto* w = index.initializer(conv.input(1));
    const auto* group = find_attribute(conv, "group");
    return w && w->dims_size() == 4 && w->dims(2) == 1 && w->dims(3) == 1 && (!group || group->i() == 1) &&
           ints_or(conv, "strides", {1, 1}) == std::vector<int64_t>{1, 1} &&
           ints_or(conv, "pads", {0, 0, 0, 0}) == std::vector<int64_t>{0, 0, 0, 0};
}

// A depthwise 3x3 NhwcConv, padding 1 on every side and stride 1 or 2 (the
// MobileNet block): its stride, or 0 for any other convolution.
int64_t fusable_depthwise_stride(const onnx::NodeProto& conv, const GraphIndex& index) {
    if (conv.op_type() != "NhwcConv" || conv.domain() != kInternalDomain || !plain_geometry(conv) ||
        conv.input_size() > 3)
        return 0;
    const auto* w = index.initializer(conv.input(1));
    const auto* group = find_attribute(conv, "group");
    if (!w || w->dims_size() != 4 || w->dims(1) != 1 || w->dims(2) != 3 || w->dims(3) != 3 || !group ||
        group->i() != w->dims(0) || ints_or(conv, "pads", {0, 0, 0, 0}) != std::vector<int64_t>{1, 1, 1, 1})
        return 0;
    const auto strides = ints_or(conv, "strides", {1, 1});
    return strides[0] == strides[1] && (strides[0] == 1 || strides[0] == 2) ? strides[0] : 0;
}

void copy_float_attribute(const onnx::NodeProto& from, const std::string& name, onnx::NodeProto& to,
                          const std::string& as) {
    if (const auto* a = find_attribute(from, name)) {
        auto* copy = to.add_attribute();
        *copy = *a;
        copy->set_name(as);
    }
}

// A 1x1 convolution read only by depthwise 3x3 convolutions (MobileNet's
// expansion): each depthwise one becomes an NhwcConvDepthwise that computes
// both in one step (see its kernel). The 1x1 convolution stays for taps and
// runs only on demand.
void fuse_depthwise(onnx::GraphProto& graph, const std::set<std::string>& tapped) {
    const GraphIndex index(graph);
    for (int i = 0; i < graph.node_size(); ++i) {
        const auto& pointwise = graph.node(i);
        if (!is_pointwise(pointwise, index) || index.is_graph_output(pointwise.output(0))) continue;
        // Readers: depthwise convolutions, and the transpose back to NCHW kept for taps.
        std::vector<Use> uses;
        bool fusable = true;
        for (const auto& use : index.consumers(pointwise.output(0))) {
            const auto& n = graph.node(use.node);
            if (is_tap_transpose(n, index)) {
                fusable = fusable && !tapped.count(n.output(0));
                continue;
            }
            fusable = fusable && use.slot == 0 && fusable_depthwise_stride(n, index) > 0 &&
                      index.initializer(n.input(1))->dims(0) == index.initializer(pointwise.input(1))->dims(0);
            uses.push_back(use);
        }
        if (uses.empty() || !fusable) continue;
        for (const auto& use : uses) {
            const auto& depthwise = graph.node(use.node);
            onnx::NodeProto fused;
            fused.set_op_type("NhwcConvDepthwise");
            fused.set_domain(kInternalDomain);
            fused.set_name(depthwise.name());
            for (int k = 0; k < 3; ++k) fused.add_input(k < pointwise.input_size() ? pointwise.input(k) : "");
            fused.add_input(depthwise.input(1));
            fused.add_input(depthwise.input_size() > 2 ? depthwise.input(2) : "");
            fused.add_output(depthwise.output(0));
            copy_float_attribute(pointwise, "activation_min", fused, "activation_min");
            copy_float_attribute(pointwise, "activation_max", fused, "activation_max");
            copy_float_attribute(depthwise, "activation_min", fused, "depthwise_activation_min");
            copy_float_attribute(depthwise, "activation_max", fused, "depthwise_activation_max");
            set_attribute(fused, "depthwise_stride", fusable_depthwise_stride(depthwise, index));
            *graph.mutable_node(use.node) = std::move(fused);
        }
    }
}

// Whether a node runs only for taps nobody asked for: its outputs are read by
// nothing but transposes back to NCHW that end there and are not tapped (the
// plain nodes fusions leave behind).
bool only_for_untapped(const onnx::GraphProto& graph, const GraphIndex& index, const onnx::NodeProto& node,
                       const std::set<std::string>& tapped) {
    for (const auto& out : node.output()) {
        if (index.is_graph_output(out)) return false;
        for (const auto& use : index.consumers(out)) {
            const auto& n = graph.node(use.node);
            if (!is_tap_transpose(n, index) || tapped.count(n.output(0))) return false;
        }
    }
    return true;
}

// The 1x1 projection after an NhwcConvDepthwise (with its residual and
// activation, if fused) joins it when it alone reads the depthwise outputs:
// the widest tensor of the block is then never written out. The plain nodes
// stay for taps.
void fuse_projections(onnx::GraphProto& graph, const std::set<std::string>& tapped) {
    const GraphIndex index(graph);
    for (int i = 0; i < graph.node_size(); ++i) {
        const auto& projection = graph.node(i);
        if (!is_pointwise(projection, index, true)) continue;
        const auto* w = index.initializer(projection.input(1));
        const int p = index.producer(projection.input(0));
        if (p < 0) continue;
        const auto& pair = graph.node(p);
        if (pair.op_type() != "NhwcConvDepthwise" || pair.domain() != kInternalDomain || pair.input_size() != 5 ||
            index.is_graph_output(pair.output(0)) || index.initializer(pair.input(3))->dims(0) != w->dims(1))
            continue;
        bool alone = true;
        for (const auto& use : index.consumers(pair.output(0))) {
            if (use.node == i) continue;
            const auto& n = graph.node(use.node);
            alone = alone && (is_tap_transpose(n, index) ? !tapped.count(n.output(0))
                                                         : only_for_untapped(graph, index, n, tapped));
        }
        if (!alone) continue;
        onnx::NodeProto fused = in_place_of(pair, projection);
        for (int k = 1; k < 4; ++k) fused.add_input(k < projection.input_size() ? projection.input(k) : "");
        copy_float_attribute(projection, "activation_min", fused, "projection_activation_min");
        copy_float_attribute(projection, "activation_max", fused, "projection_activation_max");
        *graph.mutable_node(i) = std::move(fused);
    }
}

// A 1x1 integer convolution read only by a depthwise 3x3 one (MobileNet's
// expansion, in a quantized model) becomes an NhwcQLinearConvPair in the
// depthwise one's place: inputs 0-8 the 1x1's, 9-14 the depthwise one's
// weights, their scale and zero point, the output's scale and zero point and
// the bias; the depthwise one's attributes, and the 1x1's output bounds as
// pointwise_output_min/max. It runs the two an image at a time, so that the
// expanded tensor, the widest of the block, stays in cache between them. The
// plain 1x1 stays for taps.
void fuse_int8_depthwise_pairs(onnx::GraphProto& graph, const std::set<std::string>& tapped) {
    const GraphIndex index(graph);
    auto is_qlinear_conv = [](const onnx::NodeProto& n) {
        return n.op_type() == "NhwcQLinearConv" && n.domain() == kInternalDomain && n.input_size() >= 8 &&
               plain_geometry(n);
    };
    for (int i = 0; i < graph.node_size(); ++i) {
        const auto& pointwise = graph.node(i);
        if (!is_qlinear_conv(pointwise)) continue;
        const auto* wp = index.initializer(pointwise.input(3));
        const auto* group = find_attribute(pointwise, "group");
        if (!wp || wp->dims_size() != 4 || wp->dims(2) != 1 || wp->dims(3) != 1 || (group && group->i() != 1) ||
            ints_or(pointwise, "strides", {1, 1}) != std::vector<int64_t>{1, 1} ||
            ints_or(pointwise, "pads", {0, 0, 0, 0}) != std::vector<int64_t>{0, 0, 0, 0})
            continue;
        // One integer convolution reads it; anything else only for taps nobody asked for
        // (the transpose back to NCHW, the DequantizeLinear that QDQ fusion left).
        const auto& expanded = pointwise.output(0);
        if (index.is_graph_output(expanded)) continue;
        int reader = -1;
        bool alone = true;
        for (const auto& use : index.consumers(expanded)) {
            const auto& n = graph.node(use.node);
            if (is_qlinear_conv(n) && use.slot == 0 && reader < 0) {
                reader = use.node;
                continue;
            }
            alone = alone && (is_tap_transpose(n, index) ? !tapped.count(n.output(0))
                                                         : only_for_untapped(graph, index, n, tapped));
        }
        if (reader < 0 || !alone) continue;
        const auto& depthwise = graph.node(reader);
        const auto* wd = index.initializer(depthwise.input(3));
        const auto* depthwise_group = find_attribute(depthwise, "group");
        if (!wd || wd->dims_size() != 4 || wd->dims(0) != wp->dims(0) || wd->dims(1) != 1 || wd->dims(2) != 3 ||
            wd->dims(3) != 3 || !depthwise_group || depthwise_group->i() != wd->dims(0) ||
            depthwise.input(1) != pointwise.input(6) || depthwise.input(2) != pointwise.input(7))
            continue;
        onnx::NodeProto fused = depthwise;
        fused.set_op_type("NhwcQLinearConvPair");
        fused.clear_input();
        for (int k = 0; k < 9; ++k) fused.add_input(k < pointwise.input_size() ? pointwise.input(k) : "");
        for (int k = 3; k < 9; ++k) fused.add_input(k < depthwise.input_size() ? depthwise.input(k) : "");
        for (const auto& a : pointwise.attribute())
            if (a.name() == kOutputMinAttribute || a.name() == kOutputMaxAttribute) {
                auto* copy = fused.add_attribute();
                *copy = a;
                copy->set_name(a.name() == kOutputMinAttribute ? kPointwiseOutputMinAttribute
                                                               : kPointwiseOutputMaxAttribute);
            }
        *graph.mutable_node(reader) = std::move(fused);
    }
}

}  // namespace

bool optimize_layout(onnx::GraphProto& graph, const std::set<std::string>& tapped) {
    UniqueNames names(graph);
    if (!wrap_nhwc_ops(graph, names)) return false;
    const auto scalars = scalar_constants(graph);
    for (int guard = 0; guard < graph.node_size() && push_or_cancel_pass(graph, scalars, names, tapped); ++guard) {
    }
    fuse_residual_adds(graph, tapped);
    fuse_activations(graph, tapped);
    fuse_depthwise(graph, tapped);
    fuse_projections(graph, tapped);
    fuse_int8_depthwise_pairs(graph, tapped);
    sort_nodes(graph);  // keep every node after its producers
    return true;
}

namespace {

// MatMul(a, B) -> Add(bias), B a float matrix initializer and bias one float per
// column: the Add becomes the MatMul with the bias as a third input (oneDNN adds
// it as it writes the product). The plain MatMul stays for taps.
bool fuse_matmul_bias(onnx::GraphProto& graph, const std::set<std::string>& tapped) {
    const GraphIndex index(graph);
    bool changed = false;
    for (int i = 0; i < graph.node_size(); ++i) {
        const auto& add = graph.node(i);
        if (add.op_type() != "Add" || !is_default_domain(add) || add.input_size() != 2) continue;
        for (int k = 0; k < 2; ++k) {
            const int p = index.producer(add.input(k));
            if (p < 0) continue;
            const auto& matmul = graph.node(p);
            const auto* b = matmul.input_size() == 2 ? index.initializer(matmul.input(1)) : nullptr;
            const auto* bias = index.initializer(add.input(1 - k));
            const auto& product = matmul.output(0);
            if (matmul.op_type() != "MatMul" || !is_default_domain(matmul) || !b || !bias ||
                b->data_type() != onnx::TensorProto::FLOAT || b->dims_size() != 2 ||
                bias->data_type() != onnx::TensorProto::FLOAT || bias->dims_size() != 1 ||
                bias->dims(0) != b->dims(1) || index.consumers(product).size() != 1 || index.is_graph_output(product) ||
                tapped.count(product))
                continue;
            onnx::NodeProto fused = in_place_of(matmul, add);
            fused.set_domain(kInternalDomain);
            fused.add_input(add.input(1 - k));
            *graph.mutable_node(i) = std::move(fused);
            changed = true;
            break;
        }
    }
    return changed;
}

// A fused Gelu whose input is a MatMul with a bias (above) that nothing else
// wants (only the spelled-out Gelu's own nodes read it, and no tap): the Gelu
// becomes that product with attribute activation = "gelu", applied as the
// product is written. The plain product stays for taps.
bool fuse_matmul_gelus(onnx::GraphProto& graph, const std::set<std::string>& tapped,
                       const std::vector<PatternMatch>& gelus) {
    const GraphIndex index(graph);
    bool changed = false;
    for (const auto& match : gelus) {
        const auto& gelu = graph.node(match.last);
        if (gelu.op_type() != "Gelu" || gelu.domain() != kInternalDomain) continue;  // not fused
        const auto& product = gelu.input(0);
        const int p = index.producer(product);
        if (p < 0 || index.is_graph_output(product) || tapped.count(product)) continue;
        const auto& matmul = graph.node(p);
        if (matmul.op_type() != "MatMul" || matmul.domain() != kInternalDomain || matmul.input_size() != 3) continue;
        const bool only_gelu =
            std::all_of(index.consumers(product).begin(), index.consumers(product).end(), [&](const Use& u) {
                return u.node == match.last ||
                       std::find(match.nodes.begin(), match.nodes.end(), u.node) != match.nodes.end();
            });
        if (!only_gelu) continue;
        onnx::NodeProto fused = in_place_of(matmul, gelu);
        set_attribute(fused, "activation", std::string("gelu"));
        *graph.mutable_node(match.last) = std::move(fused);
        changed = true;
    }
    return changed;
}

}  // namespace

bool fuse_patterns(onnx::GraphProto& graph, const std::set<std::string>& tapped) {
    auto matches = find_layer_norms(graph);
    auto gelus = find_gelus(graph);
    matches.insert(matches.end(), gelus.begin(), gelus.end());
    // A HardSwish carries the constants it was spelled with (3, and 6 or 1/6 to
    // within a rounding), so that the fused kernel computes what the nodes do.
    const GraphIndex index(graph);
    for (auto& swish : find_hard_swishes(graph)) {
        const auto& last = graph.node(swish.last);
        const auto& product = graph.node(swish.nodes[0]).output(0);
        const auto& add = graph.node(swish.nodes[2]);
        const auto& x = swish.fused.input(0);
        const auto offset = scalar_value(graph, index, add.input(add.input(0) == x ? 1 : 0));
        const auto scale = scalar_value(graph, index, last.input(last.input(0) == product ? 1 : 0));
        if (!offset || !scale) continue;
        set_attribute(swish.fused, "offset", *offset);
        set_attribute(swish.fused, last.op_type() == "Mul" ? "factor" : "divisor", *scale);
        matches.push_back(std::move(swish));
    }
    bool changed = false;
    for (auto& match : matches) {
        if (match.fused.op_type() == "LayerNormalization" && match.fused.input_size() < 2) continue;  // no scale
        const bool inside_tapped = std::any_of(match.nodes.begin(), match.nodes.end(), [&](int n) {
            return n != match.last && tapped.count(graph.node(n).output(0));
        });
        if (inside_tapped) continue;
        match.fused.set_domain(kInternalDomain);
        match.fused.set_name(graph.node(match.last).name());
        *graph.mutable_node(match.last) = std::move(match.fused);
        changed = true;
    }
    changed = fuse_matmul_bias(graph, tapped) || changed;
    changed = fuse_matmul_gelus(graph, tapped, gelus) || changed;
    if (changed) sort_nodes(graph);  // a fused node reads the pattern's input, which may come later in the list
    return changed;
}

}  // namespace vaiq::runtime
