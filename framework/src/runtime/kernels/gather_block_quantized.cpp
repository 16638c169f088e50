// com.microsoft GatherBlockQuantized: Gather over data quantized in blocks
// along `quantize_axis`, dequantized as it is gathered (an embedding table kept
// in 4 bits). Two storage forms, as ONNX Runtime reads them:
// - uint8 data packing 8 / bits values a byte (first in the low bits), gathered
//   along axis 0 and blocked along the last axis, zero points packed the same
//   way (default 2^(bits - 1)), as MatMulNBits stores its B;
// - int4/uint4 data (one value per byte in vaiq's memory), any axes, zero
//   points of the data's type (default 0).
// An index out of range is an error, as for Gather.
#include "runtime/kernels/common.hpp"

namespace vaiq::runtime {
namespace {

struct BlockQuantizedData {
    const uint8_t* bytes = nullptr;
    bool packed = false, is_signed = false;
    int bits = 4;

    int32_t value(int64_t i) const {
        if (!packed) return is_signed ? static_cast<int8_t>(bytes[i]) : bytes[i];
        const int per_byte = 8 / bits;
        return (bytes[i / per_byte] >> (bits * (i % per_byte))) & ((1 << bits) - 1);
    }
};

void gather_block_quantized(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& data = ctx.input(0);
    const auto indices = read_ints(ctx, ctx.input(1));
    const auto& scales = ctx.input(2);
    const int64_t rank = static_cast<int64_t>(data.shape().size());
    if (rank < 1) ctx.fail("data must have at least one dimension");
    const int64_t gather_axis = normalize_axis(ctx, ctx.attributes.get_int("gather_axis", 0), rank);
    const int64_t quantize_axis = normalize_axis(ctx, ctx.attributes.get_int("quantize_axis", 1), rank);
    const int64_t block = ctx.attributes.get_int("block_size", 128);
    if (block < 16 || (block & (block - 1)) != 0) ctx.fail("block_size must be a power of two from 16");
    BlockQuantizedData q;
    q.bits = static_cast<int>(ctx.attributes.get_int("bits", 4));
    q.bytes = reinterpret_cast<const uint8_t*>(data.bytes().data());
    q.packed = data.type() == DataType::UInt8;
    q.is_signed = data.type() == DataType::Int4;
    if (q.packed) {
        if (q.bits != 4 && q.bits != 8) ctx.fail("uint8 data holds 4- or 8-bit values");
        if (gather_axis != 0 || quantize_axis != rank - 1)
            ctx.fail("uint8 data is gathered along axis 0 and quantized along its last axis");
    } else if (data.type() != DataType::Int4 && data.type() != DataType::UInt4) {
        ctx.fail("data must be uint8, int4 or uint4");
    } else if (q.bits != 4) {
        ctx.fail("int4 and uint4 data hold 4-bit values");
    }
    if (gather_axis == quantize_axis) ctx.fail("gather_axis and quantize_axis must differ");
    // The logical shape: packed uint8 holds 8 / bits values a byte along the last axis.
    const int64_t per_byte = q.packed ? 8 / q.bits : 1;
    auto shape = data.shape();
    shape.back() *= per_byte;
    if (scales.type() != DataType::Float) ctx.fail("only float scales are supported");
    auto scale_shape = shape;
    scale_shape[static_cast<size_t>(quantize_axis)] = (shape[static_cast<size_t>(quantize_axis)] + block - 1) / block;
    if (scales.shape() != scale_shape) ctx.fail("scales must have the data's shape with one entry per block");
    const float* scale = scales.data<float>().data();
    const int64_t blocks_per_row = scale_shape[static_cast<size_t>(quantize_axis)];
    const Tensor* zero_points = ctx.has_input(3) ? &ctx.input(3) : nullptr;
    if (zero_points) {
        auto zp_shape = scale_shape;
        if (q.packed) zp_shape.back() = (zp_shape.back() + per_byte - 1) / per_byte;
        if (zero_points->type() != data.type() || zero_points->shape() != zp_shape)
            ctx.fail("zero_points must have the data's type and the scales' shape (packed like the data)");
    }
    const int64_t default_zero_point = q.packed ? 1 << (q.bits - 1) : 0;
    BlockQuantizedData z = q;  // the zero points, stored as the data is
    if (zero_points) z.bytes = reinterpret_cast<const uint8_t*>(zero_points->bytes().data());
    auto zero_point = [&](int64_t scale_index) -> int32_t {
        if (!zero_points) return static_cast<int32_t>(default_zero_point);
        if (!q.packed) return z.value(scale_index);
        // Packed per row of blocks: each row starts on a byte.
        const int64_t row = scale_index / blocks_per_row, in_row = scale_index % blocks_per_row;
        return z.value(row * ((blocks_per_row + per_byte - 1) / per_byte) * per_byte + in_row);
    };

    // data as [outer, gathered, inner]; the blocked axis as [before, along, after].
    const int64_t outer = element_count({shape.begin(), shape.begin() + gather_axis});
    const int64_t gathered = shape[static_cast<size_t>(gather_axis)];
    const int64_t inner = element_count({shape.begin() + gather_axis + 1, shape.end()});
    const int64_t along = shape[static_cast<size_t>(quantize_axis)];
    const int64_t after = element_count({shape.begin() + quantize_axis + 1, shape.end()});
    std::vector<int64_t> out_shape(shape.begin(), shape.begin() + gather_axis);
    const auto& index_shape = ctx.input(1).shape();
    out_shape.insert(out_shape.end(), index_shape.begin(), index_shape.end());
    out_shape.insert(out_shape.end(), shape.begin() + gather_axis + 1, shape.end());
    out[0] = Tensor::uninitialized(DataType::Float, out_shape);
    float* y = out[0].mutable_data<float>().data();
    const auto count = static_cast<int64_t>(indices.size());
    std::vector<int64_t> rows(indices.size());
    for (int64_t n = 0; n < count; ++n) {
        const int64_t i = indices[static_cast<size_t>(n)];
        if (i < -gathered || i >= gathered)
            ctx.fail(fmt::format("index {} is out of range for a dimension of {}", i, gathered));
        rows[static_cast<size_t>(n)] = i < 0 ? i + gathered : i;
    }
    parallel_for(outer * count, outer * count * inner > kParallelGrain, [&](int64_t mn) {
        const int64_t m = mn / count, n = mn % count;
        const int64_t first = (m * gathered + rows[static_cast<size_t>(n)]) * inner;
        float* row = y + mn * inner;
        for (int64_t i = 0; i < inner; ++i) {
            const int64_t at = first + i;
            const int64_t before = at / (along * after), position = at / after % along, rest = at % after;
            const int64_t s = (before * blocks_per_row + position / block) * after + rest;
            row[i] = static_cast<float>(q.value(at) - zero_point(s)) * scale[s];
        }
    });
}

const KernelRegistration kKernels[] = {
    {"com.microsoft", "GatherBlockQuantized", 1, 1, gather_block_quantized},
};

}  // namespace
}  // namespace vaiq::runtime
