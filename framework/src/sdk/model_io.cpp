// Reading, checking, converting and writing ONNX models.
#include <fmt/format.h>
#include <onnx/checker.h>
#include <onnx/defs/schema.h>
#include <onnx/version_converter/convert.h>

#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <set>

#include "sdk/atomic_file.hpp"
#include "sdk/protobuf_file.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/log.hpp"
#include "vaiq/model.hpp"
#include "vaiq/tensor.hpp"

namespace fs = std::filesystem;

namespace vaiq {

Model::Model(onnx::ModelProto proto, fs::path source) : proto_(std::move(proto)), source_(std::move(source)) {}

void Model::mark(const onnx::NodeProto& node, std::string_view mark) {
    if (node.output_size() > 0) marks_[node.output(0)].emplace(mark);
}

bool Model::marked(const onnx::NodeProto& node, std::string_view mark) const {
    if (node.output_size() == 0) return false;
    auto it = marks_.find(node.output(0));
    return it != marks_.end() && it->second.count(mark) > 0;
}

int64_t Model::opset(std::string_view domain) const {
    for (const auto& op : proto_.opset_import()) {
        const auto& d = op.domain();
        const bool is_default = d.empty() || d == "ai.onnx";
        if ((domain.empty() || domain == "ai.onnx") ? is_default : d == domain) return op.version();
    }
    return 0;
}

namespace {

// Calls fn on every tensor stored in the graph: initializers, Constant-like
// attributes, and the same inside subgraphs.
void for_each_tensor(onnx::GraphProto& graph, const std::function<void(onnx::TensorProto&)>& fn) {
    for (auto& t : *graph.mutable_initializer()) fn(t);
    for (auto& node : *graph.mutable_node()) {
        for (auto& attr : *node.mutable_attribute()) {
            if (attr.has_t()) fn(*attr.mutable_t());
            for (auto& t : *attr.mutable_tensors()) fn(t);
            if (attr.has_g()) for_each_tensor(*attr.mutable_g(), fn);
            for (auto& g : *attr.mutable_graphs()) for_each_tensor(g, fn);
        }
    }
}

// The same, reading only.
void for_each_tensor(const onnx::GraphProto& graph, const std::function<void(const onnx::TensorProto&)>& fn) {
    // for_each_tensor above changes nothing but what its function does, and this one's cannot.
    for_each_tensor(const_cast<onnx::GraphProto&>(graph), [&](onnx::TensorProto& t) { fn(t); });
}

bool is_within(const fs::path& child, const fs::path& parent) {
    auto c = child.begin();
    for (auto p = parent.begin(); p != parent.end(); ++p, ++c) {
        if (c == child.end() || *c != *p) return false;
    }
    return true;
}

// Where one external-data tensor's bytes are, validated: the location must
// stay inside the model's folder (no absolute paths, no "..", no symlink out
// of it) and the file must hold the bytes the tensor declares.
struct ExternalBytes {
    fs::path file;
    int64_t offset = 0, bytes = 0;
};

ExternalBytes resolve_external_data(const onnx::TensorProto& tensor, const fs::path& model_dir,
                                    const fs::path& model_path) {
    std::string location;
    int64_t offset = 0;
    int64_t length = -1;
    for (const auto& entry : tensor.external_data()) {
        try {
            if (entry.key() == "location")
                location = entry.value();
            else if (entry.key() == "offset")
                offset = std::stoll(entry.value());
            else if (entry.key() == "length")
                length = std::stoll(entry.value());
        } catch (const std::exception&) {
            throw InputError(fmt::format("{}: tensor '{}' has a bad external data {} '{}'", model_path.string(),
                                         tensor.name(), entry.key(), entry.value()));
        }
    }
    const auto where = fmt::format("{}: tensor '{}'", model_path.string(), tensor.name());
    if (location.empty()) throw InputError(fmt::format("{} is stored externally but names no location", where));
    const fs::path rel(location);
    if (rel.is_absolute() || rel.has_root_name() || rel.has_root_directory())
        throw InputError(
            fmt::format("{} has an absolute external data location '{}'; it must be relative to the "
                        "model's folder",
                        where, location));
    for (const auto& part : rel)
        if (part == "..")
            throw InputError(fmt::format("{} has the external data location '{}', which leaves the model's folder",
                                         where, location));
    std::error_code ec;
    const fs::path base = fs::weakly_canonical(model_dir, ec);
    const fs::path file = fs::weakly_canonical(model_dir / rel, ec);
    if (ec || !is_within(file, base))
        throw InputError(
            fmt::format("{} has the external data location '{}', which resolves outside the model's "
                        "folder (through a symbolic link)",
                        where, location));
    if (!fs::is_regular_file(file, ec))
        throw InputError(
            fmt::format("{} refers to the external data file '{}', which does not exist", where, location));
    const auto file_size = static_cast<int64_t>(fs::file_size(file, ec));
    const int64_t count = element_count({tensor.dims().data(), static_cast<size_t>(tensor.dims_size())});
    const auto type = static_cast<DataType>(tensor.data_type());
    if (element_size(type) == 0 || type == DataType::String)
        throw InputError(fmt::format("{} has an element type that cannot be stored externally", where));
    const int64_t bytes = stored_bytes(type, count);
    if (length >= 0 && length != bytes)
        throw InputError(fmt::format("{} declares {} elements ({} bytes) but its external data length is {}", where,
                                     count, bytes, length));
    if (offset < 0 || offset > file_size || bytes > file_size - offset)
        throw InputError(fmt::format("{} needs {} bytes at offset {} of '{}', which holds only {} bytes", where, bytes,
                                     offset, location, file_size));
    return {file, offset, bytes};
}

// Stores the tensor's data externally at `location`, `offset`, `length`.
void set_external_data(onnx::TensorProto& tensor, const std::string& location, size_t offset, size_t length) {
    tensor.clear_raw_data();
    tensor.clear_external_data();
    tensor.set_data_location(onnx::TensorProto::EXTERNAL);
    for (const auto& [key, value] : {std::pair<const char*, std::string>{"location", location},
                                     {"offset", std::to_string(offset)},
                                     {"length", std::to_string(length)}}) {
        auto* entry = tensor.add_external_data();
        entry->set_key(key);
        entry->set_value(value);
    }
}

// Reads a deferred tensor's bytes into raw_data.
void read_into_raw_data(onnx::TensorProto& tensor) {
    std::string data;
    data.reserve(stored_data_bytes(tensor));
    read_deferred(tensor, [&](const char* p, size_t n) { data.append(p, n); });
    tensor.clear_external_data();
    tensor.clear_data_location();
    tensor.set_raw_data(std::move(data));
}

// Points the tensor at its validated bytes (an absolute location marks it
// deferred) or, below `defer_bytes`, reads them into raw_data.
void resolve_tensor(onnx::TensorProto& tensor, const ExternalBytes& at, size_t defer_bytes) {
    set_external_data(tensor, at.file.string(), static_cast<size_t>(at.offset), static_cast<size_t>(at.bytes));
    if (defer_bytes == 0 || static_cast<size_t>(at.bytes) < defer_bytes) read_into_raw_data(tensor);
}

void refuse_old_opset(const Model& model, const fs::path& path) {
    const int64_t opset = model.opset();
    if (opset == 0 || opset >= kMinimumOpset) return;
    throw InputError(fmt::format(
        "{} uses opset {} of the default domain; vaiq needs opset {} or newer (13 recommended). Re-export the "
        "model from its framework with opset 10 or above, or convert it: vaiq convert-opset {} OUT.onnx --opset 13",
        path.string(), opset, kMinimumOpset, path.string()));
}

}  // namespace

Model load_model(const fs::path& path, const LoadOptions& options) {
    std::error_code ec;
    if (!fs::exists(path, ec)) throw InputError(fmt::format("{}: no such model file", path.string()));
    if (!fs::is_regular_file(path, ec)) throw InputError(fmt::format("{}: not a regular file", path.string()));
    if (fs::file_size(path, ec) == 0 && !ec) throw InputError(fmt::format("{}: the file is empty", path.string()));
    onnx::ModelProto proto;
    if (!parse_protobuf_file(path, proto))
        throw InputError(fmt::format("{}: not a valid ONNX model (the protobuf does not parse; truncated or corrupt?)",
                                     path.string()));
    if (proto.ir_version() <= 0 || !proto.has_graph() || proto.opset_import_size() == 0)
        throw InputError(fmt::format("{}: not a valid ONNX model (no {}; truncated or corrupt?)", path.string(),
                                     proto.ir_version() <= 0 ? "IR version"
                                     : !proto.has_graph()    ? "graph"
                                                             : "opset import"));
    Model model(std::move(proto), path);
    if (options.check_opset) refuse_old_opset(model, path);

    const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
    for_each_tensor(model.graph(), [&](onnx::TensorProto& t) {
        if (t.data_location() == onnx::TensorProto::EXTERNAL)
            resolve_tensor(t, resolve_external_data(t, dir, path), options.defer_external_bytes);
        try {
            check_tensor_data(t);
        } catch (const InputError& e) {
            throw InputError(fmt::format("{}: {}", path.string(), e.what()));
        }
    });
    return model;
}

namespace {

// The newest default-domain opset this build's ONNX library knows.
int64_t onnx_max_opset() {
    return onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map().at(onnx::ONNX_DOMAIN).second;
}

// What can be checked without the ONNX checker (which knows no newer opset):
// every node reads values defined before it, no value is defined twice.
void check_structure(const onnx::GraphProto& graph, std::set<std::string> defined) {
    for (const auto& v : graph.input()) defined.insert(v.name());
    for (const auto& t : graph.initializer()) defined.insert(t.name());
    for (const auto& node : graph.node()) {
        for (const auto& in : node.input())
            if (!in.empty() && !defined.count(in))
                throw InputError(fmt::format("the model's node '{}' ({}) reads '{}' before anything defines it",
                                             node.name(), node.op_type(), in));
        for_each_subgraph(node, [&](const onnx::GraphProto& g) { check_structure(g, defined); });
        for (const auto& out : node.output())
            if (!out.empty() && !defined.insert(out).second)
                throw InputError(fmt::format("the model defines '{}' twice (node '{}')", out, node.name()));
    }
    for (const auto& t : graph.initializer()) check_tensor_data(t);
}

}  // namespace

void check_model(const Model& model) {
    if (model.opset() > onnx_max_opset()) {
        // ONNX Runtime checks such models when it loads them (the tests do).
        check_structure(model.graph(), {});
        return;
    }
    try {
        onnx::checker::check_model(model.proto());
    } catch (const std::exception& e) {
        std::string message = e.what();
        if (auto nl = message.find('\n'); nl != std::string::npos) message.resize(nl);
        throw InputError(fmt::format("the model fails the ONNX checker: {}", message));
    }
}

namespace {

// ONNX's converter drops the references of tensors left in their files: they are
// put back, tensor by tensor, where the converted model kept the tensor as it was.
onnx::ModelProto with_deferred_data(onnx::ModelProto out, const Model& model) {
    std::map<std::string, const onnx::TensorProto*> deferred;
    for (const auto& init : model.graph().initializer())
        if (is_deferred(init)) deferred.emplace(init.name(), &init);
    if (deferred.empty()) return out;
    for (auto& init : *out.mutable_graph()->mutable_initializer()) {
        auto it = deferred.find(init.name());
        if (it == deferred.end() || is_deferred(init) || !init.raw_data().empty()) continue;
        const auto& original = *it->second;
        if (init.data_type() == original.data_type() &&
            std::equal(init.dims().begin(), init.dims().end(), original.dims().begin(), original.dims().end()))
            init = original;
    }
    return out;
}

// ONNX's converter has adapters for the default domain alone and refuses a node
// of any other (a com.microsoft Gelu that preparation fused): while it converts,
// each such node of the main graph stands aside as Identity nodes of its first
// input, one per output, named after its place; restore() puts it back.
struct SetAside {
    static constexpr const char* kPrefix = "vaiq_set_aside_";
    std::vector<onnx::NodeProto> nodes;

