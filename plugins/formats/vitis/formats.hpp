// The VitisQuantFormat family: VitisQuantFormat.QDQ (vitis_qdq.cpp) and
// VitisQuantFormat.FixNeuron (fixneuron.cpp), one library, sharing the
// conversion of their ops to ONNX Runtime's native QDQ (native_qdq.cpp).
#pragma once

#include <vaiq/plugin.hpp>

namespace vitis {

vaiq_plugin_descriptor vitis_qdq_descriptor();
vaiq_plugin_descriptor fixneuron_descriptor();

}  // namespace vitis
