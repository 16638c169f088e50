// Fake quantization with one scale of at most 16 bits, one loop per
// instruction set (the library picks the widest the CPU has); listed here so
// that the tests can check every one this CPU runs against the general path.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace vaiq::detail {

/// The scale and the integer range, less the zero point.
struct OneScale {
    float scale, lo, hi;
};

/// Writes quantize-dequantize of n values (`to` may be `from`).
using OneScaleKernel = void (*)(const float* from, float* to, int64_t n, OneScale s);

/// The kernels this CPU can run, by name ("portable", "avx2", "avx512"), narrowest first.
std::vector<std::pair<const char*, OneScaleKernel>> one_scale_kernels();

}  // namespace vaiq::detail
