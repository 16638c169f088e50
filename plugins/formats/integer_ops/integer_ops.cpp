// integer_ops: writes a plan in ONNX Runtime's IntegerOps form, what its
// quantize_dynamic and QuantizationMode.IntegerOps write: a MatMul becomes
// MatMulInteger and a Conv ConvInteger on quantized inputs, whose int32 result
// is Cast to float and multiplied by the product of the two input scales (a
// Conv's bias is then added in float). An activation input is quantized by
// DynamicQuantizeLinear when its parameters are left to run time (static:
// false), else by QuantizeLinear with its planned parameters; weights are
// stored quantized. ONNX Runtime fuses the MatMul chain into
// DynamicQuantizeMatMul / MatMulIntegerToFloat. An LSTM with quantized weights
// becomes com.microsoft DynamicQuantizeLSTM, which quantizes its input and
// hidden state at run time and keeps its state float; a com.microsoft Attention
// with a bias becomes QAttention on its quantized input. Every other op stays float:
// IntegerOps has no integer form for it, so its planned tensors are not written.
#include <vaiq/vaiq.hpp>

#include <map>

namespace {

using vaiq::InputError;
using vaiq::QuantType;
using vaiq::Tensor;
using vaiq::TensorQuant;
using vaiq::TensorRole;

// A quantized input as the integer ops read it.
struct Quantized {
    std::string values, scale, zero_point;
};

class Writer {
  public:
    Writer(vaiq::Model& model, const vaiq::QuantPlan& plan)
        : model_(model), graph_(model.graph()), plan_(plan), index_(graph_), names_(graph_) {}

    void run() {
        bool lstm = false;
        const auto order = vaiq::topological_order(graph_);
        google::protobuf::RepeatedPtrField<onnx::NodeProto> old_nodes;
        old_nodes.Swap(graph_.mutable_node());
        int rewritten = 0;
        for (int n : order) {
            const auto& node = old_nodes.Get(n);
            if (writes_lstm(node)) {
                rewrite_lstm(node);
                lstm = true;
                ++rewritten;
            } else if (writes_attention(node)) {
                rewrite_attention(node);
                ++rewritten;
            } else if (writes_integer(node)) {
                rewrite(node);
                ++rewritten;
            } else {
                *graph_.add_node() = node;
            }
        }
        vaiq::remove_unused_initializers(graph_);
        if (lstm) vaiq::import_opset(model_.proto(), "com.microsoft", 1);
        vaiq::log_debug("integer_ops: {} MatMul/Conv/LSTM/Attention nodes written as integer ops", rewritten);
    }

  private:
    // A MatMul or 2-D+ Conv whose two inputs the plan quantizes.
    bool writes_integer(const onnx::NodeProto& node) const {
        if (!vaiq::is_default_domain(node) || (node.op_type() != "MatMul" && node.op_type() != "Conv")) return false;
        return node.input_size() >= 2 && plan_.find(node.input(0)) && plan_.find(node.input(1));
    }

    // An LSTM whose W and R the plan quantizes, both stored weights.
    bool writes_lstm(const onnx::NodeProto& node) const {
        if (!vaiq::is_default_domain(node) || node.op_type() != "LSTM" || node.input_size() < 3) return false;
        for (int slot : {1, 2}) {
            const auto* t = plan_.find(node.input(slot));
            if (!t || !index_.initializer(t->tensor) || index_.is_graph_input(t->tensor)) return false;
        }
        return true;
    }

