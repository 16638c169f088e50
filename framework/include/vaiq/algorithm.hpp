// vaiq/algorithm.hpp - the algorithm plugin interface: a step of the run that
// uses the calibration data and evaluations of the model to change what gets
// written (fitted weights, chosen parameters, a rewritten float model,
// corrected biases), such as GPTQ, AWQ, SmoothQuant, fast finetune or bias
// correction.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "vaiq/model.hpp"
#include "vaiq/pass.hpp"
#include "vaiq/plugin.hpp"
#include "vaiq/quant.hpp"
#include "vaiq/reader.hpp"
#include "vaiq/report.hpp"  // kTensorRankingSection
#include "vaiq/tensor.hpp"

namespace vaiq {

/// One batch of model inputs, by input name.
using Feeds = std::map<std::string, Tensor>;

/// Called with each tapped tensor of a run as soon as it is computed.
using TapFunction = std::function<void(const std::string& tensor, const Tensor& value)>;

/// The run's calibration data: read it any number of times, one batch at a time
/// (the host may replay the passes after a whole one from memory).
class VAIQ_API DataStream {
  public:
    virtual ~DataStream();
    /// The next batch, or nullopt at the end.
    virtual std::optional<Feeds> next() = 0;
    /// Starts again from the first batch.
    virtual void rewind() = 0;
};

/// Continues a run from a fork with the forked tensor replaced; returns the graph outputs.
using ResumeFunction = std::function<std::vector<Tensor>(Tensor replacement)>;
/// Called at each fork of a run with the tensor, its value there and the way to resume from there.
using ForkFunction = std::function<void(const std::string& tensor, const Tensor& value, const ResumeFunction& resume)>;
/// Called with a rewritten tensor as the run computes it (or is fed it): may assign it another value.
using RewriteFunction = std::function<void(const std::string& tensor, Tensor& value)>;

/// One model compiled once by vaiq's executor and run on any number of batches.
class VAIQ_API ModelRunner {
  public:
    virtual ~ModelRunner();
    /// The graph outputs in order; `tap` sees each of `taps` as it is computed.
    virtual std::vector<Tensor> run(const Feeds& feeds, const std::vector<std::string>& taps = {},
                                    const TapFunction& tap = {}) = 0;
    /// run() for the taps alone: stops once each of `taps` has reached `tap`
    /// (what the graph computes after the last of them is skipped).
    virtual void run_taps(const Feeds& feeds, const std::vector<std::string>& taps, const TapFunction& tap) = 0;
    /// The run, forking just before the first step that reads each of `forks`:
    /// there `fork` may resume any number of times with that tensor replaced,
    /// which runs only the steps from there on, reading what the run holds at
    /// that point (what one changed tensor does to the outputs, without the
    /// steps before it). The run itself goes on unchanged. Returns the graph
    /// outputs. Throws InputError for a tensor the runner cannot fork at (see
    /// AlgorithmContext::forking_runner). `rewrite` sees each of `rewritten`
    /// (forkable too) as this run and every resumed one computes it, before
    /// anything reads it: a quantized model simulated on the float one, each
    /// tensor quantize-dequantized where it is computed. Constants are never
    /// rewritten (quantize a weight in the model given to the runner).
    virtual std::vector<Tensor> run_forking(const Feeds& feeds, const std::vector<std::string>& forks,
                                            const ForkFunction& fork, const std::vector<std::string>& rewritten = {},
                                            const RewriteFunction& rewrite = {}) = 0;
    /// Whether run_forking() can fork at (or rewrite) `tensor`.
    virtual bool can_fork(const std::string& tensor) const = 0;
};

/// How closely a quantized model's output agrees with the float model's over
/// the calibration data.
struct OutputAgreement {
    double sqnr_db = 0;      ///< +inf when exact
    double relative_l2 = 0;  ///< ||f - q|| / ||f||
    /// By what the output means: the positions whose class (argmax over the last
    /// axis, or a Softmax's) agrees with the float model's; for one score a row,
    /// its decision against 0.5 for probabilities; for decisions (Threshold,
    /// NonZero) the share of elements that agree, or in maps (rank >= 3: masks,
    /// peak maps) the IoU of the two models' positive elements, 1 where neither
    /// has any; for feature values, the share of elements within a tolerance.
    double top1_agreement = 0;
    int64_t rows = 0;  ///< the rows, elements or union top1_agreement counts
    /// Samples (along the first axis) whose decoded output (CTC greedy decoding,
    /// class 0 the blank; a classifier's top-1) agrees with the float model's.
    double sequence_agreement = 0;
    int64_t samples = 0;  ///< the samples sequence_agreement counts
    int64_t batches = 0;  ///< the calibration batches measured
};

/// agreement() on every float output of the model at once: a
/// detector's scores, boxes and landmarks, each by what it means, the worst counting.
inline constexpr int kEveryOutput = -1;

/// Which calibration batches agreement() measures. A search measures its
/// candidates on the Searched batches and confirms its choice on the HeldOut
/// ones (every fourth batch once there are four; else none, and Searched is All).
/// Screening is a third of the Searched batches (every third of them once there
/// are six), for a first look at many candidates, the best then measured on Searched.
enum class BatchSet : uint32_t { All = 0, Searched = 1, HeldOut = 2, Screening = 3 };

/// Whether batch `b` of `batches` belongs to `set`.
inline bool in_batch_set(size_t b, size_t batches, BatchSet set) {
    const bool held = batches >= 4 && b % 4 == 3;
    switch (set) {
        case BatchSet::All: return true;
        case BatchSet::HeldOut: return held;
        case BatchSet::Searched: return !held;
        case BatchSet::Screening: {
            const size_t searched = batches - (batches >= 4 ? batches / 4 : 0);
            const size_t index = b - (batches >= 4 ? b / 4 : 0);  // among the searched
            return !held && (searched < 6 || index % 3 == 0);
        }
    }
    return false;
}

/// The batches of a BatchSet a measurement takes: all of them, or only the first `first`.
struct Batches {
    /// Implicit, so that a BatchSet stands for all its batches.
    Batches(BatchSet set = BatchSet::All, size_t first = 0) : set(set), first(first) {}
    BatchSet set;
    size_t first;  ///< 0: every batch of `set`
};

/// The output agreement() measures and how it reads it ("top-1 along the last axis").
struct MeasuredOutput {
    std::string name;
    std::string measure;
    /// Whether it decodes samples (a sequence's CTC decoding, a classifier's
    /// top-1), which OutputAgreement::sequence_agreement counts; a map or
    /// feature values decode none, and their sequence agreement is always 1.
    bool decodes_samples = false;
};

/// One tensor the drafted plan quantizes (Plan stage), before any parameter exists.
struct DraftTensor {
    std::string tensor;
    TensorRole role = TensorRole::Activation;
    QuantSpec spec;
    bool constant = false;  ///< an initializer: its parameters come from its values
    /// An activation calibration observes on its own range: it neither shares
    /// another tensor's parameters nor takes its range, and has no fixed or given range.
    bool own_range = false;
};

/// The plan as drafted (Plan stage): the tensors it quantizes, and those left
/// float on purpose so far, with why.
struct Draft {
    std::vector<DraftTensor> tensors;
    std::vector<std::pair<std::string, std::string>> kept_float;
};

/// The types tensors are raised to, or float where the target cannot run them.
struct Precision {
    QuantType activation_type = QuantType::QInt16;
    QuantType weight_type = QuantType::QInt16;
    bool keep_float = false;
};

/// What a nested run of the recipe wrote (AlgorithmContext::quantize_nested).
struct NestedQuantization {
    Model quantized;
    nlohmann::json report;
};

/// What the host gives an algorithm, and the changes it accepts. The host owns
/// it; it lives for one call of Algorithm::run(). Its calls are made from one
/// thread at a time, but for runner() and forking_runner(), which several
/// threads may call at once; each runner then runs on one thread at a time
/// (inside an OpenMP parallel region, its runs use that thread alone).
class VAIQ_API AlgorithmContext {
  public:
    virtual ~AlgorithmContext();

