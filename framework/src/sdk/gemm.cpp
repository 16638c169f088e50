#include "vaiq/gemm.hpp"

#include <fmt/format.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <Eigen/Core>

#include "vaiq/error.hpp"

namespace vaiq {
namespace {

// Below this many multiply-adds a second thread saves little or costs (on two
// vCPUs: 1024x32x32 took 30 us on one thread, 40 us on two; 1024x64x64 107 and
// 69 us), and fits call the GEMM thousands of times per layer.
constexpr int64_t kOneThreadBelow = int64_t{1} << 22;

using Stride = Eigen::OuterStride<>;
using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// A matrix-vector product (n == 1: a depthwise group's output) on Eigen: oneDNN's
// sgemm took 8.2 us for 1024x1x9, Eigen 4.5 us.
void matrix_vector(bool transpose_a, bool transpose_b, int64_t m, int64_t k, float alpha, const float* a, int64_t lda,
                   const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
    Eigen::Map<RowMajor, 0, Stride> out(c, m, 1, Stride(ldc));
    // op(B) is k x 1: B stored k x 1 (stride ldb) or 1 x k (contiguous).
    const Eigen::Map<const Eigen::VectorXf, 0, Eigen::InnerStride<>> column(
        b, k, Eigen::InnerStride<>(transpose_b ? 1 : ldb));
    const auto product = [&](const auto& op_a) {
        if (beta == 0.0f)
            out.noalias() = alpha * (op_a * column);
        else
            out = beta * out + alpha * (op_a * column);
    };
    if (transpose_a)
        product(Eigen::Map<const RowMajor, 0, Stride>(a, k, m, Stride(lda)).transpose());
    else
        product(Eigen::Map<const RowMajor, 0, Stride>(a, m, k, Stride(lda)));
}

}  // namespace

void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
    if (m == 0 || n == 0) return;
    if (n == 1 && k > 0 && lda >= (transpose_a ? m : k) && ldb >= (transpose_b ? k : 1) && ldc >= 1) {
        matrix_vector(transpose_a, transpose_b, m, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    const bool small = m * n * k < kOneThreadBelow;
    const int threads = omp_get_max_threads();
    if (small) omp_set_num_threads(1);
    const auto status =
        dnnl_sgemm(transpose_a ? 'T' : 'N', transpose_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    if (small) omp_set_num_threads(threads);
    if (status != dnnl_success)
        throw InternalError(fmt::format("gemm of {} x {} by {} (strides {}, {}, {}) failed: oneDNN status {}", m, k, n,
                                        lda, ldb, ldc, static_cast<int>(status)));
}

}  // namespace vaiq
