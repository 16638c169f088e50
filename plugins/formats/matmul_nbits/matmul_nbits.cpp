// matmul_nbits: writes weight-only plans as ONNX Runtime's com.microsoft
// MatMulNBits: each MatMul whose constant B [K, N] the plan quantizes in
// blocks along K becomes one MatMulNBits node, B stored column by column as
// `bits`-bit values packed into bytes (first value in the low nibble), the
// scales [N, blocks] and, when not the default 2^(bits - 1), the zero points
// packed the same way (float zero points, HQQ's: unpacked, in the scales'
// type). Each Gather whose table [rows, cols] the plan quantizes in blocks
// along its rows becomes a GatherBlockQuantized, the table packed row by row
// the same way (uint8 [rows, cols * bits / 8]). Signed plans are stored
// offset by 2^(bits - 1), which changes no dequantized value. Nothing else may
// be planned: activations stay float in this form.
#include <vaiq/vaiq.hpp>

namespace {

using vaiq::InputError;
using vaiq::QuantType;
using vaiq::Tensor;
using vaiq::TensorQuant;

struct Settings {
    int64_t accuracy_level = 0;
};

// Packs `values` (each in [0, 2^bits)) into bytes: rows of `per_row` values, each row starting on a byte.
std::vector<uint8_t> pack_rows(const std::vector<uint8_t>& values, size_t per_row, int bits) {
    const size_t per_byte = static_cast<size_t>(8 / bits);
    const size_t row_bytes = (per_row + per_byte - 1) / per_byte;
    const size_t rows = per_row == 0 ? 0 : values.size() / per_row;
    std::vector<uint8_t> out(rows * row_bytes, 0);
    for (size_t r = 0; r < rows; ++r)
        for (size_t i = 0; i < per_row; ++i)
            out[r * row_bytes + i / per_byte] |=
                static_cast<uint8_t>(values[r * per_row + i] << (bits * static_cast<int>(i % per_byte)));
    return out;
}

class Writer {
  public:
    Writer(vaiq::Model& model, const vaiq::QuantPlan& plan, const Settings& settings)
        : model_(model), graph_(model.graph()), plan_(plan), settings_(settings), index_(graph_), names_(graph_) {}

    void run() {
        int rewritten = 0;
        std::set<std::string> written;
        int gathers = 0;
        for (auto& node : *graph_.mutable_node()) {
            if (!vaiq::is_default_domain(node) || node.input_size() != 2) continue;
            if (node.op_type() == "MatMul") {
                const auto* w = plan_.find(node.input(1));
                if (!w) continue;
                rewrite(node, *w);
                written.insert(w->tensor);
                ++rewritten;
            } else if (node.op_type() == "Gather") {
                const auto* w = plan_.find(node.input(0));
                if (!w) continue;
                rewrite_gather(node, *w);
                written.insert(w->tensor);
                ++gathers;
            }
        }
        for (const auto& t : plan_.tensors)
            if (!written.count(t.tensor))
                throw InputError(fmt::format("format 'matmul_nbits' writes the constant B of MatMul and the table of "
                                             "Gather only; '{}' is planned too (set weight_only: true)",
                                             t.tensor));
        vaiq::remove_unused_initializers(graph_);
        if (rewritten + gathers > 0) vaiq::import_opset(model_.proto(), "com.microsoft", 1);
        vaiq::log_debug("matmul_nbits: {} MatMul nodes written as MatMulNBits, {} Gather as GatherBlockQuantized",
                        rewritten, gathers);
    }

