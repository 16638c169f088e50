#include "runtime/qdq_fusion.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "runtime/kernels/int8_conv.hpp"
#include "runtime/layout.hpp"
#include "runtime/lookup_fusion.hpp"
#include "vaiq/fold.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/quant.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq::runtime {

namespace {

constexpr const char* kMicrosoft = "com.microsoft";

// One DequantizeLinear (or QuantizeLinear) with constant parameters.
struct QParams {
    std::string tensor, scale, zero_point;  ///< the integer tensor (DQ input / Q output) and its parameters
    int elem_type = 0;                      ///< of the zero point: the integer type
    bool per_tensor = true;
    int64_t axis = 1;  ///< of per-axis parameters
    float scale_value = 0;
    int64_t zero_point_value = 0;
};

class Fusion {
  public:
    Fusion(onnx::GraphProto& graph, int64_t opset) : graph_(graph), index_(graph), opset_(opset) {}

    bool run(bool& uses_microsoft, std::vector<std::string>& gone) {
        std::map<int, onnx::NodeProto> replaced;
        std::set<int> removed;
        for (int n = 0; n < graph_.node_size(); ++n) {
            const auto& node = graph_.node(n);
            if (!is_default_domain(node) || removed.count(n)) continue;
            auto fused = qlinear_form(node.op_type()) ? fuse(n) : drop_pair(n);
            if (!fused && node.op_type() == "Conv" && exact_int8_available()) fused = fuse_power_of_two_conv(n);
            if (!fused && node.op_type() == "Add") fused = fuse_power_of_two_add(n);
            if (!fused) continue;
            replaced[n] = std::move(fused->node);
            for (int r : fused->removed_nodes) removed.insert(r);
            gone_.insert(gone_.end(), fused->gone.begin(), fused->gone.end());
            uses_microsoft = uses_microsoft || replaced[n].domain() == kMicrosoft;
        }
        mark_float_matmuls(replaced, removed);
        if (replaced.empty()) return marked_ > 0;
        google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
        for (int n = 0; n < graph_.node_size(); ++n) {
            if (removed.count(n)) continue;
            auto it = replaced.find(n);
            *nodes.Add() = it != replaced.end() ? it->second : graph_.node(n);
        }
        graph_.mutable_node()->Swap(&nodes);
        gone = gone_;
        return true;
    }

  private:
    // Float MatMuls whose inputs are both dequantized: sum them as MLAS does.
    void mark_float_matmuls(const std::map<int, onnx::NodeProto>& replaced, const std::set<int>& removed) {
        for (int n = 0; n < graph_.node_size(); ++n) {
            auto& node = *graph_.mutable_node(n);
            if (replaced.count(n) || removed.count(n) || !is_default_domain(node) || node.op_type() != "MatMul")
                continue;
            if (!dequantized(node.input(0)) || !dequantized(node.input(1))) continue;
            set_attribute(node, kOrtOrderAttribute, int64_t{1});
            ++marked_;
        }
    }

    struct Fused {
        onnx::NodeProto node;
        std::vector<int> removed_nodes;
        std::vector<std::string> gone;
    };

    const onnx::TensorProto* constant(const std::string& name) const { return index_.initializer(name); }

    // An initializer's value, or a Constant node's.
    std::optional<Tensor> constant_value(const std::string& name) const {
        if (const auto* init = constant(name)) return Tensor::from_proto(*init);
        const int p = index_.producer(name);
        if (p < 0 || graph_.node(p).op_type() != "Constant") return std::nullopt;
        for (const auto& a : graph_.node(p).attribute())
            if (a.name() == "value" && a.has_t()) return Tensor::from_proto(a.t());
        return std::nullopt;
    }

    // The parameters of a Q or DQ node, when they are constants it can read.
    std::optional<QParams> params_of(int n) const {
        const auto& node = graph_.node(n);
        if (node.input_size() != 3) return std::nullopt;
        const auto* s = constant(node.input(1));
        const auto* z = constant(node.input(2));
        if (!s || !z || s->data_type() != onnx::TensorProto::FLOAT) return std::nullopt;
        QParams p;
        p.tensor = node.op_type() == "DequantizeLinear" ? node.input(0) : node.output(0);
        p.scale = node.input(1);
        p.zero_point = node.input(2);
        p.elem_type = z->data_type();
        const auto scale = Tensor::from_proto(*s);
        const auto zp = Tensor::from_proto(*z);
        p.per_tensor = scale.size() == 1;
        p.axis = int_attribute(node, "axis", 1);
        if (p.per_tensor) {
            p.scale_value = scale.data<float>()[0];
            switch (zp.type()) {
                case DataType::UInt8: p.zero_point_value = zp.data<uint8_t>()[0]; break;
                case DataType::Int8: p.zero_point_value = zp.data<int8_t>()[0]; break;
                case DataType::Int32: p.zero_point_value = zp.data<int32_t>()[0]; break;
                default: return std::nullopt;
            }
        }
        return p;
    }

    std::optional<QParams> dequantized(const std::string& tensor) const {
        const int p = index_.producer(tensor);
        if (p < 0 || !is_default_domain(graph_.node(p)) || graph_.node(p).op_type() != "DequantizeLinear")
            return std::nullopt;
        return params_of(p);
    }

