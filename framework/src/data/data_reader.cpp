#include "data/data_reader.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "sdk/npy.hpp"
#include "sdk/text.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/log.hpp"

namespace fs = std::filesystem;

namespace vaiq {

std::unique_ptr<DataReader> no_data() {
    class None final : public DataReader {
      public:
        std::optional<Batch> next() override { return std::nullopt; }
        void rewind() override {}
        size_t items() const override { return 0; }
    };
    return std::make_unique<None>();
}

std::unique_ptr<DataReader> first_batches(DataReader& all, size_t limit) {
    class First final : public DataReader {
      public:
        First(DataReader& all, size_t limit) : all_(all), limit_(limit) {}
        std::optional<Batch> next() override { return read_++ < limit_ ? all_.next() : std::nullopt; }
        void rewind() override {
            all_.rewind();
            read_ = 0;
        }
        size_t items() const override { return std::min(limit_, all_.items()); }

      private:
        DataReader& all_;
        size_t limit_, read_ = 0;
    };
    return std::make_unique<First>(all, limit);
}

std::vector<const onnx::ValueInfoProto*> feed_inputs(const onnx::GraphProto& graph) {
    std::set<std::string> constants;
    for (const auto& init : graph.initializer()) constants.insert(init.name());
    std::vector<const onnx::ValueInfoProto*> out;
    for (const auto& in : graph.input())
        if (!constants.count(in.name())) out.push_back(&in);
    return out;
}

namespace {

// "sample_2" before "sample_10": digit runs compare as numbers.
bool natural_less(const std::string& a, const std::string& b) {
    size_t i = 0, j = 0;
    while (i < a.size() && j < b.size()) {
        if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
            size_t ie = i, je = j;
            while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
            while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
            const auto na = a.substr(i, ie - i), nb = b.substr(j, je - j);
            const auto ta = na.substr(std::min(na.find_first_not_of('0'), na.size()));
            const auto tb = nb.substr(std::min(nb.find_first_not_of('0'), nb.size()));
            if (ta.size() != tb.size()) return ta.size() < tb.size();
            if (ta != tb) return ta < tb;
            i = ie;
            j = je;
        } else {
            if (a[i] != b[j]) return a[i] < b[j];
            ++i;
            ++j;
        }
    }
    return a.size() - i < b.size() - j;
}

bool is_tensor_file(const fs::path& p) {
    return fs::is_regular_file(p) && (p.extension() == ".npy" || p.extension() == ".pb");
}

std::vector<fs::path> sorted_entries(const fs::path& dir, bool folders) {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(dir))
        if (folders ? e.is_directory() : is_tensor_file(e.path())) out.push_back(e.path());
    std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) {
        return natural_less(a.filename().string(), b.filename().string());
    });
    return out;
}

// The declared dimensions of an input: a value, or nullopt when symbolic or unknown.
using Dims = std::optional<std::vector<std::optional<int64_t>>>;
Dims declared_dims(const onnx::ValueInfoProto& input) {
    if (!input.type().has_tensor_type() || !input.type().tensor_type().has_shape()) return std::nullopt;
    std::vector<std::optional<int64_t>> dims;
    for (const auto& d : input.type().tensor_type().shape().dim())
        dims.push_back(d.has_dim_value() ? std::optional<int64_t>(d.dim_value()) : std::nullopt);
    return dims;
}

// One sample: a file per input, bound to the inputs when the sample is read.
struct Item {
    std::vector<fs::path> files;
    std::string label;
};

