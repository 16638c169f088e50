#include "runtime/executor.hpp"

#include <fmt/format.h>
#include <omp.h>
#include <onnx/defs/data_type_utils.h>
#include <onnx/defs/schema.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "runtime/kernels/common.hpp"
#include "runtime/layout.hpp"
#include "runtime/qdq_fusion.hpp"
#include "runtime/team_session.hpp"
#include "runtime/thread_count.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/text.hpp"

namespace vaiq::runtime {

struct Executor::Step {
    int node;
    const KernelFn* kernel;
    int64_t opset;
    std::vector<int> inputs;    ///< value ids, -1 for an omitted input
    std::vector<int> outputs;   ///< value ids, -1 for an omitted output
    std::vector<int> implicit;  ///< outer-scope values its subgraphs read
    std::vector<int> release;   ///< values no later step (nor the caller) needs
    bool lazy = false;          ///< only lazy steps read its outputs: run only when a tap needs them
    std::shared_ptr<void> state;
    bool upcast = false;        ///< float16 inputs computed in float32 (see computes_in_float)
    /// Input positions the op's schema binds to one type parameter (Where's two
    /// choices, Max's operands): kernels read them all as the first one's type.
    std::vector<std::vector<int>> same_type;
    /// Input positions whose schema allows one element type (Resize's scales), with it.
    std::vector<std::pair<int, DataType>> fixed_type;
    bool in_team = false;  ///< its kernel may run inside a TeamSession
};

namespace {

// Arithmetic ops whose float16 values vaiq computes in float32, rounding the
// results to float16, as ONNX Runtime's CPU kernels do for most of them (the
// kernels themselves take float32): what a float16 language model runs.
bool computes_in_float(const onnx::NodeProto& node) {
    static const std::set<std::string, std::less<>> kDefault = {
        "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg", "Abs", "Exp", "Log", "Tanh", "Sigmoid",
        "Relu", "LeakyRelu", "Softmax", "LogSoftmax", "LayerNormalization", "ReduceMean", "ReduceSum", "ReduceMax",
        "ReduceMin", "MatMul", "Gemm", "Gelu", "Erf", "Cos", "Sin", "Clip", "Max", "Min", "DequantizeLinear"};
    static const std::set<std::string, std::less<>> kMicrosoft = {"MatMulNBits", "Gelu", "FastGelu",
                                                                  "SimplifiedLayerNormalization", "SkipLayerNormalization"};
    if (is_default_domain(node)) return kDefault.count(node.op_type()) > 0;
    return node.domain() == "com.microsoft" && kMicrosoft.count(node.op_type()) > 0;
}

std::string shape_string(const std::vector<int64_t>& shape) {
    std::vector<std::string> dims;
    for (auto d : shape) dims.push_back(std::to_string(d));
    return fmt::format("[{}]", join(dims));
}

// What the op's ONNX schema says of its inputs' element types: the positions it
// binds to one type parameter (groups of two or more), and those it allows one
// fixed tensor type. Nothing for ops without a schema here (contrib, internal),
// nor past the newest opset the ONNX library knows (an older schema would be
// wrong there: DequantizeLinear's scale became float16-capable in 19).
void schema_types(const onnx::NodeProto& node, int64_t opset, std::vector<std::vector<int>>& same_type,
                  std::vector<std::pair<int, DataType>>& fixed_type) {
    const auto& known = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
    const auto range = known.find(node.domain() == "ai.onnx" ? std::string() : node.domain());
    if (range == known.end() || opset > range->second.second) return;
    const auto* schema = onnx::OpSchemaRegistry::Schema(node.op_type(), static_cast<int>(opset), node.domain());
    if (!schema || schema->inputs().empty()) return;
    std::set<std::string> parameters;
    for (const auto& c : schema->typeConstraintParams()) parameters.insert(c.type_param_str);
    const auto& formals = schema->inputs();
    const auto& last = formals.back();
    const bool variadic = last.GetOption() == onnx::OpSchema::Variadic && last.GetIsHomogeneous();
    std::map<std::string, std::vector<int>> groups;
    for (int i = 0; i < node.input_size(); ++i) {
        if (node.input(i).empty()) continue;
        if (static_cast<size_t>(i) >= formals.size() && !variadic) break;
        const auto& formal = formals[std::min(static_cast<size_t>(i), formals.size() - 1)];
        if (parameters.count(formal.GetTypeStr())) {
            groups[formal.GetTypeStr()].push_back(i);
        } else if (formal.GetTypes().size() == 1) {
            const auto& type = onnx::Utils::DataTypeUtils::ToTypeProto(*formal.GetTypes().begin());
            if (type.has_tensor_type()) fixed_type.emplace_back(i, static_cast<DataType>(type.tensor_type().elem_type()));
        }
    }
    for (auto& [param, positions] : groups)
        if (positions.size() > 1) same_type.push_back(std::move(positions));
}

// Constant nodes holding a tensor become initializers of the same name (as ONNX
// Runtime makes them at load), so that the rewrites see them as the weights
// they are: exports from other frameworks often store every weight so, and a
// convolution whose weight a Constant node gives would otherwise stay
// channels-first. Not those that are graph outputs.
bool constants_as_initializers(onnx::GraphProto& graph) {
    std::set<std::string> outputs;
    for (const auto& o : graph.output()) outputs.insert(o.name());
    std::vector<int> moved;
    for (int i = 0; i < graph.node_size(); ++i) {
        const auto& node = graph.node(i);
        if (node.op_type() != "Constant" || !is_default_domain(node) || node.output_size() != 1 ||
            node.attribute_size() != 1 || node.attribute(0).name() != "value" || !node.attribute(0).has_t() ||
            outputs.count(node.output(0)))
            continue;
        auto* init = graph.add_initializer();
        *init = node.attribute(0).t();
        init->set_name(node.output(0));
        moved.push_back(i);
    }
    remove_nodes(graph, moved);
    return !moved.empty();
}

int64_t domain_opset(const Model& model, const std::string& domain) {
    const auto d = canonical_domain(domain);
    return model.opset(d.empty() ? "" : d);
}

}  // namespace

Executor::Executor(const Model& original, ExecutorOptions options) : model_(&original), options_(options) {
    // Kernels made here (oneDNN's primitives) plan for the thread count they see.
    std::optional<ThreadCount> threads;
    if (options_.threads > 0) threads.emplace(options_.threads);
    rewrite(original);
    number_values();
    find_lazy_steps();
    fold_constants();
    plan_releases();
    find_lazy_steps();
    find_transposed_taps(original);
    last_reader_ = last_readers(std::vector<bool>(steps_.size(), false));
}

// QDQ fusion, pattern fusion and layout changes, on a copy of the model.
void Executor::rewrite(const Model& original) {
    if (!options_.optimize_layout && !options_.fuse_qdq && !options_.fuse_patterns) return;
    onnx::ModelProto copy = original.proto();
    bool changed = constants_as_initializers(*copy.mutable_graph());
    if (options_.fuse_qdq) {
        std::vector<std::string> gone;
        changed = fuse_qdq(copy, gone);
        fused_away_.insert(gone.begin(), gone.end());
    }
    if (options_.fuse_patterns) changed = fuse_patterns(*copy.mutable_graph(), options_.taps) || changed;
    if (options_.optimize_layout) changed = optimize_layout(*copy.mutable_graph(), options_.taps) || changed;
    if (changed) {
        optimized_.emplace(std::move(copy), original.source());
        model_ = &*optimized_;
    }
}

int Executor::id_of(const std::string& name) {
    auto [it, inserted] = value_ids_.emplace(name, static_cast<int>(value_names_.size()));
    if (inserted) value_names_.push_back(name);
    return it->second;
}

// Numbers every value, finds each node's kernel and orders the steps.
void Executor::number_values() {
    const Model& model = *model_;
    const auto& graph = model.graph();
    std::set<std::string> initialized;
    for (const auto& init : graph.initializer()) {
        const int id = id_of(init.name());
        constants_.resize(value_names_.size());
        constants_[id] = Tensor::from_proto(init);
        initialized.insert(init.name());
    }
    for (const auto& in : graph.input()) {
        id_of(in.name());
        if (!initialized.count(in.name())) input_names_.push_back(in.name());
    }

    std::vector<std::string> unsupported;
    for (int n : topological_order(graph)) {
        const auto& node = graph.node(n);
        Step step{n, nullptr, domain_opset(model, node.domain()), {}, {}, {}, {}, false, nullptr, false, {}, {}, false};
        step.kernel = KernelRegistry::instance().find(node.domain(), node.op_type(), step.opset);
        step.in_team = KernelRegistry::instance().runs_in_team(node.domain(), node.op_type(), step.opset);
        schema_types(node, step.opset, step.same_type, step.fixed_type);
        step.upcast = computes_in_float(node);
        if (!step.kernel)
            unsupported.push_back(fmt::format("{} ({}{}{}, opset {})", node.name().empty() ? "<unnamed>" : node.name(),
                                              node.domain(), node.domain().empty() ? "" : ":", node.op_type(),
                                              step.opset));
        for (const auto& in : node.input()) step.inputs.push_back(in.empty() ? -1 : id_of(in));
        for (const auto& out : node.output()) step.outputs.push_back(out.empty() ? -1 : id_of(out));
        for (const auto& name : outer_scope_reads(node)) step.implicit.push_back(id_of(name));
        steps_.push_back(std::move(step));
    }
    if (!unsupported.empty())
        throw InputError(fmt::format("vaiq's executor has no kernel for {} node{}: {}", unsupported.size(),
                                     unsupported.size() == 1 ? "" : "s", join(unsupported, "; ")));
    for (const auto& out : graph.output()) {
        output_names_.push_back(out.name());
        id_of(out.name());
    }
    constants_.resize(value_names_.size());
    is_constant_.assign(value_names_.size(), false);
    for (const auto& name : initialized) is_constant_[value_ids_.at(name)] = true;
    // The rewritten copy's initializers live on as constants: their data need not be held twice.
    if (optimized_) {
        size_t dropped = 0;
        for (auto& init : *optimized_->graph().mutable_initializer()) {
            dropped += init.ByteSizeLong();
            onnx::TensorProto header;
            header.set_name(init.name());
            header.set_data_type(init.data_type());
            *header.mutable_dims() = init.dims();
            init.Swap(&header);
        }
        if (dropped >= kReturnedFreeBytes) return_freed_memory();
    }
}

// Liveness: a value dies after the last step that reads it, unless the caller
// gets it. Values nothing produces are read from an enclosing scope.
void Executor::plan_releases() {
    std::vector<int> last_use(value_names_.size(), -1);
    std::vector<bool> produced(value_names_.size(), false);
    for (const auto& step : steps_)
        for (int id : step.outputs)
            if (id >= 0) produced[id] = true;
    for (size_t s = 0; s < steps_.size(); ++s) {
        for (const auto* ids : {&steps_[s].inputs, &steps_[s].implicit})
            for (int id : *ids)
                if (id >= 0) last_use[id] = static_cast<int>(s);
        for (int id : steps_[s].outputs)
            if (id >= 0 && last_use[id] < static_cast<int>(s)) last_use[id] = static_cast<int>(s);
    }
    for (const auto& out : output_names_) last_use[value_ids_.at(out)] = -1;
    for (size_t id = 0; id < value_names_.size(); ++id) {
        const auto& name = value_names_[id];
        const bool is_input = std::find(input_names_.begin(), input_names_.end(), name) != input_names_.end();
        if (!produced[id] && !is_constant_[id] && !is_input) outer_names_.push_back(name);
    }
    for (size_t id = 0; id < last_use.size(); ++id)
        if (last_use[id] >= 0 && !is_constant_[id]) steps_[last_use[id]].release.push_back(static_cast<int>(id));
}

// Steps whose outputs only lazy steps read (layout transposes kept for taps, the plain
// convolution behind a fused activation, dead nodes) run on demand: from the last step
// back, a step is needed when a needed step or the graph's outputs read it.
void Executor::find_lazy_steps() {
    std::vector<bool> read(value_names_.size(), false);
    for (const auto& out : output_names_) read[value_ids_.at(out)] = true;
    for (auto it = steps_.rbegin(); it != steps_.rend(); ++it) {
        auto& step = *it;
        step.lazy = std::none_of(step.outputs.begin(), step.outputs.end(), [&](int id) { return id >= 0 && read[id]; });
        if (step.lazy) continue;
        for (const auto* ids : {&step.inputs, &step.implicit})
            for (int id : *ids)
                if (id >= 0) read[id] = true;
    }
}

// The Transposes that give a tap channels-first. A lazy one computes it only
// for taps: an any-order tap reads its input instead. At an NHWC -> NCHW one
// the layout optimisation made, lazy or not, a fork or rewrite of the tap works
// on its input, which the channels-last readers read (a fork or rewrite of the
// output alone would miss them). A transpose of the model's own is left as it
// is: its input is a value of its own, perhaps forked or rewritten too.
void Executor::find_transposed_taps(const Model& original) {
    transposed_from_.assign(value_names_.size(), -1);
    channels_last_form_.assign(value_names_.size(), -1);
    static const std::vector<int64_t> kToNchw{0, 3, 1, 2};
    std::set<std::string> own;  // the values of the model as given
    if (optimized_) {
        for (const auto& in : original.graph().input()) own.insert(in.name());
        for (const auto& node : original.graph().node()) own.insert(node.output().begin(), node.output().end());
    }
    for (const auto& step : steps_) {
        const auto& node = model_->graph().node(step.node);
        if (node.op_type() != "Transpose" || !is_default_domain(node) || step.inputs.size() != 1 ||
            step.outputs.size() != 1 || step.inputs[0] < 0 || step.outputs[0] < 0)
            continue;
        const auto& name = value_names_[step.outputs[0]];
        if (step.lazy && options_.any_order_taps.count(name)) transposed_from_[step.outputs[0]] = step.inputs[0];
        const auto* perm = find_attribute(node, "perm");
        if (optimized_ && options_.taps.count(name) && !own.count(value_names_[step.inputs[0]]) && perm &&
            std::vector<int64_t>(perm->ints().begin(), perm->ints().end()) == kToNchw)
            channels_last_form_[step.outputs[0]] = step.inputs[0];
    }
}

namespace {

// A 4-D tensor moved between channels-last and channels-first: rows of `rows`
// by `cols` per batch item transposed (4-byte elements by the fast kernel).
Tensor move_channels(const Tensor& t, bool to_last) {
    const auto& s = t.shape();
    if (s.size() != 4) throw std::logic_error("a channels-last fork or rewrite of a tensor that is not 4-D");
    if (element_size(t.type()) != 4)
        return permute4(t, to_last ? std::vector<int64_t>{0, 2, 3, 1} : std::vector<int64_t>{0, 3, 1, 2});
    Tensor out = Tensor::uninitialized(t.type(), to_last ? std::vector<int64_t>{s[0], s[2], s[3], s[1]}
                                                         : std::vector<int64_t>{s[0], s[3], s[1], s[2]});
    const int64_t rows = to_last ? s[1] : s[1] * s[2], cols = to_last ? s[2] * s[3] : s[3];
    transpose_4_byte(t.bytes().data(), out.mutable_bytes().data(), s[0], rows, cols);
    return out;
}

}  // namespace

std::vector<int> Executor::last_readers(const std::vector<bool>& run_lazy) const {
    std::vector<int> last(value_names_.size(), -1);
    for (size_t s = 0; s < steps_.size(); ++s) {
        if (steps_[s].lazy && !run_lazy[s]) continue;
        for (const auto* ids : {&steps_[s].inputs, &steps_[s].implicit})
            for (int id : *ids)
                if (id >= 0) last[id] = static_cast<int>(s);
    }
    for (const auto& name : output_names_) last[value_ids_.at(name)] = -1;
    return last;
}

// Ops whose output differs from run to run although their inputs do not.
static bool is_random(const onnx::NodeProto& node) {
    static const std::set<std::string> kRandom = {"RandomNormal",      "RandomNormalLike", "RandomUniform",
                                                  "RandomUniformLike", "Multinomial",      "Bernoulli"};
    return kRandom.count(node.op_type()) > 0;
}

void Executor::fold_constants() {
    // A step that reads only constants (Constant nodes, the DequantizeLinear of a stored
    // weight, shape arithmetic on initializers) computes the same every run: it runs once
    // here and its outputs become constants, the same objects every run, so the kernels
    // that read them keep their prepared layouts too.
    std::vector<Step> kept;
    for (auto& step : steps_) {
        const auto& node = model_->graph().node(step.node);
        // A step nothing needs (a weight's DequantizeLinear that the QDQ fusion replaced)
        // stays lazy: folded, it would hold a float copy of the weight for nobody.
        bool foldable = !step.lazy && step.implicit.empty() && !is_random(node);
        for (const auto& a : node.attribute()) foldable = foldable && !a.has_g() && a.graphs_size() == 0;
        for (int id : step.inputs) foldable = foldable && (id < 0 || is_constant_[id]);
        // A large weight is dequantized in each run instead: folded, its float copy (4x an
        // int8 weight's bytes) would sit beside it for the executor's life.
        if (foldable && node.op_type() == "DequantizeLinear" && !step.inputs.empty() && step.inputs[0] >= 0 &&
            static_cast<size_t>(constants_[step.inputs[0]].size()) * sizeof(float) >= kLargeConstantBytes)
            foldable = false;
        if (foldable) {
            KernelContext ctx{*model_, node, step.opset, {}, {}, Attributes(node), step.state, {}};
            for (int id : step.inputs) {
                ctx.inputs.push_back(id >= 0 ? &constants_[id] : nullptr);
                ctx.constant.push_back(id >= 0);
            }
            std::vector<Tensor> outputs(step.outputs.size());
            try {
                (*step.kernel)(ctx, outputs);
            } catch (const std::exception&) {
                foldable = false;  // left to fail (or not) when it runs, with the run's context
            }
            if (foldable) {
                for (size_t o = 0; o < step.outputs.size(); ++o) {
                    const int id = step.outputs[o];
                    if (id < 0) continue;
                    constants_[id] = std::move(outputs[o]);
                    is_constant_[id] = true;
                }
                continue;
            }
        }
        kept.push_back(std::move(step));
    }
    steps_ = std::move(kept);
}

Executor::~Executor() = default;

int Executor::value_id(const std::string& name) const {
    auto it = value_ids_.find(name);
    return it == value_ids_.end() ? -1 : it->second;
}

void Executor::check_feed(const std::string& name, const Tensor& value) const {
    for (const auto& in : model_->graph().input()) {
        if (in.name() != name || !in.type().has_tensor_type()) continue;
        const auto& t = in.type().tensor_type();
        if (t.elem_type() != 0 && t.elem_type() != static_cast<int>(value.type()))
            throw InputError(fmt::format("input '{}' is {}, but the model expects {}", name,
                                         data_type_name(value.type()),
                                         data_type_name(static_cast<DataType>(t.elem_type()))));
        if (!t.has_shape()) return;
        const auto& dims = t.shape().dim();
        bool ok = dims.size() == static_cast<int>(value.shape().size());
        for (int d = 0; ok && d < dims.size(); ++d)
            ok = !dims[d].has_dim_value() || dims[d].dim_value() == value.shape()[d];
        if (!ok) {
            std::vector<std::string> want;
            for (const auto& d : dims)
                want.push_back(d.has_dim_value() ? std::to_string(d.dim_value())
                                                 : (d.dim_param().empty() ? "?" : d.dim_param()));
            throw InputError(fmt::format("input '{}' has shape {}, but the model expects [{}]", name,
                                         shape_string(value.shape()), join(want)));
        }
    }
}

// A run's values by id: what the run computed or was fed, else what a
// subgraph borrows from its enclosing run, else the constants.
struct Executor::Values {
    const Executor& executor;
    std::vector<std::optional<Tensor>> slots;
    std::vector<ScopeValue> borrowed;  ///< by id; empty unless the run is nested
    /// run_forking()'s rewritten values: by id, the value whose name the rewrite
    /// sees (itself, or the channels-first tensor a channels-last one stands
    /// for), -1 for one not rewritten; and its rewrite. Shared with the resumed runs.
    const std::vector<int>* rewritten = nullptr;
    const Rewrite* rewrite = nullptr;

