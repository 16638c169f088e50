// Per-channel ranges of float tensors over the calibration data: what
// SmoothQuant and data-aware passes (activation-aware CLE) scale channels by.
#pragma once

#include <vector>

#include "pipeline/data_reader.hpp"
#include "vaiq/model.hpp"
#include "vaiq/pass.hpp"

namespace vaiq {

/// Runs every batch of `data` through the float model once, tapping the
/// requested tensors: the largest |value| per channel along each request's
/// axis. Streaming: only the maxima are kept. Tensors that are not float, or
/// whose channel count changes between batches, are left out.
ChannelRanges measure_channel_ranges(const Model& model, DataReader& data,
                                     const std::vector<ChannelRangeRequest>& requests, int threads);

}  // namespace vaiq
