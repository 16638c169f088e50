// qoperator: writes a plan as quantized operators (QuantFormat.QOperator), the
// way ONNX Runtime's QOperator format does: Conv and MatMul become QLinearConv
// and QLinearMatMul, Gemm com.microsoft QGemm, Add, Mul, Concat, GlobalAveragePool, LeakyRelu and Sigmoid
// their com.microsoft QLinear* forms, and data-movement ops whose output shares
// the input's parameters (Reshape, Transpose, MaxPool, ...) run on the integers
// directly. A Relu/Clip the plan absorbed is folded into the operator before it.
// An input left to run time (static: false) is quantized by DynamicQuantizeLinear,
// whose scale and zero point the QLinear operator reads (QLinearOps' dynamic mode).
// Everything else stays float, with QuantizeLinear/DequantizeLinear where a
// tensor crosses between the two worlds; graph outputs keep their float names.
#include <vaiq/vaiq.hpp>

#include <map>
#include <set>

namespace {

using vaiq::InputError;
using vaiq::QuantType;
using vaiq::TensorQuant;
using vaiq::TensorRole;

constexpr const char* kMicrosoft = "com.microsoft";

// Ops written in their QLinear form (vaiq::qlinear_form names it), as ONNX
// Runtime's QOperator quantizer writes them.
const std::set<std::string, std::less<>> kQLinear = {
    "Conv", "MatMul", "Gemm", "Add", "Mul", "Concat", "GlobalAveragePool", "LeakyRelu", "Sigmoid"};
// Ops that compute the same on integers as on the floats they stand for.
const std::set<std::string, std::less<>> kDataMovement = {"Reshape", "Transpose",    "Squeeze",     "Unsqueeze",
                                                          "Flatten", "MaxPool",      "Slice",       "Gather",
                                                          "Split",   "DepthToSpace", "SpaceToDepth"};
const std::set<std::string, std::less<>> kAbsorbable = {"Relu", "Clip"};


bool same_params(const vaiq::QuantParams& a, const vaiq::QuantParams& b) {
    return a.type == b.type && a.scale == b.scale && a.zero_point == b.zero_point && a.axis == b.axis;
}

class Writer {
  public:
    Writer(vaiq::Model& model, const vaiq::QuantPlan& plan)
        : model_(model), graph_(model.graph()), plan_(plan), index_(graph_), names_(graph_) {
        for (const auto& node : graph_.node())
            for (const auto& outer : vaiq::outer_scope_reads(node)) outer_reads_.insert(outer);
    }

    void run() {
        for (const auto& t : plan_.tensors) {
            const bool int32_bias = t.role == TensorRole::Bias && t.params.type == QuantType::QInt32;
            if (!is_eight_bit(t.params.type) && !int32_bias)
                throw InputError(
                    fmt::format("format 'qoperator' writes QInt8 and QUInt8 (and QInt32 biases), not {} "
                                "for tensor '{}'",
                                vaiq::quant_type_name(t.params.type), t.tensor));
            if (!t.spec.dynamic) vaiq::check_quant_params(t, model_.opset());
            if (index_.producer(t.tensor) < 0 && !index_.initializer(t.tensor) && !index_.is_graph_input(t.tensor))
                throw InputError(
                    fmt::format("the plan quantizes tensor '{}', which the model does not have", t.tensor));
        }
        const auto order = vaiq::topological_order(graph_);
        // Decide first, so that every tensor knows whether its producer writes integers.
        for (int n : order) decide(n);
        google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
        for (int n : order) {
            if (absorbed_nodes_.count(n)) continue;
            auto it = rewrites_.find(n);
            if (it == rewrites_.end()) {
                *nodes.Add() = graph_.node(n);
                continue;
            }
            *nodes.Add() = build(n, it->second);
        }
        // Integer tensors that float readers or graph outputs need back.
        for (const auto& [tensor, q] : int_outputs_) {
            if (!float_needed(tensor)) continue;
            *nodes.Add() = qdq_node("DequantizeLinear", q, tensor, params(tensor));
        }
        for (auto& n : extra_nodes_) *nodes.Add() = std::move(n);
        graph_.mutable_node()->Swap(&nodes);
        // Put every node after its producers again, then drop float weights nobody reads.
        vaiq::sort_nodes(graph_);
        vaiq::remove_unused_initializers(graph_);
        if (uses_microsoft_) {
            bool present = false;
            for (const auto& o : model_.proto().opset_import()) present = present || o.domain() == kMicrosoft;
            if (!present) {
                auto* o = model_.proto().add_opset_import();
                o->set_domain(kMicrosoft);
                o->set_version(1);
            }
        }
    }