    /// The prepared float model, with the changes algorithms made so far.
    virtual const Model& model() const = 0;
    /// The quantization plan: every tensor's type and parameters (empty in
    /// the Prepare stage, before calibration).
    virtual const QuantPlan& plan() const = 0;
    /// The nodes the recipe quantizes (by name): the target's ops, minus exclusions.
    virtual std::set<std::string> quantized_nodes() const = 0;
    /// How the target quantizes a tensor of `role` in this run (type, symmetry,
    /// per channel, block size): what a weight will be quantized with before the plan exists.
    virtual QuantSpec default_spec(TensorRole role) const = 0;
    /// Weights fitted so far (by earlier algorithms, or this one), by initializer
    /// name, that the plan still applies to: they replace the float values when
    /// the model is written. The map holds until the next call.
    virtual const std::map<std::string, Tensor>& fitted_weights() const = 0;
    virtual DataStream& data() = 0;
    /// The threads the run may use.
    virtual int threads() const = 0;

    /// The model as the run's format writes `plan`, `weights` in place of the float ones.
    virtual Model quantized(const QuantPlan& plan, const std::map<std::string, Tensor>& weights) = 0;
    /// Compiles `model` (which must outlive the runner). With `float_values`, a
    /// quantized model runs its dequantized tensors as float, so that the
    /// values between QuantizeLinear pairs can be tapped. `taps`: tensors every
    /// run will tap, kept computed once instead of recomputed for the tap.
    virtual std::unique_ptr<ModelRunner> runner(const Model& model, bool float_values = false,
                                                const std::set<std::string>& taps = {}) = 0;
    /// Compiles `model` (which must outlive the runner) for run_forking() at
    /// `forks`: each is computed under its own name (no fusion hides it), and
    /// given to a fork or a rewrite channels-first. Weights and inputs can be
    /// forked at too, unless only constant folding reads them. `threads`: what
    /// its runs may use (0: the run's threads). `rewrites`: its runs rewrite most
    /// of `forks` (a simulation); convolutions then run channels-first, where a
    /// rewrite costs no transposes, else channels-last, where they run fastest.
    virtual std::unique_ptr<ModelRunner> forking_runner(const Model& model, const std::set<std::string>& forks,
                                                        int threads = 0, bool rewrites = false) = 0;
    /// How the outputs of `quantized` agree with the float model's (model() as
    /// it was before any bias was corrected) on output `output_index` (or, for
    /// kEveryOutput, the worst of its float outputs, each by what it means),
    /// over the calibration data. The float outputs are computed once per run.
    virtual OutputAgreement agreement(const Model& quantized, int output_index = kEveryOutput,
                                      Batches batches = {}) = 0;
    /// Gives one variant's graph outputs on the batch being measured.
    using VariantOutputs = std::function<void(size_t variant, const std::vector<Tensor>& outputs)>;
    /// One worker's way to compute the variants on a batch: `run(feeds, give)`
    /// calls `give` once per variant (any order) with that variant's graph
    /// outputs on `feeds`, such as the resumed runs of one forking run.
    using VariantRun = std::function<void(const Feeds& feeds, const VariantOutputs& give)>;
    /// agreement() of `variants` models at once, without a model for each. The
    /// batches of `batches` run on workers, several at a time where `compiled`
    /// (what each worker compiles) is small enough for the cores:
    /// `make_run(threads)` is called once on each worker's thread (a runner is
    /// made where it runs; `threads` is what it may use), and what it returns is
    /// called for each batch that worker takes. Each variant's outputs count in
    /// the batches' order: the agreements do not depend on the workers. With a
    /// `reference_variant`, the others are measured against the outputs given
    /// for it on the same batch (first, before theirs) instead of the float
    /// model's, and it against the float model's: a run's own unchanged outputs,
    /// so that differences between executors do not count. Throws InternalError
    /// for a variant given no outputs or twice on a batch, or before the reference.
    virtual std::vector<OutputAgreement> agreements(size_t variants, const Model& compiled,
                                                    const std::function<VariantRun(int threads)>& make_run,
                                                    int output_index = kEveryOutput, Batches batches = {},
                                                    std::optional<size_t> reference_variant = std::nullopt) = 0;
    /// The output agreement() measures at `output_index`.
    virtual MeasuredOutput measured_output(int output_index) = 0;
    /// Whether the run's target can run these activation and weight types.
    virtual bool target_runs(QuantType activation_type, QuantType weight_type) = 0;
    /// The plan with `tensors`, and those sharing parameters with them, at
    /// `precision`, computed from calibration as the run's own is (a
    /// Conv/ConvTranspose/Gemm whose weight is left float has its output left
    /// float too, or ONNX Runtime would quantize the weight itself). `count`
    /// gets the number of activations and weights it changes.
    virtual QuantPlan raised_plan(const std::set<std::string>& tensors, const Precision& precision,
                                  size_t* count = nullptr) = 0;
    /// Runs every batch of data() through `model` once, calling `observe` with
    /// each of `tensors` as the batch computes it.
    virtual void for_each_tapped(const Model& model, const std::vector<std::string>& tensors,
                                 const TapFunction& observe) = 0;
    /// The largest |value| per channel of float tensors of `model` over data()
    /// (its first `batches`; 0: all). In the Plan stage, empty where the run
    /// has no data to decide by before calibrating (statistics files, given
    /// parameters without data, `vaiq explain`).
    virtual ChannelRanges channel_ranges(const Model& model, const std::vector<ChannelRangeRequest>& requests,
                                         size_t batches = 0) = 0;
    /// Shows progress ("layer", 3 of 24) where the user has asked for it.
    virtual void progress(std::string_view what, int64_t done, int64_t total) = 0;

