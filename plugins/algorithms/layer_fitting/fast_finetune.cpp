#include "fast_finetune.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "column_sums.hpp"
#include "rounding_step.hpp"
#include "segmented_run.hpp"
#include "vaiq/gemm.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/log.hpp"

namespace vaiq {

namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
constexpr int64_t kElementsPerBlock = 16384;   // weights a thread updates at a time in a step
// The most the batches' feeds may take for the trials to sample side by side,
// each on a pass of its own (see fast_finetune).
constexpr size_t kKeptBatchesBytes = size_t{32} << 20;

// One layer: how its weight reads its input, and the columns sampled for it.
struct Layer {
    std::string node, input, weight;
    const TensorQuant* weight_quant = nullptr;
    const TensorQuant* input_quant = nullptr;  // null: the input is not quantized
    bool conv = false;
    int64_t group = 1, kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1, pt = 0, pl = 0, pb = 0, pr = 0;
    int64_t outputs = 0, rows = 0;   // output channels; values per input column (all groups)
    int storage = 0;                 // weight layout for Gemm/MatMul: 0 [K, N], 1 [N, K]
    RowMatrix w;                     // [outputs, rows / group]
    std::vector<float> bias;         // the float layer's, for the outputs to reproduce
    std::vector<float> fitted_bias;  // as the quantized model adds it (an int8 bias is on a grid of its own)
    Eigen::MatrixXf x, y;            // sampled columns: quantized inputs [rows, n], float outputs [outputs, n]
    Eigen::MatrixXf xf;              // the float model's inputs of the same columns (for QDrop; empty when not mixed)
    int64_t stored = 0, seen = 0;
    // Instead of the columns, their sums (column_sums.hpp): where a group's
    // inputs are few enough that a step over the sums costs less than one over
    // sampled columns, and no step mixes float inputs in (QDrop).
    std::optional<ColumnSums> sums;
};

// Whether `l` is fitted on the sums of its columns rather than on sampled ones:
// a step then costs outputs x k x k instead of two products of outputs x k x
// ColumnsPerStep, and the sums hold every column in k x k values a group (and
// outputs x k more), within MemoryMB.
bool summed(const Layer& l, const FastFinetuneOptions& o, bool keep_float) {
    const int64_t k = l.rows / l.group;
    return !keep_float && k <= 2 * static_cast<int64_t>(o.batch_columns) &&
           ColumnSums::bytes(l.outputs, l.group, k) <= o.memory_bytes;
}

std::optional<Layer> layer_of(const onnx::NodeProto& n, const GraphIndex& index, const QuantPlan& plan) {
    if (!is_default_domain(n) || n.input_size() < 2) return std::nullopt;
    const bool conv = n.op_type() == "Conv", gemm = n.op_type() == "Gemm", matmul = n.op_type() == "MatMul";
    if (!conv && !gemm && !matmul) return std::nullopt;
    const auto* wq = plan.find(n.input(1));
    const auto* init = index.initializer(n.input(1));
    if (!wq || !init || !is_integer(wq->params.type) || init->data_type() != onnx::TensorProto::FLOAT)
        return std::nullopt;
    Layer l;
    l.node = n.name().empty() ? n.output(0) : n.name();
    l.input = n.input(0);
    l.weight = n.input(1);
    l.weight_quant = wq;
    l.input_quant = plan.find(n.input(0));
    l.conv = conv;
    const Tensor w = Tensor::from_proto(*init);
    const auto& shape = w.shape();
    if (conv) {
        if (shape.size() != 4) return std::nullopt;
        for (const auto& a : n.attribute())
            if (a.name() == "auto_pad" && a.s() != "NOTSET") return std::nullopt;
        l.group = int_attribute(n, "group", 1);
        l.kh = shape[2];
        l.kw = shape[3];
        const auto strides = ints_attribute(n, "strides").value_or(std::vector<int64_t>{1, 1});
        const auto dilations = ints_attribute(n, "dilations").value_or(std::vector<int64_t>{1, 1});
        const auto pads = ints_attribute(n, "pads").value_or(std::vector<int64_t>{0, 0, 0, 0});
        if (strides.size() != 2 || dilations.size() != 2 || pads.size() != 4) return std::nullopt;
        l.sh = strides[0], l.sw = strides[1], l.dh = dilations[0], l.dw = dilations[1], l.pt = pads[0], l.pl = pads[1];
        l.pb = pads[2], l.pr = pads[3];
        l.outputs = shape[0];
        l.rows = shape[1] * l.group * l.kh * l.kw;
        l.w = Eigen::Map<const RowMatrix>(w.data<float>().data(), shape[0], shape[1] * l.kh * l.kw);
    } else {
        if (shape.size() != 2 || (gemm && int_attribute(n, "transA", 0) != 0)) return std::nullopt;
        l.storage = gemm && int_attribute(n, "transB", 0) != 0 ? 1 : 0;
        const RowMatrix stored = Eigen::Map<const RowMatrix>(w.data<float>().data(), shape[0], shape[1]);
        l.w = l.storage == 1 ? stored : RowMatrix(stored.transpose());
        l.outputs = l.w.rows();
        l.rows = l.w.cols();
    }
    l.bias.assign(static_cast<size_t>(l.outputs), 0.0f);
    if (!matmul && n.input_size() >= 3) {
        const auto* b = index.initializer(n.input(2));
        if (!b || b->data_type() != onnx::TensorProto::FLOAT) return std::nullopt;
        const Tensor bias = Tensor::from_proto(*b);
        if (bias.size() != l.outputs) return std::nullopt;
        l.bias.assign(bias.data<float>().begin(), bias.data<float>().end());
        if (const auto* bq = plan.find(n.input(2)); bq && is_integer(bq->params.type)) {
            const Tensor written = fake_quantize(bias, bq->params, n.input(2));
            l.fitted_bias.assign(written.data<float>().begin(), written.data<float>().end());
        }
    }
    if (l.fitted_bias.empty()) l.fitted_bias = l.bias;
    return l;
}

// Output positions of the layer on this input, and the input column of each.
struct Columns {
    const Layer& l;
    const Tensor& value;
    int64_t count = 0, oh = 1, ow = 1, h = 1, wd = 1, channels = 0;
    Columns(const Layer& layer, const Tensor& v) : l(layer), value(v) {
        const auto& s = v.shape();
        if (l.conv) {
            if (s.size() != 4 || s[1] * l.kh * l.kw != l.rows) return;
            channels = s[1], h = s[2], wd = s[3];
            oh = (h + l.pt + l.pb - l.dh * (l.kh - 1) - 1) / l.sh + 1;
            ow = (wd + l.pl + l.pr - l.dw * (l.kw - 1) - 1) / l.sw + 1;
            if (oh <= 0 || ow <= 0) return;
            count = s[0] * oh * ow;
        } else {
            if (s.empty() || s.back() != l.rows) return;
            count = v.size() / l.rows;
        }
    }
    void fill(int64_t c, float* out) const {
        const auto v = value.data<float>();
        if (!l.conv) {
            std::copy_n(v.data() + c * l.rows, l.rows, out);
            return;
        }
        const int64_t n = c / (oh * ow), y0 = (c / ow) % oh * l.sh - l.pt, x0 = c % ow * l.sw - l.pl;
        const int64_t kh = l.kh, kw = l.kw, plane = h * wd;
        const float* image = v.data() + n * channels * plane;
        // The sampling fills every column of a summed layer twice, so this is
        // hot: a kernel row wholly inside the image (most of them) is a few
        // values read straight, where a library copy of them costs more.
        const bool inside = x0 >= 0 && x0 + (kw - 1) * l.dw < wd;
        for (int64_t ch = 0; ch < channels; ++ch, image += plane)
            for (int64_t i = 0; i < kh; ++i, out += kw) {
                const int64_t y = y0 + i * l.dh;
                if (y < 0 || y >= h) {
                    for (int64_t j = 0; j < kw; ++j) out[j] = 0.0f;
                    continue;
                }
                const float* row = image + y * wd;
                if (inside) {
                    for (int64_t j = 0, x = x0; j < kw; ++j, x += l.dw) out[j] = row[x];
                    continue;
                }
                for (int64_t j = 0, x = x0; j < kw; ++j, x += l.dw) out[j] = x < 0 || x >= wd ? 0.0f : row[x];
            }
    }
};

// The float layer's outputs of sampled columns, computed a block at a time by
// the executor's GEMM (one column at a time, the products took most of the sampling).
class PendingOutputs {
  public:
    explicit PendingOutputs(Layer& l) : l_(l), columns_(l.rows, kBlock) {}
    // Samples `slots` (in order) take the float inputs write(i, destination)
    // writes for slots[i]. The writes of a block run on the run's threads: for a
    // layer that keeps many columns, copying them one at a time left the
    // second core idle (the PP-OCRv4 detector's 3x3 layers at 160 x 160, 0.5-0.7 s each).
    template <typename Write>
    void add(std::span<const int64_t> slots, const Write& write) {
        for (size_t first = 0; first < slots.size();) {
            const auto start = static_cast<int64_t>(slots_.size());
            const auto n = std::min<int64_t>(kBlock - start, static_cast<int64_t>(slots.size() - first));
#pragma omp parallel for schedule(static) if (n * l_.rows >= kParallelValues)
            for (int64_t i = 0; i < n; ++i) write(first + static_cast<size_t>(i), columns_.col(start + i).data());
            slots_.insert(slots_.end(), slots.begin() + static_cast<std::ptrdiff_t>(first),
                          slots.begin() + static_cast<std::ptrdiff_t>(first) + n);
            first += static_cast<size_t>(n);
            if (static_cast<int64_t>(slots_.size()) == kBlock) flush();
        }
    }
    // Writes each pending sample's output, W_g x_g + b per group, into l.y (in
    // the order added: a slot the reservoir refilled takes its last column's).
    void flush() {
        const auto n = static_cast<int64_t>(slots_.size());
        if (n == 0) return;
        const int64_t k = l_.w.cols(), per_group = l_.outputs / l_.group;
        // Row-major views: the columns as [n, rows], the outputs as [n, outputs].
        outputs_.resize(static_cast<size_t>(n * l_.outputs));
        for (int64_t g = 0; g < l_.group; ++g)
            gemm(false, true, n, per_group, k, 1.0f, columns_.data() + g * k, l_.rows, l_.w.data() + g * per_group * k,
                 k, 0.0f, outputs_.data() + g * per_group, l_.outputs);
        for (int64_t c = 0; c < n; ++c) {
            float* y = l_.y.col(slots_[static_cast<size_t>(c)]).data();
            const float* o = outputs_.data() + c * l_.outputs;
            for (int64_t j = 0; j < l_.outputs; ++j) y[j] = o[j] + l_.bias[static_cast<size_t>(j)];
        }
        slots_.clear();
    }