    explicit Values(const Executor& e) : executor(e), slots(e.value_names_.size()) {}
    const Tensor* get(int id) const {
        if (slots[id]) return &*slots[id];
        if (!borrowed.empty() && borrowed[id].tensor) return borrowed[id].tensor;
        return executor.is_constant_[id] ? &executor.constants_[id] : nullptr;
    }
    // The same object every run: the executor's constant, or the enclosing one's.
    bool constant(int id) const {
        if (slots[id]) return false;
        if (!borrowed.empty() && borrowed[id].tensor) return borrowed[id].constant;
        return executor.is_constant_[id];
    }
};

std::vector<Tensor> Executor::run(const std::map<std::string, Tensor>& feeds, const std::vector<std::string>& taps,
                                  const Tap& tap) {
    Values values(*this);
    bind_feeds(feeds, values);
    return run(values, taps, tap, true);
}

void Executor::run_taps(const std::map<std::string, Tensor>& feeds, const std::vector<std::string>& taps,
                        const Tap& tap) {
    Values values(*this);
    bind_feeds(feeds, values);
    run(values, taps, tap, false);
}

std::vector<Tensor> Executor::run_nested(const std::map<std::string, Tensor>& feeds,
                                         const std::vector<ScopeValue>& outer) {
    if (outer.size() != outer_names_.size())
        throw std::logic_error(
            fmt::format("a nested run needs {} outer values, not {}", outer_names_.size(), outer.size()));
    Values values(*this);
    bind_feeds(feeds, values);
    values.borrowed.resize(value_names_.size());
    for (size_t i = 0; i < outer.size(); ++i) values.borrowed[value_ids_.at(outer_names_[i])] = outer[i];
    return run(values, {}, {}, true);
}

// Where run_forking() forks: the value ids to fork at, before each step (and at the end).
struct Executor::Forks {
    std::vector<std::vector<int>> before;  ///< steps_.size() + 1 entries
    const Fork& fork;
};

std::optional<size_t> Executor::fork_step(int id) const {
    if (id >= 0 && channels_last_form_[id] >= 0) return fork_step(channels_last_form_[id]);
    if (id < 0 || fused_away_.count(value_names_[id])) return std::nullopt;
    std::optional<size_t> producer;
    for (size_t s = 0; s < steps_.size(); ++s) {
        const auto& step = steps_[s];
        if (std::find(step.outputs.begin(), step.outputs.end(), id) != step.outputs.end()) {
            if (step.lazy) return std::nullopt;  // computed only for taps
            producer = s;
        }
        if (step.lazy) continue;
        for (const auto* ids : {&step.inputs, &step.implicit})
            if (std::find(ids->begin(), ids->end(), id) != ids->end()) return s;
    }
    const bool known = is_constant_[id] || producer ||
                       std::find(input_names_.begin(), input_names_.end(), value_names_[id]) != input_names_.end();
    const bool output = std::find(output_names_.begin(), output_names_.end(), value_names_[id]) != output_names_.end();
    if (!known || !output) return std::nullopt;
    return producer ? *producer + 1 : 0;
}

bool Executor::can_fork(const std::string& tensor) const { return fork_step(value_id(tensor)).has_value(); }

std::vector<Tensor> Executor::run_forking(const std::map<std::string, Tensor>& feeds,
                                          const std::vector<std::string>& forks, const Fork& fork,
                                          const std::vector<std::string>& rewritten, const Rewrite& rewrite) {
    Forks points{std::vector<std::vector<int>>(steps_.size() + 1), fork};
    auto forkable = [&](const std::string& name) {
        const int id = value_id(name);
        const auto s = fork_step(id);
        if (!s) throw InputError(fmt::format("cannot fork at '{}': no step of every run reads it", name));
        return std::make_pair(id, *s);
    };
    for (const auto& name : forks) {
        const auto [id, s] = forkable(name);
        points.before[s].push_back(id);
    }
    std::vector<int> rewrites(value_names_.size(), -1);
    for (const auto& name : rewritten) {
        const int id = forkable(name).first;
        rewrites[channels_last_form_[id] >= 0 ? channels_last_form_[id] : id] = id;
    }
    Values values(*this);
    bind_feeds(feeds, values);
    if (rewrite && !rewritten.empty()) {
        values.rewritten = &rewrites, values.rewrite = &rewrite;
        for (size_t id = 0; id < rewrites.size(); ++id)  // a graph input's as it is fed
            if (rewrites[id] >= 0 && values.slots[id]) rewrite_value(static_cast<int>(id), values);
    }
    return run(values, {}, {}, true, 0, &points);
}

void Executor::rewrite_value(int id, Values& values) const {
    const int as = (*values.rewritten)[id];
    auto& value = *values.slots[id];
    if (as == id) return (*values.rewrite)(value_names_[id], value);
    Tensor channels_first = move_channels(value, false);
    (*values.rewrite)(value_names_[as], channels_first);
    value = move_channels(channels_first, true);
}

// The forks before step s (s = steps_.size(): after the last): each resumed
// run reads what `values` holds now and owns only what it computes itself. A
// tensor held channels-last is given channels-first and resumes transposed back.
void Executor::fork_at(size_t s, Values& values, const Forks& forks) {
    for (const int forked : forks.before[s]) {
        const int id = channels_last_form_[forked] >= 0 ? channels_last_form_[forked] : forked;
        const Tensor* value = values.get(id);
        if (!value)
            throw InputError(fmt::format("cannot fork at '{}': the run has no value for it", value_names_[forked]));
        std::optional<Tensor> channels_first;
        if (id != forked) channels_first = move_channels(*value, false);
        const Resume resume = [&, id, forked](Tensor replacement) {
            Values rest(*this);
            rest.rewritten = values.rewritten, rest.rewrite = values.rewrite;
            rest.borrowed.resize(value_names_.size());
            for (size_t v = 0; v < value_names_.size(); ++v) {
                if (values.slots[v])
                    rest.borrowed[v] = {&*values.slots[v], false};
                else if (!values.borrowed.empty())
                    rest.borrowed[v] = values.borrowed[v];
            }
            rest.slots[id] = id == forked ? std::move(replacement) : move_channels(replacement, true);
            return run(rest, {}, {}, true, s);
        };
        forks.fork(value_names_[forked], channels_first ? *channels_first : *value, resume);
    }
}

std::vector<Tensor> Executor::run(Values& values, const std::vector<std::string>& taps, const Tap& tap,
                                  bool want_outputs, size_t first, const Forks* forks) {
    // For this run only: a count left set held for everything after it (constant
    // folding's one-thread runs left whole calibrations on one core).
    std::optional<ThreadCount> threads;
    if (options_.threads > 0) threads.emplace(options_.threads);
    const KeptLargeBlocks for_the_next_steps_and_runs;
    auto tapped = start_taps(taps, tap, values);
    // An any-order tap behind a layout transpose is tapped at the transpose's input.
    std::map<int, std::vector<int>> tapped_at;  // value id -> the tapped names it stands for
    for (size_t id = 0; id < tapped.size() && !options_.any_order_taps.empty(); ++id) {
        const int source = transposed_from_[id];
        if (!tapped[id] || source < 0) continue;
        tapped[id] = false;
        if (const Tensor* known = values.get(source)) {
            if (tap) tap(value_names_[id], *known);
        } else {
            tapped_at[source].push_back(static_cast<int>(id));
        }
    }
    auto demanded = tapped;
    for (const auto& [source, names] : tapped_at) demanded[source] = true;
    // Without outputs, the run ends when the last demanded value has been made
    // (those known from the start, feeds and constants, were tapped already).
    int64_t pending = 0;
    for (size_t id = 0; id < demanded.size(); ++id) pending += demanded[id] && !values.get(static_cast<int>(id));
    if (!want_outputs && pending == 0) return {};
    const auto run_lazy = lazy_steps_for(demanded);
    // Which step of this run reads each value last: fixed unless a tap runs lazy steps.
    const bool lazy_runs = std::find(run_lazy.begin(), run_lazy.end(), true) != run_lazy.end();
    const std::vector<int> tapped_last_reader = lazy_runs ? last_readers(run_lazy) : std::vector<int>();
    const auto& last_reader = lazy_runs ? tapped_last_reader : last_reader_;
    // Runs step s; false when the run can end there.
    auto run_one = [&](size_t s) {
        const auto& step = steps_[s];
        if (!step.lazy || run_lazy[s]) {
            auto outputs = run_step(s, values, last_reader);
            for (size_t o = 0; o < step.outputs.size(); ++o) {
                const int id = step.outputs[o];
                if (id < 0) continue;
                values.slots[id] = std::move(outputs[o]);
                if (values.rewrite && (*values.rewritten)[id] >= 0) rewrite_value(id, values);
                if (tapped[id] && tap) tap(value_names_[id], *values.slots[id]);
                if (auto at = tapped_at.find(id); at != tapped_at.end() && tap)
                    for (int name : at->second) tap(value_names_[name], *values.slots[id]);
                pending -= demanded[id] ? 1 : 0;
            }
            if (!want_outputs && pending == 0) return false;
        }
        for (int id : step.release) values.slots[id].reset();
        return true;
    };
    // Runs of two or more steps whose kernels may share one TeamSession run in
    // one (a step whose outputs go to a tap or a rewrite does not: their own
    // loops would run on one thread there).
    const int team = TeamSession::leading() || omp_in_parallel() ? 1 : omp_get_max_threads();
    auto forks_before = [&](size_t s) { return forks && !forks->before[s].empty(); };
    auto in_session = [&](size_t s) {
        if (!steps_[s].in_team) return false;
        for (int id : steps_[s].outputs)
            if (id >= 0 && (tapped[id] || tapped_at.count(id) || (values.rewrite && (*values.rewritten)[id] >= 0)))
                return false;
        return true;
    };
    bool going = true;
    for (size_t s = first; s < steps_.size() && going;) {
        // A fork's resumed runs start their own sessions: none is open here.
        if (forks_before(s)) fork_at(s, values, *forks);
        size_t end = s;
        while (team > 1 && end < steps_.size() && in_session(end) && (end == s || !forks_before(end))) ++end;
        if (end - s >= 2) {
            TeamSession::run(team, [&] {
                for (; s < end && going; ++s) going = run_one(s);
            });
        } else {
            going = run_one(s++);
        }
    }
    if (!going) return {};
    if (forks_before(steps_.size())) fork_at(steps_.size(), values, *forks);
    return want_outputs ? take_outputs(values) : std::vector<Tensor>();
}

// Checks the feeds against the inputs (an outer-scope value is taken as it is) and binds them.
void Executor::bind_feeds(const std::map<std::string, Tensor>& feeds, Values& values) const {
    for (const auto& [name, tensor] : feeds) {
        const int id = value_id(name);
        const bool outer = std::find(outer_names_.begin(), outer_names_.end(), name) != outer_names_.end();
        if (id < 0 || (!outer && std::find(input_names_.begin(), input_names_.end(), name) == input_names_.end() &&
                       !is_constant_[id]))
            throw InputError(fmt::format("the model has no input '{}' (inputs: {})", name, join(input_names_)));
        if (!outer) check_feed(name, tensor);
        values.slots[id] = tensor;
    }
    for (const auto& name : input_names_)
        if (!feeds.count(name)) throw InputError(fmt::format("input '{}' was not given", name));
}

// The tapped values by id; those known already (feeds, constants) go to the tap now.
std::vector<bool> Executor::start_taps(const std::vector<std::string>& taps, const Tap& tap,
                                       const Values& values) const {
    std::vector<bool> tapped(value_names_.size(), false);
    for (const auto& t : taps) {
        const int id = value_id(t);
        if (fused_away_.count(t))
            throw InputError(
                fmt::format("cannot tap '{}': it is computed inside an integer operator here (QDQ fusion); "
                            "turn the fusion off to see it",
                            t));
        if (id < 0) throw InputError(fmt::format("cannot tap '{}': the model has no such tensor", t));
        tapped[id] = true;
        if (tap && values.get(id)) tap(t, *values.get(id));
    }
    return tapped;
}

// The lazy steps this run needs: those producing a tapped value, and what they read.
std::vector<bool> Executor::lazy_steps_for(const std::vector<bool>& tapped) const {
    std::vector<bool> demanded = tapped;
    std::vector<bool> run_lazy(steps_.size(), false);
    for (size_t s = steps_.size(); s-- > 0;) {
        const auto& step = steps_[s];
        if (!step.lazy ||
            std::none_of(step.outputs.begin(), step.outputs.end(), [&](int id) { return id >= 0 && demanded[id]; }))
            continue;
        run_lazy[s] = true;
        for (const auto* ids : {&step.inputs, &step.implicit})
            for (int id : *ids)
                if (id >= 0) demanded[id] = true;
    }
    return run_lazy;
}

// Runs one step's kernel; a run value it reads for the last time (and once) is
// the kernel's to reuse.
std::vector<Tensor> Executor::run_step(size_t s, Values& values, const std::vector<int>& last_reader) {
    auto& step = steps_[s];
    const auto& node = model_->graph().node(step.node);
    KernelContext ctx{*model_, node, step.opset, {}, {}, Attributes(node), step.state, {}};
    if (!step.implicit.empty())
        ctx.lookup = [&](const std::string& name) {
            const int id = value_id(name);
            return id >= 0 ? ScopeValue{values.get(id), values.constant(id)} : ScopeValue{};
        };
    ctx.inputs.reserve(step.inputs.size());  // one allocation each, not one per doubling
    ctx.constant.reserve(step.inputs.size());
    ctx.donated.reserve(step.inputs.size());
    for (int id : step.inputs) {
        if (id >= 0 && !values.get(id))
            throw InputError(
                fmt::format("node '{}' reads '{}', which nothing produced", node.name(), value_names_[id]));
        ctx.inputs.push_back(id >= 0 ? values.get(id) : nullptr);
        ctx.constant.push_back(id >= 0 && values.constant(id));
        const bool last_read = id >= 0 && values.slots[id] && last_reader[id] == static_cast<int>(s) &&
                               std::count(step.inputs.begin(), step.inputs.end(), id) == 1;
        ctx.donated.push_back(last_read ? &*values.slots[id] : nullptr);
    }
    for (const auto& [i, type] : step.fixed_type)
        if (ctx.inputs[i] && ctx.inputs[i]->type() != type)
            ctx.fail(fmt::format("input {} must be {}, not {}", i, data_type_name(type),
                                 data_type_name(ctx.inputs[i]->type())));
    for (const auto& group : step.same_type)
        for (int i : group)
            if (ctx.inputs[i] && ctx.inputs[group.front()] && ctx.inputs[i]->type() != ctx.inputs[group.front()]->type())
                ctx.fail(fmt::format("inputs {} and {} must have one element type, not {} and {}", group.front(), i,
                                     data_type_name(ctx.inputs[group.front()]->type()),
                                     data_type_name(ctx.inputs[i]->type())));
    // float16 values in float32 for the kernel (not constants then: kernels key what they keep on them).
    std::vector<Tensor> widened;
    const bool upcast = step.upcast && std::any_of(ctx.inputs.begin(), ctx.inputs.end(), [](const Tensor* t) {
                            return t && t->type() == DataType::Float16;
                        });
    if (upcast) {
        widened.reserve(ctx.inputs.size());
        for (size_t i = 0; i < ctx.inputs.size(); ++i) {
            if (!ctx.inputs[i] || ctx.inputs[i]->type() != DataType::Float16) continue;
            widened.push_back(convert_float_type(*ctx.inputs[i], DataType::Float));
            ctx.inputs[i] = &widened.back();
            ctx.constant[i] = false;
            ctx.donated[i] = nullptr;
        }
    }
    std::vector<Tensor> outputs(step.outputs.size());
    const auto start = options_.profile ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    (*step.kernel)(ctx, outputs);
    if (upcast)
        for (auto& t : outputs)
            if (t.type() == DataType::Float) t = convert_float_type(t, DataType::Float16);
    if (options_.profile) {
        auto& p = profile_[node.op_type()];
        p.op_type = node.op_type();
        ++p.calls;
        p.milliseconds += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    }
    return outputs;
}

// The graph outputs: run values are the caller's now; constants (and an output listed twice) are copied.
std::vector<Tensor> Executor::take_outputs(Values& values) const {
    std::vector<Tensor> results;
    for (const auto& name : output_names_) {
        const int id = value_ids_.at(name);
        if (!values.get(id)) throw InputError(fmt::format("output '{}' was never computed", name));
        const bool movable = values.slots[id] && std::count(output_names_.begin(), output_names_.end(), name) == 1;
        results.push_back(movable ? std::move(*values.slots[id]) : *values.get(id));
    }
    return results;
}

std::vector<OpProfile> Executor::profile() const {
    std::vector<OpProfile> out;
    for (const auto& [op, p] : profile_) out.push_back(p);
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.milliseconds > b.milliseconds; });
    return out;
}

}  // namespace vaiq::runtime
