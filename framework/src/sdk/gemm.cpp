#include "vaiq/gemm.hpp"

#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.h>

#include "vaiq/error.hpp"

namespace vaiq {

void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
    if (m == 0 || n == 0) return;
    const auto status =
        dnnl_sgemm(transpose_a ? 'T' : 'N', transpose_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    if (status != dnnl_success)
        throw InternalError(fmt::format("gemm of {} x {} by {} (strides {}, {}, {}) failed: oneDNN status {}", m, k, n,
                                        lda, ldb, ldc, static_cast<int>(status)));
}

}  // namespace vaiq
