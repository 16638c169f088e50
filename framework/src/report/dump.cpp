#include "report/dump.hpp"

#include <fmt/format.h>

#include <map>

#include "data/data_reader.hpp"
#include "runtime/executor.hpp"
#include "sdk/atomic_file.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/log.hpp"
#include "vaiq/vaiq_ops.hpp"

namespace fs = std::filesystem;

namespace vaiq {

namespace {

// File names as the documented dump names them: '/' becomes '_'.
std::string file_stem(std::string name) {
    for (auto& c : name)
        if (c == '/') c = '_';
    return name;
}

template <typename T>
void write_text_values(std::ostream& out, const Tensor& t) {
    for (const T v : t.data<T>()) {
        if constexpr (std::is_floating_point_v<T>)
            out << fmt::format("{}\n", v);
        else
            out << static_cast<int64_t>(v) << '\n';
    }
}

void write_tensor(const fs::path& dir, const std::string& stem, const Tensor& t) {
    write_file_atomically(dir / (stem + ".bin"), [&](std::ostream& out) {
        out.write(reinterpret_cast<const char*>(t.bytes().data()), static_cast<std::streamsize>(t.bytes().size()));
    });
    write_file_atomically(dir / (stem + ".txt"), [&](std::ostream& out) {
        switch (t.type()) {
            case DataType::Int8: return write_text_values<int8_t>(out, t);
            case DataType::UInt8: return write_text_values<uint8_t>(out, t);
            case DataType::Int16: return write_text_values<int16_t>(out, t);
            case DataType::UInt16: return write_text_values<uint16_t>(out, t);
            case DataType::Int32: return write_text_values<int32_t>(out, t);
            case DataType::UInt32: return write_text_values<uint32_t>(out, t);
            case DataType::Int64: return write_text_values<int64_t>(out, t);
            case DataType::Float: return write_text_values<float>(out, t);
            case DataType::Double: return write_text_values<double>(out, t);
            case DataType::Float16:  // the stored bits in .bin, the values they stand for here
            case DataType::BFloat16: return write_text_values<float>(out, t.convert_float(DataType::Float));
            default: throw InputError(fmt::format("cannot dump '{}': {} values", stem, data_type_name(t.type())));
        }
    });
}

bool is_dequantize(const onnx::NodeProto& n) { return n.op_type() == "DequantizeLinear" || is_vitis_dequantize(n); }

// The dequantizing half of a Cast pair (QFloat16/QBFloat16 in the qdq format): a
// Cast to float of a float16/bfloat16 value, a stored weight or a Cast's output.
bool is_float_dequantize(const onnx::NodeProto& n, const GraphIndex& index, const onnx::GraphProto& graph) {
    auto is_half = [](int64_t t) {
        return t == static_cast<int64_t>(DataType::Float16) || t == static_cast<int64_t>(DataType::BFloat16);
    };
    if (n.op_type() != "Cast" || !is_default_domain(n) || n.input_size() < 1 ||
        int_attribute(n, "to", 0) != static_cast<int64_t>(DataType::Float))
        return false;
    if (const auto* init = index.initializer(n.input(0))) return is_half(init->data_type());
    const int producer = index.producer(n.input(0));
    if (producer < 0) return false;
    const auto& p = graph.node(producer);
    return p.op_type() == "Cast" && is_default_domain(p) && is_half(int_attribute(p, "to", 0));
}

}  // namespace

DumpResult dump_model(const fs::path& model_path, const DumpOptions& options) {
    const Model model = load_model(model_path);
    const auto& graph = model.graph();
    const GraphIndex index(graph);

    // Integer tensors by the name they are dumped under; stored weights are read directly.
    std::map<std::string, std::vector<std::string>> dumped_as;  // tensor -> stems (a pair per reader)
    std::vector<std::pair<std::string, Tensor>> constants;
    std::map<std::string, FixNeuronAttributes> fixneurons;  // output -> attributes
    for (const auto& node : graph.node()) {
        if (is_fixneuron(node) && node.output_size() > 0) {
            fixneurons[node.output(0)] = fixneuron_attributes(node);
            dumped_as[node.output(0)].push_back(file_stem(node.output(0)));
            continue;
        }
        if ((!is_dequantize(node) && !is_float_dequantize(node, index, graph)) || node.input_size() < 1) continue;
        const auto stem = file_stem(node.output(0));
        if (const auto* init = index.initializer(node.input(0)); init && !index.is_graph_input(node.input(0)))
            constants.emplace_back(stem, Tensor::from_proto(*init));
        else
            dumped_as[node.input(0)].push_back(stem);
    }
    if (constants.empty() && dumped_as.empty() && !options.dump_float)
        throw InputError(fmt::format(
            "{}: no quantized tensors to dump (the model has no DequantizeLinear, FixNeuron or float16 Cast pair); "
            "--dump-float dumps every node's float output",
            model_path.string()));

    std::unique_ptr<DataReader> reader =
        options.reader ? options.reader(model)
        : options.data ? open_data_reader(*options.data, model, "dump data")
                       : random_data_reader(model, options.random_input_shapes, nullptr, 1);
    auto batch = reader->next();
    if (!batch) throw InputError("the dump data holds no batch");

    std::error_code ec;
    fs::create_directories(options.output_dir, ec);
    if (!fs::is_directory(options.output_dir))
        throw InputError(fmt::format("cannot create the dump folder {}", options.output_dir.string()));

    DumpResult result;
    for (const auto& [stem, value] : constants) {
        write_tensor(options.output_dir, stem, value);
        ++result.quantized;
    }
    std::vector<std::string> taps;
    for (const auto& [tensor, stems] : dumped_as) taps.push_back(tensor);
    if (options.dump_float)
        for (const auto& node : graph.node())
            for (const auto& out : node.output())
                if (!out.empty() && !dumped_as.count(out)) taps.push_back(out);

    // Unfused, so every QuantizeLinear output exists; values stream to disk as they are computed.
    runtime::Executor executor(model, {.threads = 0, .fuse_qdq = false, .taps = {taps.begin(), taps.end()}});
    executor.run(batch->feeds, taps, [&](const std::string& tensor, const Tensor& value) {
        if (auto it = dumped_as.find(tensor); it != dumped_as.end()) {
            const auto fix = fixneurons.find(tensor);
            // A FixNeuron's output times 2^pos: the integers, quantized exactly by its own parameters.
            const Tensor integers = fix != fixneurons.end()
                                        ? quantize_tensor(value, fixneuron_quant_params(fix->second), tensor)
                                        : Tensor();
            for (const auto& stem : it->second)
                write_tensor(options.output_dir, stem, fix != fixneurons.end() ? integers : value);
            result.quantized += static_cast<int>(it->second.size());
        } else if (value.type() == DataType::Float) {
            write_tensor(options.output_dir, file_stem(tensor) + "_float", value);
            ++result.floats;
        }
    });
    log_info("dumped {} quantized and {} float tensors of {} to {}", result.quantized, result.floats, batch->source,
             options.output_dir.string());
    return result;
}

}  // namespace vaiq