  private:
    enum class Kind { QLinear, DataMovement };
    struct Rewrite {
        Kind kind;
        std::string output;  ///< the float tensor the integer output stands for
        int absorbed = -1;   ///< a Relu/Clip folded in
    };

    const TensorQuant* planned(const std::string& tensor) const {
        return tensor.empty() ? nullptr : plan_.find(tensor);
    }
    const vaiq::QuantParams& params(const std::string& tensor) const { return plan_.find(tensor)->params; }

    bool eight_bit(const std::string& tensor) const {
        const auto* t = planned(tensor);
        return t && is_eight_bit(t->params.type) && t->role != TensorRole::Bias;
    }

    // The single Relu/Clip reading `tensor` whose output the plan quantizes in its place.
    int absorbing_activation(const std::string& tensor) const {
        const auto& uses = index_.consumers(tensor);
        if (planned(tensor) || uses.size() != 1 || index_.is_graph_output(tensor)) return -1;
        const auto& user = graph_.node(uses[0].node);
        if (!kAbsorbable.count(user.op_type()) || uses[0].slot != 0 || !eight_bit(user.output(0))) return -1;
        return uses[0].node;
    }

    void decide(int n) {
        const auto& node = graph_.node(n);
        const bool default_domain = vaiq::is_default_domain(node);
        if (!default_domain || node.output_size() == 0) return;
        const auto& op = node.op_type();
        if (kDataMovement.count(op)) {
            const auto& in = node.input(0);
            if (!eight_bit(in) || planned(in)->spec.dynamic) return;
            for (const auto& out : node.output())
                if (!eight_bit(out) || !same_params(params(out), params(in))) return;
            rewrites_[n] = {Kind::DataMovement, node.output(0)};
            for (const auto& out : node.output()) int_outputs_[out] = names_.fresh(out + "_quantized");
            return;
        }
        if (!kQLinear.count(op) || node.output_size() != 1) return;
        const bool biased = op == "Conv" || op == "Gemm";
        const int weights = biased ? 2 : node.input_size();
        for (int i = 0; i < weights; ++i)
            if (!eight_bit(node.input(i))) return;
        if (op == "Gemm")
            for (const auto& a : node.attribute())
                if (a.name() == "beta" && a.f() != 1.0f && node.input_size() > 2) return;  // QGemm adds C as it is
        if (biased) {
            if (!index_.initializer(node.input(1))) return;
            if (node.input_size() > 2 && !node.input(2).empty()) {
                const auto* b = planned(node.input(2));
                if (!b || b->role != TensorRole::Bias || b->params.type != QuantType::QInt32) return;
            }
        }
        Rewrite r{Kind::QLinear, node.output(0)};
        if (!eight_bit(r.output)) {
            r.absorbed = absorbing_activation(r.output);
            if (r.absorbed < 0) return;
            r.output = graph_.node(r.absorbed).output(0);
        }
        // The integer kernels keep one type from input to output.
        const auto out_type = params(r.output).type;
        if (op != "MatMul" && !biased)
            for (const auto& in : node.input())
                if (params(in).type != out_type) return;
        if (biased && params(node.input(0)).type != out_type) return;
        if (planned(r.output)->spec.dynamic)
            throw InputError(fmt::format("'{}' writes '{}' as {}, which needs its parameters: give them in "
                                         "output_quantization_params (static: false quantizes only inputs at run "
                                         "time)",
                                         node.name(), r.output, vaiq::qlinear_form(op)->op));
        if (op == "Concat" || op == "Add" || op == "Mul" || op == "LeakyRelu" || op == "Sigmoid" ||
            op == "GlobalAveragePool")
            for (const auto& in : node.input())
                if (params(in).axis >= 0) return;
        if (params(r.output).axis >= 0 || params(node.input(0)).axis >= 0) return;
        rewrites_[n] = r;
        if (r.absorbed >= 0) absorbed_nodes_.insert(r.absorbed);
        int_outputs_[r.output] = names_.fresh(r.output + "_quantized");
    }

