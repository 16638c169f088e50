// Helpers the runtime's tests share.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "runtime/executor.hpp"
#include "vaiq/error.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq::runtime::test {

inline std::string error_of(const std::function<void()>& body) {
    try {
        body();
    } catch (const vaiq::InputError& e) {
        return e.what();
    }
    return "no error";
}

// Conv(pads 1) + bias + Relu computed directly, for conv_relu_model().
inline std::vector<float> reference_conv_relu(const Tensor& x, const Tensor& w, const Tensor& b) {
    std::vector<float> y(3 * 4 * 4);
    const auto xv = x.data<float>(), wv = w.data<float>(), bv = b.data<float>();
    for (int m = 0; m < 3; ++m)
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) {
                double acc = bv[m];
                for (int c = 0; c < 2; ++c)
                    for (int ki = 0; ki < 3; ++ki)
                        for (int kj = 0; kj < 3; ++kj) {
                            const int ii = i + ki - 1, jj = j + kj - 1;
                            if (ii < 0 || ii >= 4 || jj < 0 || jj >= 4) continue;
                            acc += xv[(c * 4 + ii) * 4 + jj] * wv[((m * 2 + c) * 3 + ki) * 3 + kj];
                        }
                y[(m * 4 + i) * 4 + j] = static_cast<float>(std::max(acc, 0.0));
            }
    return y;
}
// Every listed tensor (and the output y) with and without the executor's
// rewrites, within `tolerance`; the run counts per op type with them.
inline std::map<std::string, int64_t> compare_rewrites(const vaiq::Model& model, const Tensor& x,
                                                       const std::vector<std::string>& taps, float tolerance,
                                                       bool taps_known = false, int threads = 1) {
    runtime::Executor plain(model, {.threads = 1, .optimize_layout = false, .fuse_patterns = false});
    runtime::ExecutorOptions options{.threads = threads, .profile = true};
    if (taps_known) options.taps.insert(taps.begin(), taps.end());
    runtime::Executor rewritten(model, options);
    std::map<std::string, Tensor> a, b;
    a["y"] = plain.run({{"x", x}}, taps, [&](const std::string& n, const Tensor& t) { a[n] = t; })[0];
    b["y"] = rewritten.run({{"x", x}}, taps, [&](const std::string& n, const Tensor& t) { b[n] = t; })[0];
    EXPECT_EQ(b.size(), taps.size() + 1);
    for (const auto& [name, t] : a) {
        EXPECT_EQ(b[name].shape(), t.shape()) << name;
        const auto p = t.data<float>(), q = b[name].data<float>();
        for (size_t i = 0; i < p.size() && i < q.size(); ++i)
            EXPECT_NEAR(p[i], q[i], tolerance) << name << "[" << i << "]";
    }
    std::map<std::string, int64_t> calls;
    for (const auto& p : rewritten.profile()) calls[p.op_type] = p.calls;
    return calls;
}

}  // namespace vaiq::runtime::test