    // The only reader of `tensor`, when there is exactly one and it is not a graph output.
    int sole_consumer(const std::string& tensor) const {
        const auto& uses = index_.consumers(tensor);
        if (uses.size() != 1 || index_.is_graph_output(tensor)) return -1;
        return uses[0].node;
    }

    // Whether Q's range makes a Relu/Clip between the op and it redundant, by
    // ONNX Runtime's test: the clip bounds, quantized with Q's parameters (rounded),
    // cover the whole uint8 range.
    bool redundant_activation(const onnx::NodeProto& act, const QParams& q) const {
        if (act.op_type() == "Relu") return q.zero_point_value == 0;
        const auto bounds = clip_bounds(act);
        if (!bounds) return false;
        const auto [lo, hi] = *bounds;
        const double q_lo =
            std::rint(static_cast<double>(lo / q.scale_value)) + static_cast<double>(q.zero_point_value);
        const double q_hi =
            std::rint(static_cast<double>(hi / q.scale_value)) + static_cast<double>(q.zero_point_value);
        return q_lo <= 0.0 && q_hi >= 255.0;
    }

    // A Relu's or Clip's bounds (a Clip's from its attributes or constant inputs).
    std::optional<std::pair<float, float>> clip_bounds(const onnx::NodeProto& act) const {
        float lo = std::numeric_limits<float>::lowest(), hi = std::numeric_limits<float>::max();
        if (act.op_type() == "Relu") return std::pair{0.0f, hi};
        for (const auto& a : act.attribute()) {
            if (a.name() == "min") lo = a.f();
            if (a.name() == "max") hi = a.f();
        }
        for (int i = 1; i < act.input_size() && i < 3; ++i) {
            if (act.input(i).empty()) continue;
            const auto v = constant_value(act.input(i));
            if (!v || v->type() != DataType::Float || v->size() != 1) return std::nullopt;
            (i == 1 ? lo : hi) = v->data<float>()[0];
        }
        return std::pair{lo, hi};
    }

    // A Pad in constant mode with value 0 over the spatial axes of a 4-D tensor:
    // `pads` receives its [top, left, bottom, right].
    bool foldable_pad(int n, std::vector<int64_t>& pads) const {
        const auto& pad = graph_.node(n);
        if (!is_default_domain(pad) || pad.op_type() != "Pad" || pad.input_size() < 2) return false;
        for (const auto& a : pad.attribute())
            if (a.name() == "mode" && a.s() != "constant") return false;
        if (pad.input_size() > 2 && !pad.input(2).empty()) {
            const auto value = constant_value(pad.input(2));
            if (!value || value->type() != DataType::Float || value->data<float>()[0] != 0.0f) return false;
        }
        if (pad.input_size() > 3 && !pad.input(3).empty()) return false;  // axes
        const auto p = constant_value(pad.input(1));
        if (!p || p->type() != DataType::Int64 || p->size() != 8) return false;
        const auto v = p->data<int64_t>();
        if (v[0] || v[1] || v[4] || v[5]) return false;  // batch and channel axes unpadded
        for (int64_t x : v)
            if (x < 0) return false;
        pads = {v[2], v[3], v[6], v[7]};
        return true;
    }

    // Whether padding can move into a pool: zero-valued cells counted as such need
    // count_include_pad, which must not change the meaning of pads it already has.
    static bool pads_fold_into(const onnx::NodeProto& pool, const std::vector<int64_t>& extra) {
        bool counted = false, padded = false;
        for (const auto& a : pool.attribute()) {
            if (a.name() == "count_include_pad") counted = a.i() != 0;
            if (a.name() == "pads")
                for (auto x : a.ints()) padded = padded || x != 0;
            if (a.name() == "auto_pad" && !a.s().empty() && a.s() != "NOTSET") return false;
        }
        const bool any = std::any_of(extra.begin(), extra.end(), [](int64_t x) { return x != 0; });
        return !any || counted || !padded;
    }

    // Adds folded padding to a pool's pads; padded cells count as zeros.
    static void fold_pads(onnx::NodeProto& f, const std::vector<int64_t>& extra) {
        if (std::none_of(extra.begin(), extra.end(), [](int64_t x) { return x != 0; })) return;
        std::vector<int64_t> pads = ints_attribute(f, "pads").value_or(std::vector<int64_t>(4, 0));
        pads.resize(4, 0);
        for (int i = 0; i < 4; ++i) pads[i] += extra[i];
        set_attribute(f, "pads", pads);
        set_attribute(f, "count_include_pad", int64_t{1});
    }

    // A node whose inputs all come from DequantizeLinear and whose output goes to
    // one QuantizeLinear, with types ONNX Runtime's kernels take, as its QLinear form.
    std::optional<Fused> fuse(int n) {
        const auto& node = graph_.node(n);
        if (node.output_size() != 1) return std::nullopt;
        Fused fused;
        std::vector<int64_t> folded_pads;
        const auto in = dequantized_inputs(n, fused, folded_pads);
        if (!in || !input_types_fuse(node, *in)) return std::nullopt;
        const auto q = quantized_output(n, (*in)[0].elem_type, fused);
        if (!q) return std::nullopt;
        const bool weighted = node.op_type() == "Conv" || node.op_type() == "MatMul" || node.op_type() == "Gemm";
        for (size_t i = 0; i < in->size(); ++i)
            if (!(weighted && i >= 1) && (*in)[i].elem_type != q->elem_type)
                return std::nullopt;  // one type throughout
        fused.node = qlinear_node(node, *in, *q);
        if (!folded_pads.empty()) fold_pads(fused.node, folded_pads);
        return fused;
    }

