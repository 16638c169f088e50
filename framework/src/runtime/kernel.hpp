// Kernels: how the executor runs one node.
#pragma once

#include <onnx/onnx_pb.h>

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "vaiq/model.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq::runtime {

/// Constants of this size and more (a language model's weights) get no second
/// copy for the executor's life (a prepared layout, a folded dequantization):
/// on a model of several GB that copy would double the memory it takes to run.
constexpr size_t kLargeConstantBytes = size_t{64} << 20;

/// Typed access to a node's attributes, with defaults.
class Attributes {
  public:
    explicit Attributes(const onnx::NodeProto& node) : node_(node) {}
    bool has(std::string_view name) const { return find(name) != nullptr; }
    int64_t get_int(std::string_view name, int64_t fallback) const;
    float get_float(std::string_view name, float fallback) const;
    std::string get_string(std::string_view name, const std::string& fallback) const;
    std::vector<int64_t> get_ints(std::string_view name, const std::vector<int64_t>& fallback = {}) const;
    std::vector<float> get_floats(std::string_view name, const std::vector<float>& fallback = {}) const;
    const onnx::TensorProto* get_tensor(std::string_view name) const;

  private:
    const onnx::AttributeProto* find(std::string_view name) const;
    const onnx::NodeProto& node_;
};

/// A value of an enclosing scope as a subgraph reads it: borrowed, not copied.
struct ScopeValue {
    const Tensor* tensor = nullptr;  ///< nullptr: the scope has no such value
    bool constant = false;           ///< an initializer there, the same object every run
};

/// Everything a kernel sees of its node for one run.
struct KernelContext {
    const Model& model;  ///< the model the node belongs to (opsets, for subgraphs)
    const onnx::NodeProto& node;
    int64_t opset;                      ///< the opset of the node's domain
    std::vector<const Tensor*> inputs;  ///< nullptr for an omitted optional input
    std::vector<bool> constant;         ///< per input: an initializer, the same object every run
    Attributes attributes;
    std::shared_ptr<void>& state;  ///< kept across runs (e.g. compiled primitives)
    /// A value of the enclosing scope by name (for subgraph ops).
    std::function<ScopeValue(const std::string&)> lookup;
    /// Per input: the executor's own value when this node is its last reader
    /// (a kernel may then take it and write its output in place); else nullptr.
    std::vector<Tensor*> donated = {};

    size_t input_count() const { return inputs.size(); }
    bool has_input(size_t i) const { return i < inputs.size() && inputs[i] != nullptr; }
    bool is_constant(size_t i) const { return i < constant.size() && constant[i]; }
    /// The i-th input; fails when it is missing.
    const Tensor& input(size_t i) const;
    /// The i-th input's buffer to reuse when it was donated, else a copy. The
    /// input must not be read through input(i) afterwards.
    Tensor take_input(size_t i);
    /// Throws InputError naming the node, its op and opset.
    [[noreturn]] void fail(const std::string& message) const;
};

/// Computes a node's outputs (one Tensor per node output, in order).
using KernelFn = std::function<void(KernelContext&, std::vector<Tensor>& outputs)>;

/// Whether a kernel may run inside a TeamSession (runtime/team_session.hpp):
/// it shares its work only through parallel_for.hpp, or not at all. A kernel
/// that opens OpenMP regions or runs oneDNN's threads itself would run on one
/// thread there. Asked once an executor, as its path may depend on the CPU;
/// null: never.
using InTeam = bool (*)();
/// For the kernels that always may.
inline bool always_in_team() { return true; }

/// Kernels by (domain, op type, opset range).
class KernelRegistry {
  public:
    static KernelRegistry& instance();
    void add(std::string domain, std::string op, int since, int until, KernelFn fn, InTeam in_team = nullptr);
    /// nullptr when nothing covers this opset.
    const KernelFn* find(std::string_view domain, std::string_view op, int64_t opset) const;
    /// Whether the kernel find() gives may run inside a TeamSession (false when there is none).
    bool runs_in_team(std::string_view domain, std::string_view op, int64_t opset) const;
    /// Whether any opset of the op has a kernel.
    bool claims(std::string_view domain, std::string_view op) const;

  private:
    struct Entry {
        std::string domain, op;
        int since, until;
        KernelFn fn;
        InTeam in_team;
    };
    const Entry* entry(std::string_view domain, std::string_view op, int64_t opset) const;
    std::vector<Entry> entries_;
};

/// Registers a kernel from a static initializer.
struct KernelRegistration {
    KernelRegistration(std::string domain, std::string op, int since, int until, KernelFn fn,
                       InTeam in_team = nullptr) {
        KernelRegistry::instance().add(std::move(domain), std::move(op), since, until, std::move(fn), in_team);
    }
};

/// One kernel of a KernelRegistrations list.
struct KernelSpec {
    std::string domain, op;
    int since, until;
    KernelFn fn;
};

/// Registers, from a static initializer, a list of kernels that all give the
/// same InTeam answer (a file whose kernels all share work only through
/// parallel_for.hpp).
struct KernelRegistrations {
    KernelRegistrations(InTeam in_team, std::initializer_list<KernelSpec> kernels) {
        for (const auto& k : kernels) KernelRegistry::instance().add(k.domain, k.op, k.since, k.until, k.fn, in_team);
    }
};

/// "" and "ai.onnx" are the same domain.
inline std::string canonical_domain(std::string_view domain) {
    return domain == "ai.onnx" ? std::string() : std::string(domain);
}

}  // namespace vaiq::runtime
