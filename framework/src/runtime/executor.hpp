// The CPU executor: runs float and quantized ONNX models node by node.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "runtime/kernel.hpp"
#include "vaiq/model.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq::runtime {

struct ExecutorOptions {
    int threads = 0;              ///< 0: every core
    bool profile = false;         ///< time every node (see Executor::profile)
    bool optimize_layout = true;  ///< run convolutions in NHWC (see runtime/layout.hpp)
    /// Compute spelled-out LayerNorms and Gelus in one kernel each (the nodes stay for taps).
    bool fuse_patterns = true;
    /// Run DequantizeLinear -> op -> QuantizeLinear groups as the integer operators
    /// ONNX Runtime fuses them into (see runtime/qdq_fusion.hpp). The op's float
    /// output then no longer exists and cannot be tapped.
    bool fuse_qdq = true;
    /// Tensors every run will tap (calibration's): the rewrites above leave them
    /// computed once instead of fusing them away and recomputing them for the tap.
    std::set<std::string> taps{};
    /// Of those, the ones whose tap takes the values in any order (a range
    /// observer's): a tensor the layout optimisation holds in NHWC reaches the
    /// tap as it is held, under its own name, instead of transposed back.
    std::set<std::string> any_order_taps{};
};

/// Options under which Executor::run_forking() can fork at (or rewrite) `forks`:
/// no fusion computes one only for taps; dequantized values stay float. With
/// `channels_last`, one the layout optimisation holds channels-last is forked
/// and rewritten there (transposed for the fork or rewrite: convolutions run
/// fastest, but a run that rewrites most tensors pays two transposes each).
inline ExecutorOptions forking_options(int threads, const std::set<std::string>& forks, bool channels_last = true) {
    return {.threads = threads, .optimize_layout = channels_last, .fuse_qdq = false, .taps = forks};
}

/// Time spent per op type over all runs, when profiling.
struct OpProfile {
    std::string op_type;
    int64_t calls = 0;
    double milliseconds = 0;
};

/// Called with each tapped tensor as soon as it is computed; the value is
/// released after the call unless a later node needs it.
using Tap = std::function<void(const std::string& tensor, const Tensor& value)>;

/// Continues a run from a fork with the forked tensor replaced by the given
/// value; returns the graph outputs.
using Resume = std::function<std::vector<Tensor>(Tensor replacement)>;
/// Called at each fork with the tensor's name, its value in the run, and a way
/// to continue from there with another value in its place.
using Fork = std::function<void(const std::string& tensor, const Tensor& value, const Resume& resume)>;
/// Called with each rewritten tensor as a step computes it (in the run and in
/// every resumed run) or as it is fed, before any step, tap or fork reads it:
/// it may assign another value of its own (a quantized model simulated on the
/// float one). Constants are never rewritten.
using Rewrite = std::function<void(const std::string& tensor, Tensor& value)>;

/// Compiles a model once (node order, kernels, when each value can be freed)
/// and runs it on any number of input batches. Memory holds the constants plus
/// the values live at one point of one run: nothing accumulates across runs.
class Executor {
  public:
    /// Throws InputError listing every node whose op, domain or opset has no kernel.
    explicit Executor(const Model& model, ExecutorOptions options = {});
    /// The executor reads the model it was given for its whole life: not a temporary.
    explicit Executor(Model&& model, ExecutorOptions options = {}) = delete;
    ~Executor();
    Executor(const Executor&) = delete;
    Executor& operator=(const Executor&) = delete;

    /// Graph inputs to feed (those without an initializer).
    const std::vector<std::string>& input_names() const { return input_names_; }
    const std::vector<std::string>& output_names() const { return output_names_; }
    /// Tensors the graph reads without defining them: a subgraph's view of its
    /// enclosing scope. run() accepts them as feeds, unchecked.
    const std::vector<std::string>& outer_names() const { return outer_names_; }

    /// Runs one batch. Feeds are checked against the declared input types and
    /// fixed dimensions. `taps` names intermediate (or input/output) tensors to
    /// stream to `tap`. Returns the graph outputs in output order.
    std::vector<Tensor> run(const std::map<std::string, Tensor>& feeds, const std::vector<std::string>& taps = {},
                            const Tap& tap = {});

    /// run() for a subgraph (a branch, a loop's body): `outer` holds its
    /// outer_names() values, in that order, borrowed from the enclosing run for
    /// this run. A constant one counts as the subgraph's own constant, so the
    /// kernels reading it keep what they prepare from it across runs.
    std::vector<Tensor> run_nested(const std::map<std::string, Tensor>& feeds, const std::vector<ScopeValue>& outer);

    /// run() for the taps alone: stops once every tapped tensor has reached `tap`
    /// (steps run in graph order, so what follows the last of them is skipped).
    void run_taps(const std::map<std::string, Tensor>& feeds, const std::vector<std::string>& taps, const Tap& tap);

