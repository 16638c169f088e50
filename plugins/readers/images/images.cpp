// The images reader: a folder of JPEG and PNG files, decoded one batch at a
// time and turned into inputs by the data_preprocess preset and the
// image_preprocess keys set in its place.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "pixels.hpp"
#include "vaiq/error.hpp"
#include "vaiq/log.hpp"
#include "vaiq/reader.hpp"

namespace fs = std::filesystem;

namespace vaiq {
namespace {

// A folder of images: batches of the model's batch size (1 when it is not
// fixed), each image decoded and preprocessed when its batch is read.
class ImageReader final : public DataReader {
  public:
    ImageReader(std::vector<fs::path> files, const onnx::ValueInfoProto& input, const ImagePipeline& pipeline,
                std::string what)
        : files_(std::move(files)), input_(input.name()), pipeline_(pipeline), what_(std::move(what)) {
        const auto dims = declared_dims(input);
        if (!dims || dims->size() != 4)
            throw InputError(
                fmt::format("{}: images feed an input of rank 4 (NCHW or NHWC); '{}' is not", what_, input_));
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
            throw InputError(
                fmt::format("{}: input '{}' has no fixed height and width; set image_preprocess.size", what_, input_));
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

// The pipeline the options ask for: the preset, with each image_preprocess key set in its place.
ImagePipeline configured_pipeline(const Options& options) {
    auto p = preset_image_pipeline(options.get_string("data_preprocess"));
    const auto& size = options.get("image_preprocess.size");
    if (!size.is_null()) {
        constexpr double kLargestSide = 1 << 16;
        auto side = [](const nlohmann::json& x) {
            const double d = x.get<double>();
            return d >= 1 && d <= kLargestSide && d == std::floor(d);
        };
        if (!size.is_array() || size.size() != 2 || !side(size[0]) || !side(size[1]))
            throw InputError("image_preprocess.size must be [height, width], two integers from 1 to 65536");
        p.size = std::array<int64_t, 2>{size[0].get<int64_t>(), size[1].get<int64_t>()};
    }
    auto choice = [&](const char* key, std::initializer_list<const char*> choices) -> std::string {
        const auto v = options.get_string(key);
        if (v.empty() || std::any_of(choices.begin(), choices.end(), [&](const char* c) { return v == c; })) return v;
        throw InputError(fmt::format("{} '{}' is not valid (valid: {})", key, v, fmt::join(choices, ", ")));
    };
    if (const auto v = choice("image_preprocess.resize", {"stretch", "keep_aspect"}); !v.empty())
        p.resize = v == "keep_aspect" ? ImagePipeline::Resize::KeepAspect : ImagePipeline::Resize::Stretch;
    if (const auto& v = options.get("image_preprocess.crop_fraction"); !v.is_null()) {
        p.crop_fraction = v.get<double>();
        if (!(p.crop_fraction > 0 && p.crop_fraction <= 1))
            throw InputError("image_preprocess.crop_fraction must be in (0, 1]");
    }
    if (const auto v = choice("image_preprocess.interpolation", {"bilinear", "area"}); !v.empty())
        p.interpolation = v == "area" ? ImagePipeline::Interpolation::Area : ImagePipeline::Interpolation::Bilinear;
    for (const char* key : {"image_preprocess.mean", "image_preprocess.std"}) {
        const auto& v = options.get(key);
        if (v.is_null()) continue;
        const auto values = v.is_array() ? v.get<std::vector<float>>() : std::vector<float>{v.get<float>()};
        if (values.size() != 1 && values.size() != 3)
            throw InputError(fmt::format("{} takes one value or one per channel", key));
        (std::string(key) == "image_preprocess.mean" ? p.mean : p.std) = values;
    }
    for (float s : p.std)
        if (!(s > 0)) throw InputError("image_preprocess.std values must be positive");
    p.bgr = choice("image_preprocess.channel_order", {"RGB", "BGR"}) == "BGR";
    p.nhwc = choice("image_preprocess.layout", {"NCHW", "NHWC"}) == "NHWC";
    return p;
}

class Images final : public Reader {
  public:
    void configure(const Options& options) override { pipeline_ = configured_pipeline(options); }

    int claim(const fs::path& path) const override {
        std::error_code ec;
        if (!fs::is_directory(path, ec)) return 0;
        for (const auto& e : fs::directory_iterator(path, ec))
            if (e.is_regular_file() && is_image_file(e.path())) return 2;
        return 0;
    }

    std::unique_ptr<DataReader> open(const fs::path& path, const Model& model, const std::string& what) const override {
        const auto inputs = feed_inputs(model.graph());
        if (inputs.size() != 1)
            throw InputError(fmt::format("{} {} holds images, which feed a model of one input; this one has {}", what,
                                         path.string(), inputs.size()));
        std::vector<fs::path> images;
        for (const auto& e : fs::directory_iterator(path)) {
            if (e.is_regular_file() && is_image_file(e.path()))
                images.push_back(e.path());
            else if (e.is_directory() || e.path().extension() == ".npy" || e.path().extension() == ".pb")
                throw InputError(fmt::format("{} {} mixes images with tensor files or folders", what, path.string()));
        }
        std::sort(images.begin(), images.end(), [](const fs::path& a, const fs::path& b) {
            return natural_less(a.filename().string(), b.filename().string());
        });
        return std::make_unique<ImageReader>(std::move(images), *inputs[0], pipeline_, what);
    }

  private:
    ImagePipeline pipeline_;
};

const vaiq_option_descriptor kOptions[] = {
    {"data_preprocess", VAIQ_OPTION_STRING, "None",
     "The original tool's preset: preprocess_method1 (MLPerf 0.5 MobileNet: aspect-preserving bilinear resize to "
     "size / 0.875, centre crop, pixels to [-1, 1]), preprocess_method2 (MLPerf 0.5 ResNet: the same with area "
     "resampling, ImageNet channel means subtracted), None (image_preprocess alone). image_preprocess keys set "
     "explicitly override the preset's."},
    {"image_preprocess.size", VAIQ_OPTION_FLOAT_LIST, "null",
     "[height, width] the images are brought to; unset: the model input's."},
    {"image_preprocess.resize", VAIQ_OPTION_STRING, "",
     "stretch: straight to the size; keep_aspect: the shorter side to the size, the other in proportion. Unset: "
     "the preset's (None: stretch)."},
    {"image_preprocess.crop_fraction", VAIQ_OPTION_FLOAT, "null",
     "The centre crop keeps this fraction of the resized image (MLPerf: 0.875); unset: the preset's (None: 1)."},
    {"image_preprocess.interpolation", VAIQ_OPTION_STRING, "",
     "bilinear (half-pixel centres), or area (the mean over each output pixel's footprint when shrinking). Unset: "
     "the preset's (None: bilinear)."},
    {"image_preprocess.mean", VAIQ_OPTION_FLOAT_LIST, "null",
     "Subtracted from pixels (0..255): one value, or one per channel in the model's channel order. Unset: the "
     "preset's (None: 0)."},
    {"image_preprocess.std", VAIQ_OPTION_FLOAT_LIST, "null",
     "Divides pixels after the mean: one value, or one per channel. Unset: the preset's (None: 1)."},
    {"image_preprocess.channel_order", VAIQ_OPTION_STRING, "RGB", "RGB or BGR."},
    {"image_preprocess.layout", VAIQ_OPTION_STRING, "NCHW", "NCHW or NHWC."},
};

}  // namespace
}  // namespace vaiq

VAIQ_PLUGINS(vaiq::describe<vaiq::Images>("images", "0.1.0",
                                          "A folder of JPEG and PNG images, decoded and preprocessed one batch at a "
                                          "time (single-input models of rank 4)",
                                          vaiq::kOptions))
