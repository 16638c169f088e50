// A Loop's or Scan's iterations replayed outside the runtime, so that the
// inputs of each can be kept to calibrate its body (EnableSubgraph).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "vaiq/model.hpp"
#include "vaiq/tensor.hpp"

namespace vaiq::phases {

/// Iterations kept per calibration batch for a Loop's or Scan's body.
inline constexpr int64_t kIterationsKept = 32;

/// Whether iteration `i` is kept: spread evenly over `count` iterations when
/// that is known ahead (else 0), the first ones otherwise.
bool kept_iteration(int64_t i, int64_t count);

/// One iteration: its number, the count known ahead (or 0), the body's inputs
/// by name; returns the body's outputs.
using Step = std::function<std::vector<Tensor>(int64_t i, int64_t count, std::map<std::string, Tensor> feeds)>;

/// A Loop's or Scan's iterations on the node's inputs `in` (nullopt where
/// omitted), as the runtime runs them (runtime/kernels/control_flow.cpp);
/// `step` computes each. Throws InputError for inputs the node cannot run on.
void iterate(const onnx::NodeProto& node, int64_t opset, const onnx::GraphProto& body,
             const std::vector<std::optional<Tensor>>& in, const Step& step);

}  // namespace vaiq::phases
