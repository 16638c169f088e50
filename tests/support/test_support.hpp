// Helpers shared by vaiq's tests: tiny models built in code, temporary folders,
// and the plugin library a plugin test was given.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipeline/algorithm_context.hpp"
#include "plugin/registry.hpp"
#include "vaiq/calibrator.hpp"
#include "vaiq/format.hpp"
#include "vaiq/model.hpp"
#include "vaiq/pair_emitter.hpp"
#include "vaiq/quant.hpp"
#include "vaiq/reader.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq::test {

/// An algorithm's context for tests: `model` (which must outlive it), `plan`,
/// `data`, one thread; what the algorithm changes is recorded.
/// The model a test context's quantized() gives for a plan and weights.
using TestEmitter = std::function<Model(const QuantPlan&, const std::map<std::string, Tensor>&)>;

/// A context whose changes land in its members; quantized() calls `emit` (by
/// default it throws: no format in a test), agreement() is not offered.
struct TestAlgorithmContext {
    TestAlgorithmContext(const Model& model, DataReader& data, QuantPlan plan = {}, TestEmitter emit = {});
    QuantPlan plan;
    std::map<std::string, Tensor> fitted;
    std::map<std::string, QuantParams> parameters;
    std::optional<Model> replaced;
    std::map<std::string, Tensor> initializers;
    nlohmann::json report;
    HostAlgorithmContext context;
};

/// Arguments left after GoogleTest's own (a plugin test gets its library path first).
const std::vector<std::string>& extra_args();

/// A registry holding the plugin library this test was given.
PluginRegistry registry_with_test_plugin();

/// A registry holding the installed plugins and the library this test was given
/// (what a recipe naming this test's plugin next to the built-in ones needs).
PluginRegistry registry_with_installed_plugins();

/// x [1, rows, K] -> MatMul(w [K, N], named "w") -> y [1, rows, N].
Model matmul_model(const Tensor& w, int64_t rows = 8, int64_t opset = 13);

/// A fresh, empty folder under the system temp folder, removed at exit.
std::filesystem::path temp_dir();

/// Where scripts/install-ort.sh put the tests' npm packages (onnxruntime-node, playwright-core).
std::filesystem::path npm_modules();

/// The whole content of a file ("" when it cannot be read).
std::string slurp(const std::filesystem::path& path);

/// What a shell command printed and how it exited.
struct CommandResult {
    int exit_code = -1;
    std::string out;
    std::string err;
};
/// The message of the InputError `body` throws, or "no error".
std::string error_of(const std::function<void()>& body);

/// Every batch `reader` yields, from where it stands.
std::vector<Batch> all_batches(DataReader& reader);

/// Runs `command` through the shell with stdin closed, capturing its output.
CommandResult run_command(const std::string& command);

/// Writes an 8-bit grey (1 channel) or RGB (3) image of height x width x channels pixels as a PNG file.
void write_png(const std::filesystem::path& path, int64_t height, int64_t width, int64_t channels,
               const uint8_t* pixels);

/// Writes text to a file and returns its path.
std::filesystem::path write_text(const std::filesystem::path& path, const std::string& text);

/// Runs the pipeline on a recipe written to dir/`file` that quantizes dir/in.onnx
/// into dir/out.onnx with the settings in `yaml` (YAML lines); returns the report.
nlohmann::json run_recipe_in(const std::filesystem::path& dir, PluginRegistry& registry, const std::string& yaml,
                             const std::string& file = "r.yaml");

/// Builds small ONNX graphs in code.
class GraphBuilder {
  public:
    explicit GraphBuilder(int64_t opset = 13);
    GraphBuilder& input(const std::string& name, std::vector<int64_t> shape, DataType type = DataType::Float);
    GraphBuilder& output(const std::string& name, std::vector<int64_t> shape, DataType type = DataType::Float);
    GraphBuilder& initializer(const std::string& name, const Tensor& value);
    /// Adds a node; returns it for attributes.
    onnx::NodeProto& node(const std::string& op_type, std::vector<std::string> inputs, std::vector<std::string> outputs,
                          const std::string& name = "");
    Model build() const;

  private:
    onnx::ModelProto proto_;
};