  private:
    static constexpr int64_t kBlock = 512;
    static constexpr int64_t kParallelValues = 1 << 15;  // values a block's writes need to go on two threads
    Layer& l_;
    Eigen::MatrixXf columns_;  // [rows, kBlock], a column per pending sample
    std::vector<int64_t> slots_;
    std::vector<float> outputs_;
};

// Per output channel: scale, zero point and the integer range of the weight's quantization.
struct Grid {
    std::vector<float> scale, zero;
    float qmin = 0, qmax = 0;
    explicit Grid(const Layer& l) {
        const auto& p = l.weight_quant->params;
        const auto [lo, hi] = integer_range(p.type, l.weight_quant->spec.symmetric, l.weight_quant->spec.reduce_range);
        qmin = static_cast<float>(lo), qmax = static_cast<float>(hi);
        for (int64_t o = 0; o < l.outputs; ++o) {
            const size_t c = p.scale.size() == 1 ? 0 : static_cast<size_t>(o);
            scale.push_back(p.scale.at(c));
            zero.push_back(static_cast<float>(p.zero_point.at(c)));
        }
    }
    float value(int64_t o, float q) const { return (std::clamp(q + zero[o], qmin, qmax) - zero[o]) * scale[o]; }
};

// The sampled columns a layer is fitted on, and those held out to judge the
// fit: the reservoir's last fifth once there are enough (the last samples'
// columns while the reservoir has room, columns from anywhere once it filled).
// A layer with few samples and many weights (a squeeze-excitation Conv sees one
// column per sample) can fit them exactly and generalise worse than nearest
// rounding; the held-out columns show it, stop the fit at its best and keep
// nearest rounding when that is better.
struct Split {
    int64_t fit = 0, held = 0;
    explicit Split(int64_t stored) : fit(stored), held(stored >= kMinHeldOutSplit ? stored / 5 : 0) { fit -= held; }
    static constexpr int64_t kMinHeldOutSplit = 20;
};

// The layer's outputs on sampled columns, minus the float outputs: per group g,
// (W_g x_g + b - y) for `count` columns from `first` of `x` (col-major, a
// column per sample) into `err`, row-major [count, per_group] (a column's
// errors together), by the executor's GEMM.
void output_errors(const Layer& l, const float* w, const Eigen::MatrixXf& x, const Eigen::MatrixXf& y, int64_t first,
                   int64_t count, int64_t g, std::vector<float>& err) {
    const int64_t k = l.w.cols(), per_group = l.outputs / l.group;
    err.resize(static_cast<size_t>(count * per_group));
    gemm(false, true, count, per_group, k, 1.0f, x.data() + first * x.rows() + g * k, x.rows(), w + g * per_group * k,
         k, 0.0f, err.data(), per_group);
    for (int64_t c = 0; c < count; ++c) {
        float* row = err.data() + c * per_group;
        const float* target = y.data() + (first + c) * y.rows() + g * per_group;
        const float* bias = l.fitted_bias.data() + g * per_group;
        for (int64_t o = 0; o < per_group; ++o) row[o] += bias[o] - target[o];
    }
}

// Mean over columns [first, first + count) of the summed squared output error of weights `w`.
double reconstruction_loss(const Layer& l, const RowMatrix& w, int64_t first, int64_t count) {
    constexpr int64_t kChunk = 4096;  // columns at a time: the errors' memory stays small
    std::vector<float> err;
    double sum = 0;
    for (int64_t g = 0; g < l.group; ++g)
        for (int64_t c = first; c < first + count; c += kChunk) {
            output_errors(l, w.data(), l.x, l.y, c, std::min(kChunk, first + count - c), g, err);
            for (const float e : err) sum += static_cast<double>(e) * e;
        }
    return sum / static_cast<double>(std::max<int64_t>(count, 1));
}

// The fold a summed layer's fit number `fit` holds out, or -1 (too few columns to spare any).
int held_fold(const Layer& l, int fit) { return l.stored >= Split::kMinHeldOutSplit ? fit % ColumnSums::kFolds : -1; }

// The sums of a summed layer's columns in fold `fold` (`in` true) or in every
// other (`in` false); fold -1 is none, and every other is all.
ColumnSet fold_sums(const Layer& l, int fold, bool in) {
    std::array<bool, ColumnSums::kFolds> folds;
    folds.fill(!in);
    if (fold >= 0) folds[static_cast<size_t>(fold)] = in;
    return l.sums->folds(folds);
}

// The loss that judges a layer's weights: on the held-out columns, or on all
// when none are held out (with several fits of a summed layer, each held out
// another fold: none is left out of all).
double judged_loss(const Layer& l, const RowMatrix& w, int fits) {
    if (l.sums) {
        const int fold = fits == 1 ? held_fold(l, 0) : -1;
        const RowMatrix d = w - l.w;
        return fold_sums(l, fold, fold >= 0).loss(d.data());
    }
    const Split split(l.stored);
    return split.held > 0 ? reconstruction_loss(l, w, split.fit, split.held) : reconstruction_loss(l, w, 0, l.stored);
}

// What a fit descends, and the held-out loss that judges its steps.
class Objective {
  public:
    virtual ~Objective() = default;
    /// d (mean squared output error over the fitted columns) / dW at `w`, into `grad`.
    virtual void gradient(const RowMatrix& w, RowMatrix& grad) = 0;
    virtual int64_t held_columns() const = 0;
    bool holds_out() const { return held_columns() > 0; }
    virtual double held_loss(const RowMatrix& w) const = 0;
};

// ColumnsPerStep columns a step, drawn from the sampled ones; with QDrop each
// input value of a step is the quantized one with probability DropRatio, else
// the float one, so the rounding is not fitted to one particular pattern of
// the quantization noise before it (16 bits of a draw each).
class SampledColumns final : public Objective {
  public:
    SampledColumns(const Layer& l, const FastFinetuneOptions& o, std::mt19937_64& rng)
        : l_(l),
          rng_(rng),
          split_(l.stored),
          batch_(std::min<int64_t>(o.batch_columns, split_.fit)),
          pick_(0, split_.fit - 1),
          mixed_(l.xf.size() > 0),
          quantized_below_(static_cast<uint64_t>(std::clamp(o.drop_ratio, 0.0, 1.0) * 65536.0)),
          xb_(l.rows, batch_),
          yb_(l.outputs, batch_) {}

