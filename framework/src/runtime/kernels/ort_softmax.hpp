// Softmax rows computed exactly as ONNX Runtime computes them on x86-64 with
// AVX-512 (MLAS): its polynomial exp, its 16-lane summation order and its final
// multiply by 1 / sum. A quantized model whose QuantizeLinear follows a Softmax
// then rounds the same values the same way in vaiq as where it is deployed.
#pragma once

#include <cstdint>

namespace vaiq::runtime {

/// out[j] = exp(in[j] - max(in)) for j < n; returns the sum of the out[j].
float ort_sum_exp(const float* in, float* out, int64_t n, float negative_maximum);

}  // namespace vaiq::runtime
