// The backward of flex_attention on the GPU: dQ, dK, dV and the gradients of the captured float
// buffers that the score_mod reads, with the semantics of torch.nn.attention.flex_attention's
// backward (docs/backward.md).
//
//   auto [out, lse] = flex_attention(ctx, q, k, v, {.mods = m, .return_lse = true});
//   ... loss, dout ...
//   BackwardResult g = flex_attention_backward(ctx, q, k, v, out, lse, dout, {.mods = m});
//   // g.dq, g.dk, g.dv; g.buffer_grads: {"slopes", f32 tensor of the slopes' shape}, ...
//
// The call takes the same AttentionOptions as the forward (mods, block mask, bindings, scale,
// stream, variant, math); they must be the forward's. It needs the forward's lse (return_lse =
// true). The math mode (docs/math.md) applies to the score_mod it recomputes and its derivatives.
#pragma once

#include <flexjit/export.h>

#include <flexjit/attention.h>
#include <flexjit/context.h>
#include <flexjit/device_tensor.h>
#include <flexjit/tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace flexjit {

struct BackwardOptions {
  // The incoming gradient of the lse ([B, Hq, Sq] f32) when the loss uses the forward's lse;
  // null: none.
  const TensorRef* dlse = nullptr;
  // Gradients bitwise the same on every run of the same call (same inputs, device, variant,
  // config and flexjit version). false (the default): the captured float buffers' gradients are
  // accumulated with fp32 atomics, whose order (and so the last bits) can change between runs.
  // true: each 16-key slice of the dK/dV kernel adds its contributions, in a fixed order, into
  // its own partial copy of the buffers in the workspace, and a reduction kernel sums the copies
  // in a fixed order. It costs workspace, 4 * B * Hkv * round_up(Skv, 128) / 16 * (the float
  // buffers' element count, rounded up to 4) bytes, and time (docs/backward.md). dK and dV are
  // deterministic in both modes; dQ too with the second pass, which deterministic = true picks
  // (with dq_mode = Atomic it is a RuntimeError). With false, dQ follows dq_mode.
  bool deterministic = false;
  // How dQ is computed: a second pass over the KV tiles (deterministic, no workspace beyond
  // lse2 / delta), or by the dK/dV kernel itself into an f32 accumulator of
  // 4 * B * Hq * round_up(Sq, 128) * Dqk bytes (fp32 atomics on sm80_mma, bulk reductions on
  // sm90a_wgmma: the order of the additions, so dQ's last bits, can change between runs) plus a
  // convert pass. Auto: the dK/dV variant's default — the second pass for sm80_mma, dQ in the
  // dK/dV kernel for sm90a_wgmma (the sm_90a default: faster but for the sparsest masks,
  // docs/backward.md).
  enum class DqMode { Auto, SecondPass, Atomic };
  DqMode dq_mode = DqMode::Auto;
};

struct BackwardResult {
  DeviceTensor dq;  // [B, Hq, Sq, Dqk], dtype of q
  DeviceTensor dk;  // [B, Hkv, Skv, Dqk]
  DeviceTensor dv;  // [B, Hkv, Skv, Dv]
  // One per captured float buffer (f32 / f16 / bf16) of the mods, in declaration order: f32, the
  // bound buffer's shape, contiguous. Integer and bool buffers and params get none.
  std::vector<std::pair<std::string, DeviceTensor>> buffer_grads;
};

// Caller-owned gradients: dq / dk / dv of q / k / v's shapes and dtypes (last dim contiguous,
// rows 16-byte aligned), and for every captured float buffer an f32 tensor of the bound
// buffer's shape, contiguous, by name (each is overwritten).
struct BackwardOutputs {
  TensorRef dq, dk, dv;
  std::vector<std::pair<std::string, TensorRef>> buffer_grads;
};

// q, k, v as for flex_attention; out [B, Hq, Sq, Dv] and lse [B, Hq, Sq] f32 from the forward
// with the same options; dout of out's shape and q's dtype (last dim contiguous). Asynchronous
// on options.stream. Throws RuntimeError for invalid inputs (naming the tensor and what was
// expected) before any launch, CompileError / UnsupportedError for mods or shapes it cannot
// compile. CPU tensors are not accepted (the CPU backward is cpu::cpu_attention_backward).
FLEXJIT_API BackwardResult flex_attention_backward(Context& ctx, const TensorRef& q,
                                                   const TensorRef& k, const TensorRef& v,
                                                   const TensorRef& out, const TensorRef& lse,
                                                   const TensorRef& dout,
                                                   const AttentionOptions& options = {},
                                                   const BackwardOptions& backward = {});

FLEXJIT_API void flex_attention_backward_into(Context& ctx, const TensorRef& q, const TensorRef& k,
                                              const TensorRef& v, const TensorRef& out,
                                              const TensorRef& lse, const TensorRef& dout,
                                              const BackwardOutputs& grads,
                                              const AttentionOptions& options = {},
                                              const BackwardOptions& backward = {});

// Starts building the kernels that flex_attention_backward(_into) will need for this call on a
// background thread of the context, and returns at once: how many kernels it queued (0 when
// they are built or queued already, or the early start is off). Call it as soon as the
// backward's arguments are known, before the forward (a training step: the forward and the
// rest of the model run while the backward's kernels compile); the backward then finds them
// built, or waits for the compiles in flight, never compiling one twice. It changes no result:
// the backward plans and checks its call itself and gets the kernels it would have built.
//
//   flex_attention_backward_prepare(ctx, q, k, v, opts, bwd);   // returns at once
//   auto [out, lse] = flex_attention(ctx, q, k, v, opts);       // compiles meanwhile
//   ... the rest of the model, the loss ...
//   flex_attention_backward(ctx, q, k, v, out, lse, dout, opts, bwd);
//
// The arguments are the backward's (the forward's options, with the backward's config); only
// q, k and v's shapes, dtypes and layouts are read, not their data. The background thread
// compiles on up to FLEXJIT_COMPILE_THREADS - 1 threads (one is the forward's); nothing is queued
// with FLEXJIT_COMPILE_THREADS=1, with caching disabled (FLEXJIT_DISABLE_CACHE=1,
// ContextOptions::disable_cache), for CPU tensors or an empty call. Tuned configs are looked up,
// never searched. A kernel that fails to build is reported by the backward, not here; invalid
// inputs throw what the backward would. The Context's destructor waits for the compiles in
// flight (at most one compile's time) and drops the queued ones; so does process exit.
// docs/caching.md "First call".
FLEXJIT_API size_t flex_attention_backward_prepare(Context& ctx, const TensorRef& q,
                                                   const TensorRef& k, const TensorRef& v,
                                                   const AttentionOptions& options = {},
                                                   const BackwardOptions& backward = {});

// The workspace bytes flex_attention_backward_into needs for this call (AttentionOptions::
// workspace): the lse2 / delta arrays, 8 * B * Hq * round_up(Sq, 128), the dQ accumulator
// when dQ is added with atomics, and the partial buffer gradients with `deterministic`.
FLEXJIT_API size_t flex_attention_backward_workspace_bytes(Context& ctx, const TensorRef& q,
                                                           const TensorRef& k, const TensorRef& v,
                                                           const AttentionOptions& options = {},
                                                           const BackwardOptions& backward = {});

}  // namespace flexjit
