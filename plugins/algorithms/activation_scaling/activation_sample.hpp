// What AWQ and SmoothQuant search per-channel scales s on: a reservoir sample
// of each activation's token rows, the share held out to judge a search by,
// and the two sides of a scaling, X / s and Q(diag(s) W).
#pragma once

#include <Eigen/Core>

#include <map>
#include <string>
#include <vector>

#include "vaiq/algorithm.hpp"
#include "vaiq/model.hpp"
#include "vaiq/quant.hpp"

namespace vaiq {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// What a search needs of one activation: the sum of |x_j| over every row seen,
/// and a sample of token rows.
struct ActivationSample {
    std::vector<double> abs_sum;
    int64_t rows_seen = 0;
    std::vector<std::vector<float>> rows;
};

/// Runs the context's data through `model` and samples up to `sample_rows`
/// token rows of each activation in `channels` (activation -> its channel
/// count; reservoir sampling, so every row has the same chance).
std::map<std::string, ActivationSample> sample_activations(const Model& model, AlgorithmContext& context,
                                                           const std::map<std::string, int64_t>& channels,
                                                           int sample_rows);

/// The rows to sample for a search over `searched` rows and the held-out ones
/// besides (held_out_row: a quarter of the sample judges the search instead of feeding it).
inline int with_held_out(int searched) { return searched + searched / 3; }

/// The sample's rows split by held_out_row: those a search weighs, and those
/// that judge it (none when the sample is too small to split).
struct SplitRows {
    std::vector<const std::vector<float>*> fitted, held;
};
SplitRows split_rows(const ActivationSample& sample);

/// Token rows of `k` values, one matrix row each.
Matrix stack(const std::vector<const std::vector<float>*>& rows, Eigen::Index k);

/// X with channel (column) j divided by s_j.
Matrix divide_channels(const Matrix& x, const std::vector<float>& s);

/// diag(s) W for W [K, N], quantized with `spec` (its parameters from those values) and dequantized.
Matrix quantize_scaled_weight(const Eigen::Ref<const Matrix>& w, const std::vector<float>& s, const QuantSpec& spec);

}  // namespace vaiq
