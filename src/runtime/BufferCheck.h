// AttentionOptions::check_buffers on the device (binding/BufferCheck.h has the record and its
// words): the record of a call, the flag on its plan's kernels, and the read-back after them.
//
//   DeviceBufferCheck check(ctx, options.check_buffers, mods, options.stream);
//   mod_params = pack_mod_params(mods, bound, check.record());   // extents + the record
//   Plan plan = plan_...(...);  check.arm(plan);                 // checked kernels
//   build_plan(...); launch_plan(...);
//   check.verify(mods, bound);   // synchronizes; RuntimeError naming the first bad load
#pragma once

#include <flexjit/context.h>
#include <flexjit/device_tensor.h>
#include <flexjit/mods.h>

#include "binding/ModArgs.h"
#include "plan/Plan.h"

namespace flexjit::runtime {

class DeviceBufferCheck {
 public:
  // On when `enabled` and `mods` declare a captured buffer (without one there is no load to
  // check, and the call runs its unchecked kernels). On: allocates the record and zeroes it on
  // `stream`; RuntimeError if `stream` is capturing a CUDA graph (the check synchronizes it).
  DeviceBufferCheck(Context& ctx, bool enabled, const Mods& mods, void* stream);
  // Whether a call with `enabled` and `mods` runs checked kernels (the constructor's "on").
  static bool wanted(bool enabled, const Mods& mods) { return enabled && !mods.buffers.empty(); }
  // Sets the check_buffers flag on every step of `plan` (arm's work, for a caller that plans a
  // checked call's kernels without running them: the backward's early start).
  static void arm_steps(Plan& plan);

  bool on() const { return record_.defined(); }
  // The record's device address for pack_mod_params; null when off.
  void* record() const { return on() ? record_.ref().data : nullptr; }
  // Sets the check_buffers flag (kernels/BufferChecks.h) on every step of `plan` when on. After
  // planning, so the checked kernels take the configs the unchecked call would.
  void arm(Plan& plan) const;
  // When on, after the plan's launches: synchronizes the stream and reads the record; a claimed
  // one is a RuntimeError with buffer_check_message(mods, args, record).
  void verify(const Mods& mods, const BoundModArgs& args) const;

 private:
  DeviceTensor record_;
  void* stream_ = nullptr;
};

}  // namespace flexjit::runtime
