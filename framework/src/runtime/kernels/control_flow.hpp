// What the control-flow kernels share with the pipeline, which replays a
// Loop's or Scan's iterations to calibrate its body.
#pragma once

#include <cstdint>

#include "vaiq/tensor.hpp"

namespace vaiq::runtime {

/// Slice `index` of `t` along `axis`, that axis removed (a Scan's step).
Tensor slice_at(const Tensor& t, int64_t axis, int64_t index);

}  // namespace vaiq::runtime
