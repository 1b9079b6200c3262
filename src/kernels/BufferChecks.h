// The buffer checks of a kernel (AttentionOptions::check_buffers; binding/BufferCheck.h): the
// problem flag `check_buffers`, 1 when every captured-buffer load of the kernel's mods checks
// its indices (cuda::BufferChecks::Record), absent otherwise. Being a flag, it reaches the
// description's text, its hash and the generated source, so checked and unchecked kernels never
// share a cache entry; being absent when off, it leaves every unchecked description, hash and
// source as they were. runtime::DeviceBufferCheck::arm sets it on a plan's steps after planning,
// so a checked call runs the configs (tuned ones included) that the unchecked call would.
#pragma once

#include "codegen/cuda/ModCodegen.h"
#include "kernels/KernelDesc.h"

namespace flexjit::kernels {

inline constexpr const char* kCheckBuffersFlag = "check_buffers";

// The loads' checks in a description's source: Record when its check_buffers flag is nonzero.
inline cuda::BufferChecks buffer_checks(const KernelDesc& desc) {
  return desc.flags.get(kCheckBuffersFlag).value_or(0) != 0 ? cuda::BufferChecks::Record
                                                            : cuda::BufferChecks::Off;
}

// Sets the check_buffers flag of a description.
inline void set_buffer_checks(KernelDesc& desc) {
  desc.flags.set(kCheckBuffersFlag, 1);
}

}  // namespace flexjit::kernels
