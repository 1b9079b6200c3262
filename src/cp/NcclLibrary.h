// NCCL, loaded with dlopen on first use, as device/CudaDriver.h loads the CUDA driver.
//
// flexjit never links NCCL: the library, the CLI and every single-GPU call must work where there
// is none, and where there is one it often lives inside a Python package (nvidia-nccl-cu13:
// site-packages/nvidia/nccl/lib/libnccl.so.2), off the loader's path. The first use looks, in
// order, at:
//   1. a libnccl.so.2 the process already loaded (torch.distributed, the caller's own link):
//      that copy is used, so flexjit and the caller share one NCCL;
//   2. $FLEXJIT_NCCL_LIBRARY, a path to the library file;
//   3. "libnccl.so.2" through the dynamic loader (LD_LIBRARY_PATH, the ldconfig cache);
//   4. site-packages/nvidia/nccl/lib/libnccl.so.2 of the Python environments at $VIRTUAL_ENV,
//      $CONDA_PREFIX and the parent of every bin/ folder on $PATH (lib/python3.*/).
// When none loads, Nccl::require() throws a RuntimeError listing every place tried.
//
// The NCCL ABI used (stable since NCCL 2.7) is declared here, so no nccl.h is needed to build.
#pragma once

#include <cstddef>
#include <string>

struct ncclComm;
struct CUstream_st;

namespace flexjit::cp {

using NcclComm = ::ncclComm*;
using NcclStream = ::CUstream_st*;
using NcclResult = int;  // ncclResult_t: ncclSuccess = 0
inline constexpr NcclResult kNcclSuccess = 0;

struct NcclUniqueIdBytes {  // ncclUniqueId, passed by value
  char internal[128];
};

// ncclDataType_t values (nccl.h).
enum NcclDataType : int {
  kNcclInt8 = 0,
  kNcclUint8 = 1,
  kNcclInt32 = 2,
  kNcclFloat16 = 6,
  kNcclFloat32 = 7,
  kNcclBfloat16 = 9,
};
// ncclRedOp_t: ncclSum.
inline constexpr int kNcclSum = 0;

// X(name, return type, parameter list): every entry point flexjit uses.
#define FLEXJIT_NCCL_FUNCTIONS(X)                                                                \
  X(ncclGetVersion, NcclResult, (int*))                                                          \
  X(ncclGetErrorString, const char*, (NcclResult))                                               \
  X(ncclGetUniqueId, NcclResult, (NcclUniqueIdBytes*))                                           \
  X(ncclCommInitRank, NcclResult, (NcclComm*, int, NcclUniqueIdBytes, int))                      \
  X(ncclCommInitAll, NcclResult, (NcclComm*, int, const int*))                                   \
  X(ncclCommDestroy, NcclResult, (NcclComm))                                                     \
  X(ncclCommCount, NcclResult, (NcclComm, int*))                                                 \
  X(ncclCommUserRank, NcclResult, (NcclComm, int*))                                              \
  X(ncclCommCuDevice, NcclResult, (NcclComm, int*))                                              \
  X(ncclAllGather, NcclResult, (const void*, void*, size_t, int, NcclComm, NcclStream))          \
  X(ncclAllReduce, NcclResult, (const void*, void*, size_t, int, int, NcclComm, NcclStream))     \
  X(ncclReduceScatter, NcclResult, (const void*, void*, size_t, int, int, NcclComm, NcclStream)) \
  X(ncclSend, NcclResult, (const void*, size_t, int, int, NcclComm, NcclStream))                 \
  X(ncclRecv, NcclResult, (void*, size_t, int, int, NcclComm, NcclStream))                       \
  X(ncclGroupStart, NcclResult, ())                                                              \
  X(ncclGroupEnd, NcclResult, ())

class Nccl {
 public:
  // The process-wide instance; the first call searches and loads the library (never throws).
  static const Nccl& get();

  bool available() const { return available_; }
  // Every place tried and why each failed, when !available().
  const std::string& unavailable_reason() const { return reason_; }
  // Which file was loaded ("libnccl.so.2 (already loaded)", a path) and its version (22809).
  const std::string& loaded_from() const { return loaded_from_; }
  int version() const { return version_; }

  // RuntimeError "NCCL unavailable: <reason>" unless available().
  void require() const;

#define FLEXJIT_NCCL_MEMBER(name, ret, params) ret(*name##_) params = nullptr;
  FLEXJIT_NCCL_FUNCTIONS(FLEXJIT_NCCL_MEMBER)
#undef FLEXJIT_NCCL_MEMBER

  Nccl(const Nccl&) = delete;
  Nccl& operator=(const Nccl&) = delete;

 private:
  Nccl();
  bool resolve(void* lib, const std::string& from);
  bool available_ = false;
  std::string reason_;
  std::string loaded_from_;
  int version_ = 0;
};

// RuntimeError "<call> failed: <NCCL's error string>" unless r is ncclSuccess; `what` says
// what the call was for ("the ring's K / V exchange of step 2").
void nccl_check(NcclResult r, const char* call, const std::string& what = {});

}  // namespace flexjit::cp

// Calls an NCCL entry point through the loaded table and checks its result.
#define FJ_NCCL(name, what, ...) \
  ::flexjit::cp::nccl_check(::flexjit::cp::Nccl::get().name##_(__VA_ARGS__), #name, (what))
