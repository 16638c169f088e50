// The library's entry: both VitisQuantFormat writers.
#include "formats.hpp"

VAIQ_PLUGINS(vitis::vitis_qdq_descriptor(), vitis::fixneuron_descriptor())