    /// Keeps `weights` (grid values of weights the plan quantizes) in place of
    /// their float values when the model is written.
    virtual void set_fitted_weights(std::map<std::string, Tensor> weights) = 0;
    /// Gives `tensor` (one the plan quantizes) these parameters instead of those
    /// its calibration gave, for the rest of the run: a weight's clipped scale.
    /// Same type, and per tensor or per channel as before; the target's
    /// constraints still apply after. Weights fitted to the old parameters are
    /// dropped. Throws InputError for a tensor the plan does not quantize.
    virtual void set_parameters(const std::string& tensor, const QuantParams& params) = 0;
    /// Keeps `tensors` at `precision` (see raised_plan) for the rest of the run;
    /// plan() is computed anew at once (Parameters stage).
    virtual void set_precision(const std::set<std::string>& tensors, const Precision& precision) = 0;
    /// Runs the algorithm plugin `name` (a Parameters one that the descriptor's
    /// may_try lists), with the recipe's options for it, on the run as it stands
    /// (Precision and Parameters stages); its changes and report stay only if
    /// `keep()`, called after it, says so. Returns what `keep()` said.
    virtual bool try_algorithm(const std::string& name, const std::function<bool()>& keep) = 0;
    /// Whether the run runs algorithm `name` in its own turn (the recipe names
    /// it, or a setting enables it): trying it too would do its work twice.
    virtual bool runs(const std::string& name) const = 0;
    /// New float values for initializers of model() (Corrections stage): a bias
    /// corrected for its weight's quantization error. The plan is computed
    /// anew from them after the algorithm; agreement() still measures against
    /// the values before. Throws InputError for a name that is no initializer
    /// or a value of another shape or type.
    virtual void set_initializers(std::map<std::string, Tensor> values) = 0;
    /// Replaces the prepared float model (Prepare stage only): a rewrite that
    /// keeps the function up to rounding, such as scales moved between an
    /// activation and the weights that read it. Its inputs must stay as they were.
    virtual void set_model(Model model) = 0;
    /// The algorithm's section of the report (under its name). A section whose
    /// "kind" is kTensorRankingSection is a ranking the host shows and advises from.
    virtual void report(nlohmann::json section) = 0;
    /// Something about `tensor` a person should know (what was done to it, or
    /// what to try): the report's notes, shown on its page.
    virtual void note(const std::string& tensor, std::string text) = 0;

