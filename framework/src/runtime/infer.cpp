#include "runtime/infer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "runtime/executor.hpp"
#include "vaiq/error.hpp"
#include "vaiq/model.hpp"
#include "vaiq/reader.hpp"
#include "vaiq/text.hpp"

namespace fs = std::filesystem;

namespace vaiq::runtime {

InferResult infer(const fs::path& model_path, const InferOptions& options) {
    if (options.repeat < 1) throw InputError("--repeat must be at least 1");
    // Running is not quantizing: any opset the kernels cover is fine here.
    const Model model = load_model(model_path, {.check_opset = false});
    Executor executor(model, {options.threads, options.profile});
    const auto& names = executor.input_names();

    std::map<std::string, Tensor> feeds;
    size_t next = 0;
    for (const auto& binding : options.inputs) {
        const auto eq = binding.find('=');
        const bool named =
            eq != std::string::npos && std::find(names.begin(), names.end(), binding.substr(0, eq)) != names.end();
        std::string name;
        if (named) {
            name = binding.substr(0, eq);
        } else {
            while (next < names.size() && feeds.count(names[next])) ++next;
            if (next >= names.size())
                throw InputError(
                    fmt::format("{} is one input too many: the model has {} ({})", binding, names.size(), join(names)));
            name = names[next];
        }
        if (feeds.count(name)) throw InputError(fmt::format("input '{}' is given twice", name));
        feeds[name] = read_tensor_file(named ? binding.substr(eq + 1) : binding);
    }

    InferResult result;
    result.output_names = executor.output_names();
    std::vector<double> times;
    for (int r = 0; r < options.repeat; ++r) {
        const auto start = std::chrono::steady_clock::now();
        result.outputs = executor.run(feeds);
        times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    result.profile = executor.profile();
    std::sort(times.begin(), times.end());
    result.min_ms = times.front();
    result.median_ms = times[times.size() / 2];
    if (!options.output_dir.empty()) {
        fs::create_directories(options.output_dir);
        for (size_t i = 0; i < result.outputs.size(); ++i)
            write_npy(options.output_dir / fmt::format("output_{}.npy", i), result.outputs[i]);
    }
    return result;
}

}  // namespace vaiq::runtime
