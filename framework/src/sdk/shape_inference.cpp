// Shape and type inference: ONNX's, made safe for what vaiq reads (custom ops,
// models its inference would crash on), with the shapes stored or returned.
#include <fmt/format.h>
#include <google/protobuf/field_mask.pb.h>
#include <google/protobuf/util/field_mask_util.h>
#include <onnx/defs/schema.h>
#include <onnx/shape_inference/implementation.h>

#include <functional>
#include <map>
#include <set>

#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/log.hpp"
#include "vaiq/model.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {
namespace {

// The ranks of the tensors a graph declares or stores (inputs, value_info,
// outputs, initializers).
std::map<std::string, int> declared_ranks(const onnx::GraphProto& graph) {
    std::map<std::string, int> ranks;
    auto add = [&](const onnx::ValueInfoProto& v) {
        if (v.type().has_tensor_type() && v.type().tensor_type().has_shape())
            ranks[v.name()] = v.type().tensor_type().shape().dim_size();
    };
    for (const auto& v : graph.input()) add(v);
    for (const auto& v : graph.value_info()) add(v);
    for (const auto& v : graph.output()) add(v);
    for (const auto& t : graph.initializer()) ranks[t.name()] = t.dims_size();
    return ranks;
}

// Initializers up to this many values keep them in a shape-inference copy: the
// ones inference reads (shapes, axes, pads, scales) are small.
constexpr int64_t kProbeValues = 4096;

// A copy of `proto` for shape inference without the large initializers' values
// (their name, type and dimensions stay): copying a model's weights, many times
// over in preparation, cost more than the inference.
onnx::ModelProto shape_probe(const onnx::ModelProto& proto) {
    google::protobuf::FieldMask mask;  // every field but the graph's initializers
    const auto* model_fields = onnx::ModelProto::descriptor();
    for (int i = 0; i < model_fields->field_count(); ++i)
        if (model_fields->field(i)->name() != "graph") mask.add_paths(model_fields->field(i)->name());
    const auto* graph_fields = onnx::GraphProto::descriptor();
    for (int i = 0; i < graph_fields->field_count(); ++i)
        if (graph_fields->field(i)->name() != "initializer") mask.add_paths("graph." + graph_fields->field(i)->name());
    onnx::ModelProto probe;
    google::protobuf::util::FieldMaskUtil::MergeMessageTo(proto, mask, {}, &probe);
    auto* graph = probe.mutable_graph();
    for (const auto& init : proto.graph().initializer()) {
        int64_t values = 1;  // counted up to just past the bound: a fuzzed shape's product may overflow
        for (const auto d : init.dims())
            values = std::min(values * std::clamp<int64_t>(d, 0, kProbeValues + 1), kProbeValues + 1);
        if (values <= kProbeValues) {
            *graph->add_initializer() = init;
            continue;
        }
        auto& shell = *graph->add_initializer();
        shell.set_name(init.name());
        shell.set_data_type(init.data_type());
        *shell.mutable_dims() = init.dims();
    }
    return probe;
}

// ONNX's convolution inference (the library vaiq is built with) reads past the
// kernel shape, and crashes, when the weight's rank differs from the input's
// (ConvTranspose with fewer weight dimensions, ConvInteger with more). Such
// nodes are refused first: ranks come from inference of the graph without its
// convolutions, and each convolution that passes passes its input's rank on to
// its output.
void refuse_what_onnx_inference_crashes_on(const onnx::ModelProto& proto) {
    // The convolutions and where their weight is.
    auto weight_input = [](const onnx::NodeProto& n) {
        if (!is_default_domain(n)) return -1;
        const auto& op = n.op_type();
        if (op == "Conv" || op == "ConvTranspose" || op == "ConvInteger") return 1;
        return op == "QLinearConv" ? 3 : -1;
    };
    auto is_convolution = [&](const onnx::NodeProto& n) { return weight_input(n) >= 0; };
    const auto& nodes = proto.graph().node();
    if (std::none_of(nodes.begin(), nodes.end(), is_convolution)) return;
    onnx::ModelProto probe = shape_probe(proto);
    auto* probe_nodes = probe.mutable_graph()->mutable_node();
    probe_nodes->erase(std::remove_if(probe_nodes->begin(), probe_nodes->end(), is_convolution), probe_nodes->end());
    try {
        onnx::shape_inference::InferShapes(probe);
    } catch (const std::exception&) {
        // What was inferred before the error is enough.
    }
    auto ranks = declared_ranks(probe.graph());
    for (const auto& n : nodes) {
        const int w_index = weight_input(n);
        if (w_index < 0 || n.input_size() <= w_index) continue;
        const auto x = ranks.find(n.input(0)), w = ranks.find(n.input(w_index));
        if (x == ranks.end() || w == ranks.end()) continue;
        if (x->second < 3 || w->second != x->second)
            throw InputError(
                fmt::format("node '{}' ({}): the input has {} dimensions and the weight {}; both need "
                            "the same number, at least 3",
                            n.name(), n.op_type(), x->second, w->second));
        if (n.output_size() > 0) ranks[n.output(0)] = x->second;
    }
}

// ONNX shape inference, refusing first what it would crash on.
void infer_onnx_shapes(onnx::ModelProto& proto, const onnx::ShapeInferenceOptions& options = {}) {
    refuse_what_onnx_inference_crashes_on(proto);
    onnx::shape_inference::InferShapes(proto, onnx::OpSchemaRegistry::Instance(), options);
}

// ONNX shape inference on a copy; what it found before any error.
onnx::ModelProto inferred(const Model& model) {
    onnx::ModelProto proto = shape_probe(model.proto());
    try {
        infer_onnx_shapes(proto);
    } catch (const std::exception& e) {
        log_debug("shape inference stopped early: {}", e.what());
    }
    return proto;
}

}  // namespace