    /// The plan as drafted (Plan stage).
    virtual Draft draft() const = 0;
    /// Leaves `tensor` float, with why (Plan stage; the report's plan.kept_float).
    /// What takes its parameters from it stays float too, or, with
    /// `sharers_on_own_range`, is calibrated on its own range (each Slice of a
    /// tensor left float on its own grid). A tensor the draft does not hold
    /// (any longer: one that went with a tensor left float before) is only recorded.
    virtual void keep_float(const std::string& tensor, const std::string& reason,
                            bool sharers_on_own_range = false) = 0;
    /// Quantizes weight `tensor` per channel along `axis` (Plan stage); false,
    /// changing nothing, where the run's target or the model's opset (below 13)
    /// does not allow it or the draft does not hold the weight.
    virtual bool set_per_channel(const std::string& tensor, int axis) = 0;
    /// Marks `tensor` as holding channels on scales far apart on one grid (Plan
    /// stage): a later algorithm may treat it first (mixed precision raises it first).
    virtual void mark_mixed_scales(const std::string& tensor) = 0;
    /// The tensors marked so (in the Plan stage).
    virtual std::set<std::string> mixed_scale_tensors() const = 0;
    /// An algorithm's report section so far (null where it has none): what one
    /// found that another may report or build on.
    virtual nlohmann::json reported(const std::string& algorithm) const = 0;

