// The random reader: the documented random data reader, for a run without
// calibration data. It reads no path (it claims none); the run opens it by name.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "vaiq/error.hpp"
#include "vaiq/graph.hpp"
#include "vaiq/reader.hpp"
#include "vaiq/text.hpp"

namespace vaiq {

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

std::unique_ptr<DataReader> random_batches(const Model& model, const nlohmann::json& shapes,
                                           const nlohmann::json& ranges, int batches, uint64_t seed) {
    const auto inputs = feed_inputs(model.graph());
    const bool decoder =
        std::any_of(inputs.begin(), inputs.end(), [](const auto* in) { return in->name() == "input_ids"; });
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

class Random final : public Reader {
  public:
    void configure(const Options& options) override {
        shapes_ = options.get("random_data_reader_input_shape");
        ranges_ = options.get("RandomDataReaderInputDataRange");
        batches_ = static_cast<int>(options.get_int("batches"));
        seed_ = static_cast<uint64_t>(options.get_int("seed"));
        if (batches_ < 1) throw InputError("batches must be 1 or more");
    }
    int claim(const std::filesystem::path&) const override { return 0; }
    std::unique_ptr<DataReader> open(const std::filesystem::path&, const Model& model,
                                     const std::string&) const override {
        return random_batches(model, shapes_, ranges_, batches_, seed_);
    }

  private:
    nlohmann::json shapes_, ranges_;
    int batches_ = 1;
    uint64_t seed_ = 0;
};

const vaiq_option_descriptor kOptions[] = {
    {"random_data_reader_input_shape", VAIQ_OPTION_ANY, "[]",
     "[] (the model's own shapes; a dynamic leading dimension becomes 1), one shape, a list of shapes in input "
     "order, or {input: shape}."},
    {"RandomDataReaderInputDataRange", VAIQ_OPTION_ANY, "null",
     "{input: [low, high]}; without one, float inputs are uniform in [0, 1) and integer and bool inputs are 0 or 1."},
    {"batches", VAIQ_OPTION_INT, "1", "How many batches it makes (a run without data: one)."},
    {"seed", VAIQ_OPTION_INT, "0", "The generator's seed: the same seed, the same batches."},
};

}  // namespace
}  // namespace vaiq

VAIQ_PLUGINS(vaiq::describe<vaiq::Random>("random", "0.1.0",
                                          "Random inputs of the model's shapes, for a run without data (reads no path)",
                                          vaiq::kOptions))
