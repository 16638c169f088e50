// vaiq/pair_emitter.hpp - what every Q/DQ-style format shares: splicing a
// quantize-dequantize "pair" between each planned tensor and its readers.
// A format says only what one pair is (QuantizeLinear + DequantizeLinear, a
// custom-op pair, a Cast pair, one fused FixNeuron) and how a weight is stored.
#pragma once

#include <string>

#include "vaiq/graph.hpp"
#include "vaiq/model.hpp"
#include "vaiq/quant.hpp"

namespace vaiq {

class VAIQ_API PairEmitter {
  public:
    struct Settings {
        bool pair_to_weight = false;  ///< weights stay float behind a pair (AddQDQPairToWeight)
        bool dedicated_pair = false;  ///< one pair per reader of an activation (DedicatedQDQPair)
    };

    virtual ~PairEmitter();

    /// Rewrites `model` so that every tensor of `plan` is read through a pair.
    /// Weights (initializers) are stored as add_stored_weight writes them; a graph
    /// output keeps its name (the pair writes it). Throws InputError for a tensor
    /// the model lacks, a weight that is not a float constant, or what check refuses.
    void emit(Model& model, const QuantPlan& plan, Settings settings) const;

  protected:
    /// Refuses (InputError) a tensor this format cannot write.
    virtual void check(const TensorQuant& t, const Model& model) const = 0;
    /// Adds the nodes that take float `input` to float `output` through t's quantization.
    virtual void add_pair(Model& model, UniqueNames& names, const TensorQuant& t, const std::string& input,
                          const std::string& output) const = 0;
    /// Stores the float weight `name` quantized and adds the nodes that read it
    /// back as float `output`. The default keeps it float behind add_pair.
    virtual void add_stored_weight(Model& model, UniqueNames& names, const TensorQuant& t, const std::string& name,
                                   const std::string& output) const;

    /// Scale and zero-point initializers for t (scalars per tensor, vectors per channel).
    static std::pair<std::string, std::string> add_params(onnx::GraphProto& graph, UniqueNames& names,
                                                          const TensorQuant& t);
    /// Stores the float initializer `name` quantized with t's parameters as a new
    /// initializer (for add_stored_weight); returns its name.
    static std::string store_quantized(onnx::GraphProto& graph, UniqueNames& names, const TensorQuant& t,
                                       const std::string& name);

  private:
    void emit_weight(Model& model, UniqueNames& names, const GraphIndex& index, const TensorQuant& t,
                     Settings settings) const;
    void emit_activation(Model& model, UniqueNames& names, const GraphIndex& index, const TensorQuant& t,
                         Settings settings) const;
};

}  // namespace vaiq