    void gradient(const RowMatrix& w, RowMatrix& grad) override {
        for (int64_t b = 0; b < batch_; ++b) {
            const int64_t c = pick_(rng_);
            yb_.col(b) = l_.y.col(c);
            if (!mixed_) {
                xb_.col(b) = l_.x.col(c);
                continue;
            }
            for (int64_t r = 0; r < l_.rows; r += 4) {
                const uint64_t bits = rng_();
                for (int64_t j = 0; j < 4 && r + j < l_.rows; ++j)
                    xb_(r + j, b) = ((bits >> (16 * j)) & 0xffff) < quantized_below_ ? l_.x(r + j, c) : l_.xf(r + j, c);
            }
        }
        // d loss / d W_g = 2 / batch * (W_g x_g + b - y) x_g^T
        const int64_t k = l_.w.cols(), per_group = l_.outputs / l_.group;
        for (int64_t g = 0; g < l_.group; ++g) {
            output_errors(l_, w.data(), xb_, yb_, 0, batch_, g, err_);
            gemm(true, false, per_group, k, batch_, 2.0f / static_cast<float>(batch_), err_.data(), per_group,
                 xb_.data() + g * k, xb_.rows(), 0.0f, grad.data() + g * per_group * k, k);
        }
    }
    int64_t held_columns() const override { return split_.held; }
    double held_loss(const RowMatrix& w) const override { return reconstruction_loss(l_, w, split_.fit, split_.held); }

  private:
    const Layer& l_;
    std::mt19937_64& rng_;
    const Split split_;
    const int64_t batch_;
    std::uniform_int_distribution<int64_t> pick_;
    const bool mixed_;
    const uint64_t quantized_below_;
    Eigen::MatrixXf xb_, yb_;
    std::vector<float> err_;
};

// Every column but those of the held-out fold, in every step, through their sums.
class SummedColumns final : public Objective {
  public:
    SummedColumns(const Layer& l, int held)  // held < 0: none held out
        : l_(l), fitted_(fold_sums(l, held, false)), held_(fold_sums(l, held, true)), d_(l.w.rows(), l.w.cols()) {}
    void gradient(const RowMatrix& w, RowMatrix& grad) override {
        d_ = w - l_.w;
        fitted_.gradient(d_.data(), grad.data());
    }
    int64_t held_columns() const override { return held_.count; }
    double held_loss(const RowMatrix& w) const override {
        const RowMatrix d = w - l_.w;
        return held_.loss(d.data());
    }

