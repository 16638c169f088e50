// A Loop's or Scan's iterations replayed outside the runtime, so that the
// inputs of each can be kept to calibrate its body (EnableSubgraph).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "vaiq/model.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq::subgraphs {

/// Iterations kept per calibration batch for a Loop's or Scan's body.
inline constexpr int64_t kIterationsKept = 256;

/// The iterations one batch keeps: all of a run of up to kIterationsKept (a
/// range needs the extremes, and a loop's may sit in a few iterations, as a
/// decaying state's first ones); of a longer run, kIterationsKept drawn
/// uniformly from all of it (reservoir sampling, a fixed seed). A regular
/// stride would alias with a loop whose iterations alternate (every other
/// one's sign, say) and calibrate on half of what the body computes.
template <typename T>
class IterationSample {
  public:
    /// Iteration `i` (0, 1, ... in order); `make` builds it where kept, and
    /// `displaced` is given an earlier one it replaces.
    template <typename Make, typename Displaced>
    void offer(int64_t i, const Make& make, const Displaced& displaced) {
        if (i < kIterationsKept) return items_.push_back(make());
        const auto j = std::uniform_int_distribution<int64_t>(0, i)(rng_);
        if (j >= kIterationsKept) return;
        displaced(items_[static_cast<size_t>(j)]);
        items_[static_cast<size_t>(j)] = make();
    }
    const T& first() const { return items_.front(); }
    std::vector<T> take() { return std::exchange(items_, {}); }

  private:
    std::vector<T> items_;
    std::mt19937_64 rng_{0};
};

/// One iteration: its number and the body's inputs by name; returns the body's outputs.
using Step = std::function<std::vector<Tensor>(int64_t i, std::map<std::string, Tensor> feeds)>;

/// A Loop's or Scan's iterations on the node's inputs `in` (nullopt where
/// omitted), as the runtime runs them (the executor's control-flow kernels);
/// `step` computes each. Throws InputError for inputs the node cannot run on.
void iterate(const onnx::NodeProto& node, int64_t opset, const onnx::GraphProto& body,
             const std::vector<std::optional<Tensor>>& in, const Step& step);

}  // namespace vaiq::subgraphs
