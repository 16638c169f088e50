// Runs the ONNX backend test cases (Debian's libonnx-testdata) through vaiq's
// executor and compares with their reference outputs.
//
// A case is skipped when its model uses an op the executor does not claim at
// that opset, or an element type it does not handle yet (listed apart); every
// other case must match within the backend tests' tolerances (rtol 1e-3, atol 1e-7).
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "runtime/executor.hpp"
#include "runtime/kernel.hpp"
#include "vaiq/error.hpp"

namespace fs = std::filesystem;
using vaiq::DataType;
using vaiq::Tensor;

namespace {

constexpr const char* kSuites[] = {"node", "pytorch-converted", "pytorch-operator", "simple"};

enum class Verdict { Pass, Fail, SkipOp, SkipType };

// Cases whose reference data is wrong in the packaged version, with why. They
// are reported, not counted as passing or failing.
const std::map<std::string, std::string> kFaultyReferences = {
    {"node/test_cast_FLOAT_to_BFLOAT16",
     "the reference truncates to bfloat16; ONNX (since 1.14) and ONNX Runtime round to nearest even"},
    {"node/test_castlike_BFLOAT16_to_FLOAT", "its 'like' input has shape [1] where the model declares [3, 4]"},
    {"node/test_castlike_BFLOAT16_to_FLOAT_expanded", "its 'like' input has shape [1] where the model declares [3, 4]"},
    {"node/test_castlike_FLOAT_to_BFLOAT16", "its 'like' input has shape [1] where the model declares [3, 4]"},
    {"node/test_castlike_FLOAT_to_BFLOAT16_expanded", "its 'like' input has shape [1] where the model declares [3, 4]"},
};

struct Outcome {
    Verdict verdict;
    std::string detail;
};

// The backend data stores bfloat16 tensors as uint16: read them as `as`.
Tensor retyped(Tensor t, DataType as) {
    if (t.type() != DataType::UInt16 || as != DataType::BFloat16) return t;
    Tensor out(as, t.shape());
    vaiq::copy_bytes(out.mutable_bytes().data(), t.bytes().data(), t.bytes().size());
    return out;
}

Tensor read_tensor(const fs::path& file) {
    std::ifstream in(file, std::ios::binary);
    onnx::TensorProto proto;
    if (!proto.ParseFromIstream(&in)) throw vaiq::InputError(file.string() + ": not a TensorProto");
    return Tensor::from_proto(proto);
}

bool handled_type(int32_t type) {
    switch (static_cast<DataType>(type)) {
        case DataType::String:
        case DataType::Undefined: return false;
        default: return type <= 16 && type != 14 && type != 15;  // no complex types
    }
}

// The first op (at its opset) the executor has no kernel for, or "".
std::string unclaimed_op(const vaiq::Model& model, const onnx::GraphProto& graph) {
    for (const auto& node : graph.node()) {
        const auto domain = vaiq::runtime::canonical_domain(node.domain());
        const int64_t opset = model.opset(domain);
        if (!vaiq::runtime::KernelRegistry::instance().find(domain, node.op_type(), opset))
            return fmt::format("{}{}{} (opset {})", domain, domain.empty() ? "" : ":", node.op_type(), opset);
        for (const auto& attr : node.attribute())
            if (attr.has_g())
                if (auto op = unclaimed_op(model, attr.g()); !op.empty()) return op;
    }
    return {};
}

int32_t declared_type(const onnx::GraphProto& graph, const std::string& input) {
    for (const auto& v : graph.input())
        if (v.name() == input) return v.type().tensor_type().elem_type();
    return 0;
}

bool is_16_bit_float(int32_t type) {
    return type == static_cast<int32_t>(DataType::Float16) || type == static_cast<int32_t>(DataType::BFloat16);
}

// Only Cast computes on float16 and bfloat16; other kernels take float.
bool only_casts(const onnx::GraphProto& graph) {
    return std::all_of(graph.node().begin(), graph.node().end(),
                       [](const auto& n) { return n.op_type() == "Cast" || n.op_type() == "CastLike"; });
}

std::string unhandled_type(const onnx::GraphProto& graph) {
    for (const auto* list : {&graph.input(), &graph.output()})
        for (const auto& v : *list) {
            if (!v.type().has_tensor_type()) return "a non-tensor value";
            const auto t = v.type().tensor_type().elem_type();
            if (!handled_type(t)) return vaiq::data_type_name(static_cast<DataType>(t));
            if (is_16_bit_float(t) && !only_casts(graph))
                return vaiq::data_type_name(static_cast<DataType>(t)) + " outside Cast";
        }
    for (const auto& node : graph.node())
        for (const auto& attr : node.attribute()) {
            if (attr.has_t() && !handled_type(attr.t().data_type()))
                return vaiq::data_type_name(static_cast<DataType>(attr.t().data_type()));
            if (attr.name() == "to" && attr.has_i() && !handled_type(static_cast<int32_t>(attr.i())))
                return vaiq::data_type_name(static_cast<DataType>(attr.i()));
        }
    return {};
}

std::string compare(const Tensor& got, const Tensor& want) {
    if (got.type() != want.type())
        return fmt::format("type {} instead of {}", vaiq::data_type_name(got.type()),
                           vaiq::data_type_name(want.type()));
    if (got.shape() != want.shape()) return "another shape";
    if (got.type() == DataType::Float || got.type() == DataType::Double) {
        for (int64_t i = 0; i < got.size(); ++i) {
            const double g = got.type() == DataType::Float ? got.data<float>()[i] : got.data<double>()[i];
            const double w = want.type() == DataType::Float ? want.data<float>()[i] : want.data<double>()[i];
            if (std::isnan(g) && std::isnan(w)) continue;
            if (std::isinf(w) && g == w) continue;
            if (!(std::abs(g - w) <= 1e-7 + 1e-3 * std::abs(w)))
                return fmt::format("element {} is {} instead of {}", i, g, w);
        }
        return {};
    }
    return std::equal(got.bytes().begin(), got.bytes().end(), want.bytes().begin()) ? std::string() : "values differ";
}

Outcome run_case(const fs::path& dir) {
    vaiq::Model model;
    try {
        model = vaiq::load_model(dir / "model.onnx", {.check_opset = false});
    } catch (const std::exception& e) {
        return {Verdict::SkipType, e.what()};
    }
    if (auto op = unclaimed_op(model, model.graph()); !op.empty()) return {Verdict::SkipOp, op};
    if (auto type = unhandled_type(model.graph()); !type.empty()) return {Verdict::SkipType, type};
    try {
        vaiq::runtime::Executor executor(model, {.threads = 1});
        std::vector<fs::path> sets;
        for (const auto& e : fs::directory_iterator(dir))
            if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0)
                sets.push_back(e.path());
        std::sort(sets.begin(), sets.end());
        for (const auto& set : sets) {
            std::map<std::string, Tensor> feeds;
            const auto& names = executor.input_names();
            for (size_t i = 0; fs::exists(set / fmt::format("input_{}.pb", i)); ++i) {
                if (i >= names.size()) return {Verdict::Fail, "more input files than model inputs"};
                feeds[names[i]] = retyped(read_tensor(set / fmt::format("input_{}.pb", i)),
                                          static_cast<DataType>(declared_type(model.graph(), names[i])));
            }
            const auto outputs = executor.run(feeds);
            for (size_t i = 0; i < outputs.size(); ++i) {
                const auto file = set / fmt::format("output_{}.pb", i);
                if (!fs::exists(file)) continue;
                if (auto diff = compare(outputs[i], retyped(read_tensor(file), outputs[i].type())); !diff.empty())
                    return {Verdict::Fail, fmt::format("{} output {}: {}", set.filename().string(), i, diff)};
            }
        }
    } catch (const std::exception& e) {
        return {Verdict::Fail, e.what()};
    }
    return {Verdict::Pass, {}};
}

}  // namespace

