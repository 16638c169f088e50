#include "pixels.hpp"

#include <fmt/format.h>
#include <png.h>
// jpeglib.h needs FILE and size_t declared first.
#include <csetjmp>
#include <cstdio>
#include <jpeglib.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>

#include "vaiq/error.hpp"

namespace fs = std::filesystem;

namespace vaiq {

namespace {

std::string lower_extension(const fs::path& path) {
    auto ext = path.extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
    return ext;
}

// libjpeg reports errors through a callback that must not return: it jumps back
// to decode_jpeg with the message kept here.
struct JpegError {
    jpeg_error_mgr manager;
    std::jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
};

void jpeg_error_exit(j_common_ptr info) {
    auto* error = reinterpret_cast<JpegError*>(info->err);
    (*info->err->format_message)(info, error->message);
    std::longjmp(error->jump, 1);
}

void jpeg_quiet_warning(j_common_ptr, int) {}

struct FileCloser {
    void operator()(FILE* f) const { std::fclose(f); }
};

// No object with a destructor lives between setjmp and a jump back to it, so
// the jump skips nothing; the pixels' buffer is sized before setjmp.
void decode_jpeg_into(FILE* file, jpeg_decompress_struct& info, JpegError& error, Image& image) {
    info.err = jpeg_std_error(&error.manager);
    error.manager.error_exit = jpeg_error_exit;
    error.manager.emit_message = jpeg_quiet_warning;
    if (setjmp(error.jump)) {
        jpeg_destroy_decompress(&info);
        throw InputError(error.message);
    }
    jpeg_create_decompress(&info);
    jpeg_stdio_src(&info, file);
    jpeg_read_header(&info, TRUE);
    info.out_color_space = info.num_components == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(&info);
    image.height = info.output_height;
    image.width = info.output_width;
    image.channels = info.output_components;
    image.pixels.resize(static_cast<size_t>(image.height * image.width * image.channels));
    while (info.output_scanline < info.output_height) {
        JSAMPROW row = image.pixels.data() + static_cast<size_t>(info.output_scanline) *
                                                 static_cast<size_t>(image.width * image.channels);
        jpeg_read_scanlines(&info, &row, 1);
    }
    jpeg_finish_decompress(&info);
    jpeg_destroy_decompress(&info);
}

Image decode_jpeg(const fs::path& path) {
    std::unique_ptr<FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
    if (!file) throw InputError("cannot be opened");
    Image image;
    jpeg_decompress_struct info{};
    JpegError error{};
    decode_jpeg_into(file.get(), info, error, image);
    return image;
}

Image decode_png(const fs::path& path) {
    png_image png{};
    png.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&png, path.c_str())) throw InputError(png.message);
    Image image;
    image.channels = (png.format & PNG_FORMAT_FLAG_COLOR) ? 3 : 1;
    png.format = image.channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
    image.height = png.height;
    image.width = png.width;
    image.pixels.resize(PNG_IMAGE_SIZE(png));
    const png_color black{0, 0, 0};
    if (!png_image_finish_read(&png, &black, image.pixels.data(), 0, nullptr)) {
        const std::string message = png.message;
        png_image_free(&png);
        throw InputError(message);
    }
    return image;
}

// Resizes one axis at a time; values stay float until the end, where they are
// rounded to 8 bits as the image libraries the presets come from return them.
class Resampler {
  public:
    // Weights of source pixels for each of `out` output positions along an axis of `in`.
    static std::vector<std::vector<std::pair<int64_t, float>>> weights(int64_t in, int64_t out, bool area) {
        std::vector<std::vector<std::pair<int64_t, float>>> w(static_cast<size_t>(out));
        const double scale = static_cast<double>(in) / static_cast<double>(out);
        for (int64_t o = 0; o < out; ++o) {
            auto& taps = w[static_cast<size_t>(o)];
            if (area && scale > 1) {
                // The footprint [o * scale, (o + 1) * scale), each pixel weighted by its overlap.
                const double lo = static_cast<double>(o) * scale, hi = lo + scale;
                for (auto i = static_cast<int64_t>(std::floor(lo)); static_cast<double>(i) < hi && i < in; ++i) {
                    const double overlap = std::min(hi, double(i + 1)) - std::max(lo, double(i));
                    if (overlap > 1e-12) taps.emplace_back(i, static_cast<float>(overlap / scale));
                }
                continue;
            }
            double x = (static_cast<double>(o) + 0.5) * scale - 0.5;
            auto i = static_cast<int64_t>(std::floor(x));
            double f = x - static_cast<double>(i);
            if (i < 0) i = 0, f = 0;
            if (i >= in - 1) i = in - 1, f = 0;
            taps.emplace_back(i, static_cast<float>(1 - f));
            if (f > 0) taps.emplace_back(i + 1, static_cast<float>(f));
        }
        return w;
    }

