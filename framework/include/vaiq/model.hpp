// vaiq/model.hpp - an ONNX model in memory, and how it is read and written.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "vaiq/export.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {

/// The oldest default-domain opset vaiq quantizes.
inline constexpr int64_t kMinimumOpset = 10;

/// A loaded model. External data was validated by load_model(); small
/// external tensors were read into the model, large ones stay deferred in
/// their files until read (is_deferred, Tensor::from_proto).
class VAIQ_API Model {
  public:
    Model() = default;
    explicit Model(onnx::ModelProto proto, std::filesystem::path source = {});

    onnx::ModelProto& proto() { return proto_; }
    const onnx::ModelProto& proto() const { return proto_; }
    onnx::GraphProto& graph() { return *proto_.mutable_graph(); }
    const onnx::GraphProto& graph() const { return proto_.graph(); }
    /// The file it was loaded from; empty for models built in memory.
    const std::filesystem::path& source() const { return source_; }

    /// The imported opset version of a domain ("" or "ai.onnx" is the default
    /// domain); 0 when the domain is not imported.
    int64_t opset(std::string_view domain = "") const;

    /// Marks that passes leave on nodes for the phases after them (kFloatOnly,
    /// kDeviceRescale in vaiq/graph.hpp). They live beside the proto, keyed by
    /// the node's first output, so a pass that rewrites doc strings or
    /// attributes cannot lose them; they are copied with the model, not saved.
    void mark(const onnx::NodeProto& node, std::string_view mark);
    bool marked(const onnx::NodeProto& node, std::string_view mark) const;
    /// Takes over `other`'s marks (a model rebuilt from another one's proto).
    void copy_marks(const Model& other) { marks_ = other.marks_; }

  private:
    onnx::ModelProto proto_;
    std::filesystem::path source_;
    std::map<std::string, std::set<std::string, std::less<>>, std::less<>> marks_;
};

struct LoadOptions {
    /// Refuse default-domain opsets below kMinimumOpset (with advice).
    bool check_opset = true;
    /// External tensors of at least this many bytes stay in their files until
    /// read, so that a model's weights are read one at a time (0: read all now).
    size_t defer_external_bytes = size_t{1} << 20;
};

/// Reads a model and its external data. Throws InputError for a missing,
/// truncated or corrupt file, external data that escapes the model's folder or
/// does not match its tensor's declared size, and (by default) opset < 10.
VAIQ_API Model load_model(const std::filesystem::path& path, const LoadOptions& options = {});

struct SaveOptions {
    /// Store tensors as external data in a file beside the model
    /// (use_external_data_format). Required for models over 2 GB.
    bool use_external_data_format = false;
    /// Tensors smaller than this stay inline when writing external data.
    size_t external_data_size_threshold = 1024;
    /// All external tensors in one file (external_data_file), else one file
    /// per tensor, named after it.
    bool all_tensors_to_one_file = true;
    /// That one file's name; empty: "<model file name>.data".
    std::string external_data_file;
    /// The folder for the data files, relative to the model's folder and
    /// inside it ("" or "./": beside the model).
    std::string external_data_location;
    /// Run the ONNX checker before writing.
    bool check = true;
};

/// Writes a model atomically: to a temporary file in the destination folder,
/// then renamed over the destination. Refuses to write over `protected_input`
/// (the model that was read) and over the model's own source file.
VAIQ_API void save_model(const Model& model, const std::filesystem::path& path, const SaveOptions& options = {},
                         const std::filesystem::path& protected_input = {});

/// Runs the ONNX checker (full check, with strict shape inference off).
/// Throws InputError naming the first problem.
VAIQ_API void check_model(const Model& model);

/// Tensor shapes from ONNX shape inference (graph inputs, initializers, value
/// infos, outputs and what inference adds): a dimension it cannot tell is -1;
/// tensors of unknown rank are absent. Never throws for a model it cannot infer:
/// it returns what it knows.
VAIQ_API std::map<std::string, std::vector<int64_t>> infer_shapes(const Model& model);

/// Element types ONNX shape inference gives the model's tensors (inputs,
/// initializers, intermediates, outputs); absent where it cannot tell.
VAIQ_API std::map<std::string, DataType> infer_types(const Model& model);

struct ShapeInferenceOptions {
    /// Symbolic: propagate computed shape values (Shape -> Gather -> Concat ->
    /// Reshape and the like), so dimensions like `batch` and `sequence` reach
    /// every tensor, and give unknown dimensions fresh symbols.
    bool symbolic = false;
    /// A conflict between a declared and an inferred dimension is an error
    /// unless this is set; then the declared one is kept.
    bool auto_merge = true;
    /// For ops ONNX has no schema for (custom domains), assume output 0 has
    /// input 0's type and shape (elementwise contrib ops always do).
    bool guess_output_rank = false;
};

/// Runs shape inference and stores what it finds as value_info (the model's
/// own declarations stay). Returns how many tensors gained one. Throws
/// InputError for a conflict when auto_merge is off.
VAIQ_API int store_inferred_shapes(Model& model, const ShapeInferenceOptions& options = {});

/// Runs the model on `feeds` (graph inputs by name) with vaiq's CPU executor on
/// one thread; returns the graph outputs in order. For passes that evaluate
/// constant subgraphs. The executor is the host's (libvaiq_runtime registers
/// itself when loaded), so plugins link the SDK alone. Throws InputError for an
/// op the executor does not run.
VAIQ_API std::vector<Tensor> evaluate(const Model& model, const std::map<std::string, Tensor>& feeds = {});

/// Converts the default-domain opset with ONNX's version converter. Its
/// adapters into opsets 12 and 13 (Softmax, ...) need ranks that exporters
/// rarely declare: when the plain conversion fails and `declare_shapes` is
/// given, it declares shapes in a copy (e.g. symbolic shape inference) and the
/// conversion is retried; the value_info it added is dropped from the result.
VAIQ_API Model convert_opset(const Model& model, int64_t target_opset,
                             const std::function<void(Model&)>& declare_shapes = {});

}  // namespace vaiq
