// vaiq/pass.hpp - the pass plugin interface.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "vaiq/model.hpp"
#include "vaiq/plugin.hpp"

namespace vaiq {

/// A float tensor whose largest |value| per channel a pass asks for.
struct ChannelRangeRequest {
    std::string tensor;
    int axis = 1;  ///< the channel axis (1: NCHW and [N, C]; -1: the last)
};

/// Largest |value| per channel over the calibration data, by tensor.
using ChannelRanges = std::map<std::string, std::vector<float>>;

/// A named graph rewrite.
class VAIQ_API Pass : public Plugin {
  public:
    using Interface = Pass;
    static constexpr PluginKind kKind = PluginKind::Pass;

    /// Rewrites the model in place; returns whether anything changed.
    virtual bool run(Model& model) = 0;

    /// What a pass that uses the data asks the host to measure on `model`
    /// before run() (default: nothing). The host measures it when the run has
    /// calibration data and passes it to set_channel_ranges(); without data
    /// (`vaiq preprocess`) run() is called without it.
    virtual std::vector<ChannelRangeRequest> channel_ranges_wanted(const Model& model) const {
        (void)model;
        return {};
    }
    /// The measured ranges, before run(); tensors that are not float or lack
    /// the axis are left out.
    virtual void set_channel_ranges(ChannelRanges ranges) { (void)ranges; }

    /// True when run() never changes what the model computes, only how (up to
    /// float rounding: folding, fusing, clean-ups). A run whose preparation kept
    /// the function compares the quantized model against the float outputs
    /// calibration computed instead of running the given model again. The
    /// default is false.
    virtual bool keeps_function() const { return false; }
};

/// A pass without options that runs one function (returning whether it changed
/// the model): a library of such rewrites declares one per function, saying
/// whether it keeps the function (see Pass::keeps_function).
template <bool (*Run)(Model&), bool KeepsFunction = false>
class FunctionPass final : public Pass {
  public:
    bool run(Model& model) override { return Run(model); }
    bool keeps_function() const override { return KeepsFunction; }
};

}  // namespace vaiq
