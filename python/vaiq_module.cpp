// vaiq._vaiq: the pipeline for Python. The documented API (quantize_static,
// quant_pre_process, dump_model, enums) is vaiq/__init__.py; this module only
// carries recipes, readers and arrays across.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <spdlog/spdlog.h>

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "pipeline/pipeline.hpp"
#include "pipeline/preprocess.hpp"
#include "plugin/registry.hpp"
#include "recipe/recipe.hpp"
#include "report/dump.hpp"
#include "runtime/executor.hpp"
#include "sdk/atomic_file.hpp"
#include "tune/tune.hpp"
#include "util/progress.hpp"
#include "vaiq/error.hpp"
#include "vaiq/model.hpp"

namespace py = pybind11;
namespace fs = std::filesystem;
using namespace vaiq;

namespace {

DataType type_of(const py::dtype& dtype, const std::string& what) {
    const char kind = dtype.kind();
    const auto size = dtype.itemsize();
    if (kind == 'f' && size == 4) return DataType::Float;
    if (kind == 'f' && size == 2) return DataType::Float16;
    if (kind == 'f' && size == 8) return DataType::Double;
    if (kind == 'b' && size == 1) return DataType::Bool;
    if (kind == 'i' || kind == 'u') {
        const bool s = kind == 'i';
        switch (size) {
            case 1: return s ? DataType::Int8 : DataType::UInt8;
            case 2: return s ? DataType::Int16 : DataType::UInt16;
            case 4: return s ? DataType::Int32 : DataType::UInt32;
            case 8: return s ? DataType::Int64 : DataType::UInt64;
            default: break;
        }
    }
    throw InputError(fmt::format("{}: numpy dtype {} has no ONNX tensor type vaiq reads", what,
                                 py::str(static_cast<const py::object&>(dtype)).cast<std::string>()));
}

py::dtype dtype_of(DataType type) {
    switch (type) {
        case DataType::Float: return py::dtype::of<float>();
        case DataType::Float16: return py::dtype("float16");
        case DataType::Double: return py::dtype::of<double>();
        case DataType::Bool: return py::dtype::of<bool>();
        case DataType::Int8: return py::dtype::of<int8_t>();
        case DataType::UInt8: return py::dtype::of<uint8_t>();
        case DataType::Int16: return py::dtype::of<int16_t>();
        case DataType::UInt16: return py::dtype::of<uint16_t>();
        case DataType::Int32: return py::dtype::of<int32_t>();
        case DataType::UInt32: return py::dtype::of<uint32_t>();
        case DataType::Int64: return py::dtype::of<int64_t>();
        case DataType::UInt64: return py::dtype::of<uint64_t>();
        default: throw InputError(fmt::format("an output of type {} has no numpy dtype", data_type_name(type)));
    }
}

// The one copy of an array: into the tensor the executor reads.
Tensor to_tensor(const py::handle& value, const std::string& what) {
    if (!py::isinstance<py::array>(value))
        throw InputError(fmt::format("{} is a {}, not a numpy array", what,
                                     py::str(py::type::of(value).attr("__name__")).cast<std::string>()));
    const auto array = py::array::ensure(value, py::array::c_style);
    std::vector<int64_t> shape(array.shape(), array.shape() + array.ndim());
    Tensor t = Tensor::uninitialized(type_of(array.dtype(), what), shape);
    copy_bytes(t.mutable_bytes().data(), array.data(), t.bytes().size());
    return t;
}

// The tensor handed to numpy without a copy: the array owns it.
py::array to_array(Tensor&& tensor) {
    auto* owned = new Tensor(std::move(tensor));
    py::capsule owner(owned, [](void* p) { delete static_cast<Tensor*>(p); });
    std::vector<py::ssize_t> shape(owned->shape().begin(), owned->shape().end());
    return py::array(dtype_of(owned->type()), shape, owned->mutable_bytes().data(), owner);
}

std::map<std::string, Tensor> to_feeds(const py::handle& sample, const std::string& what) {
    if (!py::isinstance<py::dict>(sample))
        throw InputError(fmt::format("{} is a {}, not a dict of input name to numpy array", what,
                                     py::str(py::type::of(sample).attr("__name__")).cast<std::string>()));
    std::map<std::string, Tensor> feeds;
    for (const auto& [key, value] : sample.cast<py::dict>()) {
        if (!py::isinstance<py::str>(key)) throw InputError(fmt::format("{}: input names must be strings", what));
        const auto name = key.cast<std::string>();
        feeds[name] = to_tensor(value, fmt::format("{}['{}']", what, name));
    }
    return feeds;
}

// A CalibrationDataReader shared by every pass of one call. With rewind() each
// pass asks the object again; without it, the first pass keeps the batches it
// read, and later passes replay them (so the object is read once).
struct PythonData {
    py::object reader;
    bool rewinds = false;
    bool exhausted = false;
    bool read_before = false;
    std::vector<Batch> kept;
    std::exception_ptr python_error;  ///< what the reader raised, re-raised when the call ends
    int calls = 0;
};

class PythonReader final : public DataReader {
  public:
    explicit PythonReader(std::shared_ptr<PythonData> data) : data_(std::move(data)) {}

