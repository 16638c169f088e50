// Per-channel ranges of float tensors over the calibration data: what
// SmoothQuant and data-aware passes (activation-aware CLE) scale channels by.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "data/data_reader.hpp"
#include "vaiq/model.hpp"
#include "vaiq/pass.hpp"

namespace vaiq {

/// Runs every batch of `data` through `model` once, calling `observe` with each
/// of `tensors` as the batch computes it (kept computed: not fused away).
void for_each_tapped(const Model& model, DataReader& data, const std::vector<std::string>& tensors, int threads,
                     const std::function<void(const std::string&, const Tensor&)>& observe);

/// Runs every batch of `data` through the float model once, tapping the
/// requested tensors: the largest |value| per channel along each request's
/// axis. Streaming: only the maxima are kept. Tensors that are not float, or
/// whose channel count changes between batches, are left out.
ChannelRanges measure_channel_ranges(const Model& model, DataReader& data,
                                     const std::vector<ChannelRangeRequest>& requests, int threads);

}  // namespace vaiq