    static Image resize(const Image& src, int64_t height, int64_t width, bool area) {
        if (src.height == height && src.width == width) return src;
        const auto wx = weights(src.width, width, area), wy = weights(src.height, height, area);
        const int64_t c = src.channels;
        std::vector<float> rows(static_cast<size_t>(src.height * width * c), 0.0f);  // horizontal pass
        for (int64_t y = 0; y < src.height; ++y)
            for (int64_t x = 0; x < width; ++x)
                for (const auto& [i, w] : wx[static_cast<size_t>(x)])
                    for (int64_t k = 0; k < c; ++k)
                        rows[static_cast<size_t>((y * width + x) * c + k)] +=
                            w * src.pixels[static_cast<size_t>((y * src.width + i) * c + k)];
        Image out{height, width, c, std::vector<uint8_t>(static_cast<size_t>(height * width * c))};
        for (int64_t y = 0; y < height; ++y)
            for (int64_t x = 0; x < width; ++x)
                for (int64_t k = 0; k < c; ++k) {
                    float v = 0;
                    for (const auto& [j, w] : wy[static_cast<size_t>(y)])
                        v += w * rows[static_cast<size_t>((j * width + x) * c + k)];
                    out.pixels[static_cast<size_t>((y * width + x) * c + k)] =
                        static_cast<uint8_t>(std::clamp(std::nearbyint(v), 0.0f, 255.0f));
                }
        return out;
    }
};

Image crop(const Image& src, int64_t top, int64_t left, int64_t height, int64_t width) {
    Image out{height, width, src.channels, std::vector<uint8_t>(static_cast<size_t>(height * width * src.channels))};
    const auto row = static_cast<size_t>(width * src.channels);
    for (int64_t y = 0; y < height; ++y)
        std::copy_n(src.pixels.begin() + static_cast<std::ptrdiff_t>(((top + y) * src.width + left) * src.channels),
                    row, out.pixels.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(y) * row));
    return out;
}

// The channel values of pixel p of `image`, as the model's `channels` want them.
void pixel_channels(const Image& image, size_t p, int64_t channels, bool bgr, float* out) {
    const uint8_t* px = image.pixels.data() + p * static_cast<size_t>(image.channels);
    if (channels == 1) {
        // ITU-R 601 luma in the fixed point image libraries use for RGB -> L.
        out[0] = image.channels == 1 ? px[0] : static_cast<float>((px[0] * 19595 + px[1] * 38470 + px[2] * 7471 + 0x8000) >> 16);
        return;
    }
    for (int64_t k = 0; k < 3; ++k) {
        const int64_t source = bgr ? 2 - k : k;
        out[k] = image.channels == 1 ? px[0] : px[source];
    }
}

template <typename T>
void store(Tensor& t, size_t index, float v) {
    if constexpr (std::is_same_v<T, float>) {
        t.mutable_data<float>()[index] = v;
    } else {
        const float lo = static_cast<float>(std::numeric_limits<T>::min());
        const float hi = static_cast<float>(std::numeric_limits<T>::max());
        t.mutable_data<T>()[index] = static_cast<T>(std::clamp(std::nearbyint(v), lo, hi));
    }
}

}  // namespace