std::map<std::string, DataType> infer_types(const Model& model) {
    const auto proto = inferred(model);
    std::map<std::string, DataType> types;
    auto add = [&](const onnx::ValueInfoProto& v) {
        if (v.type().has_tensor_type() && v.type().tensor_type().elem_type() != 0)
            types[v.name()] = static_cast<DataType>(v.type().tensor_type().elem_type());
    };
    const auto& graph = proto.graph();
    for (const auto& v : graph.input()) add(v);
    for (const auto& v : graph.value_info()) add(v);
    for (const auto& v : graph.output()) add(v);
    for (const auto& t : graph.initializer()) types[t.name()] = static_cast<DataType>(t.data_type());
    return types;
}

namespace {

// Elementwise ops of custom domains: output 0 is shaped like input 0.
bool elementwise_contrib(const onnx::NodeProto& node) {
    static const std::set<std::string, std::less<>> kOps = {"Gelu", "FastGelu", "QuickGelu", "BiasGelu"};
    return node.domain() == "com.microsoft" && kOps.count(node.op_type()) > 0;
}

// Declares output 0 of custom-domain nodes like input 0 where nothing declares
// it yet; returns how many it declared.
int guess_custom_outputs(onnx::ModelProto& proto, bool every_custom_op) {
    auto& graph = *proto.mutable_graph();
    std::map<std::string, const onnx::ValueInfoProto*> known;
    for (const auto* list : {&graph.input(), &graph.value_info(), &graph.output()})
        for (const auto& v : *list)
            if (v.type().has_tensor_type()) known[v.name()] = &v;
    std::vector<onnx::ValueInfoProto> added;
    for (const auto& node : graph.node()) {
        const bool custom = !is_default_domain(node);
        if (!custom || node.input_size() == 0 || node.output_size() == 0) continue;
        if (!elementwise_contrib(node) && !every_custom_op) continue;
        const auto in = known.find(node.input(0));
        if (in == known.end() || known.count(node.output(0))) continue;
        onnx::ValueInfoProto v = *in->second;
        v.set_name(node.output(0));
        added.push_back(v);
    }
    for (auto& v : added) *graph.add_value_info() = std::move(v);
    return static_cast<int>(added.size());
}

}  // namespace

int store_inferred_shapes(Model& model, const ShapeInferenceOptions& options) {
    const int before = model.graph().value_info_size();
    onnx::ModelProto proto = shape_probe(model.proto());
    const onnx::ShapeInferenceOptions onnx_options(false, 0, options.symbolic);
    // Custom ops stop inference at their outputs: declare those and go again.
    for (int round = 0; round < 16; ++round) {
        try {
            infer_onnx_shapes(proto, onnx_options);
        } catch (const InputError&) {
            throw;
        } catch (const std::exception& e) {
            if (!options.auto_merge)
                throw InputError(
                    fmt::format("shape inference found a conflict (auto_merge keeps the declared "
                                "shape): {}",
                                e.what()));
            log_debug("shape inference stopped early: {}", e.what());
        }
        if (guess_custom_outputs(proto, options.guess_output_rank) == 0) break;
    }
    model.graph().mutable_value_info()->Swap(proto.mutable_graph()->mutable_value_info());
    return model.graph().value_info_size() - before;
}

std::map<std::string, std::vector<int64_t>> infer_shapes(const Model& model) {
    const auto proto = inferred(model);
    std::map<std::string, std::vector<int64_t>> shapes;
    auto add = [&](const onnx::ValueInfoProto& v) {
        if (!v.type().has_tensor_type() || !v.type().tensor_type().has_shape()) return;
        std::vector<int64_t> dims;
        for (const auto& d : v.type().tensor_type().shape().dim())
            dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
        shapes[v.name()] = std::move(dims);
    };
    const auto& graph = proto.graph();
    for (const auto& v : graph.input()) add(v);
    for (const auto& v : graph.value_info()) add(v);
    for (const auto& v : graph.output()) add(v);
    for (const auto& t : graph.initializer()) shapes[t.name()] = {t.dims().begin(), t.dims().end()};
    return shapes;
}

}  // namespace vaiq
