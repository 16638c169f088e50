#include "positions.hpp"

#include "dpu_arithmetic.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

namespace npu_cnn {

namespace {

// Positions of the planned tensors, and which tensor holds the position a
// node reads or writes (through activations the device fuses into it).
class Positions {
  public:
    Positions(const onnx::GraphProto& graph, vaiq::QuantPlan& plan, const Fused& fused, bool fix)
        : graph_(graph), index_(graph), fused_(fused), fix_(fix) {
        for (auto& t : plan.tensors) tensors_[t.tensor] = &t;
    }

    bool fixing() const { return fix_; }
    const onnx::GraphProto& graph() const { return graph_; }
    const vaiq::GraphIndex& index() const { return index_; }

    // Whether `tensor` is an int32 bias, whose scale is input scale x weight scale.
    bool is_int32(const std::string& tensor) const {
        auto it = tensors_.find(tensor);
        return it != tensors_.end() && it->second->params.type == vaiq::QuantType::QInt32;
    }

    std::optional<int> get(const std::string& tensor) const {
        auto it = tensors_.find(tensor);
        if (tensor.empty() || it == tensors_.end()) return std::nullopt;
        return vaiq::exact_position(it->second->params);
    }

    void set(const std::string& tensor, int position) {
        auto& params = tensors_.at(tensor)->params;
        params.scale.assign(1, static_cast<float>(std::ldexp(1.0, -position)));
    }

    // The tensor input `slot` reads, when it has a position.
    std::string input(const onnx::NodeProto& node, int slot) const {
        if (slot >= node.input_size() || !get(node.input(slot))) return {};
        return node.input(slot);
    }

    // The tensor holding the node's output position: its output, or the
    // output of the activation the device computes inside it.
    std::string output(const onnx::NodeProto& node) const {
        const onnx::NodeProto* n = &node;
        for (int hops = 0; hops < 4 && n->output_size() > 0; ++hops) {
            const auto& out = n->output(0);
            if (get(out)) return out;
            const auto& uses = index_.consumers(out);
            if (uses.size() != 1 || uses[0].slot != 0) return {};
            const auto& next = graph_.node(uses[0].node);
            if (!fused_(*n, next)) return {};
            n = &next;
        }
        return {};
    }