class FileReader final : public DataReader {
  public:
    FileReader(std::vector<Item> items, const Model& model, std::string what)
        : items_(std::move(items)), what_(std::move(what)) {
        for (const auto* in : feed_inputs(model.graph())) {
            inputs_.push_back(in->name());
            dims_[in->name()] = declared_dims(*in);
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
                t = read_tensor_file(file, &proto_name);
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
                    copy_bytes(b.mutable_bytes().data(), t.bytes().data(), t.bytes().size());
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
        copy_bytes(out.mutable_bytes().data(), t.bytes().data() + chunk * bytes, bytes);
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

// A folder of images: batches of the model's batch size (1 when it is not
// fixed), each image decoded and preprocessed when its batch is read.
class ImageReader final : public DataReader {
  public:
    ImageReader(std::vector<fs::path> files, const onnx::ValueInfoProto& input, const ImagePipeline& pipeline,
                std::string what)
        : files_(std::move(files)), input_(input.name()), pipeline_(pipeline), what_(std::move(what)) {
        const auto dims = declared_dims(input);
        if (!dims || dims->size() != 4)
            throw InputError(fmt::format("{}: images feed an input of rank 4 (NCHW or NHWC); '{}' is not", what_,
                                         input_));
        const auto& d = *dims;
        batch_ = d[0].value_or(1);
        const auto& c = pipeline_.nhwc ? d[3] : d[1];
        channels_ = c.value_or(3);
        const auto& h = pipeline_.nhwc ? d[1] : d[2];
        const auto& w = pipeline_.nhwc ? d[2] : d[3];
        if (pipeline_.size) {
            height_ = (*pipeline_.size)[0];
            width_ = (*pipeline_.size)[1];
        } else if (h && w) {
            height_ = *h;
            width_ = *w;
        } else {
            throw InputError(fmt::format("{}: input '{}' has no fixed height and width; set image_preprocess.size",
                                         what_, input_));
        }
        type_ = static_cast<DataType>(input.type().tensor_type().elem_type());
        if (static_cast<int64_t>(files_.size()) < batch_)
            throw InputError(fmt::format("{}: {} images do not fill one batch of {}", what_, files_.size(), batch_));
        if (files_.size() % static_cast<size_t>(batch_) != 0)
            log_warn("{}: the last {} images do not fill a batch of {} and are not read", what_,
                     files_.size() % static_cast<size_t>(batch_), batch_);
    }

    std::optional<Batch> next() override {
        const auto n = static_cast<size_t>(batch_);
        if (next_ + n > files_.size()) return std::nullopt;
        Tensor stacked;
        for (size_t i = 0; i < n; ++i) {
            const auto& file = files_[next_ + i];
            const auto one = image_to_input(decode_image(file), pipeline_, channels_, height_, width_, type_,
                                            fmt::format("{} {}", what_, file.string()));
            if (i == 0) {
                auto shape = one.shape();
                shape[0] = batch_;
                stacked = Tensor::uninitialized(one.type(), shape);
            }
            const size_t bytes = one.bytes().size();
            copy_bytes(stacked.mutable_bytes().data() + i * bytes, one.bytes().data(), bytes);
        }
        Batch batch;
        batch.source = n == 1 ? files_[next_].string() : fmt::format("{} (and {} more)", files_[next_].string(), n - 1);
        batch.feeds[input_] = std::move(stacked);
        next_ += n;
        return batch;
    }

    void rewind() override { next_ = 0; }
    size_t items() const override { return files_.size(); }

  private:
    std::vector<fs::path> files_;
    std::string input_;
    ImagePipeline pipeline_;
    std::string what_;
    int64_t batch_ = 1, channels_ = 3, height_ = 0, width_ = 0;
    DataType type_ = DataType::Float;
    size_t next_ = 0;
};

std::vector<fs::path> sorted_images(const fs::path& dir) {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.is_regular_file() && is_image_file(e.path())) out.push_back(e.path());
    std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) {
        return natural_less(a.filename().string(), b.filename().string());
    });
    return out;
}

// One sample folder: as many tensor files as the model has inputs.
Item sample_folder(const fs::path& dir, const std::vector<std::string>& inputs, const std::string& what) {
    auto files = sorted_entries(dir, false);
    if (files.size() != inputs.size())
        throw InputError(fmt::format("{} {}: holds {} tensor files, but the model has {} inputs ({})", what,
                                     dir.string(), files.size(), inputs.size(), join(inputs)));
    return {std::move(files), dir.string()};
}

}  // namespace

