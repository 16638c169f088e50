// `vaiq infer`: run a model on inputs from files, time it, write the outputs.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "runtime/executor.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq::runtime {

struct InferOptions {
    /// "NAME=FILE" binds an input by name; a bare "FILE" binds the next input in order.
    std::vector<std::string> inputs;
    /// Where output i is written as output_<i>.npy; empty: not written.
    std::filesystem::path output_dir;
    int repeat = 1;
    int threads = 0;
    bool profile = false;
};

struct InferResult {
    std::vector<std::string> output_names;
    std::vector<Tensor> outputs;
    double min_ms = 0;
    double median_ms = 0;
    std::vector<OpProfile> profile;  ///< with InferOptions::profile
};

InferResult infer(const std::filesystem::path& model, const InferOptions& options);

}  // namespace vaiq::runtime