  private:
    const Layer& l_;
    const ColumnSet fitted_, held_;
    RowMatrix d_;
};

RowMatrix nearest(const Layer& l) {
    const Grid grid(l);
    RowMatrix w = l.w;
    for (int64_t r = 0; r < w.rows(); ++r)
        for (int64_t c = 0; c < w.cols(); ++c) w(r, c) = grid.value(r, std::nearbyint(l.w(r, c) / grid.scale[r]));
    return w;
}

// Fits the layer's grid values; returns them as a [outputs, k] matrix. Each
// step's products run on the executor's GEMM (in `objective`) and its
// per-weight work in RoundingStep's vectorised loops.
RowMatrix fit(const Layer& l, const FastFinetuneOptions& o, Objective& objective, int64_t& iterations) {
    using RowArray = Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    const Grid grid(l);
    const Eigen::ArrayXf scale = Eigen::Map<const Eigen::ArrayXf>(grid.scale.data(), l.outputs);
    const int64_t k = l.w.cols();
    const bool adaround = o.algorithm == "adaround";
    // AdaRound: floor(w / s) plus a learned h in [0, 1]; AdaQuant: w itself.
    const RowArray scaled = l.w.array().colwise() / scale;
    const RowArray base = scaled.floor();
    RowArray param = l.w.array();
    if (adaround) {
        const RowArray rest = (scaled - base).cwiseMax(0.01f).cwiseMin(0.99f);
        param = -(((kAdaRoundZeta - kAdaRoundGamma) / (rest - kAdaRoundGamma) - 1.0f).log());
    }
    RowArray q(l.outputs, k), sig(adaround ? l.outputs : 0, k), h(adaround ? l.outputs : 0, k);
    const RoundingStep step{.k = k,
                            .scale = grid.scale.data(),
                            .zero = grid.zero.data(),
                            .qmin = grid.qmin,
                            .qmax = grid.qmax,
                            .adaround = adaround,
                            .param = param.data(),
                            .base = base.data(),
                            .q = q.data(),
                            .sig = sig.data(),
                            .h = h.data()};
    auto hard = [&] {
        RowMatrix now(l.outputs, k);
        step.decided(l.outputs, now.data());
        return now;
    };
    Adam adam(static_cast<size_t>(param.size()), o.learning_rate);
    const int warm = static_cast<int>(o.warm_start * o.iterations);
    RowMatrix w(l.outputs, k), grad(l.outputs, k);
    // The elementwise work of a step runs a block of output channels at a time on
    // the run's threads (each weight's update is its own): single-threaded, it
    // took as long as the step's two products on the GEMM's threads.
    const int64_t chunk = std::max<int64_t>(1, kElementsPerBlock / k), chunks = (l.outputs + chunk - 1) / chunk;
    const bool parallel = l.outputs * k >= 2 * kElementsPerBlock;
    auto blocks = [&](const auto& body) {
#pragma omp parallel for schedule(static) if (parallel)
        for (int64_t c = 0; c < chunks; ++c) body(c * chunk, std::min(l.outputs, (c + 1) * chunk));
    };
    // Early stopping on the held-out columns, checked twenty times (AdaRound from
    // the warm start's end): the best weights seen are kept, and the fit ends
    // once kPatience checks in a row found none better (a quarter of the
    // iterations without progress). AdaRound's checks count towards it from
    // halfway through the regulariser's annealing: before, the rounding is not
    // decided yet (fitted on the columns' sums, the warm start ends with every
    // weight at its float value, which rounds to nearest, and the first steps of
    // the regulariser move away from it before they improve on it).
    constexpr int kPatience = 5;
    const int every = std::max(1, o.iterations / 20);
    RowMatrix best;
    double best_loss = std::numeric_limits<double>::infinity();
    int stale = 0;
    const int decided = warm + (o.iterations - warm) / 2;
    // AdaRound also stops once a rounding comes within kRelaxedGap of the loss
    // the relaxed (soft) weights reached by the warm start's end: every rounding
    // is one of the relaxation's points, so the annealing has little left to
    // find. Fed the quantized model's input, no weights reproduce the float
    // output, and a rounding mostly comes that close at once: on the PP-OCRv4
    // recognizer 31 of 47 layers stopped at the warm start's end, where their
    // rounding was within 0.1 % of what 600-800 more steps reached. Where the
    // relaxed weights do no better than nearest rounding on the held-out
    // columns, no rounding is likely to: the fit stops there (nearest rounding
    // is kept). Judged on a few held-out columns (a squeeze-excitation Conv sees
    // one a sample), neither tells enough: such a fit, cheap anyway, runs on.
    constexpr double kRelaxedGap = 1e-3;
    constexpr int64_t kRelaxedJudgedColumns = 128;
    const bool judge_relaxed = adaround && warm > 0 && objective.held_columns() >= kRelaxedJudgedColumns;
    std::optional<double> relaxed;
    bool settled = false;
    auto checkpoint = [&](int it) {
        if (!objective.holds_out() || (adaround && it < warm)) return;
        if (judge_relaxed && !relaxed) {  // the first check from the warm start's end
            blocks([&](int64_t first, int64_t last) { step.weights(first, last, w.data()); });
            relaxed = objective.held_loss(w);
            settled = *relaxed >= objective.held_loss(nearest(l));
        }
        RowMatrix now = hard();
        const double loss = objective.held_loss(now);
        if (loss < best_loss)
            best_loss = loss, best = std::move(now), stale = 0;
        else if (!adaround || it >= decided)
            ++stale;
        settled = settled || (relaxed && best_loss <= *relaxed * (1 + kRelaxedGap));
    };
    int it = 0;
    for (; it < o.iterations && stale < kPatience && !settled; ++it) {
        blocks([&](int64_t first, int64_t last) { step.weights(first, last, w.data()); });
        objective.gradient(w, grad);
        const float beta = !adaround || it < warm
                               ? 0.0f
                               : static_cast<float>(o.beta_start + (o.beta_end - o.beta_start) * (it - warm) /
                                                                       std::max(1, o.iterations - warm));
        adam.next();
        blocks([&](int64_t first, int64_t last) {
            step.update(first, last, grad.data(), beta, static_cast<float>(o.reg_param), adam);
        });
        if ((it + 1) % every == 0) checkpoint(it + 1);
    }
    iterations += it;
    if (!objective.holds_out()) return hard();
    if (it % every != 0) checkpoint(it);
    return best.size() > 0 ? best : hard();
}

// Fits the layer `options.fits` times from different draws and gives each
// weight the median of the values chosen (with an odd number of AdaRound fits:
// the rounding most of them chose). One fit's decisions for the weights its
// loss barely distinguishes follow the draw; the vote keeps those that the
// data decides. A summed layer's fits differ by the fold they hold out.
RowMatrix voted_fit(const Layer& l, const FastFinetuneOptions& o, std::mt19937_64& rng, int64_t& iterations) {
    auto one = [&](int number) {
        if (!l.sums) {
            SampledColumns sampled(l, o, rng);
            return fit(l, o, sampled, iterations);
        }
        SummedColumns summed(l, held_fold(l, number));
        return fit(l, o, summed, iterations);
    };
    if (o.fits <= 1) return one(0);
    std::vector<RowMatrix> fits;
    for (int k = 0; k < o.fits; ++k) fits.push_back(one(k));
    RowMatrix out(fits[0].rows(), fits[0].cols());
    std::vector<float> values(fits.size());
    for (int64_t i = 0; i < out.size(); ++i) {
        for (size_t k = 0; k < fits.size(); ++k) values[k] = fits[k].data()[i];
        std::nth_element(values.begin(), values.begin() + (values.size() - 1) / 2, values.end());
        out.data()[i] = values[(values.size() - 1) / 2];
    }
    return out;
}

// The fitted matrix in the weight's own layout.
Tensor as_weight(const Layer& l, const RowMatrix& w, const Tensor& original) {
    Tensor out = original;
    auto dst = out.mutable_data<float>();
    if (l.conv || l.storage == 1) {
        std::copy(w.data(), w.data() + w.size(), dst.begin());
    } else {
        const RowMatrix t = w.transpose();
        std::copy(t.data(), t.data() + t.size(), dst.begin());
    }
    return out;
}

}  // namespace

