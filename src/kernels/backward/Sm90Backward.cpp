#include "kernels/backward/Sm90Backward.h"

#include <flexjit/error.h>

#include "codegen/cuda/ModCodegen.h"
#include "codegen/cuda/Wgmma.h"
#include "device/ModuleCache.h"
#include "device/TensorMap.h"
#include "kernels/BufferChecks.h"
#include "kernels/HeadDims.h"
#include "kernels/MathMode.h"
#include "kernels/forward/Sm90Wgmma.h"
#include "util/Embedded.h"

#include <flexjit_abi.h>
#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>

namespace flexjit::kernels {

namespace {

constexpr bool is_dkdv(Family f) {
  return f == Family::BackwardDkDv;
}

// The tiles each family allows: dK/dV's kv tile and dQ's q tile are the two 64-row consumers.
struct Sm90Tiles {
  std::initializer_list<int> block_m, block_n, stages;
};
constexpr Sm90Tiles kDkDvTiles = {{64, 128}, {128}, {1, 2, 3}};
constexpr Sm90Tiles kDqTiles = {{128}, {64, 128}, {1, 2, 3}};

// dK/dV's default dQ strategy: 1 = dQ = dS K inside the dK/dV kernel, added with f32
// reductions (FlashAttention-3's plan), 0 = backward_dq's second pass (PyTorch's).
constexpr int kDefaultDqAtomic = 1;

constexpr const Sm90Tiles& tiles_of(Family f) {
  return is_dkdv(f) ? kDkDvTiles : kDqTiles;
}

bool one_of(int64_t v, std::initializer_list<int> allowed) {
  return std::find(allowed.begin(), allowed.end(), v) != allowed.end();
}

std::optional<std::string> not_in(const KernelDesc& d, const char* what, int64_t v,
                                  std::initializer_list<int> allowed) {
  if (one_of(v, allowed)) return std::nullopt;
  return fmt::format("{}/sm90a_wgmma does not support {} = {}; supported: {}", to_string(d.family),
                     what, v, fmt::join(allowed, ", "));
}

// The tile dims the backward compiles: a head dim runs in the smallest at least as large
// (kernels/HeadDims.h). 192 and 256 do not fit: dK and dV's accumulators (half a tile dim each
// per thread) with S^T and dP^T's pass the 240 registers of a consumer (live_registers), so
// head dims past 128 run on sm80_mma.
constexpr std::initializer_list<int> kTileDims = {64, 128};

// The tile dims of a problem's head dims, or the dim itself when no tile takes it (a problem
// that problem_reason refuses; its checks come first).
int tile_qk(const KernelDesc& d) {
  return tile_head_dim(d.head_dim_qk, kTileDims).value_or(d.head_dim_qk);
}
int tile_v(const KernelDesc& d) {
  return tile_head_dim(d.head_dim_v, kTileDims).value_or(d.head_dim_v);
}

std::optional<std::string> problem_reason(const KernelDesc& p) {
  if (auto r = wgmma_problem_reason(p, kTileDims)) return r;
  // Deterministic buffer gradients (a dK/dV problem flag) are sm80_mma's fixed-order reduction;
  // this variant adds them with fp32 atomics.
  if (is_deterministic(p)) {
    return std::string(
        "deterministic buffer gradients run on sm80_mma (this variant adds them with fp32 "
        "atomics)");
  }
  return std::nullopt;
}

bool dq_atomic(const KernelDesc& d) {
  return d.config.get("dq_atomic").value_or(0) != 0;
}

// Accumulator registers per consumer thread (an m64nN accumulator is N / 2 floats): S and dP
// (dK/dV: S^T, dP^T over the q tile; dQ: over the kv tile) and the gradients the CTA sums. With
// dq_atomic, each consumer's half of dQ's columns (head_dim_qk / 4) is live with the packed
// P^T, dS^T (block_m / 2) while the dV / dK products run, after S^T and dP^T are gone.
int64_t live_registers(const KernelDesc& d) {
  const int64_t bm = d.config.at("block_m"), bn = d.config.at("block_n");
  const int64_t qk = tile_qk(d), v = tile_v(d);
  if (is_dkdv(d.family)) {
    const int64_t transient = dq_atomic(d) ? std::max<int64_t>(bm, bm / 2 + qk / 4) : bm;
    return transient + qk / 2 + v / 2;
  }
  return bn / 2 * 2 + qk / 2;
}

int sm90_bwd_smem(const KernelDesc& d) {
  const int bm = d.config.at_int("block_m"), bn = d.config.at_int("block_n");
  const int stages = d.config.at_int("num_stages");
  return is_dkdv(d.family)
             ? fj_bwd_dkdv_sm90_smem_bytes(bm, bn, tile_qk(d), tile_v(d), dtype_size(d.dtype),
                                           stages, dq_atomic(d) ? 1 : 0)
             : fj_bwd_dq_sm90_smem_bytes(bm, bn, tile_qk(d), tile_v(d), dtype_size(d.dtype),
                                         stages);
}

// Static shared memory of the dK/dV kernel beside its private buffer-gradient copy, at its
// largest (the mods are not known here): the consumer warps' diagonal tables
// (fj_dkdv_sm90_diag_tables) as if the mods had both a diagonal gradient site, FjDiagGrad's
// (block_m + 22) * 9 floats per warp, and a diagonal load, FjDiagLoads' round_up(block_m + 15,
// 32); 8 consumer warps.
int sm90_dkdv_static_smem_bound(const KernelDesc& d) {
  const int bm = d.config.at_int("block_m");
  return 4 * 8 * ((bm + 22) * 9 + (bm + 15 + 31) / 32 * 32);
}

Params make_config(int block_m, int block_n, int num_stages) {
  return {{"block_m", block_m}, {"block_n", block_n}, {"num_stages", num_stages}};
}

// dK/dV's config also says how dQ is made: dq_atomic = 1 adds dQ = dS K into the workspace's
// f32 accumulator from this kernel (backward_dq/atomic_convert writes dq), 0 leaves it to
// backward_dq's second pass.
Params make_dkdv_config(int block_m, int block_n, int num_stages, int dq_atomic) {
  Params p = make_config(block_m, block_n, num_stages);
  p.set("dq_atomic", dq_atomic);
  return p;
}

}  // namespace

template <Family F>
std::string_view BackwardSm90Wgmma<F>::summary() const {
  if constexpr (is_dkdv(F)) {
    return "one CTA per 128-key tile over the GQA group's q tiles: TMA, producer / consumer "
           "warpgroups, S^T, dP^T, dV += P^T dO, dK += dS^T Q on wgmma; bf16/f16; head dims "
           "multiples of 8 up to 128 (tiles 64/128); sm_90a";
  } else {
    return "one CTA per 128-query tile over its KV tiles: TMA, producer / consumer warpgroups, "
           "S, dP, dQ += dS K on wgmma; bf16/f16; head dims multiples of 8 up to 128 (tiles "
           "64/128); sm_90a";
  }
}

template <Family F>
std::optional<std::string> BackwardSm90Wgmma<F>::unsupported(const KernelDesc& problem,
                                                             const InputFacts& facts) const {
  if (auto r = problem_reason(problem)) return r;
  if (auto r = wgmma_input_reason(facts)) return r;
  // The tiles the block mask's sparse blocks must be multiples of: dK/dV's 128 keys (its q tile
  // shrinks to 64), dQ's 128 queries (its kv tile shrinks to 64).
  const int q_tile = is_dkdv(F) ? 64 : 128, kv_tile = is_dkdv(F) ? 128 : 64;
  if (facts.mask_q_block != 0 && facts.mask_q_block % q_tile != 0) {
    return fmt::format(
        "the block mask's q block size {} is not a multiple of {} (this kernel's "
        "smallest q tile)",
        facts.mask_q_block, q_tile);
  }
  if (facts.mask_kv_block != 0 && facts.mask_kv_block % kv_tile != 0) {
    return fmt::format(
        "the block mask's kv block size {} is not a multiple of {} (this kernel's "
        "smallest kv tile)",
        facts.mask_kv_block, kv_tile);
  }
  return std::nullopt;
}

template <Family F>
void BackwardSm90Wgmma<F>::validate(const KernelDesc& d) const {
  if (auto r = problem_reason(d)) throw UnsupportedError(*r);
  const std::string fv = d.family_variant();
  // No num_warps: the warpgroups follow from the tiles.
  if constexpr (is_dkdv(F)) {
    require_keys(d, {"block_m", "block_n", "dq_atomic", "num_stages"});
    const int64_t a = d.config.at("dq_atomic");
    if (a != 0 && a != 1) {
      throw UnsupportedError(fmt::format("{}: dq_atomic must be 0 or 1, not {}", fv, a));
    }
    if (a == 1 && d.config.at("block_m") != 64) {
      throw UnsupportedError(fmt::format(
          "{}: dq_atomic = 1 takes block_m = 64 (the dS^T tile of a 64-query step is the dQ "
          "products' A operand); got block_m = {}",
          fv, d.config.at("block_m")));
    }
  } else {
    require_keys(d, {"block_m", "block_n", "num_stages"});
  }
  check_bufgrad_smem_flag(d);
  const Sm90Tiles& t = tiles_of(F);
  if (auto r = not_in(d, "block_m", d.config.at("block_m"), t.block_m)) throw UnsupportedError(*r);
  if (auto r = not_in(d, "block_n", d.config.at("block_n"), t.block_n)) throw UnsupportedError(*r);
  if (auto r = not_in(d, "num_stages", d.config.at("num_stages"), t.stages)) {
    throw UnsupportedError(*r);
  }
  for (const char* flag : {"divisible", "full_blocks"}) {
    auto v = d.flags.get(flag);
    if (!v || (*v != 0 && *v != 1)) {
      throw UnsupportedError(fmt::format("{} needs flag '{}' = 0 or 1 ({})", fv, flag, d.str()));
    }
  }
  if (auto r = fast_math_flag_error(d)) throw UnsupportedError(*r);
  // The accumulators must fit the consumers' 240 registers with room for addresses, indices and
  // the packed A operands.
  if (const int64_t live = live_registers(d); live > 200) {
    throw UnsupportedError(fmt::format(
        "{}: block_m = {}, block_n = {} with head dims {}/{} (tiles {}/{}) need {} accumulator "
        "registers per consumer thread, more than the 200 of 240 this kernel allows; use {} = 64",
        fv, d.config.at("block_m"), d.config.at("block_n"), d.head_dim_qk, d.head_dim_v, tile_qk(d),
        tile_v(d), live, is_dkdv(F) ? "block_m" : "block_n"));
  }
  const int smem = sm90_bwd_smem(d);
  const int limit = cuda::max_smem_per_block(d.arch);
  if (smem > limit) {
    throw UnsupportedError(fmt::format(
        "{}: config {} needs {} bytes of shared memory for head dims {}/{} (tiles {}/{}), more "
        "than the {} bytes a block may use on {}; lower num_stages",
        fv, d.config.str(), smem, d.head_dim_qk, d.head_dim_v, tile_qk(d), tile_v(d), limit,
        d.arch.str()));
  }
}

template <Family F>
Params BackwardSm90Wgmma<F>::default_config(const KernelDesc& p) const {
  // Two stages (dK/dV's 2 and 3 measured within 1 %, docs/kernels/backward_sm90.md "Design notes").
  // dQ's kv tile: 128 keys at d <= 64; at d = 128, 64 here (the bounds checks of ragged lengths and
  // a mask_mod's loads spill with 128: document_causal 20 B) and 128 where resolve_config sees
  // lengths that divide the tiles.
  const int d = std::max(tile_qk(p), tile_v(p));  // by the tile dims
  if constexpr (is_dkdv(F)) {
    return make_dkdv_config(64, 128, 2, kDefaultDqAtomic);
  } else {
    return d <= 64 ? make_config(128, 128, 2) : make_config(128, 64, 2);
  }
}

template <Family F>
std::vector<Params> BackwardSm90Wgmma<F>::config_space(const KernelDesc& p) const {
  std::vector<Params> grid;
  const Sm90Tiles& t = tiles_of(F);
  for (int bm : t.block_m)
    for (int bn : t.block_n)
      for (int s : t.stages) {
        if constexpr (is_dkdv(F)) {
          for (int a : {0, 1})
            grid.push_back(make_dkdv_config(bm, bn, s, a));
        } else {
          grid.push_back(make_config(bm, bn, s));
        }
      }
  return valid_configs(*this, p, grid);
}

template <Family F>
Params BackwardSm90Wgmma<F>::resolve_config(const KernelDesc& problem, const Params& overrides,
                                            const InputFacts& facts) const {
  Params c = apply_overrides(*this, default_config(problem), overrides);
  if constexpr (is_dkdv(F)) {
    // A q tile of 128 asked for without a dQ strategy: the second pass (dq_atomic takes 64).
    if (c.at("block_m") != 64 && !overrides.has("dq_atomic")) c.set("dq_atomic", 0);
  } else {
    // Lengths that divide 128 x 128 tiles (the divisible build, no bounds checks): dQ's
    // 128-key tile, 1.13-1.19x faster than 64 on the H100's masked cases at d = 128 and 1.01x
    // without a mask (docs/kernels/backward_sm90.md "Design notes").
    const bool divides = facts.seqlen_q >= 0 && facts.seqlen_kv >= 0 && facts.seqlen_q % 128 == 0 &&
                         facts.seqlen_kv % 128 == 0;
    if (divides && !overrides.has("block_n")) c.set("block_n", 128);
  }
  if (facts.mask_q_block == 0) return c;
  // The tile that is not the consumers' may shrink to divide the block mask's sparse blocks.
  if constexpr (is_dkdv(F)) {
    fit_tile_to_block(c, "block_m", facts.mask_q_block, overrides, {128, 64});
  } else {
    fit_tile_to_block(c, "block_n", facts.mask_kv_block, overrides, {128, 64});
  }
  if (facts.mask_q_block % c.at("block_m") != 0 || facts.mask_kv_block % c.at("block_n") != 0) {
    throw UnsupportedError(fmt::format(
        "the block mask's sparse blocks ({}x{}) are not multiples of {}/sm90a_wgmma's {}x{} "
        "tiles; build the mask with a block size that is a multiple of 128",
        facts.mask_q_block, facts.mask_kv_block, to_string(F), c.at("block_m"), c.at("block_n")));
  }
  return c;
}

template <Family F>
void BackwardSm90Wgmma<F>::specialize(KernelDesc& d, const InputFacts& facts) const {
  specialize_divisible(d, facts);
  if constexpr (is_dkdv(F)) fit_bufgrad_smem(d, sm90_bwd_smem(d) + sm90_dkdv_static_smem_bound(d));
}

template <Family F>
std::vector<TemplateText> BackwardSm90Wgmma<F>::templates() const {
  std::vector<TemplateText> t = common_templates();
  // backward_sm80.cuh brings the element step (fj_bwd_element); its kernels need FJ_BWD_*
  // defines, and these modules set FJ_BWD_SM90_* instead (generate()).
  for (const char* name : {"mma_sm80.cuh", "attention_sm80.cuh", "backward_sm80.cuh",
                           "wgmma_sm90.cuh", "backward_sm90.cuh", "sink_grad.cuh"})
    t.push_back({name, embedded::template_text(name), false});
  return t;
}

template <Family F>
std::vector<std::string> BackwardSm90Wgmma<F>::entry_points() const {
  if constexpr (is_dkdv(F)) {
    return {"flexjit_bwd_dkdv", "flexjit_bwd_sink_grad"};  // the second: sink_grad.cuh
  } else {
    return {"flexjit_bwd_dq"};
  }
}

template <Family F>
cuda::GeneratedSource BackwardSm90Wgmma<F>::generate(const Mods& mods,
                                                     const KernelDesc& desc) const {
  validate(desc);
  mods.check();
  KernelDesc d = desc;
  d.config.set("num_warps", 8);  // the consumers' warps (the config struct's field)
  std::string config =
      fmt::format("#define {} 1\n", is_dkdv(F) ? "FJ_BWD_SM90_DKDV" : "FJ_BWD_SM90_DQ");
  config += sm90_config_struct(
      mods, d, tile_qk(desc), tile_v(desc),
      {fmt::format("static constexpr bool kDqAtomic = {};", dq_atomic(d) ? "true" : "false")});
  const int bm = desc.config.at_int("block_m"), bn = desc.config.at_int("block_n");
  // dK/dV: S^T, dP^T (n = block_m) from shared memory; dV, dK (n = head dims) with A in
  // registers. dQ: S, dP (n = block_n); dQ (n = head_dim_qk).
  config.push_back('\n');
  // dq_atomic adds dQ = dS K, half its columns per consumer, both operands MN-major in shared
  // memory.
  const int qk = tile_qk(desc), v = tile_v(desc);
  config += is_dkdv(F)
                ? cuda::wgmma_wrappers(desc.dtype, {bm}, {qk, v},
                                       dq_atomic(d) ? std::vector<int>{qk / 2} : std::vector<int>{})
                : cuda::wgmma_wrappers(desc.dtype, {bn}, {qk});
  return assemble_variant_source(
      *this, desc, mods, config,
      is_dkdv(F) ? "backward dK/dV kernel `flexjit_bwd_dkdv`"
                 : "backward dQ kernel `flexjit_bwd_dq`",
      "mods",
      cuda::generate_mod_grad_functions(mods, math_functions(desc), cuda::GradAccumulation::Atomic,
                                        buffer_checks(desc), bufgrad_smem_floats(desc)));
}

template <Family F>
unsigned BackwardSm90Wgmma<F>::smem_bytes(const KernelDesc& desc) const {
  return static_cast<unsigned>(sm90_bwd_smem(desc));
}

template <Family F>
std::vector<Launch> BackwardSm90Wgmma<F>::launches(const KernelDesc& desc, const BackwardInputs& in,
                                                   void* workspace) const {
  FJ_ASSERT(workspace != nullptr, "a backward kernel runs without the preprocess's workspace");
  FJ_ASSERT(!is_dkdv(F) ? !in.dq_atomic : in.dq_atomic == dq_atomic(desc),
            "the sm_90a dK/dV kernel launched with a dQ accumulator its config does not match");
  const QkvShape& s = in.shape;
  const int bm = desc.config.at_int("block_m"), bn = desc.config.at_int("block_n");
  FjBwdTmaMaps maps;
  maps.q = runtime::encode_bhsd_tma(in.q, bm, "q");
  maps.dout = runtime::encode_bhsd_tma(in.dout, bm, "dout");
  maps.k = runtime::encode_bhsd_tma(in.k, bn, "k");
  maps.v = runtime::encode_bhsd_tma(in.v, bn, "v");
  Launch l;
  l.block = {384, 1, 1};
  l.smem_bytes = smem_bytes(desc);
  FjBwdArgs bwd_args = make_bwd_args(in, workspace, desc.flags.at("full_blocks") != 0);
  // dK/dV under a block mask: the kv heads inner (x) and the KV tiles next (y), so that a batch's
  // tile 0 of every head starts first, the heaviest under a causal mask; the kernel reads the
  // order from FjBwdArgs::dkdv_heads_inner (docs/kernels/backward_sm90.md "Block order"). Past
  // gridDim.y's limit (runtime::kMaxGridDimYZ: 65535 KV tiles, 8.4 M keys), the grid order.
  const int64_t tiles = (s.seqlen_kv + bn - 1) / bn;
  bwd_args.dkdv_heads_inner =
      is_dkdv(F) && bwd_args.mask_t.kv_num_blocks != nullptr && tiles <= runtime::kMaxGridDimYZ ? 1
                                                                                                : 0;
  l.args.add(bwd_args);
  l.args.add_bytes(in.mod_params.data(), in.mod_params.size() * sizeof(uint64_t));
  if constexpr (is_dkdv(F)) {
    FJ_ASSERT(in.bufgrad_slice_elems <= bufgrad_smem_floats(desc) || bufgrad_smem_floats(desc) == 0,
              "the dK/dV kernel's private buffer-gradient copy is smaller than the bound buffers");
    l.entry_point = "flexjit_bwd_dkdv";
    const unsigned n = static_cast<unsigned>(tiles), heads = static_cast<unsigned>(s.heads_kv);
    l.grid = bwd_args.dkdv_heads_inner != 0
                 ? runtime::Dim3{heads, n, static_cast<unsigned>(s.batch)}
                 : runtime::Dim3{n, heads, static_cast<unsigned>(s.batch)};
    l.args.add_bytes(in.grad_params.data(), in.grad_params.size() * sizeof(uint64_t));
  } else {
    l.entry_point = "flexjit_bwd_dq";
    l.grid = {static_cast<unsigned>((s.seqlen_q + bm - 1) / bm), static_cast<unsigned>(s.heads_q),
              static_cast<unsigned>(s.batch)};
  }
  l.args.add(maps);
  std::vector<Launch> out;
  out.push_back(std::move(l));
  if (is_dkdv(F) && in.sink_grads) {  // fp32 atomics, as this variant's buffer gradients
    out.push_back(backward_sink_grad_launch(in, workspace, desc.flags.at("full_blocks") != 0,
                                            in.grad_params, false));
  }
  return out;
}

template class BackwardSm90Wgmma<Family::BackwardDkDv>;
template class BackwardSm90Wgmma<Family::BackwardDq>;

}  // namespace flexjit::kernels