    // The integer version of a planned tensor, made on first use.
    std::string int_tensor(const std::string& tensor) {
        if (auto it = int_outputs_.find(tensor); it != int_outputs_.end()) return it->second;
        if (auto it = quantized_.find(tensor); it != quantized_.end()) return it->second;
        const auto& t = *plan_.find(tensor);
        const auto name = names_.fresh(tensor + "_quantized");
        if (t.spec.dynamic) {  // DynamicQuantizeLinear writes the parameters too
            const auto s = names_.fresh(tensor + "_scale"), z = names_.fresh(tensor + "_zero_point");
            onnx::NodeProto n;
            n.set_op_type("DynamicQuantizeLinear");
            n.set_name(names_.fresh(tensor + "_QuantizeLinear"));
            n.add_input(tensor);
            for (const auto& out : {name, s, z}) n.add_output(out);
            extra_nodes_.push_back(std::move(n));
            param_names_[tensor] = {s, z};
        } else if (const auto* init = index_.initializer(tensor); init && !index_.is_graph_input(tensor)) {
            const auto values = vaiq::Tensor::from_proto(*init);
            if (values.type() != vaiq::DataType::Float)
                throw InputError(
                    fmt::format("weight '{}' is {}, not float", tensor, vaiq::data_type_name(values.type())));
            *graph_.add_initializer() = vaiq::quantize_tensor(values, t.params, tensor).to_proto(name);
        } else {
            extra_nodes_.push_back(qdq_node("QuantizeLinear", tensor, name, t.params));
        }
        quantized_[tensor] = name;
        return name;
    }

    std::pair<std::string, std::string> param_names(const std::string& tensor) {
        if (plan_.find(tensor)->spec.dynamic) int_tensor(tensor);  // its parameters come with it
        if (auto it = param_names_.find(tensor); it != param_names_.end()) return it->second;
        const auto& p = params(tensor);
        const auto s = names_.fresh(tensor + "_scale");
        const auto z = names_.fresh(tensor + "_zero_point");
        *graph_.add_initializer() = vaiq::scale_tensor(p).to_proto(s);
        *graph_.add_initializer() = vaiq::zero_point_tensor(p).to_proto(z);
        return param_names_[tensor] = {s, z};
    }

    onnx::NodeProto qdq_node(const std::string& op, const std::string& in, const std::string& out,
                             const vaiq::QuantParams& p) {
        // Parameters by the float tensor's name (the one the plan knows).
        const std::string& key = op == "QuantizeLinear" ? in : out;
        const auto [s, z] = param_names(key);
        onnx::NodeProto n;
        n.set_op_type(op);
        n.set_name(names_.fresh(out + "_node"));
        n.add_input(in);
        n.add_input(s);
        n.add_input(z);
        n.add_output(out);
        if (p.axis >= 0) {
            auto* a = n.add_attribute();
            a->set_name("axis");
            a->set_type(onnx::AttributeProto::INT);
            a->set_i(p.axis);
        }
        return n;
    }

    void add_triple(onnx::NodeProto& n, const std::string& tensor) {
        n.add_input(int_tensor(tensor));
        const auto [s, z] = param_names(tensor);
        n.add_input(s);
        n.add_input(z);
    }

