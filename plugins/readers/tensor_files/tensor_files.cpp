// The tensor_files reader: samples as .npy and TensorProto .pb files (the ONNX
// test-data layout among them), one file at a time.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "vaiq/error.hpp"
#include "vaiq/reader.hpp"
#include "vaiq/text.hpp"

namespace fs = std::filesystem;

namespace {

using vaiq::Batch;
using vaiq::InputError;
using vaiq::Tensor;
using Dims = std::optional<std::vector<std::optional<int64_t>>>;

bool is_tensor_file(const fs::path& p) {
    std::error_code ec;
    return fs::is_regular_file(p, ec) && (p.extension() == ".npy" || p.extension() == ".pb");
}

// A folder's sample folders, or its tensor files, in natural order.
std::vector<fs::path> sorted_entries(const fs::path& dir, bool folders) {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(dir))
        if (folders ? e.is_directory() : is_tensor_file(e.path())) out.push_back(e.path());
    std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) {
        return vaiq::natural_less(a.filename().string(), b.filename().string());
    });
    return out;
}

// One sample: a file per input, bound to the inputs when the sample is read.
struct Item {
    std::vector<fs::path> files;
    std::string label;
};

class FileReader final : public vaiq::DataReader {
  public:
    FileReader(std::vector<Item> items, const vaiq::Model& model, std::string what)
        : items_(std::move(items)), what_(std::move(what)) {
        for (const auto* in : vaiq::feed_inputs(model.graph())) {
            inputs_.push_back(in->name());
            dims_[in->name()] = vaiq::declared_dims(*in);
        }
    }

    std::optional<Batch> next() override {
        while (chunk_ >= chunks_) {
            if (item_ >= items_.size()) return std::nullopt;
            load(items_[item_++]);
        }
        Batch batch;
        batch.source = chunks_ > 1 ? fmt::format("{} (batch {} of {})", label_, chunk_ + 1, chunks_) : label_;
        for (const auto& [name, tensor] : loaded_) batch.feeds[name] = chunks_ > 1 ? slice(tensor, chunk_) : tensor;
        ++chunk_;
        return batch;
    }

    void rewind() override {
        item_ = 0;
        chunk_ = chunks_ = 0;
        loaded_.clear();
    }

    size_t items() const override { return items_.size(); }

  private:
    // Reads every file of a sample once and binds it: by name first ("<input>.npy", or
    // a .pb named after an input or whose TensorProto names one), the rest in order.
    std::vector<std::pair<std::string, Tensor>> read_bound(const Item& item) const {
        std::vector<std::pair<std::string, Tensor>> named, unnamed;
        std::set<std::string> bound;
        auto is_input = [&](const std::string& n) {
            return std::find(inputs_.begin(), inputs_.end(), n) != inputs_.end() && !bound.count(n);
        };
        for (const auto& file : item.files) {
            std::string proto_name;
            Tensor t;
            try {
                t = vaiq::read_tensor_file(file, &proto_name);
            } catch (const InputError& e) {
                throw InputError(fmt::format("{}: {}", what_, e.what()));
            }
            std::string name = file.stem().string();
            if (!is_input(name)) name = proto_name;
            if (is_input(name)) {
                bound.insert(name);
                named.emplace_back(name, std::move(t));
            } else {
                unnamed.emplace_back(std::string(), std::move(t));
            }
        }
        size_t next = 0;
        for (const auto& input : inputs_)
            if (!bound.count(input) && next < unnamed.size())
                named.emplace_back(input, std::move(unnamed[next++].second));
        return named;
    }