    // DynamicQuantizeLSTM: W [dirs, 4H, in] and R [dirs, 4H, H] stored quantized
    // and transposed to [dirs, in, 4H] and [dirs, H, 4H], with scales and zero
    // points per direction ([dirs]) or per gate row ([dirs, 4H]).
    void rewrite_lstm(const onnx::NodeProto& node) {
        std::vector<std::string> inputs{node.input(0)};
        std::vector<std::string> params;
        for (int slot : {1, 2}) {
            const auto& t = checked(node.input(slot), node);
            if (t.params.axis >= 0 && t.params.axis != 1)
                throw InputError(fmt::format("DynamicQuantizeLSTM quantizes '{}' of node '{}' per gate row (axis 1), "
                                             "not along axis {}",
                                             t.tensor, node.name(), t.params.axis));
            const auto values = Tensor::from_proto(*index_.initializer(t.tensor));
            inputs.push_back(vaiq::add_initializer(graph_, names_, t.tensor + "_quantized",
                                                   transposed_rows(vaiq::quantize_tensor(values, t.params, t.tensor))));
            const int64_t dirs = values.shape()[0], rows = values.shape()[1];
            std::vector<int64_t> shape{dirs};
            if (t.params.axis >= 0) shape.push_back(rows);
            vaiq::QuantParams per_dir = t.params;  // the parameters repeated for each direction, as a list
            per_dir.axis = 0;
            for (int64_t d = 1; d < dirs; ++d) {
                per_dir.scale.insert(per_dir.scale.end(), t.params.scale.begin(), t.params.scale.end());
                per_dir.zero_point.insert(per_dir.zero_point.end(), t.params.zero_point.begin(),
                                          t.params.zero_point.end());
            }
            auto scale = vaiq::scale_tensor(per_dir), zero_point = vaiq::zero_point_tensor(per_dir);
            scale.reshape(shape);
            zero_point.reshape(shape);
            params.push_back(vaiq::add_initializer(graph_, names_, t.tensor + "_scale", scale));
            params.push_back(vaiq::add_initializer(graph_, names_, t.tensor + "_zero_point", zero_point));
        }
        for (int slot = 3; slot < 8; ++slot) inputs.push_back(slot < node.input_size() ? node.input(slot) : "");
        inputs.insert(inputs.end(), params.begin(), params.end());
        auto& op = vaiq::make_node(graph_, names_, "DynamicQuantizeLSTM", inputs,
                                   {node.output().begin(), node.output().end()},
                                   (node.name().empty() ? node.output(0) : node.name()) + "_quant");
        op.set_domain("com.microsoft");
        for (const auto& a : node.attribute()) *op.add_attribute() = a;
    }

    // A com.microsoft Attention with a bias (QAttention needs one) whose input and weights the plan quantizes.
    bool writes_attention(const onnx::NodeProto& node) const {
        return node.domain() == "com.microsoft" && node.op_type() == "Attention" && node.input_size() >= 3 &&
               !node.input(2).empty() && plan_.find(node.input(0)) && plan_.find(node.input(1)) &&
               index_.initializer(node.input(1));
    }

    // QAttention: input, weights, bias, input_scale, weight_scale, mask_index,
    // input_zero_point, weight_zero_point, past.
    void rewrite_attention(const onnx::NodeProto& node) {
        const auto xq = quantized(checked(node.input(0), node));
        const auto& w = checked(node.input(1), node);
        if (w.params.axis >= 0 && w.params.axis != 1)
            throw InputError(fmt::format("QAttention quantizes '{}' of node '{}' per column (axis 1), not along axis {}",
                                         w.tensor, node.name(), w.params.axis));
        const auto wq = quantized(w);
        auto input = [&](int slot) { return slot < node.input_size() ? node.input(slot) : std::string(); };
        auto& op = vaiq::make_node(graph_, names_, "QAttention",
                                   {xq.values, wq.values, node.input(2), xq.scale, wq.scale, input(3), xq.zero_point,
                                    wq.zero_point, input(4)},
                                   {node.output().begin(), node.output().end()},
                                   (node.name().empty() ? node.output(0) : node.name()) + "_quant");
        op.set_domain("com.microsoft");
        for (const auto& a : node.attribute()) *op.add_attribute() = a;
    }

    // [dirs, rows, cols] -> [dirs, cols, rows] for one-byte elements.
    static Tensor transposed_rows(const Tensor& t) {
        const auto& s = t.shape();
        Tensor out(t.type(), {s[0], s[2], s[1]});
        const auto in = t.bytes();
        auto o = out.mutable_bytes();
        for (int64_t d = 0; d < s[0]; ++d)
            for (int64_t r = 0; r < s[1]; ++r)
                for (int64_t c = 0; c < s[2]; ++c)
                    o[static_cast<size_t>((d * s[2] + c) * s[1] + r)] = in[static_cast<size_t>((d * s[1] + r) * s[2] + c)];
        return out;
    }