  private:
    // The planned constant float matrix of `op`, blocked along `axis` in blocks of a power of two from 16.
    const onnx::TensorProto& weight(const TensorQuant& w, const onnx::NodeProto& node, const char* op,
                                    int axis) const {
        const auto* init = index_.initializer(w.tensor);
        if (!init || index_.is_graph_input(w.tensor) || init->dims_size() != 2 ||
            (init->data_type() != static_cast<int>(vaiq::DataType::Float) &&
             init->data_type() != static_cast<int>(vaiq::DataType::Float16)))
            throw InputError(fmt::format("{} takes a constant float or float16 matrix (rank 2); '{}' of node '{}' is "
                                         "not one",
                                         op, w.tensor, node.name()));
        const auto& p = w.params;
        const int bits = vaiq::quant_bits(p.type);
        if (bits != 4 && bits != 8)
            throw InputError(fmt::format("{} stores 4 or 8 bits, not {} ('{}')", op, vaiq::quant_type_name(p.type),
                                         w.tensor));
        // One block spanning the axis (a scale per channel) is written with the power of two that covers it.
        const bool one_block = p.axis == axis && p.block_size >= init->dims(axis);
        if (!one_block && (p.block_size < 16 || (p.block_size & (p.block_size - 1)) != 0 || p.axis != axis))
            throw InputError(fmt::format("{} needs blocks along axis {} of a power of two from 16 ('{}' has "
                                         "block_size {} along axis {}): set block_size, e.g. 128",
                                         op, axis, w.tensor, p.block_size, p.axis));
        // ONNX Runtime's MatMulNBits takes blocks of 16 to 256 only.
        if (std::string_view(op) == "MatMulNBits" && written_block(p.block_size, init->dims(axis)) > 256)
            throw InputError(fmt::format("MatMulNBits takes blocks of 16 to 256 values (ONNX Runtime refuses "
                                         "others); '{}' would need {}{}: set block_size up to 256, or quant_format: "
                                         "QDQ for a scale per column",
                                         w.tensor, written_block(p.block_size, init->dims(axis)),
                                         one_block ? " for one block per column" : ""));
        return *init;
    }

    // The block_size attribute: the plan's, or for one block spanning `dim` values (a scale per channel)
    // the power of two from 16 that covers them, which changes no scale.
    static int64_t written_block(int64_t block, int64_t dim) {
        if (block >= 16 && (block & (block - 1)) == 0) return block;
        int64_t b = 16;
        while (b < dim) b *= 2;
        return b;
    }

    // Gather(table [rows, cols], indices) -> GatherBlockQuantized: the table
    // packed row by row (uint8 [rows, cols * bits / 8]), scales [rows, blocks],
    // zero points (when not the default) packed per row like them.
    void rewrite_gather(onnx::NodeProto& node, const TensorQuant& w) {
        const auto& init = weight(w, node, "GatherBlockQuantized", 1);
        const auto& p = w.params;
        const int bits = vaiq::quant_bits(p.type);
        const int64_t rows = init.dims(0), cols = init.dims(1), block = written_block(p.block_size, cols);
        const int64_t blocks = (cols + block - 1) / block;
        if (cols * bits % 8 != 0)
            throw InputError(fmt::format("GatherBlockQuantized packs whole bytes per row: '{}' has {} values a row",
                                         w.tensor, cols));
        if (!p.float_zero_point.empty())
            throw InputError(
                fmt::format("GatherBlockQuantized takes integer zero points; '{}' has float ones (HQQ "
                            "quantizes MatMul weights only)",
                            w.tensor));
        const auto codes = stored_codes(w, init);  // [rows, cols]
        std::vector<uint8_t> values(static_cast<size_t>(rows * cols)), zero_points(p.zero_point.size());
        for (size_t i = 0; i < values.size(); ++i) values[i] = codes.value(i);
        bool default_zero_points = true;
        for (size_t i = 0; i < zero_points.size(); ++i) {
            zero_points[i] = codes.zero_point(p.zero_point[i]);
            default_zero_points &= codes.is_default(zero_points[i]);
        }
        std::vector<std::string> inputs{
            add_packed(w.tensor + "_Q" + std::to_string(bits), pack_rows(values, static_cast<size_t>(cols), bits), {rows}),
            node.input(1),
            vaiq::add_initializer(graph_, names_, w.tensor + "_scales",
                                  in_weight_type(Tensor::from_values<float>({rows, blocks}, p.scale), init))};
        if (!default_zero_points)
            inputs.push_back(add_packed(w.tensor + "_zero_points",
                                        pack_rows(zero_points, static_cast<size_t>(blocks), bits), {rows}));
        auto out = contrib_node("GatherBlockQuantized", node, bits, inputs);
        vaiq::set_attribute(out, "gather_axis", 0);
        vaiq::set_attribute(out, "quantize_axis", 1);
        vaiq::set_attribute(out, "block_size", block);
        vaiq::set_attribute(out, "bits", bits);
        node = std::move(out);
    }

