// Fast finetune (include_fast_ft, extra_options.FastFinetune): layer by layer,
// the quantized weights of Conv, Gemm and MatMul nodes are fitted so that the
// layer, fed what the quantized model feeds it, reproduces the float layer's
// output on the float model's input. Scales stay fixed; only which grid value
// each weight takes changes. AdaRound learns whether each weight rounds up or
// down (a rectified sigmoid pushed to 0 or 1 by an annealed regulariser);
// AdaQuant moves the weights themselves through their quantization
// (straight-through gradient).
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "vaiq/algorithm.hpp"

namespace vaiq {

struct FastFinetuneOptions {
    std::string algorithm = "adaround";    ///< OptimAlgorithm: adaround or adaquant
    int iterations = 1000;                 ///< NumIterations, per layer
    double learning_rate = 0.1;            ///< LearningRate (AdaQuant's documented default: 1e-5)
    int batch_columns = 256;               ///< output positions (pixels, rows) per step
    double reg_param = 0.01;               ///< RegParam: the rounding regulariser's weight
    double warm_start = 0.2;               ///< WarmStart: the fraction of steps without it
    double beta_start = 20, beta_end = 2;  ///< BetaRange, annealed linearly
    /// The sampled input columns and float outputs kept for the layer being fitted (bytes).
    size_t memory_bytes = size_t{512} << 20;
    /// The float model's inputs of the layers, kept over the data so that it runs
    /// once rather than once per layer (bytes; what does not fit is recomputed).
    size_t float_cache_bytes = size_t{1} << 30;
    /// DropRatio: the chance that a value of the layer's input in a step is the
    /// quantized model's rather than the float model's (1: always quantized).
    double drop_ratio = 1.0;
    /// SelectiveUpdate: keep a layer's fit only if the model's output moves
    /// closer to the float model's over the data.
    bool selective_update = false;
    /// Fits: fits per layer from different draws; each weight takes their median
    /// (an odd number of AdaRound fits: the rounding most chose).
    int fits = 1;
    uint64_t seed = 0;  ///< FixedSeed: the column sampling and QDrop's draws
};

struct FinetunedLayer {
    std::string node, weight;
    double loss_nearest = 0;  ///< mean squared output error with nearest rounding, on the held-out columns
    double loss = 0;          ///< the same after finetuning (the better of the two is kept)
    int64_t columns = 0;      ///< output positions it was fitted on
    int64_t iterations = 0;   ///< steps run (over all its fits): fewer where the held-out loss stopped improving
    double seconds = 0;
    /// The model's mean squared output error against the float model with this
    /// layer rounded to nearest and (SelectiveUpdate only, else NaN) as fitted,
    /// and whether the fit was dropped for it.
    double output_error_nearest = std::numeric_limits<double>::quiet_NaN();
    double output_error = std::numeric_limits<double>::quiet_NaN();
    bool reverted = false;
};

struct FastFinetuneResult {
    /// Per weight, float values exactly on its quantization grid, to write
    /// instead of the float weight (quantizing them gives the chosen integers).
    std::map<std::string, Tensor> rounded;
    std::vector<FinetunedLayer> layers;
    nlohmann::json to_json() const;
};

/// Fits the layers of context.model() that context.plan() quantizes one after
/// the other, each on its input as the layers fitted before it leave it in the
/// model context.quantized() writes (whose layer inputs are tapped before their
/// Q/DQ and quantized with the plan's parameters).
FastFinetuneResult fast_finetune(AlgorithmContext& context, const FastFinetuneOptions& options);

/// One whole fit per seed (options.seed unused), in step: each layer is sampled
/// for every trial, then the trials' fits of it run side by side, and the float
/// model's layer inputs are computed once for all. Results in the seeds' order,
/// each what fast_finetune with that seed gives. With `enough`, when the float
/// model's layer inputs are all cached (so a trial alone repeats no float work),
/// the first seed's fit runs alone, and if `enough` accepts it, it is the only
/// result.
std::vector<FastFinetuneResult> fast_finetune(AlgorithmContext& context, const FastFinetuneOptions& options,
                                              const std::vector<uint64_t>& seeds,
                                              const std::function<bool(const FastFinetuneResult&)>& enough = {});

/// Whether `a` agrees with the float model better than `b` by `metric` ("top1",
/// "sequence" or "sqnr"), the finer measures deciding its ties: a sequence
/// agreement counts samples (on 32 text lines, steps of 3 %), so trials often
/// tie on it while their rows still tell them apart.
bool agrees_better(const OutputAgreement& a, const OutputAgreement& b, std::string_view metric);

/// Whether no agreement can be better than `e` by `metric` except on SQNR:
/// every row agrees ("top1"), and every sample too ("sequence"); never for "sqnr".
bool agrees_fully(const OutputAgreement& e, std::string_view metric);

/// Whether trials compared by `metric` cannot be told apart at all: "sequence"
/// on an output that decodes no samples (a probability map, feature values).
/// Compared by rows instead, the PP-OCRv4 detector's three trials differed by
/// 0.2 % of its map's IoU and each seed alone found the same boxes (143 of 143),
/// and the speech embedding's by 0.01 % of its values, the trial kept scoring
/// 81.2 AUC against 81.9 for the first: one fit runs.
bool nothing_to_compare(const MeasuredOutput& output, std::string_view metric);

}  // namespace vaiq