nlohmann::json FastFinetuneResult::to_json() const {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& l : layers) {
        nlohmann::json layer = {{"node", l.node},
                                {"weight", l.weight},
                                {"columns", l.columns},
                                {"iterations", l.iterations},
                                {"loss_nearest", l.loss_nearest},
                                {"loss", l.loss},
                                {"seconds", l.seconds}};
        if (!std::isnan(l.output_error))
            layer["selective_update"] = {{"output_error_nearest", l.output_error_nearest},
                                         {"output_error", l.output_error},
                                         {"reverted", l.reverted}};
        out.push_back(std::move(layer));
    }
    return out;
}

namespace {

// Samples up to `capacity` of the layer's output positions over the data
// (reservoir sampling: every position seen equally likely kept): its input in
// `candidate` (quantized as the plan quantizes it), with `keep_float` also the
// float model's, and the float layer's output on its input in `reference`.
// Returns the candidate's mean squared output error against the reference
// (NaN without `output_error`: then both models run only as far as the layer's
// input). A capacity of 0 only measures that error.
// `quantized_inputs`, when given, holds the candidate's value of the layer's
// input for every batch (then `candidate` is not run).
double sample_layer(Layer& l, int64_t capacity, bool keep_float, ModelRunner& reference, ModelRunner* candidate,
                    DataStream& data, std::mt19937_64& rng, bool output_error,
                    const std::vector<Tensor>* cached_float_inputs, const std::vector<Tensor>* quantized_inputs,
                    std::optional<uint64_t> summed_with_seed) {
    l.x.resize(l.rows, 0);
    l.xf.resize(keep_float ? l.rows : 0, 0);
    l.y.resize(l.outputs, 0);
    l.stored = l.seen = 0;
    l.sums.reset();
    if (summed_with_seed && capacity > 0) {
        std::vector<float> shift(l.bias.size());
        for (size_t o = 0; o < shift.size(); ++o) shift[o] = l.fitted_bias[o] - l.bias[o];
        l.sums.emplace(l.w.data(), l.outputs, l.group, l.w.cols(), std::move(shift), *summed_with_seed);
    }
    // Columns added to the sums at a time: each fold sums its share in float first.
    constexpr int64_t kSummedAtOnce = 1024;
    std::vector<std::string> taps;
    if (capacity > 0) taps.push_back(l.input);
    std::vector<int64_t> placed, slots;           // a batch's kept columns and their slots
    std::unordered_map<int64_t, size_t> redrawn;  // a slot the batch drew again: its last place in `placed`
    PendingOutputs outputs(l);
    int64_t allocated = 0;  // columns of l.x, l.xf and l.y: grown by doubling, cut to l.stored at the end
    double squared_error = 0;
    int64_t output_values = 0;
    data.rewind();
    for (size_t b = 0; auto batch = data.next(); ++b) {
        std::optional<Tensor> float_input;
        const auto take_float = [&](const std::string&, const Tensor& v) { float_input = v; };
        const auto take_quantized = [&](const std::string& name, const Tensor& value) {
            if (!float_input || value.type() != DataType::Float) return;
            const Tensor q = l.input_quant ? fake_quantize(value, l.input_quant->params, name) : value;
            const Columns qc(l, q), fc(l, *float_input);
            if (qc.count == 0 || qc.count != fc.count) return;
            if (l.sums) {
                for (int64_t first = 0; first < qc.count; first += kSummedAtOnce)
                    l.sums->add(std::min(kSummedAtOnce, qc.count - first), [&](int64_t c, float* x, float* xf) {
                        qc.fill(first + c, x);
                        fc.fill(first + c, xf);
                    });
            }
            // First the reservoir's draws, in order: which columns it keeps, in which slots.
            placed.clear();
            slots.clear();
            redrawn.clear();
            for (int64_t c = 0; c < qc.count; ++c) {
                int64_t slot = l.stored;
                if (l.stored >= capacity) {
                    if (l.sums) {  // the sums hold it
                        ++l.seen;
                        continue;
                    }
                    slot = std::uniform_int_distribution<int64_t>(0, l.seen)(rng);
                }
                ++l.seen;
                if (slot >= capacity) continue;
                if (slot == l.stored) {
                    if (l.stored == allocated) {
                        allocated = std::min(capacity, std::max<int64_t>(1024, 2 * allocated));
                        l.x.conservativeResize(Eigen::NoChange, allocated);
                        if (keep_float) l.xf.conservativeResize(Eigen::NoChange, allocated);
                        l.y.conservativeResize(Eigen::NoChange, allocated);
                    }
                    ++l.stored;
                } else {
                    redrawn[slot] = placed.size();
                }
                placed.push_back(c);
                slots.push_back(slot);
            }
            // Then their values: a slot drawn again later in the batch keeps that column's.
            outputs.add(slots, [&](size_t i, float* float_column) {
                const int64_t c = placed[i], slot = slots[i];
                fc.fill(c, float_column);
                if (const auto again = redrawn.find(slot); again != redrawn.end() && again->second > i) return;
                qc.fill(c, l.x.col(slot).data());
                if (keep_float) std::copy_n(float_column, l.rows, l.xf.col(slot).data());
            });
        };
        if (!output_error) {  // both models only as far as the layer's input
            if (cached_float_inputs && b < cached_float_inputs->size())
                float_input = (*cached_float_inputs)[b];
            else
                reference.run_taps(*batch, taps, take_float);
            if (quantized_inputs)
                take_quantized(l.input, quantized_inputs->at(b));
            else
                candidate->run_taps(*batch, taps, take_quantized);
            continue;
        }
        const auto expected = reference.run(*batch, taps, take_float);
        const auto got = candidate->run(*batch, taps, take_quantized);
        for (size_t i = 0; i < std::min(expected.size(), got.size()); ++i) {
            if (expected[i].type() != DataType::Float || got[i].type() != DataType::Float ||
                expected[i].size() != got[i].size())
                continue;
            const auto e = expected[i].data<float>(), g = got[i].data<float>();
            for (size_t j = 0; j < e.size(); ++j) squared_error += std::pow(static_cast<double>(g[j]) - e[j], 2);
            output_values += static_cast<int64_t>(e.size());
        }
    }
    outputs.flush();
    const bool use_sums = l.sums && l.seen > capacity;  // more columns than kept: the fit runs on the sums
    if (!use_sums) l.sums.reset();
    const int64_t kept = use_sums ? 0 : l.stored;
    l.x.conservativeResize(Eigen::NoChange, kept);
    if (keep_float) l.xf.conservativeResize(Eigen::NoChange, kept);
    l.y.conservativeResize(Eigen::NoChange, kept);
    if (use_sums) l.stored = l.seen;
    return output_values > 0 ? squared_error / static_cast<double>(output_values)
                             : std::numeric_limits<double>::quiet_NaN();
}

// The float model's value of each layer input over the data, from one run per
// batch, where they fit in `budget` bytes: the layers are then sampled with one
// run of the quantized model each instead of two (the float run up to each
// layer's input repeats the same prefix for every layer). One pass: when the
// values kept outgrow the budget, the inputs last in graph order are dropped
// and sampled as before.
std::map<std::string, std::vector<Tensor>> cache_float_inputs(const std::vector<Layer>& layers, ModelRunner& reference,
                                                              DataStream& data, size_t budget) {
    std::vector<std::string> kept;
    for (const auto& l : layers)
        if (std::find(kept.begin(), kept.end(), l.input) == kept.end()) kept.push_back(l.input);
    const size_t layer_inputs = kept.size();
    std::map<std::string, std::vector<Tensor>> cache;
    std::map<std::string, size_t> bytes;
    size_t total = 0, batches = 0;
    data.rewind();
    while (!kept.empty()) {
        auto batch = data.next();
        if (!batch) break;
        ++batches;
        reference.run_taps(*batch, kept, [&](const std::string& name, const Tensor& v) {
            const size_t size = static_cast<size_t>(v.size()) * element_size(v.type());
            bytes[name] += size;
            total += size;
            cache[name].push_back(v);
        });
        for (; total > budget && !kept.empty(); kept.pop_back()) {
            total -= bytes[kept.back()];
            cache.erase(kept.back());
        }
    }
    if (!kept.empty())
        log_info("fast finetune: the float inputs of {} of {} layers cached ({:.1f} MB over {} batches)", kept.size(),
                 layer_inputs, static_cast<double>(total) / (1 << 20), batches);
    return cache;
}

}  // namespace