std::unique_ptr<DataReader> open_data_reader(const fs::path& path, const Model& model, const std::string& what,
                                             const ImagePipeline* images) {
    std::vector<std::string> inputs;
    for (const auto* in : feed_inputs(model.graph())) inputs.push_back(in->name());
    if (inputs.empty()) throw InputError(fmt::format("the model has no inputs to feed {} to", what));
    std::error_code ec;
    if (!fs::exists(path, ec)) throw InputError(fmt::format("{} {} does not exist", what, path.string()));
    std::vector<Item> items;
    if (fs::is_regular_file(path)) {
        if (!is_tensor_file(path))
            throw InputError(fmt::format("{} {} is not a .npy or .pb file", what, path.string()));
        if (inputs.size() != 1)
            throw InputError(
                fmt::format("{} {} is one file, but the model has {} inputs ({}); give a "
                            "folder with one folder per sample",
                            what, path.string(), inputs.size(), join(inputs)));
        items.push_back({{path}, path.string()});
    } else if (auto pictures = sorted_images(path); !pictures.empty()) {
        const auto inputs_fed = feed_inputs(model.graph());
        if (inputs_fed.size() != 1)
            throw InputError(fmt::format("{} {} holds images, which feed a model of one input; this one has {} ({})",
                                         what, path.string(), inputs.size(), join(inputs)));
        if (!sorted_entries(path, false).empty() || !sorted_entries(path, true).empty())
            throw InputError(fmt::format("{} {} mixes images with tensor files or folders", what, path.string()));
        return std::make_unique<ImageReader>(std::move(pictures), *inputs_fed[0],
                                             images ? *images : preset_image_pipeline("None"), what);
    } else {
        const auto folders = sorted_entries(path, true);
        const auto files = sorted_entries(path, false);
        if (!folders.empty() && !files.empty())
            throw InputError(
                fmt::format("{} {} mixes tensor files and folders; use one folder per "
                            "sample or one file per sample",
                            what, path.string()));
        for (const auto& f : folders) items.push_back(sample_folder(f, inputs, what));
        if (!files.empty() && inputs.size() != 1)
            throw InputError(
                fmt::format("{} {} holds tensor files, but the model has {} inputs ({}); "
                            "give one folder per sample with one file per input",
                            what, path.string(), inputs.size(), join(inputs)));
        for (const auto& f : files) items.push_back({{f}, f.string()});
    }
    if (items.empty()) throw InputError(fmt::format("{} {} holds no .npy, .pb or image (JPEG, PNG) files", what, path.string()));
    return std::make_unique<FileReader>(std::move(items), model, what);
}

namespace {

class RandomReader final : public DataReader {
  public:
    // Batches are generated up front: random data is for quick tests, and small.
    explicit RandomReader(std::vector<std::map<std::string, Tensor>> batches) : batches_(std::move(batches)) {}
    std::optional<Batch> next() override {
        if (index_ >= batches_.size()) return std::nullopt;
        Batch b{batches_[index_], fmt::format("random batch {}", index_ + 1)};
        ++index_;
        return b;
    }
    void rewind() override { index_ = 0; }
    size_t items() const override { return batches_.size(); }

  private:
    std::vector<std::map<std::string, Tensor>> batches_;
    size_t index_ = 0;
};

std::vector<int64_t> json_shape(const nlohmann::json& j) {
    std::vector<int64_t> out;
    for (const auto& d : j) out.push_back(d.get<int64_t>());
    return out;
}

template <typename T>
void fill_random(Tensor& t, std::mt19937_64& rng, double lo, double hi, bool integral) {
    auto data = t.mutable_data<T>();
    if (integral) {
        std::uniform_int_distribution<int64_t> dist(static_cast<int64_t>(std::ceil(lo)),
                                                    static_cast<int64_t>(std::floor(hi)));
        for (auto& v : data) v = static_cast<T>(dist(rng));
    } else {
        std::uniform_real_distribution<double> dist(lo, hi);
        for (auto& v : data) v = static_cast<T>(dist(rng));
    }
}

}  // namespace

