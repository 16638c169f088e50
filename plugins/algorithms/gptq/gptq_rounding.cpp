#include "gptq_rounding.hpp"

#include <fmt/format.h>
#include <Eigen/Cholesky>
#include <Eigen/Core>

#include <algorithm>
#include <cmath>

#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/log.hpp"

namespace vaiq {

namespace {

using MatrixD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// The grid value nearest to `w` under one scale and zero point, saturated to [qmin, qmax].
double grid_value(double w, double scale, double zero_point, int64_t qmin, int64_t qmax) {
    const double q =
        std::clamp(std::nearbyint(w / scale) + zero_point, static_cast<double>(qmin), static_cast<double>(qmax));
    return (q - zero_point) * scale;
}

// `rows` x `cols` row-major floats as doubles.
MatrixD as_matrix(const float* data, Eigen::Index rows, Eigen::Index cols) {
    return Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(data, rows, cols)
        .cast<double>();
}

// XᵀX over all the token rows at one input, and over the quarter held out
// (held_out_row), which judges whether GPTQ fitted on the others beats round to
// nearest: on the rows it fitted, a fit nearly always looks better.
struct TokenRows {
    MatrixD all, held;
    int64_t rows = 0, held_rows = 0;
};

// tr((W - Q)ᵀ H (W - Q)) / (K N): the mean squared output error the rounding adds, H carrying the inputs.
double output_error(const MatrixD& w, const MatrixD& q, const MatrixD& h) {
    const MatrixD d = w - q;
    return (d.transpose() * h * d).trace() / static_cast<double>(w.size());
}

}  // namespace

Tensor gptq_round(const Tensor& weight, const QuantParams& params, std::vector<double> hessian,
                  const GptqOptions& options) {
    const auto k = weight.shape()[0], n = weight.shape()[1];
    const ParamLayout layout(weight.shape(), params, "weight");
    const auto [qmin, qmax] = integer_range(params.type);
    MatrixD w = as_matrix(weight.data<float>().data(), k, n);
    Eigen::Map<MatrixD> h(hessian.data(), k, k);
    // Channels never non-zero in the data cannot be seen: their weights do not matter.
    for (Eigen::Index i = 0; i < k; ++i)
        if (h(i, i) == 0) {
            h(i, i) = 1;
            w.row(i).setZero();
        }
    const double damp = options.damping * h.diagonal().mean();
    h.diagonal().array() += damp;
    // Act-order: the rows in order of falling H diagonal (the inputs that carry the most first), W and H
    // permuted alike; each weight keeps its own block's scale (static groups), so only the order changes.
    std::vector<Eigen::Index> order(static_cast<size_t>(k));
    for (Eigen::Index i = 0; i < k; ++i) order[static_cast<size_t>(i)] = i;
    if (options.act_order) {
        std::stable_sort(order.begin(), order.end(), [&](Eigen::Index a, Eigen::Index b) { return h(a, a) > h(b, b); });
        MatrixD permuted_h(k, k), permuted_w(k, n);
        for (Eigen::Index i = 0; i < k; ++i) {
            permuted_w.row(i) = w.row(order[static_cast<size_t>(i)]);
            for (Eigen::Index j = 0; j < k; ++j)
                permuted_h(i, j) = h(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
        }
        h = permuted_h;
        w = permuted_w;
    }
    // The upper Cholesky factor U of H⁻¹ (H⁻¹ = Uᵀ U): row i of U carries column i's error forward.
    const Eigen::LLT<MatrixD> llt(h);
    if (llt.info() != Eigen::Success) throw InputError("GPTQ: the damped Hessian is not positive definite");
    const MatrixD inverse = llt.solve(MatrixD::Identity(k, k));
    const Eigen::LLT<MatrixD> llt_inverse(inverse);
    if (llt_inverse.info() != Eigen::Success) throw InputError("GPTQ: the inverse Hessian is not positive definite");
    const MatrixD u = llt_inverse.matrixU();

    MatrixD q(k, n);
    const Eigen::Index batch = std::max(1, options.batch_rows);
    for (Eigen::Index first = 0; first < k; first += batch) {
        const Eigen::Index last = std::min(k, first + batch);
        MatrixD errors(last - first, n);
        for (Eigen::Index i = first; i < last; ++i) {
            const double d = u(i, i);
            const Eigen::Index row = order[static_cast<size_t>(i)];  // where row i of the order sits in W
            for (Eigen::Index c = 0; c < n; ++c) {
                const size_t p = layout.index(static_cast<size_t>(row * n + c));
                q(i, c) = grid_value(w(i, c), params.scale[p], static_cast<double>(params.zero_point[p]), qmin, qmax);
            }
            errors.row(i - first) = (w.row(i) - q.row(i)) / d;
            // Into the rows of this batch not yet rounded ...
            for (Eigen::Index j = i + 1; j < last; ++j) w.row(j) -= u(i, j) * errors.row(i - first);
        }
        // ... and, once per batch, into every later row.
        if (last < k) w.bottomRows(k - last) -= u.block(first, last, last - first, k - last).transpose() * errors;
    }
    Tensor out(DataType::Float, weight.shape());
    auto o = out.mutable_data<float>();
    for (Eigen::Index i = 0; i < k; ++i)
        for (Eigen::Index c = 0; c < n; ++c)
            o[static_cast<size_t>(order[static_cast<size_t>(i)] * n + c)] = static_cast<float>(q(i, c));
    return out;
}

GptqResult gptq(AlgorithmContext& context, const GptqOptions& options) {
    const Model& model = context.model();
    const QuantPlan& plan = context.plan();
    GptqResult result;
    const GraphIndex index(model.graph());
    // Each planned MatMul weight, and the activation its H comes from.
    std::map<std::string, std::vector<const onnx::NodeProto*>> readers;
    for (const auto& node : model.graph().node()) {
        if (!is_default_domain(node) || node.op_type() != "MatMul" || node.input_size() != 2) continue;
        const auto* t = plan.find(node.input(1));
        const auto* init = index.initializer(node.input(1));
        if (!t || !init || init->dims_size() != 2 || !is_integer(t->params.type)) continue;
        readers[node.input(0)].push_back(&node);
    }
    if (readers.empty()) return result;
    std::map<std::string, TokenRows> inputs;
    std::vector<std::string> taps;
    for (const auto& [x, nodes] : readers) {
        const auto k = index.initializer(nodes[0]->input(1))->dims(0);
        inputs[x].all = inputs[x].held = MatrixD::Zero(k, k);
        taps.push_back(x);
    }
    context.for_each_tapped(model, taps, [&](const std::string& name, const Tensor& value) {
        if (value.type() != DataType::Float) return;
        auto& in = inputs.at(name);
        const auto k = in.all.rows();
        const auto count = static_cast<Eigen::Index>(value.size()) / k;
        const MatrixD x = as_matrix(value.data<float>().data(), count, k);
        in.all.noalias() += x.transpose() * x;
        std::vector<Eigen::Index> held;
        for (Eigen::Index r = 0; r < count; ++r)
            if (held_out_row(static_cast<uint64_t>(in.rows + r))) held.push_back(r);
        MatrixD xh(static_cast<Eigen::Index>(held.size()), k);
        for (size_t r = 0; r < held.size(); ++r) xh.row(static_cast<Eigen::Index>(r)) = x.row(held[r]);
        in.held.noalias() += xh.transpose() * xh;
        in.rows += count, in.held_rows += static_cast<int64_t>(held.size());
    });
    int64_t rounded_layers = 0, layer_count = 0;
    for (const auto& [x, nodes] : readers) layer_count += static_cast<int64_t>(nodes.size());
    for (auto& [x, in] : inputs) {
        if (in.rows == 0) continue;
        if (in.held_rows == in.rows) in.held.setZero(), in.held_rows = 0;  // too few rows to split
        const int64_t fitted_rows = in.rows - in.held_rows;
        const MatrixD h = (in.all - in.held) * (2.0 / static_cast<double>(fitted_rows));
        const MatrixD all = in.all * (2.0 / static_cast<double>(in.rows));
        const std::vector<double> every_row(all.data(), all.data() + all.size());
        // Too few rows to hold any out: judged on the fitted ones.
        const MatrixD judge = in.held_rows > 0 ? MatrixD(in.held * (2.0 / static_cast<double>(in.held_rows))) : h;
        for (const auto* node : readers.at(x)) {
            context.progress("layer", ++rounded_layers, layer_count);
            const auto& name = node->input(1);
            const auto weight = Tensor::from_proto(*index.initializer(name));
            const auto& params = plan.find(name)->params;
            std::vector<double> hv(h.data(), h.data() + h.size());
            auto rounded = gptq_round(weight, params, hv, options);
            const auto k = weight.shape()[0], n = weight.shape()[1];
            const auto rtn_values = fake_quantize(weight, params, name);
            const MatrixD w = as_matrix(weight.data<float>().data(), k, n);
            GptqLayer layer{name, output_error(w, as_matrix(rtn_values.data<float>().data(), k, n), judge),
                            output_error(w, as_matrix(rounded.data<float>().data(), k, n), judge), fitted_rows,
                            in.held_rows};
            // When GPTQ does not beat round to nearest on the rows it did not fit, keep the nearest;
            // when it does, round again with every row's H (the same method, a quarter more data).
            layer.kept = layer.error_gptq < layer.error_rtn;
            if (!layer.kept)
                rounded = rtn_values;
            else if (in.held_rows > 0)
                rounded = gptq_round(weight, params, every_row, options);
            log_debug("gptq: '{}': held-out output error {:.4g} (round to nearest), {:.4g} (GPTQ)", name,
                      layer.error_rtn, layer.error_gptq);
            result.rounded[name] = std::move(rounded);
            result.layers.push_back(layer);
        }
    }
    return result;
}

}  // namespace vaiq
