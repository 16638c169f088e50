// vaiq's own ops as other tools write them: VitisQuantizeLinear/
// VitisDequantizeLinear, FixNeuron (vaiq's and the contrib domain's, `pos` as
// INT or STRING), BFPQuantizeDequantize/MXQuantizeDequantize and com.microsoft
// Q/DQ, with fuzzed attributes, parameter types and shapes. Each is run, and
// converted to native QDQ (the block float ops: their simulation) and run again.
#include <fuzzer/FuzzedDataProvider.h>

#include "fuzz_support.hpp"
#include "native_qdq.hpp"
#include "runtime/executor.hpp"
#include "vaiq/model.hpp"
#include "vaiq/vaiq_ops.hpp"

using namespace vaiq;

namespace {

constexpr DataType kTypes[] = {DataType::Float,  DataType::Int8,    DataType::UInt8,   DataType::Int16,
                               DataType::UInt16, DataType::Int32,   DataType::UInt32,  DataType::Float16,
                               DataType::BFloat16, DataType::Int4, DataType::UInt4};

DataType pick_type(FuzzedDataProvider& in) { return kTypes[in.ConsumeIntegralInRange<size_t>(0, std::size(kTypes) - 1)]; }

Tensor fill(DataType type, std::vector<int64_t> shape, FuzzedDataProvider& in) {
    Tensor t(type, std::move(shape));
    auto out = t.mutable_bytes();
    const auto raw = in.ConsumeBytes<uint8_t>(out.size());
    for (size_t i = 0; i < raw.size(); ++i) out[i] = static_cast<std::byte>(raw[i]);
    if (type == DataType::Int4 || type == DataType::UInt4)  // one value a byte in memory
        for (auto& b : out) b = static_cast<std::byte>(static_cast<uint8_t>(b) & 0x0F);
    return t;
}

void add_initializer(onnx::GraphProto& g, const std::string& name, const Tensor& t) {
    *g.add_initializer() = t.to_proto(name);
}

void run(const Model& model, const std::map<std::string, Tensor>& feeds) {
    runtime::ExecutorOptions options;
    options.threads = 1;
    runtime::Executor executor(model, options);
    (void)executor.run(feeds);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FuzzedDataProvider in(data, size);
    onnx::ModelProto proto;
    proto.set_ir_version(8);
    auto* opset = proto.add_opset_import();
    opset->set_version(in.ConsumeBool() ? 13 : 21);
    for (const char* domain : {"com.vaiq", "ai.onnx.contrib", "com.microsoft"}) {
        auto* o = proto.add_opset_import();
        o->set_domain(domain);
        o->set_version(1);
    }
    auto& g = *proto.mutable_graph();
    g.set_name("fuzz");
    auto& node = *g.add_node();
    node.set_name("op");
    switch (in.ConsumeIntegralInRange<int>(0, 6)) {
        case 0: node.set_op_type("VitisQuantizeLinear"), node.set_domain("com.vaiq"); break;
        case 1: node.set_op_type("VitisDequantizeLinear"), node.set_domain("com.vaiq"); break;
        case 2: node.set_op_type("FixNeuron"), node.set_domain(in.ConsumeBool() ? "com.vaiq" : "ai.onnx.contrib"); break;
        case 3: node.set_op_type("QuantizeLinear"), node.set_domain("com.microsoft"); break;
        case 4: node.set_op_type("BFPQuantizeDequantize"), node.set_domain("com.vaiq"); break;
        case 5: node.set_op_type("MXQuantizeDequantize"), node.set_domain("com.vaiq"); break;
        default: node.set_op_type("DequantizeLinear"), node.set_domain("com.microsoft"); break;
    }
    // The data input: rank 0-3, small dimensions (0 allowed).
    std::vector<int64_t> shape(in.ConsumeIntegralInRange<size_t>(0, 3));
    for (auto& d : shape) d = in.ConsumeIntegralInRange<int64_t>(0, 5);
    const Tensor x = fill(pick_type(in), shape, in);
    node.add_input("x");
    auto* xi = g.add_input();
    xi->set_name("x");
    auto* xt = xi->mutable_type()->mutable_tensor_type();
    xt->set_elem_type(static_cast<int32_t>(x.type()));
    for (auto d : shape) xt->mutable_shape()->add_dim()->set_dim_value(d);
    // Parameters: none, a scale, or a scale and a zero point; scalar or one per channel.
    const int params = in.ConsumeIntegralInRange<int>(0, 2);
    std::vector<int64_t> pshape;
    if (in.ConsumeBool()) pshape.push_back(in.ConsumeIntegralInRange<int64_t>(0, 5));
    if (params >= 1) {
        node.add_input("scale");
        add_initializer(g, "scale", fill(in.ConsumeBool() ? DataType::Float : pick_type(in), pshape, in));
    }
    if (params >= 2) {
        node.add_input("zero_point");
        add_initializer(g, "zero_point", fill(pick_type(in), pshape, in));
    }
    node.add_output("y");
    g.add_output()->set_name("y");
    // Attributes, each maybe present with a fuzzed value (and sometimes the wrong kind).
    auto int_attr = [&](const char* name, int64_t lo, int64_t hi) {
        if (!in.ConsumeBool()) return;
        auto* a = node.add_attribute();
        a->set_name(name);
        if (in.ConsumeIntegralInRange<int>(0, 7) == 0) {
            a->set_type(onnx::AttributeProto::STRING);
            a->set_s(in.ConsumeRandomLengthString(8));
        } else {
            a->set_type(onnx::AttributeProto::INT);
            a->set_i(in.ConsumeIntegralInRange<int64_t>(lo, hi));
        }
    };
    int_attr("axis", -5, 5);
    int_attr("bit_width", -2, 40);
    int_attr("pos", -300, 300);
    int_attr("unsigned", -1, 2);
    int_attr("block_size", -2, 8);
    int_attr("saturate", -1, 2);
    int_attr("rounding_mode", 0, 3);
    for (const char* name : {"bfp_method", "element_dtype"})
        if (in.ConsumeBool()) {
            auto* a = node.add_attribute();
            a->set_name(name);
            a->set_type(onnx::AttributeProto::STRING);
            constexpr const char* kValues[] = {"to_bfp",   "to_bfp_prime", "int8",     "fp8_e4m3", "fp8_e5m2",
                                               "fp6_e3m2", "fp6_e2m3",     "fp4_e2m1", "fp3"};
            a->set_s(kValues[in.ConsumeIntegralInRange<size_t>(0, std::size(kValues) - 1)]);
        }

    const std::map<std::string, Tensor> feeds{{"x", x}};
    fuzz::expect_only_input_errors([&] { run(Model(proto), feeds); });
    fuzz::expect_only_input_errors([&] {
        Model model(proto);
        to_native_qdq(model);
        run(model, feeds);
    });
    return 0;
}