    // `model` with its foreign nodes set aside, or nullopt when it has none.
    std::optional<Model> set_aside(const Model& model) {
        const auto& graph = model.graph();
        const bool any = std::any_of(graph.node().begin(), graph.node().end(), [](const onnx::NodeProto& n) {
            return !is_default_domain(n) && n.input_size() > 0 && !n.input(0).empty();
        });
        if (!any) return std::nullopt;
        onnx::ModelProto proto = model.proto();
        google::protobuf::RepeatedPtrField<onnx::NodeProto> kept;
        for (const auto& node : proto.graph().node()) {
            if (is_default_domain(node) || node.input_size() == 0 || node.input(0).empty()) {
                *kept.Add() = node;
                continue;
            }
            for (int k = 0; k < node.output_size(); ++k) {
                auto& stand_in = *kept.Add();
                stand_in.set_op_type("Identity");
                stand_in.set_name(fmt::format("{}{}_{}", kPrefix, nodes.size(), k));
                stand_in.add_input(node.input(0));
                stand_in.add_output(node.output(k));
            }
            nodes.push_back(node);
        }
        proto.mutable_graph()->mutable_node()->Swap(&kept);
        return Model(std::move(proto));
    }

    // The converted model with the nodes set aside back in their places, and their domains imported.
    void restore(onnx::ModelProto& converted, const onnx::ModelProto& original) const {
        google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
        for (const auto& node : converted.graph().node()) {
            if (node.name().rfind(kPrefix, 0) != 0) {
                *nodes.Add() = node;
                continue;
            }
            const std::string place = node.name().substr(std::string_view(kPrefix).size());
            const auto cut = place.rfind('_');
            if (place.substr(cut + 1) == "0") *nodes.Add() = this->nodes.at(std::stoul(place.substr(0, cut)));
        }
        converted.mutable_graph()->mutable_node()->Swap(&nodes);
        // What the converter inferred for a stand-in's output (its input's type) is not the node's.
        std::set<std::string> stood_in, declared;
        for (const auto& node : this->nodes) stood_in.insert(node.output().begin(), node.output().end());
        for (const auto& v : original.graph().value_info()) declared.insert(v.name());
        auto* infos = converted.mutable_graph()->mutable_value_info();
        infos->erase(std::remove_if(infos->begin(), infos->end(),
                                    [&](const onnx::ValueInfoProto& v) {
                                        return stood_in.count(v.name()) && !declared.count(v.name());
                                    }),
                     infos->end());
        for (const auto& o : original.opset_import())
            if (!o.domain().empty() && o.domain() != "ai.onnx") import_opset(converted, o.domain(), o.version());
    }
};

onnx::ModelProto converted_plain(const Model& model, int target_opset,
                                 const std::function<void(Model&)>& declare_shapes);

onnx::ModelProto converted(const Model& model, int target_opset, const std::function<void(Model&)>& declare_shapes) {
    SetAside aside;
    const auto plain = aside.set_aside(model);
    if (!plain) return converted_plain(model, target_opset, declare_shapes);
    auto out = converted_plain(*plain, target_opset, declare_shapes);
    aside.restore(out, model.proto());
    return out;
}

onnx::ModelProto converted_plain(const Model& model, int target_opset,
                                 const std::function<void(Model&)>& declare_shapes) {
    std::exception_ptr plain_error;
    try {
        return onnx::version_conversion::ConvertVersion(model.proto(), target_opset);
    } catch (const std::exception&) {
        if (!declare_shapes) throw;
        plain_error = std::current_exception();
    }
    try {
        // Inference knows more of opset 11 (Slice, Resize and Clip take inputs): shapes are declared there.
        constexpr int kShapedOpset = 11;
        Model shaped = model.opset() < kShapedOpset && target_opset > kShapedOpset
                           ? Model(onnx::version_conversion::ConvertVersion(model.proto(), kShapedOpset))
                           : model;
        declare_shapes(shaped);
        auto out = onnx::version_conversion::ConvertVersion(shaped.proto(), target_opset);
        std::set<std::string> declared;
        for (const auto& v : model.graph().value_info()) declared.insert(v.name());
        auto* infos = out.mutable_graph()->mutable_value_info();
        infos->erase(std::remove_if(infos->begin(), infos->end(),
                                    [&](const onnx::ValueInfoProto& v) { return !declared.count(v.name()); }),
                     infos->end());
        return out;
    } catch (const std::exception&) {
        std::rethrow_exception(plain_error);  // the plain conversion's error says more
    }
}

}  // namespace

namespace {

// Int64 `values` as a new initializer of `graph`, named after `base`.
std::string int64_initializer(onnx::GraphProto& graph, const std::string& base, const std::vector<int64_t>& values) {
    std::set<std::string> taken;
    for (const auto& t : graph.initializer()) taken.insert(t.name());
    std::string name = base;
    for (int i = 1; taken.count(name); ++i) name = base + "_" + std::to_string(i);
    *graph.add_initializer() =
        Tensor::from_values<int64_t>({static_cast<int64_t>(values.size())}, values).to_proto(name);
    return name;
}

// The ops whose signature changed between opset `from` and `to` (beyond what
// this build's ONNX converter knows), adapted node by node: in 18 the Reduce
// ops (but ReduceSum, changed in 13) take their axes as an input; in 20
// GridSample's modes were renamed; GroupNormalization's scale and bias changed
// meaning in 21 and are refused. Every other change in 18-21 only added types
// or attributes whose defaults keep the old behaviour.
void upgrade_nodes(onnx::GraphProto& graph, int64_t from, int64_t to) {
    static const std::set<std::string> kReduceAxesToInput = {"ReduceL1",        "ReduceL2",   "ReduceLogSum",
                                                             "ReduceLogSumExp", "ReduceMax",  "ReduceMean",
                                                             "ReduceMin",       "ReduceProd", "ReduceSumSquare"};
    for (auto& node : *graph.mutable_node()) {
        for_each_subgraph(node, [&](onnx::GraphProto& g) { upgrade_nodes(g, from, to); });
        if (!is_default_domain(node)) continue;
        const auto& op = node.op_type();
        if (from < 18 && to >= 18 && kReduceAxesToInput.count(op)) {
            auto* attrs = node.mutable_attribute();
            auto axes = std::find_if(attrs->begin(), attrs->end(), [](const auto& a) { return a.name() == "axes"; });
            if (axes != attrs->end()) {
                const std::vector<int64_t> values(axes->ints().begin(), axes->ints().end());
                attrs->erase(axes);
                while (node.input_size() < 1) node.add_input("");
                node.add_input(int64_initializer(graph, (node.name().empty() ? op : node.name()) + "_axes", values));
            }
        } else if (from < 20 && to >= 20 && op == "GridSample") {
            for (auto& a : *node.mutable_attribute())
                if (a.name() == "mode") a.set_s(a.s() == "bilinear" ? "linear" : a.s() == "bicubic" ? "cubic" : a.s());
        } else if (to >= 21 && op == "GroupNormalization") {
            throw InputError(
                fmt::format("node '{}': GroupNormalization's scale and bias changed meaning in opset 21; "
                            "this vaiq cannot convert it",
                            node.name()));
        }
    }
}

// Past the newest opset ONNX's converter knows: there with it, then the rest by hand.
Model upgrade_past_onnx(const Model& model, int64_t target, const std::function<void(Model&)>& declare_shapes) {
    const int64_t known = onnx_max_opset();
    Model out = model.opset() < known
                    ? Model(with_deferred_data(converted(model, static_cast<int>(known), declare_shapes), model))
                    : model;
    upgrade_nodes(out.graph(), out.opset(), target);
    for (auto& o : *out.proto().mutable_opset_import())
        if (o.domain().empty() || o.domain() == "ai.onnx") o.set_version(target);
    return out;
}

}  // namespace

Model convert_opset(const Model& model, int64_t target_opset, const std::function<void(Model&)>& declare_shapes) {
    if (target_opset < 1) throw InputError(fmt::format("--opset {} is not an opset version", target_opset));
    const int64_t current = model.opset();
    if (current == 0) throw InputError("the model imports no default-domain opset to convert from");
    constexpr int64_t kNewest = 21;  // what vaiq's executor and these adapters reach
    if (target_opset > kNewest)
        throw InputError(fmt::format("--opset {}: this vaiq converts up to opset {}", target_opset, kNewest));
    try {
        if (target_opset > onnx_max_opset()) {
            if (current > target_opset)
                throw InputError(
                    fmt::format("cannot convert down from opset {} past ONNX {}'s", current, onnx_max_opset()));
            return upgrade_past_onnx(model, target_opset, declare_shapes);
        }
        return Model(with_deferred_data(converted(model, static_cast<int>(target_opset), declare_shapes), model));
    } catch (const std::exception& e) {
        std::string message = e.what();
        if (auto nl = message.find('\n'); nl != std::string::npos) message.resize(nl);
        if (!message.empty() && message.back() == '.') message.pop_back();
        // ONNX's adapters into opsets 12 and 13 need shapes that dynamic models may lack.
        const std::string hint = current < 11 && target_opset > 11
                                     ? "; converting to opset 11 avoids those adapters (vaiq needs 10 or newer)"
                                     : "";
        throw InputError(
            fmt::format("cannot convert the model from opset {} to {}: {}{}", current, target_opset, message, hint));
    }
}

namespace {

bool same_file(const fs::path& a, const fs::path& b) {
    if (a.empty() || b.empty()) return false;
    std::error_code ec;
    if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec);
    return fs::weakly_canonical(a, ec) == fs::weakly_canonical(b, ec);
}

// A tensor name as a file name: path separators and odd characters become '_'.
std::string file_name_for(const std::string& tensor) {
    std::string out;
    for (char c : tensor) out += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ? c : '_';
    return out.empty() || out == "." || out == ".." ? "tensor" + out : out;
}

// One tensor's place in a data file of the written model.
struct Placement {
    onnx::TensorProto* tensor;
    size_t offset, length;
};

// Where each tensor of at least the threshold's bytes goes (raw_data or
// deferred), file by file, relative to the model's folder.
std::map<fs::path, std::vector<Placement>> place_external(onnx::ModelProto& proto, const fs::path& model_path,
                                                          const SaveOptions& options) {
    const fs::path folder =
        options.external_data_location == "./" ? fs::path() : fs::path(options.external_data_location);
    std::map<fs::path, std::vector<Placement>> files;
    std::map<fs::path, size_t> sizes;
    const std::string one_file =
        options.external_data_file.empty() ? model_path.filename().string() + ".data" : options.external_data_file;
    std::set<std::string> taken = {model_path.filename().string(), one_file};
    for_each_tensor(*proto.mutable_graph(), [&](onnx::TensorProto& t) {
        const size_t length = stored_data_bytes(t);
        if ((!t.has_raw_data() && !is_deferred(t)) || length < options.external_data_size_threshold) return;
        fs::path location = folder / one_file;
        if (!options.all_tensors_to_one_file) {
            std::string name = file_name_for(t.name());
            for (int i = 1; !taken.insert(name).second; ++i) name = file_name_for(t.name()) + "_" + std::to_string(i);
            location = folder / name;
        }
        location = location.lexically_normal();
        files[location].push_back({&t, sizes[location], length});
        sizes[location] += length;
    });
    return files;
}

// The files deferred tensors are read from.
std::set<fs::path> deferred_sources(const onnx::ModelProto& proto) {
    std::set<fs::path> out;
    for_each_tensor(proto.graph(), [&](const onnx::TensorProto& t) {
        if (!is_deferred(t)) return;
        for (const auto& entry : t.external_data())
            if (entry.key() == "location") out.insert(fs::path(entry.value()));
    });
    return out;
}

// Reads every deferred tensor below `threshold` bytes (all when 0) into raw_data.
void inline_deferred(onnx::ModelProto& proto, size_t threshold) {
    for_each_tensor(*proto.mutable_graph(), [&](onnx::TensorProto& t) {
        if (is_deferred(t) && (threshold == 0 || stored_data_bytes(t) < threshold)) read_into_raw_data(t);
    });
}

}  // namespace

