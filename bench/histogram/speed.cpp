// Nanoseconds a value of vaiq::Histogram::add on batches of several sizes,
// after the first batch (which sets the bins): half-zero Relu outputs, as
// calibration's taps mostly see, and values of both signs. Batches of 3.2 M
// values and more cycle through four buffers, so that they come from memory,
// not the caches. Built and run by speed.sh.
#include <vaiq/histogram.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

int main() {
    std::printf("%-10s %10s %12s\n", "values", "relu_ns", "signed_ns");
    for (const size_t n : {size_t{50000}, size_t{200000}, size_t{800000}, size_t{3200000}, size_t{16000000}}) {
        const size_t buffers = n >= 3200000 ? 4 : 1;
        std::mt19937 rng(1);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<std::vector<float>> relu(buffers, std::vector<float>(n)), both(buffers, std::vector<float>(n));
        for (size_t b = 0; b < buffers; ++b)
            for (size_t i = 0; i < n; ++i) {
                both[b][i] = normal(rng);
                relu[b][i] = std::max(0.0f, both[b][i]);
            }
        double ns[2];
        for (int kind = 0; kind < 2; ++kind) {
            const auto& sets = kind == 0 ? relu : both;
            vaiq::Histogram h(2048, false);
            h.add(sets[0]);
            const size_t reps = std::max<size_t>(8, 80000000 / n);
            const auto start = std::chrono::steady_clock::now();
            for (size_t r = 0; r < reps; ++r) h.add(sets[r % buffers]);
            const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
            ns[kind] = took.count() / static_cast<double>(reps * n);
        }
        std::printf("%-10zu %10.3f %12.3f\n", n, ns[0], ns[1]);
    }
}