    std::optional<Batch> next() override {
        if (!data_->rewinds && position_ < data_->kept.size()) return data_->kept[position_++];
        if (data_->exhausted) return std::nullopt;
        py::gil_scoped_acquire gil;
        if (data_->rewinds && data_->read_before && position_ == 0) call("rewind");
        data_->read_before = true;
        const std::string what = fmt::format("calibration_data_reader.get_next() call {}", ++data_->calls);
        py::object sample = call("get_next");
        if (sample.is_none()) {
            if (!data_->rewinds) data_->exhausted = true;
            return std::nullopt;
        }
        Batch batch{to_feeds(sample, what), what};
        ++position_;
        if (data_->rewinds) return batch;
        data_->kept.push_back(batch);
        return batch;
    }

    void rewind() override { position_ = 0; }
    size_t items() const override { return data_->exhausted ? data_->kept.size() : 0; }

  private:
    py::object call(const char* method) {
        try {
            return data_->reader.attr(method)();
        } catch (py::error_already_set& e) {
            data_->python_error = std::current_exception();
            throw InputError(fmt::format("calibration_data_reader.{}() raised {}", method, e.what()));
        }
    }

    std::shared_ptr<PythonData> data_;
    size_t position_ = 0;
};

// The reader factory the pipeline calls per pass, or none for reader = None.
struct ReaderBinding {
    std::shared_ptr<PythonData> data;
    std::function<std::unique_ptr<DataReader>(const Model&)> factory;

    explicit ReaderBinding(const py::object& reader) {
        if (reader.is_none()) return;
        if (!py::hasattr(reader, "get_next"))
            throw InputError("the calibration data reader has no get_next() method (CalibrationDataReader protocol)");
        data = std::make_shared<PythonData>();
        data->reader = reader;
        data->rewinds = py::hasattr(reader, "rewind");
        factory = [d = data](const Model&) { return std::make_unique<PythonReader>(d); };
    }
    // The reader's own exception, when it raised one, instead of the pipeline's.
    void rethrow_python_error() const {
        if (data && data->python_error) std::rethrow_exception(data->python_error);
    }
};

// Runs `work` without the GIL (readers take it back to call Python); the
// reader's own exception comes back as itself.
template <typename Work>
auto without_gil(const ReaderBinding& binding, Work&& work) {
    try {
        py::gil_scoped_release release;
        return work();
    } catch (const InputError&) {
        binding.rethrow_python_error();
        throw;
    }
}

RunOptions run_options(const ReaderBinding& binding, const std::vector<std::string>& statistics) {
    RunOptions options;
    options.progress = stderr_is_terminal();
    options.calibration_reader = binding.factory;
    options.calibration_files.assign(statistics.begin(), statistics.end());
    return options;
}

// Runs a loaded recipe with the caller's reader (or from statistics files); the report as JSON text.
std::string run_with_reader(const Recipe& recipe, const py::object& reader,
                            const std::vector<std::string>& statistics = {}) {
    ReaderBinding binding(reader);
    PluginRegistry registry;
    registry.load_default_paths();
    const RunOptions options = run_options(binding, statistics);
    return without_gil(binding, [&] { return run_pipeline(recipe, registry, options).report_json.dump(); });
}

// `vaiq calibrate`: the statistics of the recipe's data (or the caller's reader),
// or of statistics files merged, written atomically to `output`; returns the
// tensor and batch counts.
py::dict calibrate(const std::string& path, const std::vector<std::string>& assignments, const py::object& reader,
                   const std::vector<std::string>& statistics, const std::string& output) {
    ReaderBinding binding(reader);
    PluginRegistry registry;
    registry.load_default_paths();
    const RunOptions options = run_options(binding, statistics);
    const Recipe recipe = load_recipe(path, assignments);
    const auto tables = without_gil(binding, [&] {
        auto t = calibrate_pipeline(recipe, registry, options);
        write_file_atomically(output, [&](std::ostream& out) { out << t.statistics.dump() << '\n'; });
        return t;
    });
    py::dict out;
    out["tensors"] = tables.statistics["tensors"].size();
    out["batches"] = tables.statistics["batches"].get<int>();
    out["output"] = output;
    return out;
}

std::string run_document(const std::string& document, const std::string& label, const std::string& base_dir,
                         const py::object& reader) {
    return run_with_reader(load_recipe_text(document, label, base_dir), reader);
}

std::string run_recipe(const std::string& path, const std::vector<std::string>& assignments, const py::object& reader,
                       const std::vector<std::string>& statistics) {
    return run_with_reader(load_recipe(path, assignments), reader, statistics);
}

// `vaiq tune`, with the caller's metric (a callable of the model path and the
// report dict) when the target's measure is `metric`; returns the tune report.
std::string tune_recipe(const std::string& path, const std::vector<std::string>& assignments, const std::string& space,
                        const std::string& target_text, const py::object& metric, const py::object& reader) {
    ReaderBinding binding(reader);
    auto target = TuneTarget::parse(target_text);
    if (!metric.is_none()) {
        if (!PyCallable_Check(metric.ptr())) throw InputError("tune: metric is not callable");
        // `metric` outlives the search (the caller's frame holds it); called with the GIL taken back.
        target.metric = [&metric](const std::filesystem::path& model, const nlohmann::json& report) {
            py::gil_scoped_acquire gil;
            const auto as_dict = py::module_::import("json").attr("loads")(report.dump());
            return metric(model.string(), as_dict).cast<double>();
        };
    }
    const auto candidates = load_tune_space(space);
    PluginRegistry registry;
    registry.load_default_paths();
    const RunOptions options = run_options(binding, {});
    return without_gil(
        binding, [&] { return tune(path, assignments, candidates, target, registry, options).to_json(target).dump(); });
}

std::string preprocess_model(const std::string& input, const std::string& output, const py::dict& args) {
    PreprocessOptions o;
    auto get = [&](const char* name, auto& into) {
        if (args.contains(name)) into = args[name].cast<std::decay_t<decltype(into)>>();
    };
    get("skip_optimization", o.skip_optimization);
    get("skip_onnx_shape", o.skip_onnx_shape);
    get("skip_symbolic_shape", o.skip_symbolic_shape);
    get("auto_merge", o.auto_merge);
    get("int_max", o.int_max);
    get("guess_output_rank", o.guess_output_rank);
    get("verbose", o.verbose);
    get("save_as_external_data", o.save_as_external_data);
    get("all_tensors_to_one_file", o.all_tensors_to_one_file);
    get("external_data_location", o.external_data_location);
    get("external_data_size_threshold", o.external_data_size_threshold);
    get("passes", o.passes);
    PluginRegistry registry;
    registry.load_default_paths();
    py::gil_scoped_release release;
    return preprocess(input, output, o, registry).dump();
}

py::dict dump(const std::string& model, const py::object& reader, const std::string& shapes_json, bool dump_float,
              const std::string& output_dir) {
    ReaderBinding binding(reader);
    DumpOptions o;
    o.reader = binding.factory;
    o.random_input_shapes = nlohmann::json::parse(shapes_json);
    o.dump_float = dump_float;
    o.output_dir = output_dir;
    const auto r = without_gil(binding, [&] { return dump_model(model, o); });
    py::dict out;
    out["quantized_tensors"] = r.quantized;
    out["float_tensors"] = r.floats;
    return out;
}

py::list infer(const std::string& path, const py::dict& feeds_in, int threads) {
    auto feeds = to_feeds(feeds_in, "feeds");
    std::vector<Tensor> outputs;
    {
        py::gil_scoped_release release;
        const Model model = load_model(path);
        runtime::ExecutorOptions options;
        options.threads = threads;
        runtime::Executor executor(model, options);
        outputs = executor.run(feeds);
    }
    py::list out;
    for (auto& t : outputs) out.append(to_array(std::move(t)));
    return out;
}

}  // namespace