void save_model(const Model& model, const fs::path& path, const SaveOptions& options, const fs::path& protected_input) {
    if (path.empty()) throw InputError("no output path was given");
    for (const auto& input : {protected_input, model.source()})
        if (same_file(path, input))
            throw InputError(
                fmt::format("refusing to write over the input model {}; choose another output path", input.string()));
    if (options.check) check_model(model);

    const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
        throw InputError(fmt::format("{}: the output folder {} does not exist", path.string(), dir.string()));

    if (!options.use_external_data_format) {
        constexpr size_t kProtobufLimit = std::numeric_limits<int32_t>::max();
        size_t size = model.proto().ByteSizeLong();
        for_each_tensor(model.graph(), [&](const onnx::TensorProto& t) {
            if (is_deferred(t)) size += stored_data_bytes(t);
        });
        if (size > kProtobufLimit)
            throw InputError(
                fmt::format("the model is {:.2f} GB, over protobuf's 2 GB limit for one file; save it "
                            "with use_external_data_format",
                            size / 1e9));
        const auto sources = deferred_sources(model.proto());
        std::optional<onnx::ModelProto> inlined;
        if (!sources.empty()) {
            inlined = model.proto();
            inline_deferred(*inlined, 0);
        }
        const auto& proto = inlined ? *inlined : model.proto();
        write_file_atomically(path, [&](std::ostream& out) {
            if (!proto.SerializeToOstream(&out)) throw InternalError("protobuf failed to serialize the model");
        });
        return;
    }
    const fs::path folder = fs::path(options.external_data_location).lexically_normal();
    if (folder.is_absolute() || (!folder.empty() && *folder.begin() == ".."))
        throw InputError(fmt::format("external_data_location '{}' must be a folder inside the model's folder",
                                     options.external_data_location));
    const fs::path data_name(options.external_data_file);
    if (!options.external_data_file.empty() &&
        (data_name.has_parent_path() || data_name == "." || data_name == ".." || data_name == path.filename()))
        throw InputError(
            fmt::format("the external data file name '{}' must be a plain file name other than the "
                        "model's",
                        options.external_data_file));
    onnx::ModelProto proto = model.proto();
    // Deferred tensors under the threshold stay inline, as raw_data would.
    inline_deferred(proto, options.external_data_size_threshold);
    const auto files = place_external(proto, path, options);
    // The data files are written first, reading deferred tensors from where they are; a file the model
    // reads from must not be replaced under it.
    const auto sources = deferred_sources(proto);
    std::vector<PendingFile> written;
    for (const auto& entry : files) {
        const auto& placements = entry.second;  // not a structured binding: lambdas capture it (clang 14)
        const fs::path file = dir / entry.first;
        for (const auto& source : sources)
            if (same_file(file, source))
                throw InputError(
                    fmt::format("{} would replace {}, which the model's weights are read from; choose "
                                "another output name or external_data_location",
                                file.string(), source.string()));
        fs::create_directories(file.parent_path(), ec);
        written.emplace_back(file, [&](std::ostream& out) {
            for (const auto& p : placements) {
                if (is_deferred(*p.tensor))
                    read_deferred(*p.tensor, [&](const char* bytes, size_t n) {
                        out.write(bytes, static_cast<std::streamsize>(n));
                    });
                else
                    out.write(p.tensor->raw_data().data(), static_cast<std::streamsize>(p.length));
            }
        });
    }
    for (const auto& [location, placements] : files)
        for (const auto& p : placements) set_external_data(*p.tensor, location.generic_string(), p.offset, p.length);
    PendingFile model_file(path, [&](std::ostream& out) {
        if (!proto.SerializeToOstream(&out)) throw InternalError("protobuf failed to serialize the model");
    });
    // Everything is on disk; now the renames. A model left over from an earlier run goes first when its
    // data files are about to be replaced: a process killed between the renames then leaves no model,
    // never an old one reading new data.
    const bool replaces_data =
        std::any_of(files.begin(), files.end(), [&](const auto& f) { return fs::exists(dir / f.first, ec); });
    failpoint("save:before-renames");
    if (replaces_data) fs::remove(path, ec);
    for (auto& file : written) file.commit();
    failpoint("save:data-renamed");
    model_file.commit();
}

}  // namespace vaiq
