// The one place the runtime asks which instruction sets the CPU has: kernels
// pick their vector paths from it, so the choice is made once and can be seen.
#pragma once

namespace vaiq::runtime {

struct CpuFeatures {
    bool ssse3 = false;  ///< byte shuffles (pshufb)
    bool avx2 = false;
    bool fma = false;
    bool avx512f = false;
    bool avx512bw = false;    ///< byte and word lanes
    bool avx512vbmi = false;  ///< with AVX512BW: byte permutes across a whole vector
    bool avx512vnni = false;  ///< with AVX512BW: 8-bit dot products into int32 lanes
    bool avx512vl = false;    ///< AVX-512 instructions on 128- and 256-bit vectors
};

/// What this CPU supports, detected on first use.
const CpuFeatures& cpu_features();

}  // namespace vaiq::runtime
