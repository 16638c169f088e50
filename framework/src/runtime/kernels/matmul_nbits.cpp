// com.microsoft MatMulNBits: A [..., K] times B stored as `bits`-bit blocks
// along K, column by column (see the matmul_nbits format). B is dequantized to
// float once (kept while its inputs are constant) and multiplied in float, as
// ONNX Runtime's CPU kernel computes for accuracy levels 0 to 3.
#include <Eigen/Core>

#include <memory>

#include "runtime/kernels/common.hpp"

namespace vaiq::runtime {
namespace {

// B as a float [K, N] matrix, row-major.
std::vector<float> dequantized_b(const KernelContext& ctx, int64_t k, int64_t n, int bits, int64_t block) {
    const int64_t blocks = (k + block - 1) / block;
    const int64_t blob = block * bits / 8;
    const auto& b = ctx.input(1);
    if (b.type() != DataType::UInt8 || b.size() != n * blocks * blob) ctx.fail("B must be uint8 [N, blocks, blob]");
    const auto& scales = ctx.input(2);
    if (scales.type() != DataType::Float || scales.size() != n * blocks) ctx.fail("scales must be float [N, blocks]");
    const auto bv = b.data<uint8_t>();
    const auto sv = scales.data<float>();
    const int per_byte = 8 / bits;
    const auto mask = static_cast<uint8_t>((1 << bits) - 1);
    // Zero points: packed uint8 [N, ceil(blocks / per_byte)], float [N, blocks], or the default 2^(bits - 1).
    auto zero_point = [&](int64_t col, int64_t blk) -> float {
        if (!ctx.has_input(3)) return static_cast<float>(1 << (bits - 1));
        const auto& z = ctx.input(3);
        if (z.type() == DataType::Float) return z.data<float>()[static_cast<size_t>(col * blocks + blk)];
        const int64_t row_bytes = (blocks + per_byte - 1) / per_byte;
        if (z.type() != DataType::UInt8 || z.size() != n * row_bytes) ctx.fail("zero_points do not match B");
        const uint8_t byte = z.data<uint8_t>()[static_cast<size_t>(col * row_bytes + blk / per_byte)];
        return static_cast<float>((byte >> (bits * (blk % per_byte))) & mask);
    };
    std::vector<float> w(static_cast<size_t>(k * n));
    for (int64_t col = 0; col < n; ++col)
        for (int64_t blk = 0; blk < blocks; ++blk) {
            const float scale = sv[static_cast<size_t>(col * blocks + blk)], zp = zero_point(col, blk);
            const uint8_t* bytes = bv.data() + (col * blocks + blk) * blob;
            for (int64_t r = 0; r < block && blk * block + r < k; ++r) {
                const auto q = static_cast<float>((bytes[r / per_byte] >> (bits * (r % per_byte))) & mask);
                w[static_cast<size_t>((blk * block + r) * n + col)] = (q - zp) * scale;
            }
        }
    return w;
}

void matmul_nbits(KernelContext& ctx, std::vector<Tensor>& out) {
    const auto& a = ctx.input(0);
    if (a.type() != DataType::Float) ctx.fail("A must be float");
    const int64_t k = ctx.attributes.get_int("K", 0), n = ctx.attributes.get_int("N", 0);
    const auto bits = static_cast<int>(ctx.attributes.get_int("bits", 4));
    const int64_t block = ctx.attributes.get_int("block_size", 0);
    if (k <= 0 || n <= 0 || (bits != 4 && bits != 8) || block < 16 || (block & (block - 1)) != 0)
        ctx.fail("K, N, bits (4 or 8) and block_size (a power of two from 16) are required");
    if (a.shape().empty() || a.shape().back() != k) ctx.fail("A's last dimension must be K");
    if (ctx.has_input(4)) ctx.fail("g_idx is not supported");
    // The dequantized weights, kept across runs while B, scales and zero points are constants.
    const bool constant = ctx.is_constant(1) && ctx.is_constant(2) && (!ctx.has_input(3) || ctx.is_constant(3));
    std::shared_ptr<std::vector<float>> w;
    if (constant && ctx.state) w = std::static_pointer_cast<std::vector<float>>(ctx.state);
    if (!w) {
        w = std::make_shared<std::vector<float>>(dequantized_b(ctx, k, n, bits, block));
        if (constant) ctx.state = w;
    }
    auto shape = a.shape();
    shape.back() = n;
    const int64_t rows = a.size() / k;
    out[0] = make_tensor<float>(shape);
    using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    Eigen::Map<const Matrix> am(a.data<float>().data(), rows, k);
    Eigen::Map<const Matrix> wm(w->data(), k, n);
    Eigen::Map<Matrix> om(out[0].mutable_data<float>().data(), rows, n);
    om.noalias() = am * wm;
    if (ctx.has_input(5)) {
        const auto& bias = ctx.input(5);
        if (bias.type() != DataType::Float || bias.size() != n) ctx.fail("bias must be float [N]");
        om.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(bias.data<float>().data(), n);
    }
}

const KernelRegistration kKernels[] = {
    {"com.microsoft", "MatMulNBits", 1, 1, matmul_nbits},
};

}  // namespace
}  // namespace vaiq::runtime
