// vaiq/gemm.hpp - float matrix products on the executor's GEMM, for the
// algorithms that fit layers by gradient descent (AdaRound, AdaQuant).
#pragma once

#include <cstdint>

#include "vaiq/export.hpp"

namespace vaiq {

/// C = alpha * op(A) * op(B) + beta * C on row-major float matrices: C is m x n,
/// op(A) m x k, op(B) k x n, op(X) the transpose of X where asked; lda, ldb and
/// ldc are the row strides of A, B and C as stored. Runs oneDNN's sgemm (compiled
/// for the CPU at run time: AVX2, AVX-512) on the threads the run allows.
/// Throws InternalError when the product cannot be computed (a stride shorter
/// than its row).
VAIQ_API void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                   int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace vaiq