    // The weight's values in float; the scales in its own type (a float16 model stays float16).
    static Tensor float_values(const onnx::TensorProto& init) {
        return vaiq::convert_float_type(Tensor::from_proto(init), vaiq::DataType::Float);
    }
    static Tensor in_weight_type(const Tensor& scales, const onnx::TensorProto& init) {
        return vaiq::convert_float_type(scales, static_cast<vaiq::DataType>(init.data_type()));
    }

    // Packed bytes as a uint8 initializer of `shape` (its last dimension: what is left per row).
    std::string add_packed(const std::string& name, const std::vector<uint8_t>& bytes, std::vector<int64_t> shape) {
        int64_t rows = 1;
        for (auto d : shape) rows *= d;
        shape.push_back(static_cast<int64_t>(bytes.size()) / rows);
        Tensor t(vaiq::DataType::UInt8, shape);
        vaiq::copy_bytes(t.mutable_bytes().data(), bytes.data(), bytes.size());
        return vaiq::add_initializer(graph_, names_, name, t);
    }

    // The plan's values and zero points as stored: unsigned, a signed value moved up by 2^(bits - 1) (which
    // changes no dequantized value).
    struct StoredCodes {
        Tensor q;  // the plan's codes
        int bits = 4;
        int64_t offset = 0;
        uint8_t value(size_t i) const {
            return static_cast<uint8_t>((offset ? q.data<int8_t>()[i] : q.data<uint8_t>()[i]) + offset);
        }
        uint8_t zero_point(int64_t z) const { return static_cast<uint8_t>(z + offset); }
        bool is_default(uint8_t stored_zero_point) const { return stored_zero_point == (1 << (bits - 1)); }
    };
    static StoredCodes stored_codes(const TensorQuant& w, const onnx::TensorProto& init) {
        StoredCodes c;
        c.bits = vaiq::quant_bits(w.params.type);
        const bool is_signed = w.params.type == QuantType::QInt4 || w.params.type == QuantType::QInt8;
        c.offset = is_signed ? int64_t{1} << (c.bits - 1) : 0;
        c.q = vaiq::quantize_tensor(float_values(init), w.params, w.tensor);
        return c;
    }

    // The com.microsoft node that replaces `node`, reading `inputs` and writing its output.
    static onnx::NodeProto contrib_node(const char* op, const onnx::NodeProto& node, int bits,
                                        const std::vector<std::string>& inputs) {
        onnx::NodeProto out;
        out.set_op_type(op);
        out.set_domain("com.microsoft");
        out.set_name((node.name().empty() ? node.output(0) : node.name()) + "_Q" + std::to_string(bits));
        for (const auto& in : inputs) out.add_input(in);
        out.add_output(node.output(0));
        return out;
    }

