#include "runtime/cpu_features.hpp"

namespace vaiq::runtime {

const CpuFeatures& cpu_features() {
    static const CpuFeatures features = [] {
        CpuFeatures f;
        f.ssse3 = __builtin_cpu_supports("ssse3");
        f.avx2 = __builtin_cpu_supports("avx2");
        f.fma = __builtin_cpu_supports("fma");
        f.avx512f = __builtin_cpu_supports("avx512f");
        f.avx512bw = f.avx512f && __builtin_cpu_supports("avx512bw");
        f.avx512vbmi = f.avx512f && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vbmi");
        f.avx512vnni = f.avx512f && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
        f.avx512vl = f.avx512f && __builtin_cpu_supports("avx512vl");
        return f;
    }();
    return features;
}

}  // namespace vaiq::runtime