    // ONNX Runtime's DropQDQNodesRules: an op that only moves, selects or
    // compares values, between a DequantizeLinear and a QuantizeLinear with the
    // same scale and zero point, runs on the integers themselves (exact: Q(DQ(x))
    // is x). The max and min need a positive scale to keep their order.
    std::optional<Fused> drop_pair(int n) const {
        const auto& node = graph_.node(n);
        static const std::set<std::string, std::less<>> kMoves = {"Expand",    "Flatten",  "Gather",  "GatherElements",
                                                                  "Reshape",   "Slice",    "Squeeze", "Tile",
                                                                  "Transpose", "Unsqueeze"};
        const auto& op = node.op_type();
        const bool ordered = (op == "MaxPool" && opset_ >= 12) || op == "ReduceMax" || op == "ReduceMin";
        // ONNX Runtime drops the pair around any Resize; a nearest one only selects values.
        const auto* mode = find_attribute(node, "mode");
        const bool selects = op == "Resize" && (!mode || mode->s() == "nearest");
        if ((!kMoves.count(op) && !ordered && !selects) || node.output_size() != 1 || node.input_size() < 1)
            return std::nullopt;
        for (int i = 1; i < node.input_size(); ++i)
            if (dequantized(node.input(i))) return std::nullopt;  // one dequantized input, as there
        const auto dq = dequantized(node.input(0));
        if (!dq || !dq->per_tensor ||
            (dq->elem_type != onnx::TensorProto::UINT8 && dq->elem_type != onnx::TensorProto::INT8))
            return std::nullopt;
        const int consumer = sole_consumer(node.output(0));
        if (consumer < 0 || !is_default_domain(graph_.node(consumer)) ||
            graph_.node(consumer).op_type() != "QuantizeLinear")
            return std::nullopt;
        const auto q = params_of(consumer);
        if (!q || !q->per_tensor || q->elem_type != dq->elem_type || q->scale_value != dq->scale_value ||
            q->zero_point_value != dq->zero_point_value || (ordered && !(q->scale_value > 0)))
            return std::nullopt;
        Fused fused;
        fused.node = node;
        fused.node.set_input(0, dq->tensor);
        fused.node.set_output(0, q->tensor);
        fused.removed_nodes.push_back(consumer);
        fused.gone.push_back(node.output(0));
        return fused;
    }

    // Beyond ONNX Runtime's rules: a Conv whose scales are all powers of two (the NPU
    // recipes' form, which an int8 bias with a step of its own, an int8 activation or
    // a Relu the output's QuantizeLinear does not make redundant keep ONNX Runtime
    // from fusing) runs as an integer convolution where that provably computes the
    // same. In float each product is an integer number of the accumulator's step
    // x_scale * w_scale; when a channel's |products| and |bias| sum to under 2^24
    // steps, every partial sum is exact in any order, so the float Conv yields the
    // int32 sum exactly, and the power-of-two requantization is exact as well. The
    // activation becomes a clamp of the integers: Q is monotone, so
    // Q(clip(y, lo, hi)) = clamp(Q(y), Q(lo), Q(hi)).
    std::optional<Fused> fuse_power_of_two_conv(int n) {
        const auto& node = graph_.node(n);
        if (node.output_size() != 1 || node.input_size() < 2 || node.input_size() > 3) return std::nullopt;
        Fused fused;
        std::vector<int64_t> no_pads;  // (only pools fold a Pad)
        const auto in = dequantized_inputs(n, fused, no_pads);
        if (!in) return std::nullopt;
        const auto& x = (*in)[0];
        if (!x.per_tensor || !is_8_bit(x.elem_type) || !power_of_two(x.scale_value)) return std::nullopt;
        const auto* w_stored = constant((*in)[1].tensor);
        if (!w_stored || w_stored->data_type() != onnx::TensorProto::INT8 || w_stored->dims_size() != 4)
            return std::nullopt;
        const Tensor w = Tensor::from_proto(*w_stored);
        const int64_t m = w.shape()[0], k = m > 0 ? w.size() / m : 0;
        const auto w_scales = channel_scales((*in)[1], m);
        if (!w_scales || k == 0) return std::nullopt;
        std::vector<double> bias(static_cast<size_t>(m), 0.0);  // float values, exact in double
        if (in->size() == 3) {
            const auto* stored = constant((*in)[2].tensor);
            const auto b_scales = channel_scales((*in)[2], m);
            if (!stored || !b_scales || stored->dims_size() != 1 || stored->dims(0) != m) return std::nullopt;
            const auto values = integers(Tensor::from_proto(*stored));
            if (!values) return std::nullopt;
            for (int64_t c = 0; c < m; ++c) bias[c] = (*values)[c] * (*b_scales)[c];
        }
        std::optional<int> activation;
        const auto q = quantized_output(n, 0, fused, &activation);
        if (!q || !is_8_bit(q->elem_type) || !power_of_two(q->scale_value)) return std::nullopt;
        std::optional<std::pair<float, float>> bounds;
        if (activation && !(bounds = clip_bounds(graph_.node(*activation)))) return std::nullopt;

        const auto [x_min, x_max] = q_range(x.elem_type);
        const double x_reach =
            std::max(static_cast<double>(x.zero_point_value) - x_min, x_max - static_cast<double>(x.zero_point_value));
        const auto wv = w.data<int8_t>();
        std::vector<int32_t> bias_steps(static_cast<size_t>(m));
        for (int64_t c = 0; c < m; ++c) {
            const double step = static_cast<double>(x.scale_value) * (*w_scales)[c];
            const double b = bias[c] / step;
            if (b != std::nearbyint(b)) return std::nullopt;  // a bias finer than the accumulator's step
            double reach = 0;
            for (int64_t i = 0; i < k; ++i) reach += std::abs(static_cast<double>(wv[c * k + i]));
            if (reach * x_reach + std::abs(b) >= 16777216.0) return std::nullopt;
            bias_steps[c] = static_cast<int32_t>(b);
            // QLinearConv's float32 multiplier must be the exact power as well.
            const float multiplier = x.scale_value * static_cast<float>((*w_scales)[c]) / q->scale_value;
            if (!std::isnormal(multiplier) || static_cast<double>(multiplier) != step / q->scale_value)
                return std::nullopt;
        }

        std::vector<QParams> params{(*in)[0], (*in)[1], QParams{}};
        params[2].tensor = add_initializer(graph_, names(), node.name() + "_bias_steps",
                                           Tensor::from_values<int32_t>({m}, bias_steps));
        fused.node = qlinear_node(node, params, *q);
        if (bounds) set_output_bounds(fused.node, *q, *bounds);
        return fused;
    }