bool is_image_file(const fs::path& path) {
    const auto ext = lower_extension(path);
    return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

Image decode_image(const fs::path& path) {
    try {
        Image image = lower_extension(path) == ".png" ? decode_png(path) : decode_jpeg(path);
        if (image.height <= 0 || image.width <= 0) throw InputError("the image is empty");
        return image;
    } catch (const InputError& e) {
        throw InputError(fmt::format("image {}: {}", path.string(), e.what()));
    }
}

ImagePipeline preset_image_pipeline(const std::string& name) {
    ImagePipeline p;
    if (name == "None") return p;
    p.name = name;
    p.resize = ImagePipeline::Resize::KeepAspect;
    p.crop_fraction = 0.875;
    if (name == "preprocess_method1") {
        p.interpolation = ImagePipeline::Interpolation::Bilinear;
        p.mean = {127.5f};  // (x / 255 - 0.5) * 2
        p.std = {127.5f};
        return p;
    }
    if (name == "preprocess_method2") {
        p.interpolation = ImagePipeline::Interpolation::Area;
        p.mean = {123.68f, 116.78f, 103.94f};
        p.std = {1.0f};
        return p;
    }
    throw InputError(fmt::format("unknown data_preprocess '{}' (preprocess_method1, preprocess_method2 or None)", name));
}

Tensor image_to_input(const Image& image, const ImagePipeline& pipeline, int64_t channels, int64_t height,
                      int64_t width, DataType type, const std::string& what) {
    if (channels != 1 && channels != 3)
        throw InputError(fmt::format("{}: the model input has {} channels; images feed 1 or 3", what, channels));
    for (const auto* values : {&pipeline.mean, &pipeline.std})
        if (values->size() != 1 && static_cast<int64_t>(values->size()) != channels)
            throw InputError(fmt::format("{}: {} gives {} means or stds for a {}-channel input", what, pipeline.name,
                                         values->size(), channels));
    // Resize so that the centre crop of `crop_fraction` is the input size.
    const double f = pipeline.crop_fraction;
    auto scaled_h = static_cast<int64_t>(static_cast<double>(height) / f);
    auto scaled_w = static_cast<int64_t>(static_cast<double>(width) / f);
    if (pipeline.resize == ImagePipeline::Resize::KeepAspect) {
        if (image.height > image.width)
            scaled_h = static_cast<int64_t>(static_cast<double>(scaled_h) * image.height / image.width);
        else
            scaled_w = static_cast<int64_t>(static_cast<double>(scaled_w) * image.width / image.height);
    }
    scaled_h = std::max(scaled_h, height);
    scaled_w = std::max(scaled_w, width);
    const bool area = pipeline.interpolation == ImagePipeline::Interpolation::Area;
    const Image resized = crop(Resampler::resize(image, scaled_h, scaled_w, area), (scaled_h - height) / 2,
                               (scaled_w - width) / 2, height, width);

    std::vector<int64_t> shape = pipeline.nhwc ? std::vector<int64_t>{1, height, width, channels}
                                               : std::vector<int64_t>{1, channels, height, width};
    Tensor out(type, shape);
    const auto pixels = static_cast<size_t>(height * width);
    float values[3];
    for (size_t p = 0; p < pixels; ++p) {
        pixel_channels(resized, p, channels, pipeline.bgr, values);
        for (int64_t k = 0; k < channels; ++k) {
            const float mean = pipeline.mean.size() == 1 ? pipeline.mean[0] : pipeline.mean[static_cast<size_t>(k)];
            const float std = pipeline.std.size() == 1 ? pipeline.std[0] : pipeline.std[static_cast<size_t>(k)];
            const float v = (values[k] - mean) / std;
            const size_t index = pipeline.nhwc ? p * static_cast<size_t>(channels) + static_cast<size_t>(k)
                                               : static_cast<size_t>(k) * pixels + p;
            switch (type) {
                case DataType::Float: store<float>(out, index, v); break;
                case DataType::UInt8: store<uint8_t>(out, index, v); break;
                case DataType::Int8: store<int8_t>(out, index, v); break;
                default:
                    throw InputError(fmt::format("{}: images feed float, uint8 or int8 inputs, not {}", what,
                                                 data_type_name(type)));
            }
        }
    }
    return out;
}

}  // namespace vaiq
