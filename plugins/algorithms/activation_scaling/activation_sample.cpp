#include "activation_sample.hpp"

#include <algorithm>
#include <cmath>
#include <random>

namespace vaiq {

std::map<std::string, ActivationSample> sample_activations(const Model& model, AlgorithmContext& context,
                                                           const std::map<std::string, int64_t>& channels,
                                                           int sample_rows) {
    std::map<std::string, ActivationSample> out;
    std::vector<std::string> taps;
    for (const auto& [x, k] : channels) {
        taps.push_back(x);
        out[x].abs_sum.assign(static_cast<size_t>(k), 0.0);
    }
    std::mt19937_64 rng(0);
    context.for_each_tapped(model, taps, [&](const std::string& name, const Tensor& value) {
        if (value.type() != DataType::Float) return;
        auto& s = out.at(name);
        const auto k = s.abs_sum.size();
        const auto v = value.data<float>();
        for (size_t r = 0; r + k <= v.size(); r += k) {
            for (size_t j = 0; j < k; ++j) s.abs_sum[j] += std::abs(v[r + j]);
            ++s.rows_seen;
            // Reservoir sampling: every row seen so far is kept with the same chance.
            if (static_cast<int>(s.rows.size()) < sample_rows) {
                s.rows.emplace_back(v.begin() + static_cast<std::ptrdiff_t>(r),
                                    v.begin() + static_cast<std::ptrdiff_t>(r + k));
            } else {
                std::uniform_int_distribution<int64_t> pick(0, s.rows_seen - 1);
                const auto slot = pick(rng);
                if (slot < sample_rows)
                    std::copy_n(v.begin() + static_cast<std::ptrdiff_t>(r), k,
                                s.rows[static_cast<size_t>(slot)].begin());
            }
        }
    });
    return out;
}

SplitRows split_rows(const ActivationSample& sample) {
    SplitRows out;
    for (size_t r = 0; r < sample.rows.size(); ++r)
        (held_out_row(r) ? out.held : out.fitted).push_back(&sample.rows[r]);
    if (out.fitted.empty()) std::swap(out.fitted, out.held);  // a sample too small to split
    return out;
}

Matrix stack(const std::vector<const std::vector<float>*>& rows, Eigen::Index k) {
    Matrix x(static_cast<Eigen::Index>(rows.size()), k);
    for (size_t r = 0; r < rows.size(); ++r)
        x.row(static_cast<Eigen::Index>(r)) = Eigen::Map<const Eigen::RowVectorXf>(rows[r]->data(), k);
    return x;
}

Matrix divide_channels(const Matrix& x, const std::vector<float>& s) {
    Matrix out = x;
    for (Eigen::Index j = 0; j < out.cols(); ++j) out.col(j) /= s[static_cast<size_t>(j)];
    return out;
}

Matrix quantize_scaled_weight(const Eigen::Ref<const Matrix>& w, const std::vector<float>& s, const QuantSpec& spec) {
    Matrix scaled = w;
    for (Eigen::Index j = 0; j < scaled.rows(); ++j) scaled.row(j) *= s[static_cast<size_t>(j)];
    const auto tensor = Tensor::from_values<float>({scaled.rows(), scaled.cols()},
                                                   std::vector<float>(scaled.data(), scaled.data() + scaled.size()));
    const auto q = fake_quantize(tensor, constant_params(tensor, spec), "weight");
    return Eigen::Map<const Matrix>(q.data<float>().data(), scaled.rows(), scaled.cols());
}

}  // namespace vaiq
