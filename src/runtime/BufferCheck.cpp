#include "runtime/BufferCheck.h"

#include <flexjit/error.h>

#include "Pipeline.h"
#include "binding/BufferCheck.h"
#include "device/CudaDriver.h"
#include "kernels/BufferChecks.h"
#include "plan/ContextImpl.h"

#include <cstdint>
#include <vector>

namespace flexjit::runtime {

DeviceBufferCheck::DeviceBufferCheck(Context& ctx, bool enabled, const Mods& mods, void* stream)
    : stream_(stream) {
  if (!wanted(enabled, mods)) return;
  impl_of(ctx).device->make_current();
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (Driver::get().cuStreamIsCapturing_(static_cast<CUstream>(stream), &status) == CUDA_SUCCESS &&
      status != CU_STREAM_CAPTURE_STATUS_NONE) {
    throw RuntimeError(
        "check_buffers cannot run while the stream captures a CUDA graph: it synchronizes the "
        "stream after the kernels to read what they recorded; run the checked call outside the "
        "capture");
  }
  // i32 words in pairs: the record's 64-bit words.
  record_ = DeviceTensor::empty(ctx, DType::I32, {2 * kBufferCheckWords});
  FJ_CU(cuMemsetD8Async, "zeroing the check_buffers record",
        reinterpret_cast<CUdeviceptr>(record_.ref().data), 0, 8 * kBufferCheckWords,
        static_cast<CUstream>(stream));
}

void DeviceBufferCheck::arm(Plan& plan) const {
  if (on()) arm_steps(plan);
}

void DeviceBufferCheck::arm_steps(Plan& plan) {
  for (PlanStep& step : plan.steps)
    kernels::set_buffer_checks(step.desc);
}

void DeviceBufferCheck::verify(const Mods& mods, const BoundModArgs& args) const {
  if (!on()) return;
  FJ_CU(cuStreamSynchronize, "the check_buffers read-back", static_cast<CUstream>(stream_));
  std::vector<int64_t> words(kBufferCheckWords);
  record_.copy_to_host(words.data());
  if (words[buffer_check::kClaimed] == 0) return;
  // The kernels numbered the load sites of the mods as the pipeline lowered them.
  throw RuntimeError(buffer_check_message(lower_mods(mods), args, words));
}

}  // namespace flexjit::runtime