  private:
    const onnx::GraphProto& graph_;
    vaiq::GraphIndex index_;
    const Fused& fused_;
    bool fix_;
    std::map<std::string, vaiq::TensorQuant*> tensors_;
};

struct Outcome {
    bool applies = false;
    bool violated = false;
    bool adjusted = false;
};

// A violation, fixed by `fix` when refining.
template <typename Fix>
Outcome violation(Positions& p, Fix&& fix) {
    if (p.fixing()) fix();
    return {true, true, p.fixing()};
}

constexpr Outcome kHolds{true, false, false};

int clamp(int v, int lo, int hi) { return std::min(std::max(v, lo), hi); }

// Input and output share one position: the larger one comes down.
Outcome align_in_out(const onnx::NodeProto& node, Positions& p) {
    const auto in = p.input(node, 0), out = p.output(node);
    if (in.empty() || out.empty()) return {};
    const int pi = *p.get(in), po = *p.get(out);
    if (pi == po) return kHolds;
    return violation(p, [&] { po > pi ? p.set(out, pi) : p.set(in, po); });
}

// Every input and the output share the smallest position among them.
Outcome align_concat(const onnx::NodeProto& node, Positions& p) {
    const auto out = p.output(node);
    if (out.empty()) return {};
    std::vector<std::string> tensors{out};
    for (int i = 0; i < node.input_size(); ++i)
        if (auto in = p.input(node, i); !in.empty()) tensors.push_back(in);
    int lowest = *p.get(out);
    for (const auto& t : tensors) lowest = std::min(lowest, *p.get(t));
    const bool aligned =
        std::all_of(tensors.begin(), tensors.end(), [&](const auto& t) { return *p.get(t) == lowest; });
    if (aligned) return kHolds;
    return violation(p, [&] {
        for (const auto& t : tensors) p.set(t, lowest);
    });
}

// Positions of every input, or nothing when one has none.
std::optional<std::vector<std::pair<std::string, int>>> all_inputs(const onnx::NodeProto& node, const Positions& p) {
    std::vector<std::pair<std::string, int>> out;
    for (int i = 0; i < node.input_size(); ++i) {
        const auto in = p.input(node, i);
        if (in.empty()) return std::nullopt;
        out.emplace_back(in, *p.get(in));
    }
    if (out.empty()) return std::nullopt;
    return out;
}

// shift_read = max(ipos) - min(ipos) in [0, 7]: the largest comes down.
Outcome shift_read(const onnx::NodeProto& node, Positions& p) {
    const auto ins = all_inputs(node, p);
    if (!ins) return {};
    auto by_pos = [](const auto& a, const auto& b) { return a.second < b.second; };
    const auto lo = *std::min_element(ins->begin(), ins->end(), by_pos);
    const auto hi = *std::max_element(ins->begin(), ins->end(), by_pos);
    if (hi.second - lo.second <= 7) return kHolds;
    return violation(p, [&] { p.set(hi.first, lo.second + 7); });
}

// Add: shift_write = min(ipos) - opos in [-7, 25]; Mul: sum(ipos) - opos in [0, 32].
Outcome shift_write(const onnx::NodeProto& node, Positions& p) {
    const auto ins = all_inputs(node, p);
    const auto out = p.output(node);
    if (!ins || out.empty()) return {};
    int base = 0;
    if (node.op_type() == "Add") {
        base = ins->front().second;
        for (const auto& [t, pos] : *ins) base = std::min(base, pos);
    } else {
        for (const auto& [t, pos] : *ins) base += pos;
    }
    const auto [lo, hi] = node.op_type() == "Add" ? std::pair{-7, 25} : std::pair{0, 32};
    const int shift = base - *p.get(out);
    if (shift >= lo && shift <= hi) return kHolds;
    return violation(p, [&] { p.set(out, base - clamp(shift, lo, hi)); });
}

// shift_cut = wpos + ipos - opos in [0, 16]: the weight's position moves.
Outcome shift_cut(const onnx::NodeProto& node, Positions& p) {
    const auto in = p.input(node, 0), weight = p.input(node, 1), out = p.output(node);
    if (in.empty() || weight.empty() || out.empty()) return {};
    const int pi = *p.get(in), pw = *p.get(weight), po = *p.get(out);
    const int cut = pw + pi - po;
    if (cut >= 0 && cut <= 16) return kHolds;
    return violation(p, [&] { p.set(weight, clamp(cut, 0, 16) + po - pi); });
}

// shift_bias = wpos + ipos - bpos in [min(0, shift_cut - 16), 15], with 0 as
// the lower limit before a LeakyRelu. An int32 bias must sit exactly at
// wpos + ipos (its scale is input scale x weight scale).
Outcome shift_bias(const onnx::NodeProto& node, Positions& p) {
    const auto in = p.input(node, 0), weight = p.input(node, 1), bias = p.input(node, 2), out = p.output(node);
    if (in.empty() || weight.empty() || bias.empty() || out.empty()) return {};
    const int pi = *p.get(in), pw = *p.get(weight), pb = *p.get(bias), po = *p.get(out);
    const int shift = pw + pi - pb;
    int lo = std::min(0, pw + pi - po - 16), hi = 15;
    for (const auto& use : p.index().consumers(node.output(0)))
        if (p.graph().node(use.node).op_type() == "LeakyRelu") lo = 0;
    if (p.is_int32(bias)) lo = hi = 0;
    if (shift >= lo && shift <= hi) return kHolds;
    return violation(p, [&] { p.set(bias, pw + pi - clamp(shift, lo, hi)); });
}

// HardSigmoid: ipos in [0, 15], opos >= 7, 14 + ipos - opos >= 0.
Outcome hard_sigmoid(const onnx::NodeProto& node, Positions& p) {
    if (!dpu::is_dpu_hard_sigmoid(node)) return {};
    const auto in = p.input(node, 0), out = p.output(node);
    if (in.empty() || out.empty()) return {};
    const int pi = *p.get(in), po = *p.get(out);
    const int new_in = clamp(pi, 0, 15);
    int new_out = std::max(po, 7);
    if (14 + new_in - new_out < 0) new_out = 14 + new_in;
    if (new_in == pi && new_out == po) return kHolds;
    return violation(p, [&] {
        p.set(in, new_in);
        p.set(out, new_out);
    });
}

// Swish's Mul (x * hard_sigmoid(x)): ipos0 + ipos1 - opos in [0, 15].
Outcome shift_swish(const onnx::NodeProto& node, Positions& p) {
    if (node.input_size() != 2) return {};
    auto feeds_hard_sigmoid = [&](const std::string& t) {
        const auto& uses = p.index().consumers(t);
        return std::any_of(uses.begin(), uses.end(),
                           [&](const vaiq::Use& u) { return dpu::is_dpu_hard_sigmoid(p.graph().node(u.node)); });
    };
    if (!feeds_hard_sigmoid(node.input(0)) && !feeds_hard_sigmoid(node.input(1))) return {};
    const auto a = p.input(node, 0), b = p.input(node, 1), out = p.output(node);
    if (a.empty() || b.empty() || out.empty()) return {};
    const int sum = *p.get(a) + *p.get(b);
    const int shift = sum - *p.get(out);
    if (shift >= 0 && shift <= 15) return kHolds;
    return violation(p, [&] { p.set(out, sum - clamp(shift, 0, 15)); });
}

struct Constraint {
    const char* name;
    bool on;
    std::set<std::string> ops;
    Outcome (*apply)(const onnx::NodeProto&, Positions&);
};

std::vector<Constraint> constraints(const Rules& r) {
    // Alignment first, then the shifts, as the device's compiler checks them.
    return {
        {"AlignConcat", r.align_concat, {"Concat"}, align_concat},
        {"AlignPool", r.align_pool, {"MaxPool", "AveragePool", "GlobalAveragePool"}, align_in_out},
        {"AlignPad", r.align_pad, {"Pad"}, align_in_out},
        {"AlignSlice", r.align_slice, {"Slice"}, align_in_out},
        {"AdjustShiftRead", r.shift_read, {"Add", "Sub"}, shift_read},
        {"AdjustShiftWrite", r.shift_write, {"Add", "Mul"}, shift_write},
        {"AdjustShiftCut", r.shift_cut, {"Conv", "ConvTranspose", "Gemm"}, shift_cut},
        {"AdjustShiftBias", r.shift_bias, {"Conv", "ConvTranspose", "Gemm"}, shift_bias},
        {"AdjustHardSigmoid", r.hard_sigmoid, {"HardSigmoid"}, hard_sigmoid},
        {"AdjustShiftSwish", r.shift_swish, {"Mul"}, shift_swish},
    };
}

// One sweep of every constraint over every node; counts into `counts`.
bool sweep(const std::vector<Constraint>& list, Positions& p, std::vector<vaiq::ConstraintCount>& counts,
           std::vector<std::set<int>>* adjusted, bool first) {
    bool changed = false;
    for (size_t c = 0; c < list.size(); ++c) {
        if (!list[c].on) continue;
        for (int n = 0; n < p.graph().node_size(); ++n) {
            const auto& node = p.graph().node(n);
            if (!list[c].ops.count(node.op_type())) continue;
            const auto outcome = list[c].apply(node, p);
            if (first && outcome.applies) ++counts[c].checked;
            if (!p.fixing() && outcome.violated) ++counts[c].violated;
            if (outcome.adjusted) {
                changed = true;
                if (adjusted) (*adjusted)[c].insert(n);
            }
        }
    }
    return changed;
}

std::vector<vaiq::ConstraintCount> empty_counts(const std::vector<Constraint>& list) {
    std::vector<vaiq::ConstraintCount> counts;
    for (const auto& c : list) counts.push_back({c.name, 0, 0, 0});
    return counts;
}

std::vector<vaiq::ConstraintCount> enabled(const std::vector<Constraint>& list,
                                           std::vector<vaiq::ConstraintCount> counts) {
    std::vector<vaiq::ConstraintCount> out;
    for (size_t c = 0; c < list.size(); ++c)
        if (list[c].on) out.push_back(std::move(counts[c]));
    return out;
}

}  // namespace

std::vector<vaiq::ConstraintCount> refine_positions(const onnx::GraphProto& graph, vaiq::QuantPlan& plan,
                                                    const Rules& rules, const Fused& fused, int max_sweeps) {
    const auto list = constraints(rules);
    auto counts = empty_counts(list);
    std::vector<std::set<int>> adjusted(list.size());
    {
        Positions fixer(graph, plan, fused, true);
        for (int s = 0; s < max_sweeps; ++s)
            if (!sweep(list, fixer, counts, &adjusted, s == 0)) break;
    }
    auto after = empty_counts(list);
    Positions checker(graph, plan, fused, false);
    sweep(list, checker, after, nullptr, false);
    for (size_t c = 0; c < list.size(); ++c) {
        counts[c].adjusted = static_cast<int>(adjusted[c].size());
        counts[c].violated = after[c].violated;
    }
    return enabled(list, std::move(counts));
}

std::vector<vaiq::ConstraintCount> check_positions(const onnx::GraphProto& graph, const vaiq::QuantPlan& plan,
                                                   const Rules& rules, const Fused& fused) {
    vaiq::QuantPlan copy = plan;  // checking never writes, but Positions can
    const auto list = constraints(rules);
    auto counts = empty_counts(list);
    Positions checker(graph, copy, fused, false);
    sweep(list, checker, counts, nullptr, true);
    auto out = enabled(list, std::move(counts));
    vaiq::ConstraintCount pof2{"PowerOfTwoScale", 0, 0, 0};
    for (const auto& t : plan.tensors) {
        ++pof2.checked;
        if (!vaiq::exact_position(t.params)) ++pof2.violated;
    }
    out.insert(out.begin(), pof2);
    return out;
}

}  // namespace npu_cnn