    void add_params(onnx::NodeProto& n, const std::string& tensor) {
        const auto [s, z] = param_names(tensor);
        n.add_input(s);
        n.add_input(z);
    }

    onnx::NodeProto build(int index, const Rewrite& r) {
        const auto& node = graph_.node(index);
        onnx::NodeProto n = node;
        if (r.kind == Kind::DataMovement) {
            n.set_input(0, int_tensor(node.input(0)));
            for (int i = 0; i < n.output_size(); ++i) n.set_output(i, int_outputs_.at(node.output(i)));
            return n;
        }
        const auto form = *vaiq::qlinear_form(node.op_type());
        n.clear_input();
        n.clear_output();
        n.set_op_type(std::string(form.op));
        n.set_domain(std::string(form.domain));
        if (!form.domain.empty()) uses_microsoft_ = true;
        const auto& op = node.op_type();
        if (op == "Conv" || op == "MatMul") {
            add_triple(n, node.input(0));
            add_triple(n, node.input(1));
            add_params(n, r.output);
            if (op == "Conv" && node.input_size() > 2 && !node.input(2).empty()) n.add_input(int_tensor(node.input(2)));
        } else if (op == "Gemm") {
            add_triple(n, node.input(0));
            add_triple(n, node.input(1));
            n.add_input(node.input_size() > 2 && !node.input(2).empty() ? int_tensor(node.input(2)) : std::string());
            add_params(n, r.output);
            n.clear_attribute();
            for (const auto& a : node.attribute())
                if (a.name() != "beta") *n.add_attribute() = a;
        } else if (op == "Concat") {
            add_params(n, r.output);
            for (const auto& in : node.input()) add_triple(n, in);
        } else if (op == "Add" || op == "Mul") {
            add_triple(n, node.input(0));
            add_triple(n, node.input(1));
            add_params(n, r.output);
        } else {  // GlobalAveragePool, LeakyRelu, Sigmoid
            add_triple(n, node.input(0));
            add_params(n, r.output);
            if (op == "GlobalAveragePool") {
                auto* a = n.add_attribute();
                a->set_name("channels_last");
                a->set_type(onnx::AttributeProto::INT);
                a->set_i(0);
            }
        }
        n.add_output(int_outputs_.at(r.output));
        return n;
    }

    // A float reader, or the graph's interface, needs the float value of `tensor`.
    bool float_needed(const std::string& tensor) const {
        if (index_.is_graph_output(tensor)) return true;
        for (const auto& use : index_.consumers(tensor)) {
            if (absorbed_nodes_.count(use.node)) continue;
            auto it = rewrites_.find(use.node);
            if (it == rewrites_.end()) return true;  // rewritten readers take the integer version
        }
        return outer_reads_.count(tensor) > 0;  // a subgraph reads it from the enclosing scope
    }

    vaiq::Model& model_;
    onnx::GraphProto& graph_;
    const vaiq::QuantPlan& plan_;
    vaiq::GraphIndex index_;
    vaiq::UniqueNames names_;
    std::set<std::string> outer_reads_;  ///< tensors subgraphs read from this graph
    std::map<int, Rewrite> rewrites_;
    std::set<int> absorbed_nodes_;
    std::map<std::string, std::string> int_outputs_;  ///< float tensor -> integer output of a rewritten node
    std::map<std::string, std::string>
        quantized_;  ///< float tensor -> its QuantizeLinear output or quantized initializer
    std::map<std::string, std::pair<std::string, std::string>> param_names_;
    std::vector<onnx::NodeProto> extra_nodes_;
    bool uses_microsoft_ = false;
};

class QOperator final : public vaiq::Format {
  public:
    void emit(vaiq::Model& model, const vaiq::QuantPlan& plan) const override { Writer(model, plan).run(); }
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<QOperator>("qoperator", "0.1.0",
                                       "Quantized operators: QLinearConv, QLinearMatMul, com.microsoft QLinear* "
                                       "(QuantFormat.QOperator)"))
