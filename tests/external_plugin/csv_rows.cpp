// csv_rows: a third-party reader. A folder of .csv files is a calibration set:
// each file one sample of a single-input float model, its numbers in row-major
// order filling the input's declared shape. CsvScale (an extra option) scales
// every value, as a unit conversion would.
#include <vaiq/vaiq.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;

namespace {

bool is_csv(const fs::path& p) { return p.extension() == ".csv"; }

class CsvSamples final : public vaiq::DataReader {
  public:
    CsvSamples(std::vector<fs::path> files, std::string input, std::vector<int64_t> shape, float scale)
        : files_(std::move(files)), input_(std::move(input)), shape_(std::move(shape)), scale_(scale) {}

    std::optional<vaiq::Batch> next() override {
        if (next_ >= files_.size()) return std::nullopt;
        const auto& file = files_[next_++];
        std::stringstream text;
        text << std::ifstream(file).rdbuf();
        std::string numbers = text.str();
        std::replace(numbers.begin(), numbers.end(), ',', ' ');
        std::stringstream cells(numbers);
        std::vector<float> values;
        for (float v; cells >> v;) values.push_back(v * scale_);
        vaiq::Tensor t(vaiq::DataType::Float, shape_);
        if (values.size() != static_cast<size_t>(t.size()))
            throw vaiq::InputError(file.string() + ": " + std::to_string(values.size()) + " numbers for an input of " +
                                   std::to_string(t.size()));
        std::copy(values.begin(), values.end(), t.mutable_data<float>().begin());
        return vaiq::Batch{{{input_, std::move(t)}}, file.string()};
    }
    void rewind() override { next_ = 0; }
    size_t items() const override { return files_.size(); }

  private:
    std::vector<fs::path> files_;
    std::string input_;
    std::vector<int64_t> shape_;
    float scale_;
    size_t next_ = 0;
};

class CsvRows final : public vaiq::Reader {
  public:
    void configure(const vaiq::Options& options) override {
        scale_ = static_cast<float>(options.get_float("CsvScale"));
    }
    int claim(const fs::path& path) const override {
        std::error_code ec;
        for (const auto& e : fs::directory_iterator(path, ec))
            if (is_csv(e.path())) return 1;
        return 0;
    }
    std::unique_ptr<vaiq::DataReader> open(const fs::path& path, const vaiq::Model& model,
                                           const std::string& what) const override {
        const auto inputs = vaiq::feed_inputs(model.graph());
        const auto dims = inputs.size() == 1 ? vaiq::declared_dims(*inputs[0]) : std::nullopt;
        if (!dims || std::any_of(dims->begin(), dims->end(), [](const auto& d) { return !d; }))
            throw vaiq::InputError(what + ": csv_rows feeds one input of a fixed shape");
        std::vector<int64_t> shape;
        for (const auto& d : *dims) shape.push_back(*d);
        std::vector<fs::path> files;
        for (const auto& e : fs::directory_iterator(path))
            if (is_csv(e.path())) files.push_back(e.path());
        std::sort(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) {
            return vaiq::natural_less(a.filename().string(), b.filename().string());
        });
        return std::make_unique<CsvSamples>(std::move(files), inputs[0]->name(), std::move(shape), scale_);
    }

  private:
    float scale_ = 1;
};

const vaiq_option_descriptor kOptions[] = {
    {"CsvScale", VAIQ_OPTION_FLOAT, "1.0", "Every value is multiplied by this."},
};

}  // namespace

VAIQ_PLUGINS(vaiq::describe<CsvRows>("csv_rows", "1.0.0", "A folder of .csv files, one sample each", kOptions))