    void load(const Item& item) {
        loaded_.clear();
        stacked_ = false;
        label_ = item.label;
        chunks_ = 1;
        chunk_ = 0;
        std::optional<int64_t> common;
        for (auto& [name, t] : read_bound(item)) {
            const auto& dims = dims_.at(name);
            int64_t chunks = 1;
            if (dims && !dims->empty()) {
                const auto& shape = t.shape();
                if (shape.size() + 1 == dims->size() && (!(*dims)[0] || *(*dims)[0] == 1)) {
                    // One sample without its batch dimension.
                    auto with_batch = shape;
                    with_batch.insert(with_batch.begin(), 1);
                    Tensor b(t.type(), with_batch);
                    vaiq::copy_bytes(b.mutable_bytes().data(), t.bytes().data(), t.bytes().size());
                    t = std::move(b);
                } else if (shape.size() == dims->size() && (*dims)[0] && !shape.empty() && shape[0] != *(*dims)[0] &&
                           *(*dims)[0] > 0 && shape[0] % *(*dims)[0] == 0) {
                    chunks = shape[0] / *(*dims)[0];
                } else if (shape.size() == dims->size() + 1 && shape[0] > 0) {
                    // A stack of batches (dataset size, N, C, H, W), as the original tool's .pb files hold.
                    chunks = shape[0];
                    stacked_ = true;
                }
            }
            if (common && *common != chunks)
                throw InputError(
                    fmt::format("{} {}: input '{}' holds {} batches but the sample's other "
                                "inputs hold {}",
                                what_, item.label, name, chunks, *common));
            common = chunks;
            loaded_.emplace_back(name, std::move(t));
        }
        chunks_ = common.value_or(1);
    }

    Tensor slice(const Tensor& t, size_t chunk) const {
        auto shape = t.shape();
        shape[0] /= static_cast<int64_t>(chunks_);
        if (stacked_) shape.erase(shape.begin());
        Tensor out = Tensor::uninitialized(t.type(), shape);
        const size_t bytes = out.bytes().size();
        vaiq::copy_bytes(out.mutable_bytes().data(), t.bytes().data() + chunk * bytes, bytes);
        return out;
    }

    std::vector<Item> items_;
    std::vector<std::string> inputs_;   ///< the model's feed inputs, in order
    std::string what_;                  ///< "calibration data", "evaluation data": for messages
    std::map<std::string, Dims> dims_;  // copied: the reader may outlive the model
    size_t item_ = 0;
    std::string label_;
    std::vector<std::pair<std::string, Tensor>> loaded_;
    size_t chunk_ = 0;
    size_t chunks_ = 0;
    bool stacked_ = false;  ///< the loaded tensors hold one batch per leading index
};

// One sample folder: as many tensor files as the model has inputs.
Item sample_folder(const fs::path& dir, const std::vector<std::string>& inputs, const std::string& what) {
    auto files = sorted_entries(dir, false);
    if (files.size() != inputs.size())
        throw InputError(fmt::format("{} {}: holds {} tensor files, but the model has {} inputs ({})", what,
                                     dir.string(), files.size(), inputs.size(), vaiq::join(inputs)));
    return {std::move(files), dir.string()};
}

class TensorFiles final : public vaiq::Reader {
  public:
    int claim(const fs::path& path) const override {
        std::error_code ec;
        if (!fs::is_directory(path, ec)) return is_tensor_file(path) ? 1 : 0;
        for (const auto& e : fs::directory_iterator(path, ec))
            if (e.is_directory() || is_tensor_file(e.path())) return 1;
        return 0;
    }

    std::unique_ptr<vaiq::DataReader> open(const fs::path& path, const vaiq::Model& model,
                                           const std::string& what) const override {
        std::vector<std::string> inputs;
        for (const auto* in : vaiq::feed_inputs(model.graph())) inputs.push_back(in->name());
        std::vector<Item> items;
        if (!fs::is_directory(path)) {
            if (inputs.size() != 1)
                throw InputError(
                    fmt::format("{} {} is one file, but the model has {} inputs ({}); give a folder "
                                "with one folder per sample",
                                what, path.string(), inputs.size(), vaiq::join(inputs)));
            items.push_back({{path}, path.string()});
        } else {
            const auto folders = sorted_entries(path, true);
            const auto files = sorted_entries(path, false);
            if (!folders.empty() && !files.empty())
                throw InputError(
                    fmt::format("{} {} mixes tensor files and folders; use one folder per sample or one "
                                "file per sample",
                                what, path.string()));
            for (const auto& f : folders) items.push_back(sample_folder(f, inputs, what));
            if (!files.empty() && inputs.size() != 1)
                throw InputError(
                    fmt::format("{} {} holds tensor files, but the model has {} inputs ({}); give one "
                                "folder per sample with one file per input",
                                what, path.string(), inputs.size(), vaiq::join(inputs)));
            for (const auto& f : files) items.push_back({{f}, f.string()});
        }
        return std::make_unique<FileReader>(std::move(items), model, what);
    }
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<TensorFiles>(
    "tensor_files", "0.1.0",
    "Samples as .npy or TensorProto .pb files: a file, a folder of files, or a folder of one folder per sample "
    "(the ONNX test-data layout)"))