    // The same for an Add of two power-of-two DequantizeLinears (a residual Add
    // before a Relu, in the NPU recipes' form): each input is an integer number of
    // its step, so in steps of the finer one the float sum is exact while the two
    // reach under 2^24 of them; the sum is then requantized by a shift.
    std::optional<Fused> fuse_power_of_two_add(int n) {
        const auto& node = graph_.node(n);
        if (node.output_size() != 1 || node.input_size() != 2) return std::nullopt;
        Fused fused;
        std::vector<int64_t> no_pads;
        const auto in = dequantized_inputs(n, fused, no_pads);
        if (!in) return std::nullopt;
        for (const auto& p : *in)
            if (!p.per_tensor || !is_8_bit(p.elem_type) || !power_of_two(p.scale_value)) return std::nullopt;
        std::optional<int> activation;
        const auto q = quantized_output(n, 0, fused, &activation);
        if (!q || !is_8_bit(q->elem_type) || !power_of_two(q->scale_value)) return std::nullopt;
        std::optional<std::pair<float, float>> bounds;
        if (activation && !(bounds = clip_bounds(graph_.node(*activation)))) return std::nullopt;
        const float finer = std::min((*in)[0].scale_value, (*in)[1].scale_value);
        double reach = 0;
        for (const auto& p : *in) {
            const auto [lo, hi] = q_range(p.elem_type);
            const auto zp = static_cast<double>(p.zero_point_value);
            reach += std::max(zp - lo, hi - zp) * static_cast<double>(p.scale_value / finer);
        }
        if (reach >= 16777216.0) return std::nullopt;
        fused.node.set_op_type("PowerOfTwoQLinearAdd");
        fused.node.set_domain(kInternalDomain);
        fused.node.set_name(node.name());
        for (const auto& p : *in) {
            fused.node.add_input(p.tensor);
            fused.node.add_input(p.scale);
            fused.node.add_input(p.zero_point);
        }
        fused.node.add_input(q->scale);
        fused.node.add_input(q->zero_point);
        fused.node.add_output(q->tensor);
        if (bounds) set_output_bounds(fused.node, *q, *bounds);
        return fused;
    }

    // The activation's bounds as the output's integers (QuantizeLinear of each).
    static void set_output_bounds(onnx::NodeProto& node, const QParams& q, std::pair<float, float> bounds) {
        auto code = [&](float v) {
            const double r = std::nearbyint(static_cast<double>(v) / q.scale_value) + q.zero_point_value;
            const auto [lo, hi] = q_range(q.elem_type);
            return static_cast<int64_t>(std::clamp(r, lo, hi));
        };
        set_attribute(node, kOutputMinAttribute, code(bounds.first));
        set_attribute(node, kOutputMaxAttribute, code(bounds.second));
    }

    static bool is_8_bit(int elem_type) {
        return elem_type == onnx::TensorProto::INT8 || elem_type == onnx::TensorProto::UINT8;
    }

    static std::pair<double, double> q_range(int elem_type) {
        return elem_type == onnx::TensorProto::UINT8 ? std::pair{0.0, 255.0} : std::pair{-128.0, 127.0};
    }

    // A positive float32 that is an exact power of two (and not subnormal).
    static bool power_of_two(double v) {
        int exponent = 0;
        return v > 0 && std::isnormal(static_cast<float>(v)) && std::frexp(v, &exponent) == 0.5;
    }

