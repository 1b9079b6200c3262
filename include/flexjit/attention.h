// flex_attention on the GPU: out = softmax(score_mod(scale · Q Kᵀ) masked by mask_mod) · V,
// per (batch, head), with GQA, an optional block mask and an optional logsumexp output.
// Semantics: PyTorch's torch.nn.attention.flex_attention (see docs/runtime.md).
//
//   Context ctx;
//   BlockMask bm = ...;  DeviceBlockMask dbm = create_block_mask(ctx, standard_mods("causal"),
//                                                               B, 1, S, S);
//   auto [out, lse] = flex_attention(ctx, q, k, v, {.mods = standard_mods("alibi"),
//                                                   .block_mask = &dbm,
//                                                   .bindings = {.buffers = {{"slopes", s}}},
//                                                   .return_lse = true});
#pragma once

#include <flexjit/export.h>

#include <flexjit/context.h>
#include <flexjit/device_tensor.h>
#include <flexjit/mods.h>
#include <flexjit/tensor.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flexjit {

class DeviceBlockMask;
struct KvCache;

// Values for the captured buffers (device tensors) and runtime parameters of a Mods, by name.
// A parameter left out takes its declared default; a buffer left out is an error.
struct ModBindings {
  std::vector<std::pair<std::string, TensorRef>> buffers;
  std::vector<std::pair<std::string, double>> params;
};

// A block configuration (docs/architecture.md, "The public config"). The fields are the tile knobs
// every tiled kernel family has; zeros take the default for the arch, dtype and head dims (and,
// with a block mask, tiles that divide its sparse blocks). `params` sets a family's own knobs by
// name, as its kernels take them; a key left out takes the default:
//   "num_splits"  decode_split (docs/kernels/decode.md): the splits of the KV range, 1 to 128
//                 (0: from the SM count and the KV length);
//   "q_tiles"     forward/sm90a_wgmma (docs/kernels/forward_sm90.md): query tiles per CTA, 1 or 2
//                 (m blocks N - 1 - j and j; the second's loads overlap the first's last tile);
//   "persistent"  forward/sm90a_wgmma: 1 = persistent CTAs (about one per SM, each claiming query
//                 tiles over every head, pairs of them with q_tiles 2), 0 = one CTA per query
//                 tile (or pair).
// `flexjit kernels --families` and kernel_families() (flexjit/kernel.h) list every family's keys. A
// key no family takes is an UnsupportedError; a call applies to each of its kernels the keys that
// kernel's family takes (block_m applies to the forward, not to decoding).
//   BlockConfig c{.block_n = 64};
//   c.params["q_tiles"] = 2;
struct BlockConfig {
  int block_m = 0, block_n = 0, num_warps = 0, num_stages = 0;
  std::map<std::string, int64_t> params = {};
};

// Device scratch memory for calls whose kernels need it (several kernels in one call, or a
// reference kernel). With `data` null, flexjit allocates what a call needs in stream order on
// the call's stream (cuMemAllocAsync / cuMemFreeAsync), so nothing waits. A caller that gives
// one must give at least flex_attention_workspace_bytes(); it must stay valid until the call's
// kernels finish on the stream.
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

// How a call's block config is chosen (docs/tuning.md). FromEnv reads FLEXJIT_AUTOTUNE
// (off | cached | search; unset: off). Off: the variant's defaults table. Cached: a winner stored
// for this device and workload (beside the kernel cache), else the defaults. Search: a stored
// winner, else every candidate config is compiled, checked against the default's output and
// timed on the call's own inputs, and the fastest is stored. The caller's nonzero BlockConfig
// fields always win over a tuned config.
enum class AutotuneMode { FromEnv, Off, Cached, Search };

// How the GPU kernels compute the score_mod's transcendentals (exp, exp2, log, log2, tanh,
// sigmoid) and their derivatives; docs/math.md lists the instructions and their errors.
// Exact: the accurate CUDA functions (tanhf, expf, ...). Approx: one hardware instruction each
// (tanh.approx.f32, ex2.approx.ftz.f32, lg2.approx.ftz.f32): softcap's tanh costs a fraction.
// Auto: FLEXJIT_MATH (auto | exact | approx) when set, else Approx for bf16 / f16 inputs (whose
// own rounding is larger than the approximations' error; verified on an H100: docs/math.md) and
// Exact for f32 (tf32, held to a tighter rule). Division, sqrt, pow
// and mask_mods are exact in every mode; the CPU backend is always exact.
enum class MathMode { Auto, Exact, Approx };
FLEXJIT_API std::string_view to_string(MathMode m);  // "auto", "exact", "approx"
FLEXJIT_API std::optional<MathMode> parse_math_mode(std::string_view s);  // those three words

// Descale factors of e4m3 (float8_e4m3fn) q, k, v: a real value is the stored e4m3 value times
// its tensor's factor. Each is an f32 tensor on q's device with one dim of extent 1 (one factor
// for the tensor) or of the tensor's heads (q: Hq, k and v: Hkv; one per head), contiguous; one
// left out is 1. Only e4m3 inputs take them (the GPU forward on sm_90a, and the CPU backend with
// host tensors); docs/attention.md "FP8 inputs".
struct Fp8Descale {
  std::optional<TensorRef> q, k, v;
};

