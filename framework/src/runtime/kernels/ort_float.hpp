// Float kernels computed in the order ONNX Runtime computes them on x86-64 (its
// MLAS kernels with AVX-512/FMA, its Eigen sums), so that a quantized model whose
// QuantizeLinear follows one of these ops rounds exactly the same values in vaiq
// as where it is deployed. Each is exact IEEE arithmetic in a fixed order.
#pragma once

#include <cstdint>

namespace vaiq::runtime {

/// Softmax's exponentials: out[j] = exp(in[j] + negative_maximum) for j < n with
/// MLAS's polynomial; returns their sum in its 16-lane order.
float ort_sum_exp(const float* in, float* out, int64_t n, float negative_maximum);

/// The maximum of a row, as MLAS finds it before Softmax (16 lanes at a time
/// where the CPU has AVX-512; the maximum is the same in any order).
float ort_row_max(const float* x, int64_t n);

/// MLAS's error function (its AVX-512 kernel where the CPU has AVX-512, else FMA3).
void ort_erf(const float* in, float* out, int64_t n);

/// Sigmoid as ONNX Runtime computes it: MLAS's rational polynomial (FMA where
/// the CPU has it, 16 lanes at a time with AVX-512). `out` may be `in`.
void ort_logistic(const float* in, float* out, int64_t n);

/// Tanh as ONNX Runtime's recurrent ops compute it (MLAS's tanh): x clamped to
/// [-9, 9], x p(x^2) / q(x^2) with Eigen's coefficients (FMA where the CPU has
/// it). `out` may be `in`.
void ort_tanh(const float* in, float* out, int64_t n);

/// Exact (erf) GELU as ONNX Runtime computes it: MLAS's fused AVX-512 kernel
/// where the CPU has AVX-512, else x / sqrt 2, the FMA erf, 0.5 x (erf + 1).
/// `out` may be `in`.
void ort_gelu(const float* in, float* out, int64_t n);

/// The sum of a contiguous row as ONNX Runtime's ReduceSum/ReduceMean adds it
/// (Eigen's vectorised sum with 4-lane packets).
float ort_row_sum(const float* x, int64_t n);

/// One row of LayerNormalization as MLAS's AVX2 kernel computes it: the mean
/// from a 4-lane double sum, the centred variance from 8-lane float fused
/// multiply-adds, y = ((x - mean) * (1 / sqrt(var + eps))) * scale + bias with
/// the last step fused (bias may be null). Writes the mean and 1 / std. Bit for
/// bit what ONNX Runtime 1.30 computes when n is at least 8 (shorter rows may
/// differ in the last bit).
void ort_layer_norm_row(const float* x, const float* scale, const float* bias, float* y, int64_t n, float epsilon,
                        float* mean_out, float* inv_std_out);

/// C[m, n] = A[m, k] B[k, n], row-major, as MLAS's SGEMM sums with A untransposed
/// (ONNX Runtime's MatMul, and ConvTranspose with its prepacked filter): fused
/// multiply-adds in k order within panels of 128 values of k (256, 512 or 1024
/// when n < k and n is at most 64, 32 or 16, as MLAS widens its K stride), panel
/// sums added in order. (Where ONNX Runtime splits a large product's n among
/// threads, each share picks its own panel.)
void ort_sgemm(const float* a, const float* b, float* c, int64_t m, int64_t k, int64_t n);

}  // namespace vaiq::runtime