    // A constant integer tensor's values, exactly, as doubles.
    static std::optional<std::vector<double>> integers(const Tensor& t) {
        std::vector<double> out;
        switch (t.type()) {
            case DataType::Int8: out.assign(t.data<int8_t>().begin(), t.data<int8_t>().end()); break;
            case DataType::Int16: out.assign(t.data<int16_t>().begin(), t.data<int16_t>().end()); break;
            case DataType::Int32: out.assign(t.data<int32_t>().begin(), t.data<int32_t>().end()); break;
            default: return std::nullopt;
        }
        return out;
    }

    // A DequantizeLinear's scales, one per output channel (a per-tensor one repeated),
    // when its zero points are 0, its scales powers of two, and any axis is 0.
    std::optional<std::vector<double>> channel_scales(const QParams& p, int64_t m) const {
        const auto* s = constant(p.scale);
        const auto* z = constant(p.zero_point);
        if (!s || !z) return std::nullopt;
        const auto zero_points = integers(Tensor::from_proto(*z));
        if (!zero_points || std::any_of(zero_points->begin(), zero_points->end(), [](double v) { return v != 0; }))
            return std::nullopt;
        const Tensor scale = Tensor::from_proto(*s);
        const auto v = scale.data<float>();
        if (!std::all_of(v.begin(), v.end(), [](float f) { return power_of_two(f); })) return std::nullopt;
        if (v.size() == 1) return std::vector<double>(static_cast<size_t>(m), v[0]);
        if (static_cast<int64_t>(v.size()) != m || p.axis != 0) return std::nullopt;
        return std::vector<double>(v.begin(), v.end());
    }

    UniqueNames& names() {
        if (!names_) names_.emplace(graph_);
        return *names_;
    }

    // Every input's DequantizeLinear; an AveragePool's may come through a
    // zero-valued constant Pad, which ONNX Runtime folds into the pool's pads.
    std::optional<std::vector<QParams>> dequantized_inputs(int n, Fused& fused,
                                                           std::vector<int64_t>& folded_pads) const {
        const auto& node = graph_.node(n);
        std::vector<QParams> in;
        for (int i = 0; i < node.input_size(); ++i) {
            if (node.input(i).empty()) return std::nullopt;
            auto dq = dequantized(node.input(i));
            if (!dq && node.op_type() == "AveragePool" && i == 0) {
                const int pad = index_.producer(node.input(0));
                if (pad >= 0 && sole_consumer(node.input(0)) == n && foldable_pad(pad, folded_pads) &&
                    pads_fold_into(node, folded_pads)) {
                    dq = dequantized(graph_.node(pad).input(0));
                    fused.removed_nodes.push_back(pad);
                    fused.gone.push_back(node.input(0));
                }
            }
            if (!dq) return std::nullopt;
            in.push_back(*dq);
        }
        return in;
    }

    // Whether ONNX Runtime has a kernel for these input types and arities.
    static bool input_types_fuse(const onnx::NodeProto& node, const std::vector<QParams>& in) {
        const auto& op = node.op_type();
        const bool weighted = op == "Conv" || op == "MatMul" || op == "Gemm";
        if (op == "Gemm" && float_attribute(node, "beta", 1.0f) != 1.0f && node.input_size() > 2) return false;
        for (size_t i = 0; i < in.size(); ++i) {
            const bool weight = weighted && i == 1, bias = (op == "Conv" || op == "Gemm") && i == 2;
            if (bias) {
                if (in[i].elem_type != onnx::TensorProto::INT32) return false;
            } else if (weight) {
                if (in[i].elem_type != onnx::TensorProto::INT8 && in[i].elem_type != onnx::TensorProto::UINT8)
                    return false;
            } else if (!in[i].per_tensor || (in[i].elem_type != onnx::TensorProto::UINT8 &&
                                             (weighted || in[i].elem_type != onnx::TensorProto::INT8))) {
                // On x86 ONNX Runtime fuses Conv, MatMul and Gemm for uint8 activations only
                // (int8 pairs reach them converted); the other ops take int8 as well.
                return false;
            }
        }
        if (op == "Conv" && in.size() < 2) return false;
        if (op == "MatMul" && in.size() != 2) return false;
        return true;
    }

    // The one QuantizeLinear the output goes to, through a redundant Relu/Clip for Conv
    // (through any Relu/Clip after any op, which `kept_activation` then names, when given).
    std::optional<QParams> quantized_output(int n, int activation_type, Fused& fused,
                                            std::optional<int>* kept_activation = nullptr) const {
        const auto& node = graph_.node(n);
        std::string out = node.output(0);
        int consumer = sole_consumer(out);
        if (consumer < 0) return std::nullopt;
        fused.gone.push_back(out);
        std::optional<int> activation;
        if ((node.op_type() == "Conv" || kept_activation) && is_default_domain(graph_.node(consumer)) &&
            (graph_.node(consumer).op_type() == "Relu" || graph_.node(consumer).op_type() == "Clip")) {
            activation = consumer;
            out = graph_.node(consumer).output(0);
            consumer = sole_consumer(out);
            if (consumer < 0) return std::nullopt;
            fused.removed_nodes.push_back(*activation);
            fused.gone.push_back(out);
        }
        const auto& qnode = graph_.node(consumer);
        if (!is_default_domain(qnode) || qnode.op_type() != "QuantizeLinear") return std::nullopt;
        const auto q = params_of(consumer);
        if (!q || !q->per_tensor || (activation_type && q->elem_type != activation_type)) return std::nullopt;
        if (kept_activation) {
            *kept_activation = activation;
        } else if (activation && !redundant_activation(graph_.node(*activation), *q)) {
            return std::nullopt;
        }
        fused.removed_nodes.push_back(consumer);
        return q;
    }

