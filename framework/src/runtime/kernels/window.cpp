#include "runtime/kernels/window.hpp"

namespace vaiq::runtime {

WindowGeometry WindowGeometry::from(const KernelContext& ctx, const std::vector<int64_t>& in,
                                    const std::vector<int64_t>& kernel, bool ceil_mode) {
    const size_t n = in.size();
    WindowGeometry g;
    g.strides = ctx.attributes.get_ints("strides", std::vector<int64_t>(n, 1));
    g.dilations = ctx.attributes.get_ints("dilations", std::vector<int64_t>(n, 1));
    const auto pads = ctx.attributes.get_ints("pads", std::vector<int64_t>(2 * n, 0));
    if (g.strides.size() != n || g.dilations.size() != n || pads.size() != 2 * n || kernel.size() != n)
        ctx.fail("strides, dilations, pads and kernel_shape do not match the input's rank");
    const auto auto_pad = ctx.attributes.get_string("auto_pad", "NOTSET");
    g.pad_begin.assign(pads.begin(), pads.begin() + static_cast<long>(n));
    g.pad_end.assign(pads.begin() + static_cast<long>(n), pads.end());
    g.out.resize(n);
    g.declared_pad_end.resize(n);
    for (size_t d = 0; d < n; ++d) {
        if (g.strides[d] < 1 || g.dilations[d] < 1) ctx.fail("strides and dilations must be positive");
        const int64_t span = (kernel[d] - 1) * g.dilations[d] + 1;
        if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
            const int64_t out = (in[d] + g.strides[d] - 1) / g.strides[d];
            const int64_t total = std::max<int64_t>(0, (out - 1) * g.strides[d] + span - in[d]);
            g.pad_begin[d] = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
            g.pad_end[d] = total - g.pad_begin[d];
        } else if (auto_pad == "VALID") {
            g.pad_begin[d] = g.pad_end[d] = 0;
        } else if (auto_pad != "NOTSET") {
            ctx.fail("auto_pad '" + auto_pad + "' is not NOTSET, SAME_UPPER, SAME_LOWER or VALID");
        }
        g.declared_pad_end[d] = g.pad_end[d];
        const int64_t room = in[d] + g.pad_begin[d] + g.pad_end[d] - span;
        if (room < 0) ctx.fail("the window is larger than the padded input");
        int64_t out = (ceil_mode ? (room + g.strides[d] - 1) / g.strides[d] : room / g.strides[d]) + 1;
        if (ceil_mode && (out - 1) * g.strides[d] >= in[d] + g.pad_begin[d]) --out;
        g.out[d] = out;
        // oneDNN wants the end padding that produces exactly this output.
        g.pad_end[d] = std::max(g.pad_end[d], (out - 1) * g.strides[d] + span - in[d] - g.pad_begin[d]);
    }
    return g;
}

}  // namespace vaiq::runtime
