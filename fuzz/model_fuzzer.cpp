// Model files: protobuf bytes, external-data references (a data file sits
// beside the model), tensors whose declared sizes lie. A model that loads must
// also decode, check, infer shapes and save without anything but InputError.
#include <fstream>

#include "fuzz_support.hpp"
#include "vaiq/model.hpp"
#include "vaiq/tensor.hpp"

using namespace vaiq;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const bool external_file = [] {
        std::ofstream out(fuzz::scratch() / "weights.bin", std::ios::binary);
        for (int i = 0; i < 8192; ++i) out.put(static_cast<char>(i * 37));
        return true;
    }();
    (void)external_file;
    const auto path = fuzz::write_input("model.onnx", data, size);
    fuzz::expect_only_input_errors([&] {
        LoadOptions options;
        options.defer_external_bytes = size % 2 ? 64 : 0;  // both the deferred and the eager path
        Model model = load_model(path, options);
        for (const auto& init : model.graph().initializer()) (void)Tensor::from_proto(init);
        (void)infer_shapes(model);
        check_model(model);
        SaveOptions save;
        save.check = false;
        save.use_external_data_format = size % 3 == 0;
        save.external_data_size_threshold = 16;
        save_model(model, fuzz::scratch() / "out.onnx", save, path);
    });
    return 0;
}
