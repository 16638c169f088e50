// The executor on small fuzzed graphs: the input is a ModelProto (seeded with
// the ONNX backend test models); one that passes the ONNX checker is run on
// inputs of its declared types and shapes. Refusing a model or an input with
// InputError is fine; a crash, a sanitizer report or another exception is not.
// A model may ask for more memory than exists (Expand to 10^12 elements):
// std::bad_alloc is accepted as that refusal.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstring>
#include <map>
#include <new>

#include "fuzz_support.hpp"
#include "runtime/executor.hpp"
#include "vaiq/model.hpp"

using namespace vaiq;

namespace {

constexpr int64_t kMaxElements = 1 << 16;  // per input: small graphs, fast runs
constexpr int kMaxNodes = 64;

// An input of the declared type and shape (unknown dimensions 1), or nullopt
// when it cannot be made small.
std::optional<Tensor> make_input(const onnx::ValueInfoProto& in, FuzzedDataProvider& bytes) {
    if (!in.type().has_tensor_type()) return std::nullopt;
    const auto& tt = in.type().tensor_type();
    std::vector<int64_t> shape;
    int64_t count = 1;
    for (const auto& d : tt.shape().dim()) {
        const int64_t v = d.has_dim_value() ? d.dim_value() : 1;
        if (v < 0 || v > kMaxElements) return std::nullopt;
        shape.push_back(v);
        count *= v;
        if (count > kMaxElements) return std::nullopt;
    }
    const auto type = static_cast<DataType>(tt.elem_type());
    if (type == DataType::String || type == DataType::Undefined || element_size(type) == 0) return std::nullopt;
    Tensor t(type, shape);  // zeros
    auto out = t.mutable_bytes();
    // Small values, element by element: integer inputs often become sizes, indices or
    // trip counts; bools are 0 or 1.
    const size_t size = element_size(type);
    const int top = type == DataType::Bool ? 1 : 3;
    for (size_t i = 0; i + size <= out.size(); i += size) {
        const int v = bytes.ConsumeIntegralInRange<int>(0, top);
        if (type == DataType::Float) {
            const float f = static_cast<float>(v) * 0.5f;
            std::memcpy(&out[i], &f, sizeof f);
        } else if (type == DataType::Double) {
            const double f = v * 0.5;
            std::memcpy(&out[i], &f, sizeof f);
        } else if (type != DataType::Float16 && type != DataType::BFloat16) {
            out[i] = static_cast<std::byte>(v);  // little-endian: the low byte
        }
    }
    return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    onnx::ModelProto proto;
    if (!proto.ParseFromArray(data, static_cast<int>(size))) return 0;
    if (proto.graph().node_size() > kMaxNodes) return 0;
    FuzzedDataProvider bytes(data, size);
    try {
        Model model(std::move(proto));
        check_model(model);
        std::map<std::string, Tensor> feeds;
        std::set<std::string> constants;
        for (const auto& init : model.graph().initializer()) constants.insert(init.name());
        for (const auto& in : model.graph().input()) {
            if (constants.count(in.name())) continue;
            auto t = make_input(in, bytes);
            if (!t) return 0;
            feeds[in.name()] = std::move(*t);
        }
        runtime::ExecutorOptions options;
        options.threads = 1;
        runtime::Executor executor(model, options);
        (void)executor.run(feeds);
    } catch (const InputError&) {
    } catch (const std::bad_alloc&) {
    } catch (const std::exception& e) {
        std::fprintf(stderr, "not an input error: %s\n", e.what());
        std::abort();
    }
    return 0;
}