struct AttentionOptions {
  Mods mods;  // score_mod and/or mask_mod; none means plain softmax attention
  // Tiles to visit. With a block mask, its partial tiles apply `mods.mask_mod` (or, when
  // `mods` has none, the mask_mod the block mask was built from). Without one, every tile is
  // visited and the mask_mod applied everywhere.
  const DeviceBlockMask* block_mask = nullptr;
  ModBindings bindings;
  std::optional<float> scale;  // default 1 / sqrt(head_dim_qk)
  bool return_lse = false;
  void* stream = nullptr;  // a CUstream; null is the default stream
  BlockConfig config;
  // A kernel variant by name ("sm80_mma"; `flexjit kernels` lists them); empty: chosen by the
  // arch and the inputs (FLEXJIT_LOG=kernels prints the choice and why others were passed
  // over). A named variant that cannot run the call is an UnsupportedError saying why.
  std::string variant;
  Workspace workspace;
  // A KV cache (include/flexjit/paged_kv.h): per-sequence KV lengths and, optionally, K and V in
  // page pools read through a page table. Such calls run the split-KV decode kernels for any Sq
  // (docs/kernels/decode.md). Short queries (Sq <= 16) on contiguous K / V take those kernels
  // without one when they support the call.
  const KvCache* kv_cache = nullptr;
  AutotuneMode autotune = AutotuneMode::FromEnv;
  // The forward, the backward (which must take the forward's options) and decoding alike.
  MathMode math = MathMode::Auto;
  // A debug mode for captured-buffer indices that only the device knows (bias[doc_id[q_idx]]):
  // the kernels check every load against the bound buffer's extents, an out-of-bounds load reads
  // 0, and after the launches the call synchronizes its stream and throws RuntimeError naming
  // the first bad load (buffer, index, extent, load and position; docs/attention.md, "Checking
  // buffer indices"). Slower; checked kernels are compiled and cached apart; no autotuning
  // search; not while the stream captures a graph. The forward, backward and decoding on the
  // GPU. Off: the loads are unchecked (an index outside its extent is undefined behaviour).
  bool check_buffers = false;
  // e4m3 q, k, v: their descale factors (Fp8Descale). The forward computes softmax(score_mod(
  // scale * (q_descale * k_descale * q·k))) (v_descale * V) with f32 scores and writes a bf16 out.
  Fp8Descale descale;
};

struct AttentionResult {
  DeviceTensor out;  // [B, Hq, Sq, Dv], dtype of q (bf16 for e4m3 q: attention_out_dtype)
  DeviceTensor lse;  // [B, Hq, Sq] f32, natural log; undefined unless return_lse
};

// q [B, Hq, Sq, Dqk], k [B, Hkv, Skv, Dqk], v [B, Hkv, Skv, Dv] on the context's device, any
// strides with the last dim contiguous. Asynchronous on `options.stream`. Throws RuntimeError
// for invalid inputs (with the precise problem), CompileError / UnsupportedError for mods or
// shapes flexjit cannot compile.
FLEXJIT_API AttentionResult flex_attention(Context& ctx, const TensorRef& q, const TensorRef& k,
                                           const TensorRef& v,
                                           const AttentionOptions& options = {});

// The same into caller-owned tensors: out [B, Hq, Sq, Dv] (attention_out_dtype(q.dtype), last
// dim contiguous) and
// lse [B, Hq, Sq] f32 (may be null).
FLEXJIT_API void flex_attention_into(Context& ctx, const TensorRef& q, const TensorRef& k,
                                     const TensorRef& v, const TensorRef& out, const TensorRef* lse,
                                     const AttentionOptions& options = {});

// The workspace bytes flex_attention_into needs for this call: 0 for the forward kernels except
// persistent ones (forward/sm90a_wgmma with persistent = 1, the default at head dim 64 and with
// 192-row tiles at head dims 80-128 and e4m3's on sm_90a: the work counter and a 16-byte tile slot
// per CTA and Q buffer, 4,352 bytes with alignment on 132 SMs) and 192-row tiles over a block mask
// (the union schedule: per mask batch, head and 192-row query tile 32 bytes and 4 per KV tile, used
// where the mask keeps no schedule of its own yet; docs/kernels/forward_sm90.md); the e4m3
// forward's V^T (B x Hkv x Dv x Skv rounded up to 64 bytes; docs/kernels/forward_sm90.md "FP8");
// the split-KV decode plan's partials (B x Hq x Sq x splits x (Dv + 1) floats) when the call
// decodes (docs/kernels/decode.md).
FLEXJIT_API size_t flex_attention_workspace_bytes(Context& ctx, const TensorRef& q,
                                                  const TensorRef& k, const TensorRef& v,
                                                  const AttentionOptions& options = {});

}  // namespace flexjit
