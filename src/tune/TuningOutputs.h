// What the tuner compares between a candidate config and the default one: the output tensors of
// a family's launches. A family states them by specializing TuningOutputs for its inputs type
// next to that type (kernels/forward/Forward.h does); without one, candidates are timed but their
// outputs are not compared (the tuning log says so).
#pragma once

#include <flexjit/tensor.h>

#include <vector>

namespace flexjit::tune {

template <typename Inputs>
struct TuningOutputs {
  static constexpr bool kCompared = false;
  static std::vector<TensorRef> of(const Inputs&) { return {}; }
};

}  // namespace flexjit::tune
