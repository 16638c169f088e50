// NumPy .npy files and ONNX TensorProto .pb files as tensors.
#pragma once

#include <filesystem>
#include <string>

#include "vaiq/tensor.hpp"

namespace vaiq {

/// Reads a .npy file (format 1.0 to 3.0, little-endian, C order). Throws
/// InputError naming the file for anything else.
Tensor read_npy(const std::filesystem::path& file);

/// Writes a .npy file (format 1.0), atomically.
void write_npy(const std::filesystem::path& file, const Tensor& tensor);

/// Reads a serialized onnx TensorProto (.pb); its name goes to `name` when given.
Tensor read_tensor_proto(const std::filesystem::path& file, std::string* name = nullptr);

/// By extension: .npy or .pb (whose TensorProto name goes to `name` when given).
Tensor read_tensor_file(const std::filesystem::path& file, std::string* name = nullptr);

}  // namespace vaiq