    /// Whether data() yields the run's data: false in the Plan stage where no
    /// data may decide the plan (see channel_ranges()), and in the Written stage
    /// for a run calibrated from statistics files only.
    virtual bool has_data() const = 0;
    /// The model as the format wrote it (Written stage), changed in place: its
    /// control flow's bodies quantized.
    virtual Model& written() = 0;
    /// A nested run of the recipe (Written stage): `model` quantized up to the
    /// written model on `data`, with the recipe's algorithms (this one among
    /// them, for control flow inside). The recipe's node lists keep the nodes
    /// `model` has, and its overrides match optionally. `shared_inputs` and
    /// `shared_outputs` (tensor -> [zero point, scale]) give the values it shares
    /// with the model around it their parameters there, where the recipe's
    /// input_/output_quantization_params give none. nullopt when
    /// nodes_to_quantize names none of its nodes; throws InputError where the
    /// run refuses the model or its data.
    virtual std::optional<NestedQuantization> quantize_nested(const Model& model, DataReader& data,
                                                              const nlohmann::json& shared_inputs,
                                                              const nlohmann::json& shared_outputs) = 0;
};

/// When in the run an algorithm works.
enum class AlgorithmStage : uint32_t {
    /// After the parameters are computed: on the plan, its weights and precisions.
    Parameters = 1,
    /// At the end of preparation, before calibration: on the float model (set_model).
    Prepare = 2,
    /// After every Parameters algorithm, on the weights and types as they will be
    /// written: corrections for what is left of their error (set_initializers).
    Corrections = 3,
    /// After the parameters are computed, before any Parameters algorithm: which
    /// precision each tensor gets (set_precision), so that weights are fitted at it.
    Precision = 4,
    /// After the plan is drafted, before calibration: which tensors stay float,
    /// which weights go per channel (draft(), keep_float(), set_per_channel()).
    Plan = 5,
    /// Once the model is written, before it is checked: on the written model
    /// (written(), quantize_nested()), such as the bodies of its
    /// If, Loop and Scan nodes quantized by nested runs.
    Written = 6,
};

/// A named step that changes what gets written, from data.
class VAIQ_API Algorithm : public Plugin {
  public:
    using Interface = Algorithm;
    static constexpr PluginKind kKind = PluginKind::Algorithm;

    virtual AlgorithmStage stage() const { return AlgorithmStage::Parameters; }
    /// Does its work through `context`; throws InputError for a model or data it cannot take.
    virtual void run(AlgorithmContext& context) = 0;
};

/// Whether token row `index` (counted from the first row an algorithm saw) is
/// held out of its fit, to judge the fit by: one row in four, chosen by a hash
/// of the index so that no pattern of positions or batches decides which (a
/// stride of 4 would hold out the same positions of every sequence).
inline bool held_out_row(uint64_t index) {
    uint64_t z = index + 0x9e3779b97f4a7c15ull;  // splitmix64's finaliser
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return ((z ^ (z >> 31)) >> 62) == 0;
}

/// For algorithms that change weights through float32 arithmetic: throws
/// InputError naming `algorithm` when the model holds a float16 initializer.
VAIQ_API void require_float32_weights(const Model& model, std::string_view algorithm);

}  // namespace vaiq