PYBIND11_MODULE(_vaiq, m) {
    m.doc() = "vaiq's pipeline, called by the vaiq package";
    install_stderr_logger();
    spdlog::set_level(spdlog::level::info);
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const InputError& e) {
            PyErr_SetString(PyExc_ValueError, e.what());
        }
    });
    m.def("run_document", &run_document, py::arg("document"), py::arg("label"), py::arg("base_dir"),
          py::arg("reader"), "Runs a recipe given as a YAML/JSON document; returns the report as JSON text");
    m.def("run_recipe", &run_recipe, py::arg("path"), py::arg("assignments"), py::arg("reader"), py::arg("statistics"),
          "Runs a recipe file with key=value assignments (from statistics files when given); returns the report as "
          "JSON text");
    m.def("calibrate", &calibrate, py::arg("path"), py::arg("assignments"), py::arg("reader"), py::arg("statistics"),
          py::arg("output"), "Writes the statistics of a recipe's calibration (or of statistics files merged)");
    m.def("tune", &tune_recipe, py::arg("path"), py::arg("assignments"), py::arg("space"), py::arg("target"),
          py::arg("metric"), py::arg("reader"));
    m.def("preprocess", &preprocess_model, py::arg("input"), py::arg("output"), py::arg("args"));
    m.def("dump", &dump, py::arg("model"), py::arg("reader"), py::arg("shapes_json"), py::arg("dump_float"),
          py::arg("output_dir"));
    m.def("infer", &infer, py::arg("model"), py::arg("feeds"), py::arg("threads"));
    m.def("set_log_level", [](const std::string& level) { spdlog::set_level(spdlog::level::from_str(level)); });
    m.def("version", [] { return std::string(VAIQ_VERSION_STRING); });
}