    const TensorQuant& checked(const std::string& tensor, const onnx::NodeProto& node) {
        const auto& t = *plan_.find(tensor);
        if (!is_eight_bit(t.params.type))
            throw InputError(fmt::format("format 'integer_ops' writes QInt8 and QUInt8, not {} for tensor '{}' of "
                                         "node '{}'",
                                         vaiq::quant_type_name(t.params.type), t.tensor, node.name()));
        if (!t.spec.dynamic) vaiq::check_quant_params(t, model_.opset());
        return t;
    }

    void rewrite(const onnx::NodeProto& node) {
        const bool conv = node.op_type() == "Conv";
        const auto& x = checked(node.input(0), node);
        const auto& w = checked(node.input(1), node);
        const auto xq = quantized(x);
        const auto wq = conv ? conv_weight(w, node) : matmul_weight(w, node);
        const std::string base = node.name().empty() ? node.output(0) : node.name();
        const std::string int_out = node.output(0) + "_output_quantized";
        auto& op = vaiq::make_node(graph_, names_, conv ? "ConvInteger" : "MatMulInteger",
                                   {xq.values, wq.values, xq.zero_point, wq.zero_point}, {int_out}, base + "_quant");
        if (conv)
            for (const auto& a : node.attribute()) *op.add_attribute() = a;
        auto& cast = vaiq::make_node(graph_, names_, "Cast", {int_out}, {int_out + "_cast_output"}, int_out + "_cast");
        vaiq::set_attribute(cast, "to", static_cast<int64_t>(vaiq::DataType::Float));
        const std::string scales = names_.fresh(base + "_quant_scales_mul:0");
        vaiq::make_node(graph_, names_, "Mul", {xq.scale, wq.scale}, {scales}, base + "_quant_scales_mul");
        const bool bias = conv && node.input_size() > 2 && !node.input(2).empty();
        const std::string scaled = bias ? names_.fresh(node.output(0) + "quant_scaled_output") : node.output(0);
        vaiq::make_node(graph_, names_, "Mul", {int_out + "_cast_output", scales}, {scaled},
                        base + "_quant_output_scale_mul");
        if (bias) add_conv_bias(node, scaled);
    }

    // The float bias, shaped [1, C, 1, ...] to broadcast over the output.
    void add_conv_bias(const onnx::NodeProto& node, const std::string& scaled) {
        const auto rank = static_cast<size_t>(index_.initializer(node.input(1))->dims_size());
        std::vector<int64_t> shape(rank, 1);
        shape[1] = -1;
        const auto shape_name = vaiq::add_initializer(graph_, names_, node.output(0) + "_bias_reshape_shape",
                                                      Tensor::from_values<int64_t>({int64_t(rank)}, shape));
        const auto reshaped = names_.fresh(node.output(0) + "_bias_reshape_output");
        vaiq::make_node(graph_, names_, "Reshape", {node.input(2), shape_name}, {reshaped}, reshaped);
        vaiq::make_node(graph_, names_, "Add", {scaled, reshaped}, {node.output(0)}, node.output(0) + "_bias_add");
    }

    // MatMulInteger takes one B zero point per column: per-channel weights of a
    // 2-D B along its columns only.
    Quantized matmul_weight(const TensorQuant& w, const onnx::NodeProto& node) {
        if (w.params.axis >= 0) {
            const auto* init = index_.initializer(w.tensor);
            if (!init || init->dims_size() != 2 || w.params.axis != 1)
                throw InputError(fmt::format("MatMulInteger quantizes B per column only: '{}' of node '{}' is per "
                                             "channel along axis {}",
                                             w.tensor, node.name(), w.params.axis));
        }
        return quantized(w);
    }

