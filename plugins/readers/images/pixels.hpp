// Images as model inputs: JPEG and PNG decoding (libjpeg-turbo, libpng) and
// the preprocessing that turns pixels into an input tensor.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "vaiq/tensor.hpp"

namespace vaiq {

/// Decoded pixels, row-major, height x width x channels (1: grey, 3: RGB).
struct Image {
    int64_t height = 0, width = 0, channels = 0;
    std::vector<uint8_t> pixels;
};

/// Whether `path` names a JPEG or PNG file (by extension, any case).
bool is_image_file(const std::filesystem::path& path);

/// Decodes a JPEG or PNG file to 8-bit grey or RGB (16-bit PNGs are scaled
/// down, alpha is composited onto black, palettes expanded). Throws InputError
/// naming the file when it cannot be decoded.
Image decode_image(const std::filesystem::path& path);

/// How pixels become a model input: resize (and crop), channel order,
/// normalisation ((pixel - mean) / std, pixels in 0..255), layout.
struct ImagePipeline {
    enum class Resize {
        Stretch,     ///< straight to the size (divided by crop_fraction first)
        KeepAspect,  ///< the shorter side to size / crop_fraction, the other in proportion
    };
    enum class Interpolation {
        Bilinear,  ///< half-pixel centres, as OpenCV's INTER_LINEAR
        Area,      ///< the mean over each output pixel's footprint when shrinking (INTER_AREA); bilinear when growing
    };
    std::optional<std::array<int64_t, 2>> size;  ///< [height, width]; default: the model input's
    Resize resize = Resize::Stretch;
    double crop_fraction = 1.0;  ///< the centre crop keeps this fraction of the resized image
    Interpolation interpolation = Interpolation::Bilinear;
    std::vector<float> mean{0.0f}, std{1.0f};  ///< one per channel (in the model's channel order), or one for all
    bool bgr = false;                          ///< channel order BGR instead of RGB
    bool nhwc = false;                         ///< layout NHWC instead of NCHW
    std::string name = "image_preprocess";     ///< for messages
};

/// The pipeline of a preset name of the original tool: "preprocess_method1"
/// (MLPerf 0.5 MobileNet: aspect-preserving bilinear resize to size / 0.875,
/// centre crop, pixels to [-1, 1]), "preprocess_method2" (MLPerf 0.5 ResNet:
/// the same with area resampling, the ImageNet channel means subtracted), or
/// "None" (stretch to the size, pixels as they are).
ImagePipeline preset_image_pipeline(const std::string& name);

/// One image as a model input of shape [1, channels, height, width] (or NHWC)
/// and element type `type` (float, or uint8/int8 rounded and saturated).
/// Grey images feed 3-channel models replicated; RGB images feed 1-channel
/// models as luma (ITU-R 601). `what` names the image in messages.
Tensor image_to_input(const Image& image, const ImagePipeline& pipeline, int64_t channels, int64_t height,
                      int64_t width, DataType type, const std::string& what);

}  // namespace vaiq
