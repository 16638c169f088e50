// Tensors whose channels live on different scales: a detector head that packs
// score logits of a few units next to box offsets of hundreds in one tensor,
// a Concat of differently ranged branches. One per-tensor grid is sized by the
// widest channel, and the narrow ones keep only a few of its steps (M-LSD's
// centre scores on the grid of its ±480 displacements: every pixel a "peak").
// Found from the float model's per-channel ranges on the first calibration
// batches; where the graph already splits such a tensor (every reader is a
// Slice or Split), each piece is quantized on its own grid and the tensor stays
// float; elsewhere the tensor is named with what to do.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "pipeline/planner.hpp"
#include "vaiq/model.hpp"
#include "vaiq/pass.hpp"

namespace vaiq {

/// One tensor whose channel ranges differ by more than the threshold.
struct MixedScaleTensor {
    std::string tensor;
    std::string role = "activation";  ///< or "weight": a head's weight planned per tensor
    std::string node;                 ///< its producer (for a weight: the layer reading it)
    int axis = 1;                     ///< the channel axis measured
    double widest = 0;                ///< the largest |value| of its widest channel
    double narrowest = 0;             ///< that of its narrowest channel that is not constant zero
    std::vector<int> narrow;          ///< channels below widest / threshold
    /// What was done: "split" (each Slice/Split reading it quantized on its own range,
    /// the tensor float), "per_channel" (a weight), or "" (named, with `advice`).
    std::string action;
    std::string advice;

    nlohmann::json to_json() const;
};

/// The planned activations worth measuring: those the graph splits (every
/// reader a Slice or Split), the outputs of Concat, and graph outputs computed
/// by a Conv or ConvTranspose (a head), each with its channel axis.
std::vector<ChannelRangeRequest> mixed_scale_candidates(const Model& model, const DraftPlan& draft);

/// Of the `measured` candidates (mixed_scale_candidates), those whose widest channel exceeds `ratio` times their
/// narrowest non-zero one. Those the graph splits leave the plan: each
/// Slice/Split output is then quantized on its own range, and whatever took
/// its parameters from them keeps taking them. Then the per-tensor weights of
/// the heads (the layers computing those tensors, the tensors left float in
/// the plan and the graph outputs) whose output channels differ as much: with
/// `per_channel_weights` (the target allows it, opset 13 or later) they are
/// quantized per channel, else named.
std::vector<MixedScaleTensor> split_mixed_scales(const Model& model, DraftPlan& draft,
                                                 const std::vector<ChannelRangeRequest>& measured,
                                                 const ChannelRanges& ranges, double ratio, bool per_channel_weights);

}  // namespace vaiq
