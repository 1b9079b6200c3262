// The host cost of a GPU call from C++, and where it goes: flex_attention_into on a shape whose
// kernel takes a few microseconds (so N back-to-back asynchronous calls measure the host work),
// beside the parts a call is made of, each timed the same way:
//
//   validate + plan   flex_attention_workspace_bytes (the call's checks, mod arguments, the
//                     registry's choice of variant and config; no build, no launch)
//   whole call        flex_attention_into (the above, the kernel's lookup in the memory cache,
//                     the mod parameters' upload and the launch)
//   empty launch      cuLaunchKernel of an empty kernel (the driver's floor)
//
// for the mods given (standard names; default: noop causal alibi_causal relative_bias_causal),
// each also with a causal block mask ("+mask") where it has a mask_mod.
//
//   flexjit-host-bench [--n 5000] [--repeats 7] [mods...]
// The median over repeats of (N calls, then a synchronize) / N. Needs a GPU.
#include <flexjit/attention.h>
#include <flexjit/context.h>
#include <flexjit/device_block_mask.h>
#include <flexjit/device_tensor.h>
#include <flexjit/error.h>
#include <flexjit/mods.h>

#include "device/CudaDriver.h"
#include "jit/Nvrtc.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

using namespace flexjit;

namespace {

double median_us(Context& ctx, int n, int repeats, const std::function<void()>& call) {
  for (int i = 0; i < 50; ++i)
    call();
  ctx.synchronize();
  std::vector<double> us;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i)
      call();
    ctx.synchronize();
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        n);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int n = 5000, repeats = 7;
  std::vector<std::string> names;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--n" || a == "--repeats") && i + 1 < argc) {
      (a == "--n" ? n : repeats) = std::atoi(argv[++i]);
    } else if (a == "-h" || a == "--help") {
      fmt::print("usage: flexjit-host-bench [--n 5000] [--repeats 7] [standard mod names...]\n");
      return 0;
    } else {
      names.push_back(a);
    }
  }
  if (names.empty()) names = {"noop", "causal", "alibi_causal", "relative_bias_causal"};
  try {
    Context ctx;
    const std::vector<int64_t> shape = {1, 2, 64, 64};
    DeviceTensor q = DeviceTensor::empty(ctx, DType::BF16, shape);
    DeviceTensor out = DeviceTensor::empty(ctx, DType::BF16, shape);
    DeviceTensor lse = DeviceTensor::empty(ctx, DType::F32, {1, 2, 64});
    DeviceTensor slopes = DeviceTensor::empty(ctx, DType::F32, {2});
    fmt::print("# {}, q = k = v [1, 2, 64, 64] bf16, median of {} x {} calls, us per call\n",
               ctx.device_name(), repeats, n);
    DeviceTensor bias = DeviceTensor::empty(ctx, DType::F32, {8192});
    // The causal block mask (broadcast over batch and heads) for the "+mask" rows.
    const DeviceBlockMask causal_mask = create_block_mask(
        ctx, standard_mods("causal"), 1, 1, static_cast<int>(shape[2]), static_cast<int>(shape[2]));
    fmt::print("{:<24} {:>16} {:>12}\n", "mods", "validate + plan", "whole call");
    for (const std::string& name : names) {
      for (bool with_mask : {false, true}) {
        AttentionOptions o;
        o.mods = standard_mods(name);
        if (with_mask && !o.mods.mask_mod.defined()) continue;
        o.return_lse = true;
        o.autotune = AutotuneMode::Off;
        if (with_mask) o.block_mask = &causal_mask;
        for (const Buffer& b : o.mods.buffers) {
          if (b.name() == "slopes") o.bindings.buffers.emplace_back("slopes", slopes.ref());
          if (b.name() == "bias") o.bindings.buffers.emplace_back("bias", bias.ref());
        }
        const double plan_us = median_us(ctx, n, repeats, [&] {
          (void)flex_attention_workspace_bytes(ctx, q.ref(), q.ref(), q.ref(), o);
        });
        const double call_us = median_us(ctx, n, repeats, [&] {
          flex_attention_into(ctx, q.ref(), q.ref(), q.ref(), out.ref(), &lse.ref(), o);
        });
        fmt::print("{:<24} {:>16.2f} {:>12.2f}\n", name + (with_mask ? " +mask" : ""), plan_us,
                   call_us);
      }
    }
    // The driver's floor: an empty kernel through cuLaunchKernel.
    jit::CompileRequest req;
    req.source = "extern \"C\" __global__ void fj_empty() {}\n";
    req.kernel_name = "fj_empty";
    req.arch = ctx.arch();
    req.label = "empty";
    const jit::CompiledKernel empty = jit::nvrtc_compile(req);
    CUmodule module = nullptr;
    CUfunction fn = nullptr;
    FJ_CU(cuModuleLoadData, "the empty kernel", &module, empty.cubin.data());
    FJ_CU(cuModuleGetFunction, "the empty kernel", &fn, module, "fj_empty");
    const double launch_us = median_us(ctx, n, repeats, [&] {
      FJ_CU(cuLaunchKernel, "the empty kernel", fn, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr,
            nullptr);
    });
    fmt::print("{:<24} {:>29.2f}\n", "empty launch", launch_us);
  } catch (const Error& e) {
    fmt::print(stderr, "flexjit-host-bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
