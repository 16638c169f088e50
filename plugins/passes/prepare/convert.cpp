// Conversions before quantization: float16 models to float32, NCHW inputs to
// NHWC, and ONNX shape inference stored in the model.
#include "passes.hpp"

namespace prepare_passes {

namespace {

constexpr int32_t kFloat16 = onnx::TensorProto::FLOAT16;
constexpr int32_t kFloat = onnx::TensorProto::FLOAT;

bool widen(onnx::TensorProto& t) {
    if (t.data_type() != kFloat16) return false;
    t = vaiq::Tensor::from_proto(t).convert_float(vaiq::DataType::Float).to_proto(t.name());
    return true;
}

bool widen(onnx::ValueInfoProto& v) {
    if (!v.type().has_tensor_type() || v.type().tensor_type().elem_type() != kFloat16) return false;
    v.mutable_type()->mutable_tensor_type()->set_elem_type(kFloat);
    return true;
}

// Every float16 tensor, declaration, attribute and Cast target of a graph and its subgraphs.
int widen_graph(onnx::GraphProto& graph) {
    int changed = 0;
    for (auto& t : *graph.mutable_initializer()) changed += widen(t);
    for (auto* list : {graph.mutable_input(), graph.mutable_output(), graph.mutable_value_info()})
        for (auto& v : *list) changed += widen(v);
    for (auto& node : *graph.mutable_node())
        for (auto& a : *node.mutable_attribute()) {
            if (a.has_t()) changed += widen(*a.mutable_t());
            if (a.has_g()) changed += widen_graph(*a.mutable_g());
            for (auto& g : *a.mutable_graphs()) changed += widen_graph(g);
            if (a.name() == "to" && a.i() == kFloat16 && (node.op_type() == "Cast")) {
                a.set_i(kFloat);
                ++changed;
            }
        }
    return changed;
}

}  // namespace

bool convert_fp16_to_fp32(vaiq::Model& model) {
    if (widen_graph(model.graph()) == 0) return false;
    // Casts between what are now both float do nothing: they become Identity and go.
    const auto types = vaiq::infer_types(model);
    int redundant = 0;
    for (auto& node : *model.graph().mutable_node()) {
        if (node.op_type() != "Cast" || vaiq::int_attribute(node, "to", 0) != kFloat) continue;
        const auto in = types.find(node.input(0));
        if (in == types.end() || in->second != vaiq::DataType::Float) continue;
        node.set_op_type("Identity");
        node.clear_attribute();
        ++redundant;
    }
    if (redundant) eliminate_identity(model);
    vaiq::log_info("convert_fp16_to_fp32: the model computes in float32 ({} redundant Casts removed)", redundant);
    return true;
}

bool convert_nchw_to_nhwc(vaiq::Model& model) {
    auto& graph = model.graph();
    const vaiq::GraphIndex index(graph);
    vaiq::UniqueNames names(graph);
    std::vector<onnx::NodeProto> transposes;
    for (auto& input : *graph.mutable_input()) {
        const auto& name = input.name();
        if (index.initializer(name) || !input.type().has_tensor_type()) continue;
        const auto& shape = input.type().tensor_type().shape();
        const auto& uses = index.consumers(name);
        if (shape.dim_size() != 4 || uses.empty()) {
            vaiq::log_info("convert_nchw_to_nhwc: input '{}' skipped: not a 4-D tensor read by the model", name);
            continue;
        }
        const bool nhwc_already = std::all_of(uses.begin(), uses.end(), [&](const vaiq::Use& u) {
            const auto& n = graph.node(u.node);
            return n.op_type() == "Transpose" && vaiq::ints_attribute(n, "perm") == std::vector<int64_t>{0, 3, 1, 2};
        });
        if (nhwc_already) {
            vaiq::log_info("convert_nchw_to_nhwc: input '{}' skipped: the model reads it as NHWC already", name);
            continue;
        }
        const bool read_as_nchw = std::any_of(uses.begin(), uses.end(), [&](const vaiq::Use& u) {
            const auto& op = graph.node(u.node).op_type();
            return u.slot == 0 && (op == "Conv" || op == "ConvTranspose" || op == "MaxPool" || op == "AveragePool" ||
                                   op == "BatchNormalization" || op == "InstanceNormalization");
        });
        if (!read_as_nchw) {
            vaiq::log_info("convert_nchw_to_nhwc: input '{}' skipped: no channels-first op reads it", name);
            continue;
        }
        // The model now takes NHWC and transposes it back for the ops that want NCHW.
        const auto nchw = names.fresh(name + "_nchw");
        vaiq::replace_all_uses(graph, name, nchw);
        auto* dims = input.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim();
        const onnx::TensorShapeProto_Dimension c = (*dims)[1];
        (*dims)[1] = (*dims)[2];
        (*dims)[2] = (*dims)[3];
        (*dims)[3] = c;
        onnx::NodeProto t;
        t.set_op_type("Transpose");
        t.set_name(names.fresh(name + "_to_nchw"));
        t.add_input(name);
        t.add_output(nchw);
        auto* perm = t.add_attribute();
        perm->set_name("perm");
        perm->set_type(onnx::AttributeProto::INTS);
        for (int64_t p : {0, 3, 1, 2}) perm->add_ints(p);
        transposes.push_back(std::move(t));
        vaiq::log_info("convert_nchw_to_nhwc: input '{}' is NHWC now", name);
    }
    if (transposes.empty()) return false;
    for (auto& t : transposes) *graph.add_node() = std::move(t);
    vaiq::sort_nodes(graph);
    return true;
}

bool infer_onnx_shapes(vaiq::Model& model) {
    const int added = vaiq::store_inferred_shapes(model);
    vaiq::log_debug("infer_onnx_shapes: {} tensors gained a shape", added);
    return added > 0;
}

}  // namespace prepare_passes