/// A weight spec in blocks of `block_size` along axis 0 (K of a MatMul's B).
QuantSpec blocked_spec(QuantType type, bool symmetric, int64_t block_size);

/// A float tensor with the given shape, filled with start, start+step, ...
Tensor ramp(std::vector<int64_t> shape, float start = 0.0f, float step = 1.0f);

using vaiq::set_attribute;
void set_ints_attribute(onnx::NodeProto& node, const std::string& name, const std::vector<int64_t>& values);

/// The graph as text for golden files: nodes in order as
/// "op(inputs) -> outputs", then initializers as "name: type[shape]", sorted.
std::string dump_graph(const Model& model);

/// Compares `actual` with the golden file; with VAIQ_UPDATE_GOLDEN=1 in the
/// environment, rewrites the file instead. Returns "" when they agree, else
/// both texts for the failure message.
std::string compare_golden(const std::filesystem::path& golden, const std::string& actual);

/// Conv(x, w, b) -> Relu -> y on a [1, 2, 4, 4] input, 3 output channels.
Model conv_relu_model(int64_t opset = 13);

/// y = If(flag, then: Relu(x @ W), else: x @ V), x [1, 8], flag a bool scalar: the
/// branches read x, W and V from the main graph (nodes then_mm, then_relu, else_mm).
Model branching_model();

/// (h, ys) = Loop(trips, x): h <- Tanh(h @ W), ys stacks Relu(h @ W) of each
/// iteration; x [1, 8], W a main-graph weight the body reads (nodes loop_mm,
/// loop_tanh, loop_relu, loop_going). `conditional`: no trip count, the body's
/// condition ends it after as many iterations.
Model looping_model(int64_t trips, bool conditional = false);

/// looping_model with an If in the body: h @ W for the first two iterations,
/// h @ V after (nodes loop_early, loop_choose, then_mm, else_mm, loop_tanh, ...).
Model looping_branching_model(int64_t trips);

/// (s, zs) = Scan(s0, xs) over the rows of xs [steps, 8]: s <- s + x_t @ U,
/// zs stacks Relu(x_t @ U); U and s0 main-graph initializers.
Model scanning_model(int64_t steps);

/// Adds a LayerNorm over the last axis (length `width`) of `x` as exporters
/// spell it before opset 17, writing `y`: (x - mean) / sqrt(mean((x - mean)^2)
/// + 1e-5) * gamma + beta, gamma 0.5 + 0.1 i and beta 0.2 i - 0.3. Its nodes
/// and tensors are named `prefix` + ReduceMean, Sub, Pow, ReduceMean_1, Add,
/// Sqrt, Div, Mul, Add_1 (outputs + "_out").
void add_spelled_layer_norm(GraphBuilder& b, const std::string& x, const std::string& y, int64_t width,
                            const std::string& prefix = "ln/");

/// x [1, 2, 4, 4] -> Conv to 3 channels -> c * Sigmoid(c) -> y: a swish, which
/// the DPU simulations turn into c * HardSigmoid(c). The Sigmoid writes "s".
Model swish_model();

/// One tensor of a quantization plan.
TensorQuant quant_entry(std::string tensor, TensorRole role, QuantType type, std::vector<float> scale,
                        std::vector<int64_t> zero_point, int axis = -1);

/// Writes `plan` into `model` with the format plugin `format_name` of the library this test was given.
void emit_with_format(const std::string& format_name, Model& model, const QuantPlan& plan,
                      const nlohmann::json& options = nullptr);

/// One calibrator run two ways over shards of batches (each batch a flat list
/// of values): one observer seeing every batch in order, and one observer per
/// shard whose statistics, saved and then merged into a fresh observer, give
/// the result (what `vaiq calibrate` on each shard and `vaiq run --calibration`
/// do).
struct ShardedCalibration {
    CalibrationResult whole, merged;
    float extent = 0;  ///< the largest |value| of all shards
};
/// `count` batches of `size` normally distributed values (deterministic for a seed).
std::vector<std::vector<float>> normal_batches(int count, int size, float stddev, unsigned seed);

ShardedCalibration calibrate_in_shards(const std::string& calibrator, const nlohmann::json& options,
                                       const QuantSpec& spec,
                                       const std::vector<std::vector<std::vector<float>>>& shards);

}  // namespace vaiq::test