namespace {

// The calibration batches held in memory, read by any number of streams at
// once: the trials then sample a layer side by side, each on its own pass.
class KeptBatches final : public DataStream {
  public:
    explicit KeptBatches(std::shared_ptr<const std::vector<Feeds>> batches) : batches_(std::move(batches)) {}
    std::optional<Feeds> next() override {
        return at_ < batches_->size() ? std::optional((*batches_)[at_++]) : std::nullopt;
    }
    void rewind() override { at_ = 0; }

    // Every batch of `data`, when their feeds take at most `budget` bytes; else null.
    static std::shared_ptr<const std::vector<Feeds>> read(DataStream& data, size_t budget) {
        auto batches = std::make_shared<std::vector<Feeds>>();
        size_t bytes = 0;
        data.rewind();
        while (auto batch = data.next()) {
            for (const auto& [name, value] : *batch) bytes += value.bytes().size();
            if (bytes > budget) return nullptr;
            batches->push_back(std::move(*batch));
        }
        return batches;
    }

  private:
    std::shared_ptr<const std::vector<Feeds>> batches_;
    size_t at_ = 0;
};

// One whole fit from one seed: its own draws, the weights it has chosen so far
// and the quantized values its segmented run keeps.
struct Trial {
    Trial(AlgorithmContext& context, const std::vector<Layer>& all, uint64_t seed, size_t budget,
          std::unique_ptr<DataStream> own_data)
        : seed(seed),
          own(std::move(own_data)),
          data(own ? *own : context.data()),
          rng(seed),
          layers(all),
          segments(context, data, budget) {
        result.layers.reserve(all.size());  // `pending` points into it
    }
    uint64_t seed;
    std::unique_ptr<DataStream> own;  // its own pass over the batches, when trials sample side by side
    DataStream& data;                 // that, or the context's
    std::mt19937_64 rng;
    std::vector<Layer> layers;  // each trial samples its own columns
    SegmentedRun segments;
    FastFinetuneResult result;
    FinetunedLayer* pending = nullptr;  // SelectiveUpdate: the layer fitted last, judged by the next sampling
    Tensor pending_nearest;
};

// A trial's fit of one layer, computed on a thread of its own.
struct LayerFit {
    double error = 0, loss_nearest = 0, loss = 0;
    int64_t iterations = 0;
    RowMatrix plain, fitted;
    double seconds = 0;  ///< the trial's own sampling and fit, not the other trials' beside them
};

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

std::vector<FastFinetuneResult> fast_finetune(AlgorithmContext& context, const FastFinetuneOptions& options,
                                              const std::vector<uint64_t>& seeds,
                                              const std::function<bool(const FastFinetuneResult&)>& enough) {
    const Model& float_model = context.model();
    const QuantPlan& plan = context.plan();
    DataStream& data = context.data();
    const GraphIndex index(float_model);
    std::vector<Layer> layers;
    for (const auto& n : float_model.graph().node())
        if (auto l = layer_of(n, index, plan)) layers.push_back(std::move(*l));
    if (layers.empty()) return std::vector<FastFinetuneResult>(seeds.size());

    std::set<std::string> inputs;
    for (const auto& l : layers) inputs.insert(l.input);
    const auto reference = context.runner(float_model, false, inputs);
    const bool keep_float = options.drop_ratio < 1;
    // SelectiveUpdate runs the float model to its outputs for each layer anyway.
    // The float inputs are the same for every trial: cached once.
    const auto float_inputs = options.selective_update
                                  ? std::map<std::string, std::vector<Tensor>>{}
                                  : cache_float_inputs(layers, *reference, data, options.float_cache_bytes);
    // The trials from `some` seeds in step, on the float inputs cached above.
    auto in_step = [&](const std::vector<uint64_t>& some) {
        // Without SelectiveUpdate (which runs the quantized model to its outputs),
        // each layer's quantized input comes from the nodes after the previous
        // layer's only, with the values before kept (within the float cache's budget).
        // The float inputs of the layer being sampled, where the cache could not hold
        // them: computed once for every trial, from a segmented run of the float model
        // (its nodes once in all, not the model up to each such layer: the PP-OCRv4
        // detector's last 17 layers at 640 x 640 cost 40 s that way), else by a run up
        // to the layer when the values it keeps outgrow the budget too.
        std::vector<Tensor> layer_floats;
        SegmentedRun float_segments(context, data, options.float_cache_bytes);
        // The trials sample a layer side by side, one thread each, when the data is
        // small (kKeptBatchesBytes), held in memory for each to read on a pass of
        // its own. Small inputs make small runs, which two threads share poorly: a
        // speech embedding CNN's three trials took 15.1 -> 13.5 s (the same values:
        // its kernels give the same bits on one thread as on two). Large inputs keep
        // both threads busy in one run, and side by side they only held more: the
        // PP-OCRv4 detector on 16 pages (78 MB) took as long, its peak 5.2 -> 5.7 GB.
        const bool side_by_side = some.size() > 1 && omp_get_max_threads() > 1 && !options.selective_update;
        const auto kept = side_by_side ? KeptBatches::read(data, kKeptBatchesBytes) : nullptr;
        std::vector<std::unique_ptr<Trial>> trials;
        for (const auto seed : some)
            trials.push_back(std::make_unique<Trial>(context, layers, seed, options.float_cache_bytes,
                                                     kept ? std::make_unique<KeptBatches>(kept) : nullptr));
        // Samples layer `l` of trial `t` from the quantized model with the weights
        // the trial chose so far (with `columns` false, nothing); returns that
        // model's output error, which only SelectiveUpdate reads (else NaN, and the
        // models stop at the layer).
        auto sample = [&](Trial& t, Layer& l, const Model& quantized, bool columns = true) {
            std::vector<Tensor> quantized_inputs;
            const bool segmented =
                !options.selective_update && t.segments.compute(quantized, l.input, [&](size_t b, const Tensor& v) {
                    if (quantized_inputs.size() <= b) quantized_inputs.resize(b + 1);
                    quantized_inputs[b] = v;
                });
            // Float values: the layer's input must exist, before its Q/DQ, to be tapped.
            const auto candidate = segmented ? nullptr : context.runner(quantized, true, {l.input});
            const auto column_bytes = ((keep_float ? 2 : 1) * l.rows + l.outputs) * sizeof(float);
            auto capacity =
                columns ? std::max<int64_t>(1, static_cast<int64_t>(options.memory_bytes / column_bytes)) : 0;
            // A summed layer keeps its columns while they are fewer than half its
            // inputs a group: then a step over them all costs less than one over the sums.
            const bool sums = summed(l, options, keep_float);
            if (sums && columns) capacity = std::min(capacity, (l.rows / l.group + 1) / 2);
            const auto cached = float_inputs.find(l.input);
            const auto* floats = cached != float_inputs.end() ? &cached->second
                                 : layer_floats.empty()       ? nullptr
                                                              : &layer_floats;
            return sample_layer(l, capacity, keep_float, *reference, candidate.get(), t.data, t.rng,
                                options.selective_update, floats, segmented ? &quantized_inputs : nullptr,
                                sums ? std::optional(t.seed) : std::nullopt);
        };
        // SelectiveUpdate: the layer a trial fitted last, judged by the output error
        // the next sampling measures; dropped (back to nearest rounding) if it is worse.
        auto judge_pending = [&](Trial& t, double error_now) {
            if (!t.pending) return false;
            auto& p = *std::exchange(t.pending, nullptr);
            p.output_error = error_now;
            p.reverted = !(error_now <= p.output_error_nearest);
            if (p.reverted) {
                t.result.rounded[p.weight] = std::move(t.pending_nearest);
                p.loss = p.loss_nearest;
                log_info("fast finetune: {} dropped: the model's output error went from {:.4g} to {:.4g} with it",
                         p.node, p.output_error_nearest, error_now);
            }
            return p.reverted;
        };
        // The trials' fits of a layer are independent: they run side by side, one
        // thread each (a fit's products are small; a second thread made one 12 %
        // faster on the PP-OCRv4 recognizer). All at once, even with more trials
        // than cores: the cores are then shared among them rather than the last fit
        // running alone (three on two cores: 1.5 fits' time, not 2).
        const int team = omp_get_max_threads() > 1 ? static_cast<int>(trials.size()) : 1;
        std::vector<LayerFit> fits(trials.size());
        // Calls `work(t)` for every trial, side by side (a thread each) when `together`;
        // then rethrows the first trial's failure.
        auto for_each_trial = [&](bool together, const auto& work) {
            std::vector<std::exception_ptr> failures(trials.size());
            auto guarded = [&](size_t t) {
                try {
                    work(t);
                } catch (...) {
                    failures[t] = std::current_exception();
                }
            };
            if (together) {
#pragma omp parallel for schedule(dynamic) num_threads(team)
                for (size_t t = 0; t < trials.size(); ++t) guarded(t);
            } else {
                for (size_t t = 0; t < trials.size(); ++t) guarded(t);
            }
            for (const auto& failure : failures)
                if (failure) std::rethrow_exception(failure);
        };
        // Layer by layer, in graph order: each is fitted on its input as the layers
        // before it, already fitted, now compute it, so it also makes up for what
        // their rounding still changes (fitting all on inputs from nearest rounding
        // would have each correct errors that are no longer there).
        for (size_t i = 0; i < layers.size(); ++i) {
            context.progress("layer", static_cast<int64_t>(i) + 1, static_cast<int64_t>(layers.size()));
            layer_floats.clear();
            if (!options.selective_update && !float_inputs.count(layers[i].input)) {
                const bool segmented =
                    float_segments.compute(float_model, layers[i].input, [&](size_t b, const Tensor& v) {
                        if (layer_floats.size() <= b) layer_floats.resize(b + 1);
                        layer_floats[b] = v;
                    });
                if (!segmented) {
                    layer_floats.clear();
                    if (trials.size() > 1) {
                        data.rewind();
                        while (auto batch = data.next())
                            reference->run_taps(*batch, {layers[i].input}, [&](const std::string&, const Tensor& v) {
                                layer_floats.push_back(v);
                            });
                    }
                }
            }
            // Each trial's model with the weights it chose so far, written on this
            // thread (only the context's runners are made on several at once):
            // beforehand when the trials sample side by side, else one at a time.
            std::vector<Model> quantized(trials.size());
            auto emit = [&](size_t t) { quantized[t] = context.quantized(plan, trials[t]->result.rounded); };
            if (kept)
                for (size_t t = 0; t < trials.size(); ++t) emit(t);
            std::fill(fits.begin(), fits.end(), LayerFit{});
            for_each_trial(kept != nullptr, [&](size_t t) {
                auto& trial = *trials[t];
                auto& l = trial.layers[i];
                const auto start = std::chrono::steady_clock::now();
                if (!kept) emit(t);
                fits[t].error = sample(trial, l, quantized[t]);
                if (options.selective_update && judge_pending(trial, fits[t].error)) {
                    emit(t);
                    fits[t].error = sample(trial, l, quantized[t]);
                }
                quantized[t] = Model();  // its runs are done
                fits[t].seconds = seconds_since(start);
            });
            // One trial: no enclosing region, so that the fit's own regions keep the
            // thread pool (nested in even an inactive region, each would start new threads).
            for_each_trial(team > 1, [&](size_t t) {
                const auto& l = trials[t]->layers[i];
                if (l.stored == 0) return;
                const auto start = std::chrono::steady_clock::now();
                auto& f = fits[t];
                f.plain = nearest(l);
                f.fitted = voted_fit(l, options, trials[t]->rng, f.iterations);
                f.loss_nearest = judged_loss(l, f.plain, options.fits);
                f.loss = judged_loss(l, f.fitted, options.fits);
                f.seconds += seconds_since(start);
            });
            for (size_t t = 0; t < trials.size(); ++t) {
                auto& trial = *trials[t];
                auto& l = trial.layers[i];
                if (l.stored == 0) continue;
                auto& f = fits[t];
                FinetunedLayer r{l.node, l.weight, f.loss_nearest, f.loss, l.stored, f.iterations, 0};
                // Keep nearest rounding when fitting did not help (on the held-out columns).
                const bool improved = r.loss < r.loss_nearest;
                const Tensor original = Tensor::from_proto(*index.initializer(l.weight));
                trial.result.rounded[l.weight] = as_weight(l, improved ? f.fitted : f.plain, original);
                r.loss = std::min(r.loss, r.loss_nearest);
                r.output_error_nearest = f.error;
                r.seconds = f.seconds;
                log_info("fast finetune: {} ({} columns): output error {:.4g} -> {:.4g} in {:.1f} s ({} iterations){}",
                         l.node, l.stored, r.loss_nearest, r.loss, r.seconds, r.iterations,
                         trials.size() > 1 ? fmt::format(", seed {}", trial.seed) : "");
                trial.result.layers.push_back(r);
                if (options.selective_update && improved) {
                    trial.pending = &trial.result.layers.back();
                    trial.pending_nearest = as_weight(l, f.plain, original);
                }
                l.x.resize(0, 0);  // the next layer gets the memory
                l.xf.resize(0, 0);
                l.y.resize(0, 0);
                l.sums.reset();
            }
        }
        std::vector<FastFinetuneResult> results;
        for (auto& trial : trials) {
            if (trial->pending)
                judge_pending(*trial, sample(*trial, trial->layers.back(),
                                             context.quantized(plan, trial->result.rounded), false));
            results.push_back(std::move(trial->result));
        }
        return results;
    };
    // When every layer's float input is cached, a trial run alone repeats no
    // float work: the first then runs alone, and the others only if `enough`
    // does not accept it. Otherwise they run in step, each layer's float input
    // computed once for all (the PP-OCRv4 detector: three in step 59 s, the
    // first alone and then two in step 78 s).
    const bool all_cached =
        std::all_of(layers.begin(), layers.end(), [&](const Layer& l) { return float_inputs.count(l.input) > 0; });
    if (!enough || seeds.size() < 2 || !all_cached) return in_step(seeds);
    auto results = in_step({seeds.front()});
    if (enough(results.front())) return results;
    auto rest = in_step(std::vector<uint64_t>(seeds.begin() + 1, seeds.end()));
    std::move(rest.begin(), rest.end(), std::back_inserter(results));
    return results;
}

FastFinetuneResult fast_finetune(AlgorithmContext& context, const FastFinetuneOptions& options) {
    return std::move(fast_finetune(context, options, {options.seed}).front());
}

bool agrees_better(const OutputAgreement& a, const OutputAgreement& b, std::string_view metric) {
    auto ordered = [](const OutputAgreement& e, std::string_view by) {
        if (by == "sequence") return std::tuple(e.sequence_agreement, e.top1_agreement, e.sqnr_db);
        if (by == "sqnr") return std::tuple(e.sqnr_db, 0.0, 0.0);
        return std::tuple(e.top1_agreement, e.sqnr_db, 0.0);
    };
    return ordered(a, metric) > ordered(b, metric);
}

bool nothing_to_compare(const MeasuredOutput& output, std::string_view metric) {
    return metric == "sequence" && !output.decodes_samples;
}

bool agrees_fully(const OutputAgreement& e, std::string_view metric) {
    if (metric == "sqnr") return false;
    return e.top1_agreement >= 1.0 && (metric != "sequence" || e.sequence_agreement >= 1.0);
}

}  // namespace vaiq