int main(int argc, char** argv) {
    const fs::path root = argc > 1 ? fs::path(argv[1]) : fs::path(VAIQ_ONNX_TESTDATA);
    const bool verbose = argc > 2 && std::string(argv[2]) == "--verbose";
    int passed = 0, failed = 0, skipped = 0, faulty = 0;
    std::map<std::string, int> skipped_ops, skipped_types;
    for (const char* suite : kSuites) {
        const auto dir = root / suite;
        if (!fs::is_directory(dir)) {
            fmt::print("missing test data folder {}\n", dir.string());
            return 1;
        }
        std::vector<fs::path> cases;
        for (const auto& e : fs::directory_iterator(dir))
            if (fs::exists(e.path() / "model.onnx")) cases.push_back(e.path());
        std::sort(cases.begin(), cases.end());
        for (const auto& c : cases) {
            const auto outcome = run_case(c);
            const auto name = fmt::format("{}/{}", suite, c.filename().string());
            switch (outcome.verdict) {
                case Verdict::Pass:
                    ++passed;
                    if (verbose) fmt::print("PASS {}\n", name);
                    break;
                case Verdict::Fail:
                    if (auto known = kFaultyReferences.find(name); known != kFaultyReferences.end()) {
                        ++faulty;
                        fmt::print("FAULTY REFERENCE {}: {} ({})\n", name, known->second, outcome.detail);
                        break;
                    }
                    ++failed;
                    fmt::print("FAIL {}: {}\n", name, outcome.detail);
                    break;
                case Verdict::SkipOp:
                    ++skipped;
                    ++skipped_ops[outcome.detail];
                    if (verbose) fmt::print("SKIP {}: op {}\n", name, outcome.detail);
                    break;
                case Verdict::SkipType:
                    ++skipped;
                    ++skipped_types[outcome.detail];
                    if (verbose) fmt::print("SKIP {}: {}\n", name, outcome.detail);
                    break;
            }
        }
    }
    fmt::print("skipped for element types not handled yet: {}\n", skipped_types.size());
    for (const auto& [type, n] : skipped_types) fmt::print("  {} ({} cases)\n", type, n);
    fmt::print("skipped for {} ops not claimed\n", skipped_ops.size());
    std::string ops;
    for (const auto& [op, n] : skipped_ops) ops += fmt::format("{}{} ({})", ops.empty() ? "  " : ", ", op, n);
    if (!ops.empty()) fmt::print("{}\n", ops);
    fmt::print("{} passed, {} failed, {} skipped, {} with faulty reference data\n", passed, failed, skipped, faulty);
    return failed == 0 ? 0 : 1;
}
