// Sliding-window geometry shared by convolution and pooling: strides,
// dilations and pads from the attributes (auto_pad included), output sizes.
#pragma once

#include "runtime/kernels/common.hpp"

namespace vaiq::runtime {

struct WindowGeometry {
    std::vector<int64_t> strides, dilations, pad_begin, pad_end, out;
    std::vector<int64_t> declared_pad_end;  ///< pad_end before ceil_mode extended it

    /// `in` and `kernel` are the spatial sizes. With `ceil_mode` the output
    /// rounds up, dropping a last window that would start in the end padding.
    static WindowGeometry from(const KernelContext& ctx, const std::vector<int64_t>& in,
                               const std::vector<int64_t>& kernel, bool ceil_mode);
};

}  // namespace vaiq::runtime
