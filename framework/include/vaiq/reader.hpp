// vaiq/reader.hpp - reader plugins: what turns a data folder or file into batches
// of model inputs (tensor files, images; audio or text in a plugin of your own),
// as the Python tools' CalibrationDataReader does.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "vaiq/export.hpp"
#include "vaiq/model.hpp"
#include "vaiq/plugin.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {

/// One batch of model inputs, and where it came from (for messages).
struct Batch {
    std::map<std::string, Tensor> feeds;
    std::string source;
};

/// Yields batches in order. Hold only what the current batch needs, so a
/// reader over a million samples costs what one sample costs.
class VAIQ_API DataReader {
  public:
    virtual ~DataReader();
    /// The next batch, or nullopt at the end. Throws InputError naming the file
    /// and input when a file cannot be read or does not fit the model.
    virtual std::optional<Batch> next() = 0;
    /// Starts again from the first batch.
    virtual void rewind() = 0;
    /// Number of samples (files or folders; a file may hold several batches).
    virtual size_t items() const = 0;
};

/// A reader plugin. Every loaded reader is asked how well it reads a data path;
/// the one that claims it most opens it. Its options are recipe settings it
/// declares (data_preprocess, image_preprocess.size, or an extra option).
class VAIQ_API Reader : public Plugin {
  public:
    static constexpr PluginKind kKind = PluginKind::Reader;
    using Interface = Reader;

    /// 0: this reader cannot read `path`; otherwise how specific it is to it
    /// (the built-in readers: 1 for tensor files, 2 for a folder of images).
    /// Called for a path that exists; it must not throw for one it cannot read.
    virtual int claim(const std::filesystem::path& path) const = 0;
    /// Opens `path` for `model`'s inputs. `what` ("calibration data") starts
    /// the reader's messages. Throws InputError when the data cannot feed the model.
    virtual std::unique_ptr<DataReader> open(const std::filesystem::path& path, const Model& model,
                                             const std::string& what) const = 0;
};

/// The inputs a caller must feed: graph inputs without an initializer.
VAIQ_API std::vector<const onnx::ValueInfoProto*> feed_inputs(const onnx::GraphProto& graph);

/// An input's declared dimensions, each a value or nullopt (symbolic or
/// unknown); nullopt when it declares no shape.
VAIQ_API std::optional<std::vector<std::optional<int64_t>>> declared_dims(const onnx::ValueInfoProto& input);

/// "sample_2" before "sample_10": digit runs compare as numbers.
VAIQ_API bool natural_less(std::string_view a, std::string_view b);

/// Reads a .npy file (format 1.0 to 3.0, little-endian, C order). Throws
/// InputError naming the file for anything else.
VAIQ_API Tensor read_npy(const std::filesystem::path& file);

/// Writes a .npy file (format 1.0), atomically.
VAIQ_API void write_npy(const std::filesystem::path& file, const Tensor& tensor);

/// Reads a serialized onnx TensorProto (.pb); its name goes to `name` when given.
VAIQ_API Tensor read_tensor_proto(const std::filesystem::path& file, std::string* name = nullptr);

/// By extension: .npy or .pb (whose TensorProto name goes to `name` when given).
VAIQ_API Tensor read_tensor_file(const std::filesystem::path& file, std::string* name = nullptr);

}  // namespace vaiq