    // The QLinear node: each input's (tensor, scale, zero point) and the output's parameters, in the op's order.
    onnx::NodeProto qlinear_node(const onnx::NodeProto& node, const std::vector<QParams>& in, const QParams& q) const {
        const auto& op = node.op_type();
        const auto form = *qlinear_form(op);
        onnx::NodeProto f;
        f.set_op_type(std::string(form.op));
        f.set_domain(std::string(form.domain));
        f.set_name(node.name());
        *f.mutable_attribute() = node.attribute();
        auto triple = [&](const QParams& p) {
            f.add_input(p.tensor);
            f.add_input(p.scale);
            f.add_input(p.zero_point);
        };
        auto output_params = [&] {
            f.add_input(q.scale);
            f.add_input(q.zero_point);
        };
        if (op == "Conv" || op == "MatMul") {
            triple(in[0]);
            triple(in[1]);
            output_params();
            if (in.size() > 2) f.add_input(in[2].tensor);
        } else if (op == "Gemm") {
            triple(in[0]);
            triple(in[1]);
            f.add_input(in.size() > 2 ? in[2].tensor : std::string());
            output_params();
            remove_attribute(f, "beta");  // QGemm has no beta: an int32 C is added as it is
        } else if (op == "Concat") {
            output_params();
            for (const auto& p : in) triple(p);
        } else {
            for (const auto& p : in) triple(p);
            output_params();
            if (op == "Softmax") set_attribute(f, "opset", opset_);
            if (op == "GlobalAveragePool") set_attribute(f, "channels_last", int64_t{0});
        }
        f.add_output(q.tensor);
        return f;
    }

    onnx::GraphProto& graph_;
    GraphIndex index_;
    std::optional<UniqueNames> names_;  ///< made when a fusion first adds an initializer
    int64_t opset_;  ///< of the default domain: QLinearSoftmax reads rows as Softmax did then
    int marked_ = 0;
    std::vector<std::string> gone_;
};

}  // namespace

