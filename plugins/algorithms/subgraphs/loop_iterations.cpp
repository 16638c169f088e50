#include "loop_iterations.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"

namespace vaiq::subgraphs {

void iterate(const onnx::NodeProto& node, int64_t opset, const onnx::GraphProto& body,
             const std::vector<std::optional<Tensor>>& in, const Step& step) {
    const auto& formal = body.input();
    auto name = [&](size_t i) { return formal[static_cast<int>(i)].name(); };
    const size_t required = node.op_type() == "Loop" ? 2 : 0;  // M and cond may be omitted
    for (size_t i = required; i < in.size(); ++i)
        if (!in[i]) throw InputError(fmt::format("its input {} is omitted", i));
    if (node.op_type() == "Loop") {
        const size_t carried = in.size() - std::min<size_t>(in.size(), 2);
        if (in.size() < 2 || static_cast<size_t>(formal.size()) != carried + 2)
            throw InputError(fmt::format("the body takes {} inputs; the node gives it {} loop-carried values",
                                         formal.size(), carried));
        const bool bounded = in[0].has_value();
        if (bounded && (in[0]->type() != DataType::Int64 || in[0]->size() != 1))
            throw InputError("its trip count is not a single int64");
        if (in[1] && (in[1]->type() != DataType::Bool || in[1]->size() != 1))
            throw InputError("its condition is not a single bool");
        const int64_t trips = bounded ? in[0]->data<int64_t>()[0] : 0;
        bool going = !in[1] || in[1]->bytes()[0] != std::byte{0};
        std::vector<Tensor> state;
        for (size_t v = 0; v < carried; ++v) state.push_back(*in[2 + v]);
        for (int64_t i = 0; (!bounded || i < trips) && going; ++i) {
            std::map<std::string, Tensor> feeds;
            feeds[name(0)] = Tensor::from_values<int64_t>({}, std::vector<int64_t>{i});
            Tensor condition(DataType::Bool, {});
            condition.mutable_bytes()[0] = std::byte{going};
            feeds[name(1)] = std::move(condition);
            for (size_t v = 0; v < carried; ++v) feeds[name(2 + v)] = std::move(state[v]);
            auto out = step(i, std::move(feeds));
            if (out.size() < carried + 1 || out[0].type() != DataType::Bool || out[0].size() != 1)
                throw InputError("its body's condition is not a single bool");
            going = out[0].bytes()[0] != std::byte{0};
            for (size_t v = 0; v < carried; ++v) state[v] = std::move(out[1 + v]);
        }
        return;
    }
    if (opset < 9) throw InputError("a Scan of opset 8 (batched, with sequence lengths) is not quantized");
    const int64_t m = int_attribute(node, "num_scan_inputs", -1);
    if (m < 1 || m > static_cast<int64_t>(in.size()) || formal.size() != static_cast<int>(in.size()))
        throw InputError("num_scan_inputs does not match its inputs and body");
    const size_t n = in.size() - static_cast<size_t>(m);
    auto axes = ints_attribute(node, "scan_input_axes").value_or(std::vector<int64_t>(static_cast<size_t>(m), 0));
    const auto reversed =
        ints_attribute(node, "scan_input_directions").value_or(std::vector<int64_t>(static_cast<size_t>(m), 0));
    if (axes.size() != static_cast<size_t>(m) || reversed.size() != axes.size())
        throw InputError("scan_input_axes and scan_input_directions need one value per scanned input");
    int64_t length = -1;
    for (size_t j = 0; j < axes.size(); ++j) {
        const auto& shape = in[n + j]->shape();
        if (axes[j] < 0) axes[j] += static_cast<int64_t>(shape.size());
        if (axes[j] < 0 || axes[j] >= static_cast<int64_t>(shape.size()) || (length >= 0 && shape[axes[j]] != length))
            throw InputError("its scanned inputs do not share a length along their axes");
        length = shape[axes[j]];
    }
    std::vector<Tensor> state;
    for (size_t v = 0; v < n; ++v) state.push_back(*in[v]);
    for (int64_t t = 0; t < length; ++t) {
        std::map<std::string, Tensor> feeds;
        for (size_t v = 0; v < n; ++v) feeds[name(v)] = std::move(state[v]);
        for (size_t j = 0; j < axes.size(); ++j)
            feeds[name(n + j)] = slice_at(*in[n + j], axes[j], reversed[j] ? length - 1 - t : t);
        auto out = step(t, std::move(feeds));
        if (out.size() < n) throw InputError("its body gives fewer outputs than it has states");
        for (size_t v = 0; v < n; ++v) state[v] = std::move(out[v]);
    }
}

}  // namespace vaiq::subgraphs
