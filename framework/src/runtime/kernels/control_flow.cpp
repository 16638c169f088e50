// Control flow: If, Loop and Scan run subgraphs, which may read the enclosing scope.
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "runtime/executor.hpp"
#include "runtime/kernels/common.hpp"

namespace vaiq::runtime {

namespace {

// A graph attribute compiled once: the graph as a model (with the parent's
// opsets) and its executor, kept in the node's state.
struct Subgraph {
    Model model;
    std::unique_ptr<Executor> executor;
};

struct SubgraphState {
    std::map<std::string, std::unique_ptr<Subgraph>> graphs;
};

Subgraph& subgraph(KernelContext& ctx, const std::string& name) {
    auto state = std::static_pointer_cast<SubgraphState>(ctx.state);
    if (!state) {
        state = std::make_shared<SubgraphState>();
        ctx.state = state;
    }
    auto& slot = state->graphs[name];
    if (!slot) {
        const onnx::GraphProto* graph = nullptr;
        for (const auto& a : ctx.node.attribute())
            if (a.name() == name && a.has_g()) graph = &a.g();
        if (!graph) ctx.fail("has no " + name);
        onnx::ModelProto proto;
        proto.set_ir_version(ctx.model.proto().ir_version());
        *proto.mutable_opset_import() = ctx.model.proto().opset_import();
        *proto.mutable_graph() = *graph;
        auto made = std::make_unique<Subgraph>();
        made->model = Model(std::move(proto));
        made->executor = std::make_unique<Executor>(made->model, ExecutorOptions{});
        slot = std::move(made);
    }
    return *slot;
}

// What the subgraph reads of the enclosing scope: borrowed, not copied (a
// branch often reads the enclosing graph's weights).
std::vector<ScopeValue> enclosing_values(KernelContext& ctx, const Subgraph& g) {
    std::vector<ScopeValue> outer;
    for (const auto& name : g.executor->outer_names()) {
        outer.push_back(ctx.lookup ? ctx.lookup(name) : ScopeValue{});
        if (!outer.back().tensor)
            ctx.fail("the subgraph reads '" + name + "', which the enclosing graph does not have");
    }
    return outer;
}

const std::string& input_name(const Subgraph& g, int i) { return g.model.graph().input(i).name(); }

// `parts` (one shape and type) stacked along a new axis `axis`.
Tensor stack(const KernelContext& ctx, const std::vector<Tensor>& parts, int64_t axis, DataType empty_type) {
    if (parts.empty()) return Tensor(empty_type, {0});
    const auto& first = parts.front();
    for (const auto& p : parts)
        if (p.shape() != first.shape() || p.type() != first.type())
            ctx.fail(fmt::format("a scan output changes from {} [{}] to {} [{}] between iterations",
                                 data_type_name(first.type()), fmt::join(first.shape(), ", "), data_type_name(p.type()),
                                 fmt::join(p.shape(), ", ")));
    std::vector<int64_t> shape = first.shape();
    int64_t before = 1, after = 1;
    for (int64_t d = 0; d < axis; ++d) before *= shape[d];
    for (size_t d = static_cast<size_t>(axis); d < shape.size(); ++d) after *= shape[d];
    shape.insert(shape.begin() + axis, static_cast<int64_t>(parts.size()));
    Tensor out(first.type(), shape);
    const size_t row = static_cast<size_t>(after) * element_size(first.type());
    for (int64_t o = 0; o < before; ++o)
        for (size_t i = 0; i < parts.size(); ++i)
            std::memcpy(out.mutable_bytes().data() + (static_cast<size_t>(o) * parts.size() + i) * row,
                        parts[i].bytes().data() + static_cast<size_t>(o) * row, row);
    return out;
}

DataType declared_output_type(const Subgraph& g, int i) {
    const auto type = g.model.graph().output(i).type().tensor_type().elem_type();
    return type == 0 ? DataType::Float : static_cast<DataType>(type);
}

void if_kernel(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& cond = ctx.input(0);
    if (cond.type() != DataType::Bool || cond.size() != 1) ctx.fail("the condition must be a single bool");
    auto& b = subgraph(ctx, view<bool>(cond)[0] ? "then_branch" : "else_branch");
    auto results = b.executor->run_nested({}, enclosing_values(ctx, b));
    if (results.size() != out.size())
        ctx.fail(fmt::format("the branch has {} outputs; the node has {}", results.size(), out.size()));
    for (size_t i = 0; i < out.size(); ++i) out[i] = std::move(results[i]);
}

// Loop: body(iteration, cond, carried...) -> (cond, carried..., scan outputs...)
// while the iteration is below M (when given) and cond holds; scan outputs are
// stacked along a new first axis.
void loop_kernel(KernelContext& ctx, std::vector<Tensor>& out) {
    auto& body = subgraph(ctx, "body");
    const int carried = static_cast<int>(ctx.input_count()) - 2;
    if (carried < 0 || body.model.graph().input_size() != carried + 2)
        ctx.fail(fmt::format("the body takes {} inputs; the node gives it {} loop-carried values",
                             body.model.graph().input_size(), std::max(carried, 0)));
    const int scans = body.model.graph().output_size() - 1 - carried;
    if (scans < 0 || static_cast<int>(out.size()) != carried + scans)
        ctx.fail(fmt::format("the body has {} outputs; the node has {} outputs and {} loop-carried values",
                             body.model.graph().output_size(), out.size(), carried));
    auto scalar = [&](size_t i, DataType type, const char* what) -> const Tensor& {
        const auto& t = ctx.input(i);
        if (t.type() != type || t.size() != 1)
            ctx.fail(std::string(what) + " must be a single " + data_type_name(type));
        return t;
    };
    const bool bounded = ctx.has_input(0);  // else only the condition stops it
    const int64_t trips = bounded ? view<int64_t>(scalar(0, DataType::Int64, "M"))[0] : 0;
    bool keep_going = ctx.has_input(1) ? view<bool>(scalar(1, DataType::Bool, "cond"))[0] : true;
    std::vector<Tensor> state;
    for (int v = 0; v < carried; ++v) state.push_back(ctx.input(2 + static_cast<size_t>(v)));
    std::vector<std::vector<Tensor>> scanned(static_cast<size_t>(scans));
    const auto outer = enclosing_values(ctx, body);
    for (int64_t i = 0; (!bounded || i < trips) && keep_going; ++i) {
        std::map<std::string, Tensor> feeds;
        feeds[input_name(body, 0)] = Tensor::from_values<int64_t>({}, std::vector<int64_t>{i});
        Tensor cond(DataType::Bool, {});
        cond.mutable_bytes()[0] = std::byte{keep_going};
        feeds[input_name(body, 1)] = std::move(cond);
        for (int v = 0; v < carried; ++v) feeds[input_name(body, 2 + v)] = std::move(state[static_cast<size_t>(v)]);
        auto results = body.executor->run_nested(feeds, outer);
        if (results[0].type() != DataType::Bool || results[0].size() != 1)
            ctx.fail("the body's condition must be a single bool");
        keep_going = view<bool>(results[0])[0];
        for (int v = 0; v < carried; ++v)
            state[static_cast<size_t>(v)] = std::move(results[1 + static_cast<size_t>(v)]);
        for (int k = 0; k < scans; ++k)
            scanned[static_cast<size_t>(k)].push_back(std::move(results[1 + static_cast<size_t>(carried + k)]));
    }
    for (int v = 0; v < carried; ++v) out[static_cast<size_t>(v)] = std::move(state[static_cast<size_t>(v)]);
    for (int k = 0; k < scans; ++k)
        out[static_cast<size_t>(carried + k)] =
            stack(ctx, scanned[static_cast<size_t>(k)], 0, declared_output_type(body, 1 + carried + k));
}

// Scan over `states` and `sequences` (the state carried through every step,
// the scanned inputs sliced along their axes), as opset 9 defines it.
std::vector<Tensor> scan_once(KernelContext& ctx, Subgraph& body, std::vector<Tensor> states,
                              const std::vector<const Tensor*>& sequences, const std::vector<int64_t>& input_axes,
                              const std::vector<int64_t>& input_reversed, int outputs,
                              const std::vector<ScopeValue>& outer) {
    const int n = static_cast<int>(states.size()), m = static_cast<int>(sequences.size());
    if (body.model.graph().input_size() != n + m || body.model.graph().output_size() != outputs || outputs < n)
        ctx.fail(
            fmt::format("the body takes {} inputs and gives {} outputs; the node has {} states, {} scanned "
                        "inputs and {} outputs",
                        body.model.graph().input_size(), body.model.graph().output_size(), n, m, outputs));
    int64_t length = -1;
    for (int j = 0; j < m; ++j) {
        const auto& seq = *sequences[static_cast<size_t>(j)];
        const int64_t axis = input_axes[static_cast<size_t>(j)];
        if (axis >= static_cast<int64_t>(seq.shape().size())) ctx.fail("a scan axis is beyond its input's rank");
        if (length >= 0 && seq.shape()[axis] != length)
            ctx.fail(fmt::format("scanned inputs of {} and {} steps", length, seq.shape()[axis]));
        length = seq.shape()[axis];
    }
    std::vector<std::vector<Tensor>> scanned(static_cast<size_t>(outputs - n));
    for (int64_t t = 0; t < std::max<int64_t>(length, 0); ++t) {
        std::map<std::string, Tensor> feeds;
        for (int v = 0; v < n; ++v) feeds[input_name(body, v)] = std::move(states[static_cast<size_t>(v)]);
        for (int j = 0; j < m; ++j)
            feeds[input_name(body, n + j)] =
                slice_at(*sequences[static_cast<size_t>(j)], input_axes[static_cast<size_t>(j)],
                         input_reversed[static_cast<size_t>(j)] ? length - 1 - t : t);
        auto results = body.executor->run_nested(feeds, outer);
        for (int v = 0; v < n; ++v) states[static_cast<size_t>(v)] = std::move(results[static_cast<size_t>(v)]);
        for (int k = 0; k < outputs - n; ++k)
            scanned[static_cast<size_t>(k)].push_back(std::move(results[static_cast<size_t>(n + k)]));
    }
    std::vector<Tensor> result = std::move(states);
    const auto output_axes = ctx.attributes.get_ints("scan_output_axes", std::vector<int64_t>(scanned.size(), 0));
    const auto output_reversed =
        ctx.attributes.get_ints("scan_output_directions", std::vector<int64_t>(scanned.size(), 0));
    if (output_axes.size() != scanned.size() || output_reversed.size() != scanned.size())
        ctx.fail("scan_output_axes and scan_output_directions need one value per scan output");
    for (size_t k = 0; k < scanned.size(); ++k) {
        auto& parts = scanned[k];
        if (output_reversed[k]) std::reverse(parts.begin(), parts.end());
        const int64_t rank = parts.empty() ? 1 : static_cast<int64_t>(parts.front().shape().size()) + 1;
        int64_t axis = output_axes[k] < 0 ? output_axes[k] + rank : output_axes[k];
        if (axis < 0 || axis >= rank) ctx.fail("a scan output axis is out of range");
        result.push_back(
            stack(ctx, parts, parts.empty() ? 0 : axis, declared_output_type(body, n + static_cast<int>(k))));
    }
    return result;
}

void scan_kernel(KernelContext& ctx, std::vector<Tensor>& out) {
    auto& body = subgraph(ctx, "body");
    const auto outer = enclosing_values(ctx, body);
    const int64_t m = ctx.attributes.get_int("num_scan_inputs", -1);
    // Opset 8 puts an optional sequence_lens first and a batch axis on everything.
    const bool batched = ctx.opset < 9;
    const size_t first = batched ? 1 : 0;
    const int64_t n = static_cast<int64_t>(ctx.input_count()) - static_cast<int64_t>(first) - m;
    if (m < 1 || n < 0) ctx.fail("num_scan_inputs must be between 1 and the number of inputs");
    const auto reversed = ctx.attributes.get_ints(batched ? "directions" : "scan_input_directions",
                                                  std::vector<int64_t>(static_cast<size_t>(m), 0));
    auto axes = ctx.attributes.get_ints("scan_input_axes", std::vector<int64_t>(static_cast<size_t>(m), 0));
    if (reversed.size() != static_cast<size_t>(m) || axes.size() != static_cast<size_t>(m))
        ctx.fail("the scan directions and axes need one value per scanned input");
    for (size_t j = 0; j < axes.size(); ++j) {
        const auto rank = static_cast<int64_t>(ctx.input(first + static_cast<size_t>(n) + j).shape().size());
        if (axes[j] < 0) axes[j] += rank;
        if (axes[j] < 0) ctx.fail("a scan axis is out of range");
    }
    const int outputs = static_cast<int>(out.size());
    if (!batched) {
        std::vector<Tensor> states;
        std::vector<const Tensor*> sequences;
        for (int64_t v = 0; v < n; ++v) states.push_back(ctx.input(static_cast<size_t>(v)));
        for (int64_t j = 0; j < m; ++j) sequences.push_back(&ctx.input(static_cast<size_t>(n + j)));
        auto results = scan_once(ctx, body, std::move(states), sequences, axes, reversed, outputs, outer);
        for (size_t i = 0; i < out.size(); ++i) out[i] = std::move(results[i]);
        return;
    }
    // Opset 8: each batch row scanned on its own along axis 1, the rows stacked again.
    if (ctx.input(1).shape().empty()) ctx.fail("the inputs need a batch axis");
    const int64_t batch = ctx.input(1).shape()[0];
    for (size_t i = first; i < ctx.input_count(); ++i) {
        const auto& shape = ctx.input(i).shape();
        const size_t least = i < first + static_cast<size_t>(n) ? 1 : 2;  // a scanned input also has its steps
        if (shape.size() < least || shape[0] != batch)
            ctx.fail(fmt::format("input {} has shape [{}]: it needs the batch axis of {} first{}", i,
                                 fmt::join(shape, ", "), batch, least == 2 ? ", then the steps" : ""));
    }
    if (ctx.has_input(0)) {
        const auto lengths = view<int64_t>(ctx.input(0));
        const auto& seq = ctx.input(first + static_cast<size_t>(n));
        for (auto l : lengths)
            if (seq.shape().size() < 2 || l != seq.shape()[1])
                ctx.fail("sequence_lens shorter than the scanned inputs is not supported");
    }
    std::vector<std::vector<Tensor>> rows(out.size());
    for (int64_t b = 0; b < batch; ++b) {
        std::vector<Tensor> states;
        std::vector<Tensor> slices;
        for (int64_t v = 0; v < n; ++v) states.push_back(slice_at(ctx.input(first + static_cast<size_t>(v)), 0, b));
        for (int64_t j = 0; j < m; ++j) slices.push_back(slice_at(ctx.input(first + static_cast<size_t>(n + j)), 0, b));
        std::vector<const Tensor*> sequences;
        for (const auto& s : slices) sequences.push_back(&s);
        auto results = scan_once(ctx, body, std::move(states), sequences, std::vector<int64_t>(axes.size(), 0),
                                 reversed, outputs, outer);
        for (size_t i = 0; i < out.size(); ++i) rows[i].push_back(std::move(results[i]));
    }
    for (size_t i = 0; i < out.size(); ++i)
        out[i] = stack(ctx, rows[i], 0, declared_output_type(body, static_cast<int>(i)));
}

const KernelRegistration kKernels[] = {
    {"", "If", 1, 21, if_kernel},
    {"", "Loop", 1, 21, loop_kernel},
    {"", "Scan", 8, 21, scan_kernel},
};

}  // namespace
}  // namespace vaiq::runtime
