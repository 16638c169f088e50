// Calibration and evaluation data: data paths opened by the reader plugins, and
// the host's own readers (random inputs, none, the first batches of another).
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "plugin/registry.hpp"
#include "vaiq/model.hpp"
#include "vaiq/reader.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq {

/// The reader plugins a run opens data paths with, each configured with the
/// recipe's settings it declares.
class DataReaders {
  public:
    void add(std::string name, PluginInstance<Reader> reader);
    /// Every reader plugin of `registry`, with its default options.
    static DataReaders all_of(const PluginRegistry& registry);
    /// Opens `path` (a folder or file) with the reader that claims it most.
    /// `what` names the data in messages. Throws InputError when the path does
    /// not exist, when no reader or two readers claim it, or the reader refuses it.
    std::unique_ptr<DataReader> open(const std::filesystem::path& path, const Model& model,
                                     const std::string& what) const;
    /// Random inputs for `model` from the random reader (a run without data).
    std::unique_ptr<DataReader> open_random(const Model& model) const;

  private:
    std::vector<std::pair<std::string, PluginInstance<Reader>>> readers_;
};

/// Opens `path` with the installed readers (the built-in plugin folder and
/// VAIQ_PLUGIN_PATH), each with its default options.
std::unique_ptr<DataReader> open_data_reader(const std::filesystem::path& path, const Model& model,
                                             const std::string& what = "calibration data");

/// Random inputs from the installed random reader, as the documented random
/// data reader makes them. `shapes`: [] (the model's own shapes; a dynamic
/// leading dimension becomes 1), one shape, a list of shapes in input order, or
/// {input: shape}. `ranges`: null or {input: [low, high]}; without one, float
/// inputs are uniform in [0, 1) and integer and bool inputs are 0 or 1.
/// Deterministic for a given seed.
std::unique_ptr<DataReader> random_data_reader(const Model& model, const nlohmann::json& shapes,
                                               const nlohmann::json& ranges, int batches, uint64_t seed = 0);

/// A reader without a batch.
std::unique_ptr<DataReader> no_data();

/// The first `limit` batches of `all` (which must outlive it).
std::unique_ptr<DataReader> first_batches(DataReader& all, size_t limit);

}  // namespace vaiq
