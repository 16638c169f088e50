// A Loop's or Scan's iterations replayed outside the runtime, so that the
// inputs of each can be kept to calibrate its body (EnableSubgraph).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "vaiq/model.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq::phases {

/// Iterations kept per calibration batch for a Loop's or Scan's body.
inline constexpr int64_t kIterationsKept = 32;

/// Whether iteration `i` of `count` (known ahead) is one of the
/// kIterationsKept spread evenly over them.
bool kept_iteration(int64_t i, int64_t count);

/// The iterations one batch keeps. With the count known ahead, kept_iteration;
/// without, every stride-th, the stride doubling (and every other one kept so
/// far dropped) whenever twice kIterationsKept are kept: kIterationsKept to
/// twice as many remain, spread over the whole run however long it is.
template <typename T>
class IterationSample {
  public:
    /// Iteration `i` (`count`: known ahead, else 0); `make` builds it where kept.
    template <typename Make>
    void offer(int64_t i, int64_t count, const Make& make) {
        if (count > 0 ? !kept_iteration(i, count) : i % stride_ != 0) return;
        items_.push_back(make());
        if (count > 0 || items_.size() < static_cast<size_t>(2 * kIterationsKept)) return;
        for (size_t j = 0; 2 * j < items_.size(); ++j) items_[j] = std::move(items_[2 * j]);
        items_.resize(items_.size() / 2);
        stride_ *= 2;
    }
    const T& first() const { return items_.front(); }
    std::vector<T> take() { return std::exchange(items_, {}); }

  private:
    std::vector<T> items_;
    int64_t stride_ = 1;
};

/// One iteration: its number, the count known ahead (or 0), the body's inputs
/// by name; returns the body's outputs.
using Step = std::function<std::vector<Tensor>(int64_t i, int64_t count, std::map<std::string, Tensor> feeds)>;

/// A Loop's or Scan's iterations on the node's inputs `in` (nullopt where
/// omitted), as the runtime runs them (runtime/kernels/control_flow.cpp);
/// `step` computes each. Throws InputError for inputs the node cannot run on.
void iterate(const onnx::NodeProto& node, int64_t opset, const onnx::GraphProto& body,
             const std::vector<std::optional<Tensor>>& in, const Step& step);

}  // namespace vaiq::phases
