#include "data/data_reader.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "sdk/text.hpp"
#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/log.hpp"
#include "vaiq/reader.hpp"

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

void DataReaders::add(std::string name, PluginInstance<Reader> reader) {
    readers_.emplace_back(std::move(name), std::move(reader));
}

DataReaders DataReaders::all_of(const PluginRegistry& registry) {
    DataReaders out;
    for (const auto* info : registry.list(PluginKind::Reader))
        out.add(info->name, registry.create<Reader>(info->name, registry.resolve_options(*info, nullptr)));
    return out;
}

std::unique_ptr<DataReader> DataReaders::open(const fs::path& path, const Model& model, const std::string& what) const {
    if (feed_inputs(model.graph()).empty())
        throw InputError(fmt::format("the model has no inputs to feed {} to", what));
    std::error_code ec;
    if (!fs::exists(path, ec)) throw InputError(fmt::format("{} {} does not exist", what, path.string()));
    int best = 0;
    std::vector<const std::pair<std::string, PluginInstance<Reader>>*> claimants;
    for (const auto& reader : readers_) {
        const int claim = reader.second->claim(path);
        if (claim > best) claimants.clear();
        if (claim > 0 && claim >= best) {
            best = claim;
            claimants.push_back(&reader);
        }
    }
    std::vector<std::string> names;
    for (const auto& [name, reader] : readers_) names.push_back(name);
    if (claimants.empty())
        throw InputError(
            fmt::format("{} {} is nothing the readers take (readers: {}; `vaiq plugins` says what "
                        "each reads)",
                        what, path.string(), names.empty() ? "none" : join(names)));
    if (claimants.size() > 1)
        throw InputError(
            fmt::format("{} {}: readers '{}' and '{}' both claim it at {}; a reader meant to replace "
                        "another claims more",
                        what, path.string(), claimants[0]->first, claimants[1]->first, best));
    log_debug("{} {}: read by reader '{}'", what, path.string(), claimants[0]->first);
    return claimants[0]->second->open(path, model, what);
}

std::unique_ptr<DataReader> open_data_reader(const fs::path& path, const Model& model, const std::string& what) {
    static const DataReaders installed = [] {
        static PluginRegistry registry;  // outlives the readers it made
        registry.load_default_paths();
        return DataReaders::all_of(registry);
    }();
    return installed.open(path, model, what);
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