namespace {

// A one-element constant (an initializer or a Constant's output), or nullopt.
std::optional<Tensor> scalar_constant(const onnx::GraphProto& graph, const GraphIndex& index, const std::string& name) {
    auto v = constant_value(graph, index, name);
    if (!v || v->size() != 1) return std::nullopt;
    return v;
}

// ONNX Runtime's basic optimizations remove, whatever produced its input, a Relu
// whose one reader is a QuantizeLinear with the type's lowest zero point
// (ReluQuantTransformer), and a Clip whose constant bounds hold Q's whole range
// to within float epsilon (ClipQuantFusion): the Q clamps the same. They run
// before the QDQ fusions, so the op before the activation then fuses (a residual
// Add before a Relu becomes QLinearAdd there). Returns whether anything changed.
bool remove_activations_before_quantize(onnx::GraphProto& graph, int64_t opset, std::vector<std::string>& gone) {
    const GraphIndex index(graph);
    std::set<int> removed;
    for (int n = 0; n < graph.node_size(); ++n) {
        const auto& act = graph.node(n);
        if (!is_default_domain(act)) continue;
        if (act.op_type() != "Relu" && act.op_type() != "Clip") continue;
        if (act.input_size() < 1 || act.output_size() != 1 || index.is_graph_output(act.output(0))) continue;
        const auto& uses = index.consumers(act.output(0));
        if (uses.size() != 1) continue;
        const int q = uses[0].node;
        auto& qnode = *graph.mutable_node(q);
        if (!is_default_domain(qnode) || qnode.op_type() != "QuantizeLinear" ||
            qnode.input_size() != 3 || uses[0].slot != 0)
            continue;
        const auto zp = scalar_constant(graph, index, qnode.input(2));
        if (!zp || (zp->type() != DataType::UInt8 && zp->type() != DataType::Int8)) continue;
        const bool is_unsigned = zp->type() == DataType::UInt8;
        const int32_t zero_point = is_unsigned ? zp->data<uint8_t>()[0] : zp->data<int8_t>()[0];
        if (act.op_type() == "Relu") {
            if (zero_point != (is_unsigned ? 0 : -128)) continue;
        } else {
            const auto scale = scalar_constant(graph, index, qnode.input(1));
            if (!scale || scale->type() != DataType::Float || !scale->shape().empty() || !zp->shape().empty()) continue;
            float lo = std::numeric_limits<float>::lowest(), hi = std::numeric_limits<float>::max();
            bool constant = true;
            if (opset < 11) {
                for (const auto& a : act.attribute()) {
                    if (a.name() == "min") lo = a.f();
                    if (a.name() == "max") hi = a.f();
                }
            }
            for (int i = 1; i < act.input_size() && i < 3; ++i) {
                if (act.input(i).empty()) continue;
                const auto v = scalar_constant(graph, index, act.input(i));
                if (!v || v->type() != DataType::Float)
                    constant = false;
                else
                    (i == 1 ? lo : hi) = v->data<float>()[0];
            }
            if (!constant) continue;
            const float s = scale->data<float>()[0];
            const float lower = s * static_cast<float>((is_unsigned ? 0 : -128) - zero_point);
            const float upper = s * static_cast<float>((is_unsigned ? 255 : 127) - zero_point);
            constexpr float kEpsilon = std::numeric_limits<float>::epsilon();
            if (kEpsilon < lo - lower || kEpsilon < upper - hi) continue;
        }
        qnode.set_input(0, act.input(0));
        gone.push_back(act.output(0));
        removed.insert(n);
    }
    if (removed.empty()) return false;
    google::protobuf::RepeatedPtrField<onnx::NodeProto> kept;
    for (int n = 0; n < graph.node_size(); ++n)
        if (!removed.count(n)) *kept.Add() = graph.node(n);
    graph.mutable_node()->Swap(&kept);
    return true;
}

// ONNX Runtime's QDQS8ToU8Transformer on x86: an int8 QuantizeLinear read only by
// a DequantizeLinear with the same zero point becomes uint8, the zero point moved
// by 128; the values the pair stands for are unchanged. It runs after ONNX
// Runtime gives every reader of a shared DequantizeLinear its own copy, so only a
// pair whose DequantizeLinear has at most one reading node is converted.
void int8_pairs_to_uint8(onnx::GraphProto& graph) {
    const GraphIndex index(graph);
    UniqueNames names(graph);
    for (int n = 0; n < graph.node_size(); ++n) {
        auto& q = *graph.mutable_node(n);
        if (!is_default_domain(q) || q.op_type() != "QuantizeLinear" || q.input_size() != 3) continue;
        // A QuantizeLinear of a constant is folded into a quantized initializer first,
        // which leaves a lone int8 DequantizeLinear: not a pair.
        const int source = index.producer(q.input(0));
        if (index.initializer(q.input(0)) || (source >= 0 && graph.node(source).op_type() == "Constant")) continue;
        const auto& uses = index.consumers(q.output(0));
        if (uses.size() != 1 || index.is_graph_output(q.output(0))) continue;
        auto& dq = *graph.mutable_node(uses[0].node);
        if (!is_default_domain(dq) || dq.op_type() != "DequantizeLinear" || dq.input_size() != 3) continue;
        if (index.consumers(dq.output(0)).size() > 1) continue;
        const auto* qz = index.initializer(q.input(2));
        const auto* dz = index.initializer(dq.input(2));
        if (!qz || !dz || qz->data_type() != onnx::TensorProto::INT8 || dz->data_type() != onnx::TensorProto::INT8)
            continue;
        const auto qv = Tensor::from_proto(*qz), dv = Tensor::from_proto(*dz);
        if (qv.size() != 1 || dv.size() != 1 || qv.data<int8_t>()[0] != dv.data<int8_t>()[0]) continue;
        const auto zp = static_cast<uint8_t>(static_cast<int>(qv.data<int8_t>()[0]) + 128);
        const auto name = names.fresh(q.input(2) + "_u8");
        *graph.add_initializer() = Tensor::from_values<uint8_t>({}, std::vector<uint8_t>{zp}).to_proto(name);
        q.set_input(2, name);
        dq.set_input(2, name);
    }
}

// A constant's values as floats (a scalar or 1-D scale), or nullopt.
std::optional<std::vector<float>> float_constant(const GraphIndex& index, const std::string& name) {
    const auto* t = index.initializer(name);
    if (!t || t->data_type() != onnx::TensorProto::FLOAT) return std::nullopt;
    const auto values = Tensor::from_proto(*t);
    const auto v = values.data<float>();
    return std::vector<float>(v.begin(), v.end());
}

// Whether a node's output reaches a QuantizeLinear through single readers,
// Relu and Clip only (graph outputs do not count as readers, as in ONNX Runtime).
bool reaches_quantize(const onnx::GraphProto& graph, const GraphIndex& index, const onnx::NodeProto& node) {
    for (const onnx::NodeProto* current = &node;;) {
        if (current->output_size() != 1) return false;
        const auto& uses = index.consumers(current->output(0));
        if (uses.size() != 1) return false;
        const auto& next = graph.node(uses[0].node);
        if (next.op_type() == "QuantizeLinear") return true;
        if (next.op_type() != "Relu" && next.op_type() != "Clip") return false;
        current = &next;
    }
}

// A DequantizeLinear of `quantized` (stored under `base`'s name) with `params`,
// appended to the graph; returns its output. `with_zero_point`: a third input.
std::string dequantized(onnx::GraphProto& graph, UniqueNames& names, const std::string& base, const Tensor& quantized,
                        const QuantParams& params, bool with_zero_point) {
    const auto q = add_initializer(graph, names, base + "_quantized", quantized);
    const auto scale = add_initializer(graph, names, base + "_scale", scale_tensor(params));
    const auto output = names.fresh(base + "_DequantizeLinear_Output");
    std::vector<std::string> inputs = {q, scale};
    if (with_zero_point)
        inputs.push_back(add_initializer(graph, names, base + "_zero_point", zero_point_tensor(params)));
    auto& dq = make_node(graph, names, "DequantizeLinear", std::move(inputs), {output}, output + "_node", "");
    if (params.axis >= 0) set_attribute(dq, "axis", params.axis);
    return output;
}

// ONNX Runtime's WeightBiasQuantization (basic optimization level): a Conv,
// ConvTranspose or Gemm that reads a per-tensor DequantizeLinear input and
// feeds a QuantizeLinear gets its float weight quantized to int8 (asymmetric,
// from the weight's min and max with 0 included: MLAS's
// GetQuantizationParameter) and its float bias to int32 at input scale x
// weight scale, so that the group fuses into an integer operator. vaiq writes
// no such layer, but models from elsewhere have them.
bool quantize_float_weights_and_biases(onnx::GraphProto& graph) {
    const GraphIndex index(graph);
    UniqueNames names(graph);
    bool changed = false;
    for (int n = 0; n < graph.node_size(); ++n) {
        const auto node = graph.node(n);  // a copy: nodes are appended below
        const auto& op = node.op_type();
        if (!is_default_domain(node) || (op != "Conv" && op != "ConvTranspose" && op != "Gemm") ||
            node.input_size() < 2)
            continue;
        const int source = index.producer(node.input(0));
        if (source < 0 || graph.node(source).op_type() != "DequantizeLinear" || graph.node(source).input_size() < 2)
            continue;
        const auto input_scale = float_constant(index, graph.node(source).input(1));
        if (!input_scale || input_scale->size() != 1 || !reaches_quantize(graph, index, node)) continue;
        const int weight_source = index.producer(node.input(1));
        const bool weight_dequantized =
            weight_source >= 0 && graph.node(weight_source).op_type() == "DequantizeLinear";
        const auto* weight = index.initializer(node.input(1));
        if (!weight_dequantized && (!weight || weight->data_type() != onnx::TensorProto::FLOAT)) continue;
        const bool has_bias = node.input_size() > 2 && !node.input(2).empty();
        const auto* bias = has_bias ? index.initializer(node.input(2)) : nullptr;
        if (has_bias && (!bias || bias->dims_size() != 1 || bias->data_type() != onnx::TensorProto::FLOAT)) continue;
        if (weight_dequantized && !bias) continue;

        QuantParams weight_params;  // only its scale matters for a dequantized weight
        if (weight_dequantized) {
            const auto& dq = graph.node(weight_source);
            const auto scale = dq.input_size() > 1 ? float_constant(index, dq.input(1)) : std::nullopt;
            if (!scale) continue;
            if (scale->size() != 1) {
                const auto* w = index.initializer(dq.input(0));
                const int64_t rank = w ? w->dims_size() : 0;
                int64_t axis = int_attribute(dq, "axis", 1);
                if (axis < 0) axis += rank;
                const int64_t expected = op == "Gemm" && int_attribute(node, "transB", 0) == 0 ? 1 : 0;
                if (static_cast<int64_t>(scale->size()) != bias->dims(0) || int_attribute(dq, "block_size", 0) != 0 ||
                    axis != expected)
                    continue;
            }
            weight_params.scale = *scale;
        } else {
            // MLAS's GetQuantizationParameter, in float as there (compute_quant_params works in double).
            const auto w = Tensor::from_proto(*weight);
            float lo = 0.0f, hi = 0.0f;
            for (float x : w.data<float>()) lo = std::min(lo, x), hi = std::max(hi, x);
            const float scale = hi == lo ? 1.0f : (hi - lo) / 255.0f;
            const float zero = std::nearbyint(std::max(-128.0f, std::min(127.0f, -128.0f - lo / scale)));
            weight_params = {QuantType::QInt8, {scale}, {static_cast<int64_t>(zero)}, -1};
            const auto dq = dequantized(graph, names, node.input(1), quantize_tensor(w, weight_params, node.input(1)),
                                        weight_params, true);
            graph.mutable_node(n)->set_input(1, dq);
            changed = true;
        }
        if (!bias) continue;
        // int32 at input scale x weight scale, per channel where the weight is; no zero point, as there.
        const bool per_channel = weight_params.scale.size() != 1;
        QuantParams bias_params{QuantType::QInt32, {}, std::vector<int64_t>(weight_params.scale.size(), 0),
                                per_channel ? 0 : -1};
        for (float sw : weight_params.scale) bias_params.scale.push_back((*input_scale)[0] * sw);
        const auto dq = dequantized(graph, names, node.input(2),
                                    quantize_tensor(Tensor::from_proto(*bias), bias_params, node.input(2)),
                                    bias_params, false);
        graph.mutable_node(n)->set_input(2, dq);
        changed = true;
    }
    return changed;
}

}  // namespace

bool fuse_qdq(onnx::ModelProto& model, std::vector<std::string>& gone) {
    int64_t opset = 0;
    for (const auto& o : model.opset_import())
        if (o.domain().empty() || o.domain() == "ai.onnx") opset = o.version();
    const bool stripped = remove_activations_before_quantize(*model.mutable_graph(), opset, gone);
    const bool quantized = quantize_float_weights_and_biases(*model.mutable_graph());
    int8_pairs_to_uint8(*model.mutable_graph());
    bool uses_microsoft = false;
    const bool changed = Fusion(*model.mutable_graph(), opset).run(uses_microsoft, gone);
    if (uses_microsoft) import_opset(model, kMicrosoft, 1);
    const bool looked_up = fuse_lookup_tables(model, gone);
    const bool folded = fold_into_tables(model, gone);
    return changed || quantized || stripped || looked_up || folded;
}

}  // namespace vaiq::runtime
