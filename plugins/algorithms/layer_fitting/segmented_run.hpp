// A model run over the calibration data one segment at a time: each call
// computes only the nodes a requested tensor still needs, reading the values
// earlier calls kept. Fast finetune fits its layers in graph order, each on its
// input as the layers fitted before it leave it; the nodes before a layer's
// input are then final, so they are run once per batch in all instead of once
// per layer (the prefix up to each layer, half the model on average).
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "vaiq/algorithm.hpp"

namespace vaiq {

class SegmentedRun {
  public:
    /// Runs over the batches of `data`. `budget`: the bytes of kept values (over
    /// every batch) past which the run gives up.
    SegmentedRun(AlgorithmContext& context, DataStream& data, size_t budget)
        : context_(context), data_(data), budget_(budget) {}

    /// Calls `take(batch index, value)` with `tensor` of `model` for each batch of
    /// the data. `model` may differ from the models of earlier calls only in
    /// initializers that no node computed before reads (the weights of layers
    /// not fitted yet). Returns false once the values it kept outgrew the budget
    /// (the call that outgrew it still delivers), or for a model it cannot split
    /// (a tensor read from outside the graph): the caller then discards what
    /// `take` got and runs the whole model, as it will for every later call.
    bool compute(const Model& model, const std::string& tensor, const std::function<void(size_t, const Tensor&)>& take);

    /// Bytes of the values kept now.
    size_t kept_bytes() const { return kept_bytes_; }

  private:
    // Every later call declines; the values kept are freed. Returns false.
    bool give_up();

    AlgorithmContext& context_;
    DataStream& data_;
    size_t budget_;
    bool failed_ = false;
    std::set<std::string> computed_;                   // nodes run, by first output
    std::vector<std::map<std::string, Tensor>> kept_;  // per batch: values later nodes read
    size_t kept_bytes_ = 0;
};

}  // namespace vaiq