    // ConvInteger takes one weight zero point: per-channel weights with equal
    // zero points (symmetric ones) keep their scales in the float multiply.
    Quantized conv_weight(const TensorQuant& w, const onnx::NodeProto& node) {
        if (w.params.axis < 0) return quantized(w);
        const auto& zp = w.params.zero_point;
        if (w.params.axis != 0 || std::adjacent_find(zp.begin(), zp.end(), std::not_equal_to<>()) != zp.end())
            throw InputError(fmt::format("ConvInteger takes one weight zero point: '{}' of node '{}' is per channel "
                                         "with different zero points (set WeightSymmetric)",
                                         w.tensor, node.name()));
        auto out = stored_weight(w);
        const auto rank = static_cast<size_t>(index_.initializer(w.tensor)->dims_size());
        std::vector<int64_t> shape(rank, 1);
        shape[1] = static_cast<int64_t>(w.params.scale.size());
        out.scale = vaiq::add_initializer(graph_, names_, w.tensor + "_scale",
                                          Tensor::from_values<float>(shape, w.params.scale));
        vaiq::QuantParams one = w.params;
        one.zero_point.resize(1);
        one.scale.resize(1);
        one.axis = -1;
        out.zero_point = vaiq::add_initializer(graph_, names_, w.tensor + "_zero_point", vaiq::zero_point_tensor(one));
        return out;
    }

    Quantized stored_weight(const TensorQuant& w) {
        if (w.spec.dynamic) throw InputError(fmt::format("weight '{}' cannot be quantized at run time", w.tensor));
        const auto values = Tensor::from_proto(*index_.initializer(w.tensor));
        return {vaiq::add_initializer(graph_, names_, w.tensor + "_quantized",
                                      vaiq::quantize_tensor(values, w.params, w.tensor)),
                "", ""};
    }

    // The integer form of a planned input, made once and shared by its readers.
    Quantized quantized(const TensorQuant& t) {
        if (auto it = done_.find(t.tensor); it != done_.end()) return it->second;
        Quantized q;
        if (index_.initializer(t.tensor) && !index_.is_graph_input(t.tensor)) {
            q = stored_weight(t);
            q.scale = vaiq::add_initializer(graph_, names_, t.tensor + "_scale", vaiq::scale_tensor(t.params));
            q.zero_point =
                vaiq::add_initializer(graph_, names_, t.tensor + "_zero_point", vaiq::zero_point_tensor(t.params));
        } else if (t.spec.dynamic) {
            q = {names_.fresh(t.tensor + "_quantized"), names_.fresh(t.tensor + "_scale"),
                 names_.fresh(t.tensor + "_zero_point")};
            vaiq::make_node(graph_, names_, "DynamicQuantizeLinear", {t.tensor}, {q.values, q.scale, q.zero_point},
                            t.tensor + "_QuantizeLinear");
        } else {
            q = {names_.fresh(t.tensor + "_quantized"),
                 vaiq::add_initializer(graph_, names_, t.tensor + "_scale", vaiq::scale_tensor(t.params)),
                 vaiq::add_initializer(graph_, names_, t.tensor + "_zero_point", vaiq::zero_point_tensor(t.params))};
            vaiq::make_node(graph_, names_, "QuantizeLinear", {t.tensor, q.scale, q.zero_point}, {q.values},
                            t.tensor + "_QuantizeLinear");
        }
        return done_[t.tensor] = q;
    }

    vaiq::Model& model_;
    onnx::GraphProto& graph_;
    const vaiq::QuantPlan& plan_;
    vaiq::GraphIndex index_;
    vaiq::UniqueNames names_;
    std::map<std::string, Quantized> done_;
};

class IntegerOps final : public vaiq::Format {
  public:
    void emit(vaiq::Model& model, const vaiq::QuantPlan& plan) const override {
        if (model.opset() < 11)
            throw InputError(fmt::format("format 'integer_ops' writes DynamicQuantizeLinear (opset 11); the model is "
                                         "opset {}: convert it first (vaiq convert-opset --opset 13)",
                                         model.opset()));
        Writer(model, plan).run();
    }
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<IntegerOps>("integer_ops", "0.1.0",
                                        "MatMulInteger/ConvInteger with dynamic or given input parameters "
                                        "(QuantizationMode.IntegerOps, quantize_dynamic)"))
