// Calibration and evaluation data: batches of model inputs read from files, one
// batch at a time, or generated at random.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/images.hpp"
#include "vaiq/model.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {

/// One batch of model inputs, and where it came from (for messages).
struct Batch {
    std::map<std::string, Tensor> feeds;
    std::string source;
};

/// Yields batches in order. Only the current file is held in memory, so a
/// reader over a million samples costs what one sample costs.
class DataReader {
  public:
    virtual ~DataReader() = default;
    /// The next batch, or nullopt at the end. Throws InputError naming the file
    /// and input when a file cannot be read or does not fit the model.
    virtual std::optional<Batch> next() = 0;
    /// Starts again from the first batch.
    virtual void rewind() = 0;
    /// Number of sample files or folders (a file may hold several batches).
    virtual size_t items() const = 0;
};

/// Reads `path`, one of:
///  - a folder of `test_data_set_*` folders (the ONNX test-data layout): each
///    holds one sample as `input_<i>.pb`, bound by the tensor's name when it
///    names an input, else by index;
///  - a folder of folders: each holds one sample, one .npy/.pb file per input,
///    named after the input (`<input>.npy`) or bound in sorted order;
///  - a folder of .npy/.pb files, one sample each (single-input models);
///  - a folder of JPEG/PNG images (single-input models of rank 4), decoded one
///    at a time and turned into inputs by `images` (default: the "None" preset);
///  - a single .npy/.pb file (single-input models).
/// A file whose leading dimension is a multiple of the model's fixed batch
/// dimension is split into batches of that size; a file that lacks the batch
/// dimension gets one; a file with one dimension more than the input holds a
/// stack of batches along its first.
/// `what` names the data in messages.
std::unique_ptr<DataReader> open_data_reader(const std::filesystem::path& path, const Model& model,
                                             const std::string& what = "calibration data",
                                             const ImagePipeline* images = nullptr);

/// Random inputs, as the documented random data reader makes them. `shapes`:
/// [] (the model's own shapes; a dynamic leading dimension becomes 1), one
/// shape, a list of shapes in input order, or {input: shape}. `ranges`: null or
/// {input: [low, high]}; without one, float inputs are uniform in [0, 1) and
/// integer and bool inputs are 0 or 1. Deterministic for a given seed.
std::unique_ptr<DataReader> random_data_reader(const Model& model, const nlohmann::json& shapes,
                                               const nlohmann::json& ranges, int batches, uint64_t seed = 0);

/// A reader without a batch.
std::unique_ptr<DataReader> no_data();

/// The first `limit` batches of `all` (which must outlive it).
std::unique_ptr<DataReader> first_batches(DataReader& all, size_t limit);

/// The inputs a caller must feed: graph inputs without an initializer.
std::vector<const onnx::ValueInfoProto*> feed_inputs(const onnx::GraphProto& graph);

}  // namespace vaiq