    void rewrite(onnx::NodeProto& node, const TensorQuant& w) {
        const auto& init = weight(w, node, "MatMulNBits", 0);
        const auto& p = w.params;
        const int bits = vaiq::quant_bits(p.type);
        const int64_t k = init.dims(0), n = init.dims(1), block = written_block(p.block_size, k);
        const int64_t blocks = (k + block - 1) / block;
        const auto codes = stored_codes(w, init);  // [K, N]
        // Column-major blocks; the rows past K (padding) hold the block's zero point.
        std::vector<uint8_t> values(static_cast<size_t>(n * blocks * block));
        std::vector<uint8_t> zero_points(static_cast<size_t>(n * blocks));
        std::vector<float> scales(static_cast<size_t>(n * blocks));
        // Float zero points (HQQ's) are written unpacked, [N, blocks] in the scales' type, moved up like the codes.
        const bool float_zero_points = !p.float_zero_point.empty();
        std::vector<float> float_zeros(float_zero_points ? static_cast<size_t>(n * blocks) : 0);
        bool default_zero_points = !float_zero_points;
        for (int64_t col = 0; col < n; ++col)
            for (int64_t b = 0; b < blocks; ++b) {
                const auto param = static_cast<size_t>(b * n + col);  // the [blocks, N] layout of the plan
                const auto zp = codes.zero_point(p.zero_point[param]);
                zero_points[static_cast<size_t>(col * blocks + b)] = zp;
                scales[static_cast<size_t>(col * blocks + b)] = p.scale[param];
                if (float_zero_points)
                    float_zeros[static_cast<size_t>(col * blocks + b)] =
                        p.float_zero_point[param] + static_cast<float>(codes.offset);
                default_zero_points &= codes.is_default(zp);
                for (int64_t r = 0; r < block; ++r) {
                    const int64_t row = b * block + r;
                    values[static_cast<size_t>((col * blocks + b) * block + r)] =
                        row < k ? codes.value(static_cast<size_t>(row * n + col)) : zp;
                }
            }
        std::vector<std::string> inputs{
            node.input(0),
            add_packed(w.tensor + "_Q" + std::to_string(bits), pack_rows(values, static_cast<size_t>(block), bits),
                       {n, blocks}),
            vaiq::add_initializer(graph_, names_, w.tensor + "_scales",
                                  in_weight_type(Tensor::from_values<float>({n, blocks}, scales), init))};
        if (float_zero_points)
            inputs.push_back(
                vaiq::add_initializer(graph_, names_, w.tensor + "_zero_points",
                                      in_weight_type(Tensor::from_values<float>({n, blocks}, float_zeros), init)));
        else if (!default_zero_points)
            inputs.push_back(add_packed(w.tensor + "_zero_points",
                                        pack_rows(zero_points, static_cast<size_t>(blocks), bits), {n}));
        auto out = contrib_node("MatMulNBits", node, bits, inputs);
        vaiq::set_attribute(out, "K", k);
        vaiq::set_attribute(out, "N", n);
        vaiq::set_attribute(out, "bits", bits);
        vaiq::set_attribute(out, "block_size", block);
        if (settings_.accuracy_level != 0) vaiq::set_attribute(out, "accuracy_level", settings_.accuracy_level);
        node = std::move(out);
    }

    vaiq::Model& model_;
    onnx::GraphProto& graph_;
    const vaiq::QuantPlan& plan_;
    Settings settings_;
    vaiq::GraphIndex index_;
    vaiq::UniqueNames names_;
};

class MatMulNBits final : public vaiq::Format {
  public:
    void configure(const vaiq::Options& options) override {
        settings_.accuracy_level = options.get_int("accuracy_level");
        if (settings_.accuracy_level < 0 || settings_.accuracy_level > 4)
            throw InputError(fmt::format("accuracy_level must be 0 to 4, not {}", settings_.accuracy_level));
    }

    void emit(vaiq::Model& model, const vaiq::QuantPlan& plan) const override {
        Writer(model, plan, settings_).run();
    }

  private:
    Settings settings_;
};

const vaiq_option_descriptor kOptions[] = {
    {"accuracy_level", VAIQ_OPTION_INT, "0",
     "MatMulNBits' accuracy_level: 0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8 activations (ONNX Runtime's CPU "
     "computes in int8 only with 4)."},
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<MatMulNBits>("matmul_nbits", "0.1.0",
                                         "com.microsoft MatMulNBits: 4- or 8-bit MatMul weights in blocks along K",
                                         kOptions))
