// What a compiled kernel uses of an SM: registers, spills, stack, static shared memory.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace flexjit::jit {

// -1 means "not reported".
struct ResourceUsage {
  int registers = -1;
  int static_shared_bytes = -1;
  int stack_frame_bytes = -1;
  int spill_store_bytes = -1;
  int spill_load_bytes = -1;
  int max_threads_per_block = -1;  // from __launch_bounds__, when the kernel has one
  // Why ptxas serialized the kernel's wgmma (each one waited for before the next issues: a
  // Hopper kernel at a fraction of its speed), e.g. "C7512: insufficient register resources";
  // empty when it did not (or the log did not say).
  std::string wgmma_serialized;
  // "168 registers, 0 B spills, 0 B stack, 0 B static smem" (+ ", wgmma serialized (...)")
  std::string str() const;
};

// Reads the usage of entry function `kernel` (its symbol name) from the ptxas verbose output
// that NVRTC puts in the program log when compiled with --ptxas-options=-v. Fields the log does
// not mention stay -1. ptxas's "Potential Performance Loss: wgmma.mma_async instructions are
// serialized ..." remark for the kernel fills wgmma_serialized.
ResourceUsage usage_from_ptxas_log(std::string_view log, std::string_view kernel);

// Reads what the cubin's ELF records for `kernel`: registers and stack frame (.nv.info
// EIATTR_REGCOUNT / EIATTR_FRAME_SIZE) and max threads (EIATTR_MAX_THREADS). Spills and static
// shared memory are not recorded there; they stay -1. A malformed cubin gives all -1.
ResourceUsage usage_from_cubin(const std::vector<char>& cubin, std::string_view kernel);

// The SM version the cubin was built for, from the ELF header's e_flags (90 for sm_90 and
// sm_90a); -1 when `cubin` is not a CUDA ELF.
int cubin_sm_version(const std::vector<char>& cubin);

}  // namespace flexjit::jit