namespace {

// A decoder exported as language models are (input_ids, past key/value inputs):
// its random inputs are what language-model calibration scripts build: a sequence of
// kDecoderSequence tokens with an empty past.
constexpr int64_t kDecoderSequence = 32;

bool is_past_state(const std::string& name) { return name.rfind("past", 0) == 0; }

// The vocabulary size: rows of the embedding table input_ids indexes, or nullopt.
std::optional<int64_t> vocabulary(const Model& model) {
    const GraphIndex index(model.graph());
    for (const auto& node : model.graph().node())
        if (node.op_type() == "Gather" && node.input_size() == 2 && node.input(1) == "input_ids")
            if (const auto* table = index.initializer(node.input(0)); table && table->dims_size() >= 1)
                return table->dims(0);
    return std::nullopt;
}

// Fills a decoder input: tokens over the vocabulary, a mask of ones, positions 0, 1, ...
bool fill_decoder_input(Tensor& t, const std::string& name, std::optional<int64_t> vocab, std::mt19937_64& rng) {
    if (t.type() != DataType::Int64 && t.type() != DataType::Int32) return false;
    const auto& shape = t.shape();
    const int64_t last = shape.empty() ? 1 : shape.back();
    auto set = [&](size_t i, int64_t v) {
        if (t.type() == DataType::Int64)
            t.mutable_data<int64_t>()[i] = v;
        else
            t.mutable_data<int32_t>()[i] = static_cast<int32_t>(v);
    };
    if (name == "input_ids" && vocab) {
        std::uniform_int_distribution<int64_t> token(0, *vocab - 1);
        for (size_t i = 0; i < static_cast<size_t>(t.size()); ++i) set(i, token(rng));
    } else if (name == "attention_mask") {
        for (size_t i = 0; i < static_cast<size_t>(t.size()); ++i) set(i, 1);
    } else if (name == "position_ids") {
        for (size_t i = 0; i < static_cast<size_t>(t.size()); ++i) set(i, static_cast<int64_t>(i) % last);
    } else {
        return false;
    }
    return true;
}

}  // namespace

