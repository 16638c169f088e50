#include "runtime/kernel.hpp"

#include <fmt/format.h>

#include "vaiq/error.hpp"

namespace vaiq::runtime {

const onnx::AttributeProto* Attributes::find(std::string_view name) const {
    for (const auto& a : node_.attribute())
        if (a.name() == name) return &a;
    return nullptr;
}

int64_t Attributes::get_int(std::string_view name, int64_t fallback) const {
    const auto* a = find(name);
    return a ? a->i() : fallback;
}

float Attributes::get_float(std::string_view name, float fallback) const {
    const auto* a = find(name);
    return a ? a->f() : fallback;
}

std::string Attributes::get_string(std::string_view name, const std::string& fallback) const {
    const auto* a = find(name);
    return a ? a->s() : fallback;
}

std::vector<int64_t> Attributes::get_ints(std::string_view name, const std::vector<int64_t>& fallback) const {
    const auto* a = find(name);
    return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : fallback;
}

std::vector<float> Attributes::get_floats(std::string_view name, const std::vector<float>& fallback) const {
    const auto* a = find(name);
    return a ? std::vector<float>(a->floats().begin(), a->floats().end()) : fallback;
}

const onnx::TensorProto* Attributes::get_tensor(std::string_view name) const {
    const auto* a = find(name);
    return a && a->has_t() ? &a->t() : nullptr;
}

const Tensor& KernelContext::input(size_t i) const {
    if (!has_input(i)) fail(fmt::format("input {} is required", i));
    return *inputs[i];
}

Tensor KernelContext::take_input(size_t i) {
    if (i < donated.size() && donated[i]) return std::move(*donated[i]);
    return input(i);
}

void KernelContext::fail(const std::string& message) const {
    throw InputError(fmt::format("node '{}' ({}{}{}, opset {}): {}", node.name(), node.domain(),
                                 node.domain().empty() ? "" : ":", node.op_type(), opset, message));
}

KernelRegistry& KernelRegistry::instance() {
    static KernelRegistry registry;
    return registry;
}

void KernelRegistry::add(std::string domain, std::string op, int since, int until, KernelFn fn, InTeam in_team) {
    entries_.push_back({canonical_domain(domain), std::move(op), since, until, std::move(fn), in_team});
}

const KernelRegistry::Entry* KernelRegistry::entry(std::string_view domain, std::string_view op, int64_t opset) const {
    const auto d = canonical_domain(domain);
    for (const auto& e : entries_)
        if (e.domain == d && e.op == op && opset >= e.since && opset <= e.until) return &e;
    return nullptr;
}

const KernelFn* KernelRegistry::find(std::string_view domain, std::string_view op, int64_t opset) const {
    const auto* e = entry(domain, op, opset);
    return e ? &e->fn : nullptr;
}

bool KernelRegistry::runs_in_team(std::string_view domain, std::string_view op, int64_t opset) const {
    const auto* e = entry(domain, op, opset);
    return e && e->in_team && e->in_team();
}

bool KernelRegistry::claims(std::string_view domain, std::string_view op) const {
    const auto d = canonical_domain(domain);
    for (const auto& e : entries_)
        if (e.domain == d && e.op == op) return true;
    return false;
}

}  // namespace vaiq::runtime
