// Tensor files as calibration data and `vaiq infer` inputs: .npy (header,
// dtype, shape, sizes) and ONNX TensorProto .pb, chosen by the first byte.
#include "fuzz_support.hpp"
#include "vaiq/reader.hpp"
#include "vaiq/tensor.hpp"

using namespace vaiq;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const auto path = fuzz::write_input(data[0] % 2 ? "tensor.npy" : "tensor.pb", data + 1, size - 1);
    fuzz::expect_only_input_errors([&] {
        std::string name;
        const Tensor t = read_tensor_file(path, &name);
        // What was read is what it claims to be.
        int64_t count = 1;
        for (auto d : t.shape()) count *= d;
        if (static_cast<int64_t>(t.bytes().size()) != stored_bytes(t.type(), count) &&
            static_cast<int64_t>(t.bytes().size()) != count * static_cast<int64_t>(element_size(t.type())))
            throw std::logic_error("a tensor file read into a tensor whose bytes do not match its shape");
    });
    return 0;
}
