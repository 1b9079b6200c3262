// The output tensors of a family's launches, as the tuner (tune/StepTuner.h) compares them
// between a candidate config and the default one. A description of the kernels' outputs, so it
// lives with the kernels. A family states them by specializing TuningOutputs for its inputs type
// next to that type (kernels/forward/Forward.h does); without one, candidates are timed but their
// outputs are not compared (the tuning log says so). The families of one inputs type (the
// backward's three) tell their outputs apart by `family`.
#pragma once

#include <flexjit/tensor.h>

#include "kernels/KernelDesc.h"

#include <vector>

namespace flexjit::kernels {

template <typename Inputs>
struct TuningOutputs {
  static constexpr bool kCompared = false;
  // What a step of `family` writes: compared with the default's.
  static std::vector<TensorRef> of(const Inputs&, Family) { return {}; }
  // What a step of `family` adds into (atomics) rather than writes: zeroed before every run of
  // a candidate, so that each starts where the call's own launch starts.
  static std::vector<TensorRef> accumulated(const Inputs&, Family) { return {}; }
};

}  // namespace flexjit::kernels