    /// run() that forks just before the first step reading each of `forks`:
    /// there `fork` may resume any number of times with that tensor replaced,
    /// which runs only the steps from the fork on, reading the values the run
    /// holds at that point (what one changed tensor does to the outputs, without
    /// the steps before it). The run itself goes on unchanged after each fork.
    /// Memory holds its live values plus one resumed run's. Throws InputError
    /// for a tensor can_fork() refuses. `rewrite` sees each of `rewritten` (which
    /// must be forkable too) as it is computed, in this run and the resumed ones.
    std::vector<Tensor> run_forking(const std::map<std::string, Tensor>& feeds, const std::vector<std::string>& forks,
                                    const Fork& fork, const std::vector<std::string>& rewritten = {},
                                    const Rewrite& rewrite = {});

    /// Whether run_forking() can fork at `tensor`: an input, a constant or a
    /// step's output that a step of every run reads (or a graph output), or a
    /// tapped tensor the layout optimisation holds channels-last (the fork and a
    /// rewrite see and give it channels-first). A tensor that a rewrite computes
    /// only for taps (see ExecutorOptions::taps), or a constant only folded steps
    /// read, is not.
    bool can_fork(const std::string& tensor) const;

    /// Whether run() can tap `tensor`: the compiled graph computes it, not inside
    /// a fused operator. Rewrites may drop a tensor that no tap asked for.
    bool can_tap(const std::string& tensor) const { return value_id(tensor) >= 0 && !fused_away_.count(tensor); }

    /// Per op type, slowest first; empty unless ExecutorOptions::profile.
    std::vector<OpProfile> profile() const;

  private:
    struct Step;
    struct Values;
    struct Forks;
    /// Runs steps `first` on; `forks` (optional) says where to fork on the way.
    std::vector<Tensor> run(Values& values, const std::vector<std::string>& taps, const Tap& tap, bool want_outputs,
                            size_t first = 0, const Forks* forks = nullptr);
    /// The step before which run_forking() forks at value `id`: its first reader
    /// among the steps every run runs, else (a graph output) the step after its producer.
    std::optional<size_t> fork_step(int id) const;
    void fork_at(size_t s, Values& values, const Forks& forks);
    /// Applies run_forking()'s rewrite to value `id` as computed (channels-first).
    void rewrite_value(int id, Values& values) const;
    // The constructor's jobs, in order.
    void rewrite(const Model& original);
    void number_values();
    /// Runs the steps that read only constants once; their outputs become constants
    /// (not for lazy steps, nor a DequantizeLinear of a weight of kLargeConstantBytes in float).
    void fold_constants();
    void plan_releases();
    void find_lazy_steps();
    void find_transposed_taps(const Model& original);
    int id_of(const std::string& name);
    // A run's jobs.
    void bind_feeds(const std::map<std::string, Tensor>& feeds, Values& values) const;
    std::vector<bool> start_taps(const std::vector<std::string>& taps, const Tap& tap, const Values& values) const;
    std::vector<bool> lazy_steps_for(const std::vector<bool>& tapped) const;
    std::vector<Tensor> run_step(size_t s, Values& values, const std::vector<int>& last_reader);
    std::vector<Tensor> take_outputs(Values& values) const;
    int value_id(const std::string& name) const;
    void check_feed(const std::string& name, const Tensor& value) const;

    std::optional<Model> optimized_;  ///< the rewritten graph, when layout optimisation applied
    const Model* model_;
    ExecutorOptions options_;
    std::vector<std::string> value_names_;
    std::map<std::string, int> value_ids_;
    std::vector<Tensor> constants_;  ///< by value id; empty where not a constant
    std::vector<bool> is_constant_;
    std::vector<int> last_reader_;  ///< per value, the last step reading it when no lazy step runs
    std::vector<Step> steps_;
    std::vector<std::string> input_names_;
    std::vector<std::string> output_names_;
    std::vector<std::string> outer_names_;
    std::map<std::string, OpProfile> profile_;
    std::set<std::string> fused_away_;  ///< tensors the QDQ fusion removed
    /// Per value, for an any-order tap computed by a lazy Transpose: the value
    /// that transpose reads (tapped instead); -1 otherwise.
    std::vector<int> transposed_from_;
    /// Per value, for a tap the layout optimisation computes by an NHWC -> NCHW
    /// Transpose of its own (lazy or not): the channels-last value it transposes,
    /// at which run_forking() forks and rewrites it; -1 otherwise.
    std::vector<int> channels_last_form_;
    /// Per value, the last step that reads it among those that run (`run_lazy`
    /// says which lazy ones do); -1 for the caller's outputs and unread values.
    std::vector<int> last_readers(const std::vector<bool>& run_lazy) const;
};

}  // namespace vaiq::runtime
