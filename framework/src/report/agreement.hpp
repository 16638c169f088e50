// How a candidate's outputs agree with the float model's on a fixed set of
// batches, each output by what it means: what the algorithms' agreement() and
// agreements() measure (mixed precision's target, a ranking's cost per tensor).
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/batch_workers.hpp"
#include "data/data_reader.hpp"
#include "runtime/executor.hpp"
#include "vaiq/algorithm.hpp"
#include "vaiq/model.hpp"
#include "vaiq/quant.hpp"

namespace vaiq {

/// What an output means, read from the op that computes it; it decides how
/// agreement with the float model is counted.
struct OutputMeaning {
    enum class Kind {
        Argmax,     ///< classes along `axis` (a Softmax's, else the last): each position's argmax
        Threshold,  ///< independent probabilities (a Sigmoid: masks, multi-label, one score a row): v >= 0.5
        NonZero,    ///< a map a comparison masked (a peak map, a Cast of a boolean): v != 0
        /// values no op gives a meaning, in a map of rank >= 4 (an embedding, a
        /// feature map, a depth map): none of its axes is known to hold classes, so
        /// an element agrees when it lies within kValuesTolerance of the float
        /// output's range from the float value
        Values,
    };
    static constexpr double kValuesTolerance = 0.05;
    Kind kind = Kind::Argmax;
    int64_t axis = -1;       ///< Argmax: the classes' axis (negative: from the end)
    bool flattened = false;  ///< Argmax: the classes are every value from `axis` on (Softmax before opset 13)
    std::string source;      ///< the op that says so, e.g. "Softmax 'prob'"; empty for the default

    std::string describe() const;
};

/// The meaning of graph output `output` of `model`: a Softmax's (or LogSoftmax's)
/// axis, a Sigmoid's independent decisions, a comparison's mask; else, when its
/// `rank` as computed is 4 or more, its values; else the last axis' argmax
/// (logits: [N, C], a sequence's [N, T, C]), one score a row deciding against 0.5 or 0.
OutputMeaning output_meaning(const Model& model, const std::string& output, size_t rank = 2);

/// One output a reference measures, and what it means.
struct ReferenceOutput {
    int index = 0;  ///< in the model's outputs
    std::string name;
    OutputMeaning meaning;
};

/// The first batches of some data with the float model's outputs on each, kept
/// in memory (feeds and the measured outputs per batch: bounded by the batch
/// count), so that any number of candidate models is measured against them.
struct ReferenceBatches {
    std::vector<std::map<std::string, Tensor>> feeds;
    std::vector<std::vector<Tensor>> outputs;  ///< per batch, one per `measured` output
    std::vector<ReferenceOutput> measured;     ///< one output, or every float output (kEveryOutput)

    /// "'y'", or "every output (9: 'a', 'b', ...)".
    std::string describe_outputs() const;
    /// Each measured output's meaning, the same ones once.
    std::string describe_measures() const;
    /// Whether a measured output decodes samples (see MeasuredOutput::decodes_samples).
    bool decodes_samples() const;
};

/// Runs up to `max_batches` batches (0: all) of `data` through the float
/// model, keeping output `output_index`, or every float output for
/// kEveryOutput; `taps`/`tap` see each batch's intermediate values on the way.
ReferenceBatches reference_batches(const Model& float_model, DataReader& data, int max_batches, int output_index,
                                   int threads, const std::vector<std::string>& taps = {},
                                   const runtime::Tap& tap = {});

using OutputError = OutputAgreement;

/// A sample's rows (over the last axis, `row_length` values each) read as CTC
/// greedy decoding reads them: each row's argmax, repeats merged, class 0 (the
/// blank) dropped. A text recognizer's line is wrong when this differs, while
/// most of its rows (blanks, a character's repeats) can change without effect.
std::vector<int64_t> greedy_decode(std::span<const float> sample, int64_t row_length);

/// A candidate's outputs against the reference on its batches (see
/// OutputAgreement); of several outputs, the worst: the least agreement and
/// sequence agreement, the lowest SQNR, the largest relative L2 error, each
/// wherever it is.
OutputError measure_output(const Model& candidate, const ReferenceBatches& reference, int threads);

using VariantOutputs = AlgorithmContext::VariantOutputs;
/// Computes the outputs of several variants on one batch (see AlgorithmContext::agreements).
using VariantRun = AlgorithmContext::VariantRun;
/// measure_output() of `variants` candidates whose outputs the runs made by
/// `make_run(threads)` give, batch by batch: `split.batches` workers at a time,
/// each making its run on its own thread, their outputs counted in the batches'
/// order; with a `reference_variant`, the others against its outputs on the same
/// batch (see AlgorithmContext::agreements).
std::vector<OutputError> measure_outputs(size_t variants, const std::function<VariantRun(int threads)>& make_run,
                                         BatchThreads split, const ReferenceBatches& reference,
                                         std::optional<size_t> reference_variant = std::nullopt);

}  // namespace vaiq
