// vaiq/qdq_view.hpp - a QDQ model read back as the float graph it quantizes
// and the parameters of each tensor, so that what was planned can be checked
// on what was written.
#pragma once

#include "vaiq/export.hpp"
#include "vaiq/model.hpp"
#include "vaiq/quant.hpp"

namespace vaiq {

struct QdqView {
    /// The model without QuantizeLinear/DequantizeLinear: a Q -> DQ pair is
    /// collapsed into the tensor Q reads (a graph output keeps its own name); a
    /// DequantizeLinear of a stored (initializer) weight stays as its output's name.
    Model graph;
    /// Per tensor of `graph`: the parameters it is quantized with (the Q's for
    /// an activation, the DQ's for a stored weight). Tensors with no Q/DQ are absent.
    QuantPlan plan;
};

/// Reads a QDQ model (default-domain or com.microsoft Q/DQ). A format that
/// writes pairs of its own (Vitis Q/DQ, FixNeuron) is read after its
/// Format::to_native(). Scales and zero points must be initializers; a pair
/// whose Q and DQ disagree keeps the Q's.
VAIQ_API QdqView read_qdq(const Model& model);

}  // namespace vaiq