std::unique_ptr<DataReader> random_data_reader(const Model& model, const nlohmann::json& shapes,
                                               const nlohmann::json& ranges, int batches, uint64_t seed) {
    const auto inputs = feed_inputs(model.graph());
    const bool decoder = std::any_of(inputs.begin(), inputs.end(), [](const auto* in) { return in->name() == "input_ids"; });
    const auto vocab = decoder ? vocabulary(model) : std::nullopt;
    std::vector<std::string> names;
    for (const auto* in : inputs) names.push_back(in->name());
    std::map<std::string, std::vector<int64_t>> given;
    if (shapes.is_object()) {
        for (const auto& [name, s] : shapes.items()) {
            if (std::find(names.begin(), names.end(), name) == names.end())
                throw InputError(
                    fmt::format("random_data_reader_input_shape names '{}', which is not an input of the "
                                "model (inputs: {}){}",
                                name, join(names), did_you_mean(name, names)));
            given[name] = json_shape(s);
        }
    } else if (!shapes.empty() && shapes[0].is_array()) {
        if (shapes.size() != names.size())
            throw InputError(
                fmt::format("random_data_reader_input_shape gives {} shapes, but the model has {} inputs ({})",
                            shapes.size(), names.size(), join(names)));
        for (size_t i = 0; i < names.size(); ++i) given[names[i]] = json_shape(shapes[i]);
    } else if (!shapes.empty()) {
        if (names.size() != 1)
            throw InputError(
                fmt::format("random_data_reader_input_shape gives one shape, but the model has {} inputs "
                            "({}); give a list of shapes or a map of input name to shape",
                            names.size(), join(names)));
        given[names[0]] = json_shape(shapes);
    }
    if (ranges.is_object())
        for (const auto& [name, r] : ranges.items())
            if (std::find(names.begin(), names.end(), name) == names.end())
                throw InputError(
                    fmt::format("RandomDataReaderInputDataRange names '{}', which is not an input of the "
                                "model (inputs: {}){}",
                                name, join(names), did_you_mean(name, names)));

    std::mt19937_64 rng(seed);
    std::vector<std::map<std::string, Tensor>> generated(static_cast<size_t>(std::max(batches, 0)));
    for (int b = 0; b < batches; ++b) {
        for (const auto* in : inputs) {
            std::vector<int64_t> shape;
            if (auto it = given.find(in->name()); it != given.end()) {
                shape = it->second;
            } else {
                const auto dims = declared_dims(*in);
                if (!dims)
                    throw InputError(
                        fmt::format("input '{}' has no declared shape; give it in "
                                    "random_data_reader_input_shape",
                                    in->name()));
                for (size_t d = 0; d < dims->size(); ++d) {
                    if ((*dims)[d])
                        shape.push_back(*(*dims)[d]);
                    else if (d == 0)
                        shape.push_back(1);  // the batch dimension, as documented
                    else if (decoder)
                        shape.push_back(is_past_state(in->name()) ? 0 : kDecoderSequence);
                    else
                        throw InputError(
                            fmt::format("input '{}' has a dynamic dimension {}; give its shape in "
                                        "random_data_reader_input_shape",
                                        in->name(), d));
                }
            }
            const auto type = static_cast<DataType>(in->type().tensor_type().elem_type());
            Tensor t(type, shape);
            double lo = 0, hi = 1;
            const bool ranged = ranges.is_object() && ranges.contains(in->name());
            if (ranged) {
                lo = ranges[in->name()][0].get<double>();
                hi = ranges[in->name()][1].get<double>();
            }
            if (decoder && !ranged) {
                if (is_past_state(in->name()) && t.size() == 0) {
                    generated[b][in->name()] = std::move(t);
                    continue;
                }
                if (fill_decoder_input(t, in->name(), vocab, rng)) {
                    generated[b][in->name()] = std::move(t);
                    continue;
                }
            }
            switch (type) {
                case DataType::Float: fill_random<float>(t, rng, lo, hi, false); break;
                case DataType::Float16: {
                    Tensor wide(DataType::Float, shape);
                    fill_random<float>(wide, rng, lo, hi, false);
                    auto* o = reinterpret_cast<uint16_t*>(t.mutable_bytes().data());
                    for (size_t i = 0; i < wide.data<float>().size(); ++i) o[i] = float_to_half(wide.data<float>()[i]);
                    break;
                }
                case DataType::Double: fill_random<double>(t, rng, lo, hi, false); break;
                case DataType::Int64: fill_random<int64_t>(t, rng, lo, hi, true); break;
                case DataType::Int32: fill_random<int32_t>(t, rng, lo, hi, true); break;
                case DataType::UInt8: fill_random<uint8_t>(t, rng, lo, hi, true); break;
                case DataType::Int8: fill_random<int8_t>(t, rng, lo, hi, true); break;
                case DataType::Bool:
                    for (auto& v : t.mutable_bytes()) v = static_cast<std::byte>(rng() & 1);
                    break;
                default:
                    throw InputError(fmt::format("the random data reader cannot make {} input '{}'",
                                                 data_type_name(type), in->name()));
            }
            generated[b][in->name()] = std::move(t);
        }
    }
    return std::make_unique<RandomReader>(std::move(generated));
}

}  // namespace vaiq
