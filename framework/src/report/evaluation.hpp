// How close the quantized model is to the float one, measured by running both
// on the same batches with vaiq's executor. Only running sums are kept.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/data_reader.hpp"
#include "vaiq/model.hpp"
#include "vaiq/spool.hpp"

namespace vaiq {

struct OutputMetrics {
    std::string name;
    int64_t elements = 0;
    double sqnr_db = 0;  ///< 10 log10(sum f^2 / sum (f - q)^2); +inf when identical
    double cosine = 0;   ///< cosine similarity of the flattened outputs
    double max_abs_error = 0;
    std::optional<double> top1_agreement;  ///< [N, C] outputs: rows whose argmax agrees
};

struct Evaluation {
    int batches = 0;
    int64_t samples = 0;  ///< rows of the first output
    std::vector<OutputMetrics> outputs;
    /// With labels: top-1 accuracy of output 0 for the float and quantized model.
    std::optional<double> float_accuracy;
    std::optional<double> quantized_accuracy;
    /// With labels and a language model's logits [N, T, V] as output 0: the
    /// perplexity, exp of the mean negative log-likelihood of the labelled tokens.
    std::optional<double> float_perplexity;
    std::optional<double> quantized_perplexity;

    nlohmann::json to_json() const;
};

/// A candidate model's outputs compared with a reference's, batch by batch;
/// only running sums are kept. Outputs that are not float (or float16) in both
/// are skipped; an [N, C] output also counts the rows whose argmax agrees.
class OutputComparison {
  public:
    explicit OutputComparison(std::vector<std::string> names);
    /// One batch: `reference[o]` and `candidate[o]` are output `names[o]` of each model.
    void add(const std::vector<Tensor>& reference, const std::vector<Tensor>& candidate, const std::string& source);
    /// Per compared output, in order.
    std::vector<OutputMetrics> metrics() const;

  private:
    struct Sums {
        double signal = 0, noise = 0, dot = 0, q2 = 0, max_abs = 0;
        int64_t elements = 0, rows = 0, agree = 0;
        bool classifier = true;
    };
    std::vector<std::string> names_;
    std::vector<Sums> sums_;
};

/// The model's output names, in the order its executor returns them.
std::vector<std::string> output_names(const Model& model);

/// The float model's outputs on each batch of the data, put aside (in memory up
/// to 256 MB, beyond in a temporary file) until the quantized model runs.
struct ReferenceOutputs {
    std::vector<std::string> names;      ///< the model's outputs
    std::vector<std::string> sources;    ///< the batches, in order
    std::vector<int64_t> batch_samples;  ///< per batch, rows of the first output
    TensorSpool outputs;                 ///< names.size() per batch, float (others as empty placeholders)
    void add(const std::string& source, std::vector<Tensor> batch_outputs);
};

/// Two models' outputs put aside on the same batches, compared (`candidate`
/// against `reference`, output by output and batch by batch).
Evaluation compare_outputs(const ReferenceOutputs& reference, const ReferenceOutputs& candidate);

/// Runs up to `max_batches` batches (0: all) of the data through the float model.
std::unique_ptr<ReferenceOutputs> reference_outputs(const Model& float_model, DataReader& data, int threads,
                                                    int max_batches = 0);

/// Compares the quantized model's outputs on the data with the float model's
/// put aside (from the first `max_batches` batches, 0: all it holds); the data
/// must give the same batches again.
Evaluation compare_outputs(const ReferenceOutputs& reference, const Model& quantized, DataReader& data,
                           const Tensor* labels, int threads, int max_batches = 0);

/// Runs up to `max_batches` batches (0: all) through the float model, then
/// through the quantized one (the float outputs wait in memory, or in a
/// temporary file beyond 256 MB), so only one model's weights are held at a time.
/// The data must give the same batches each time it is rewound. `labels`, when
/// given, holds one integer class per sample of the first output, in order (for
/// logits [N, T, V]: one token per position, N x T per batch).
Evaluation compare_outputs(const Model& float_model, const Model& quantized, DataReader& data, const Tensor* labels,
                           int threads, int max_batches = 0);

}  // namespace vaiq
