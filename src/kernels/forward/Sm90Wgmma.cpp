#include "kernels/forward/Sm90Wgmma.h"

#include <flexjit/error.h>

#include "codegen/cuda/ModCodegen.h"
#include "codegen/cuda/SourceWriter.h"
#include "codegen/cuda/Wgmma.h"
#include "device/MaskScheduleCache.h"
#include "device/TensorMap.h"
#include "ir/Visitor.h"
#include "kernels/HeadDims.h"
#include "kernels/MathMode.h"
#include "kernels/forward/ForwardArgs.h"
#include "kernels/forward/Sm80Mma.h"
#include "kernels/forward_companions/Fp8Transpose.h"
#include "kernels/forward_companions/UnionSchedule.h"
#include "util/Embedded.h"

#include <flexjit_abi.h>
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <optional>
#include <tuple>

namespace flexjit::kernels {

namespace {

// block_m 192: three consumer warpgroups (no ping-pong, 160 registers each) for the
// softmax-bound head dim 64; block_n 192: the wider KV tile FlashAttention-3 uses there.
constexpr std::initializer_list<int> kBlockMs = {128, 192};
constexpr std::initializer_list<int> kBlockNs = {64, 128, 176, 192};
constexpr std::initializer_list<int> kStages = {2, 3, 4};
// Query tiles per CTA: 2 pairs m blocks N - 1 - j and j (equal causal work per CTA) and loads
// the second's Q and first K / V tiles while the consumers finish the first.
constexpr std::initializer_list<int> kQTiles = {1, 2};
// Persistent CTAs (about one per SM) walking pairs of query tiles over every head (q_tiles 2),
// the next tile's loads under the last one's end (forward_sm90.cuh, FjWorkItems).
constexpr std::initializer_list<int> kPersistent = {0, 1};

// An e4m3 KV cache (flag kv_e4m3; docs/kernels/forward_sm90.md "e4m3 KV caches"): bf16 / f16 q,
// head dims multiples of 16 (16-byte units of e4m3), on a KV cache.
std::optional<std::string> kv_e4m3_reason(const KernelDesc& p) {
  const int64_t fp8 = p.flags.get("kv_e4m3").value_or(0);
  if (fp8 == 0) return std::nullopt;
  if (fp8 != 1) {
    return fmt::format("forward/sm90a_wgmma needs flag 'kv_e4m3' = 0 or 1, not {}", fp8);
  }
  if (!on_kv_cache(p)) {
    return "forward/sm90a_wgmma reads e4m3 K / V (flag kv_e4m3) only on a KV cache (flags "
           "page_size / seq_lens); contiguous e4m3 inputs take dtype e4m3";
  }
  if (p.dtype != DType::BF16 && p.dtype != DType::F16) {
    return fmt::format("forward/sm90a_wgmma on an e4m3 KV cache takes bf16 or f16 q, not {}",
                       to_string(p.dtype));
  }
  for (auto [what, d] : {std::pair{"head_dim_qk", p.head_dim_qk}, {"head_dim_v", p.head_dim_v}}) {
    if (d % 16 != 0) {
      return fmt::format(
          "forward/sm90a_wgmma on an e4m3 KV cache does not support {} = {}; supported: "
          "multiples of 16 (16-byte rows of e4m3) up to 256",
          what, d);
    }
  }
  return std::nullopt;
}

// A KV cache (chunked prefill: the page_size / seq_lens flags, kernels/forward/Forward.h): any
// power-of-two page size from 1 to 256 (TMA boxes where a page holds whole KV tiles, cp.async
// gathers otherwise; docs/kernels/forward_sm90.md "KV caches"), seq_lens 0 or 1.
std::optional<std::string> kv_cache_reason(const KernelDesc& p) {
  const int64_t page = kv_page_size(p);
  if (page < 0 || page > 256 || (page & (page - 1)) != 0) {
    return fmt::format(
        "forward/sm90a_wgmma does not support page_size = {}; supported: 0 (contiguous K / V) or "
        "a power of two from 1 to 256",
        page);
  }
  const int64_t lens = p.flags.get("seq_lens").value_or(0);
  if (lens != 0 && lens != 1) {
    return fmt::format("forward/sm90a_wgmma needs flag 'seq_lens' = 0 or 1, not {}", lens);
  }
  return kv_e4m3_reason(p);
}

bool one_of(int64_t v, std::initializer_list<int> allowed) {
  return std::find(allowed.begin(), allowed.end(), v) != allowed.end();
}

std::optional<std::string> not_in(const char* what, int64_t v, std::initializer_list<int> allowed) {
  if (one_of(v, allowed)) return std::nullopt;
  return fmt::format("forward/sm90a_wgmma does not support {} = {}; supported: {}", what, v,
                     fmt::join(allowed, ", "));
}

bool is_fp8(const KernelDesc& d) {
  return d.dtype == DType::E4M3;
}

// e4m3 q, k, v (docs/kernels/forward_sm90.md "FP8"): head dims multiples of 16 (16-byte rows),
// qk up to 256 and v up to 128 (the P V accumulator beside S and P in 128 x 128 tiles), in tiles
// of 128-byte rows (128 or 256 elements); no KV cache.
std::optional<std::string> fp8_problem_reason(const KernelDesc& p) {
  for (auto [what, d, most] :
       {std::tuple{"head_dim_qk", p.head_dim_qk, 256}, {"head_dim_v", p.head_dim_v, 128}}) {
    if (d < 16 || d > most || d % 16 != 0) {
      return fmt::format(
          "forward/sm90a_wgmma with e4m3 inputs does not support {} = {}; supported: multiples "
          "of 16 from 16 to {}",
          what, d, most);
    }
  }
  if (on_kv_cache(p)) {
    return "forward/sm90a_wgmma does not run e4m3 inputs on a KV cache (page tables or "
           "per-sequence lengths); e4m3 takes contiguous q, k, v";
  }
  return std::nullopt;
}

std::optional<std::string> problem_reason(const KernelDesc& p) {
  if (auto r = wgmma_problem_reason(p, kSm90ForwardTileDims)) return r;
  if (is_fp8(p)) return fp8_problem_reason(p);
  return std::nullopt;
}

// The tile dims of a problem's head dims (kSm90ForwardTileDims; e4m3: kSm90Fp8TileDims), or the
// dim itself when no tile takes it (a problem that problem_reason refuses; its checks come
// first).
int tile_qk(const KernelDesc& d) {
  return tile_head_dim(d.head_dim_qk, is_fp8(d) ? kSm90Fp8TileDims : kSm90ForwardTileDims)
      .value_or(d.head_dim_qk);
}
int tile_v(const KernelDesc& d) {
  return tile_head_dim(d.head_dim_v, is_fp8(d) ? kSm90Fp8TileDims : kSm90ForwardTileDims)
      .value_or(d.head_dim_v);
}

// q_tiles and persistent may be absent (configs written before they existed): one query tile
// per CTA, one CTA per query tile.
int q_tiles_of(const KernelDesc& d) {
  return static_cast<int>(d.config.get("q_tiles").value_or(1));
}
int persistent_of(const KernelDesc& d) {
  return static_cast<int>(d.config.get("persistent").value_or(0));
}

// What a KV cache needs of a config: one query tile per CTA (every loader thread walks the tiles:
// a persistent CTA's claims are one thread's, and two tiles per CTA spilled the loaders'
// registers) and no `divisible` (each sequence has its own length). 128- and 192-row tiles both
// serve it (192: the loaders in 32 registers; docs/kernels/forward_sm90.md "KV caches").
std::optional<std::string> kv_cache_config_reason(const KernelDesc& d) {
  if (!on_kv_cache(d)) return std::nullopt;
  if (persistent_of(d) != 0 || q_tiles_of(d) != 1) {
    return fmt::format(
        "forward/sm90a_wgmma on a KV cache runs one query tile per CTA (persistent = 0, q_tiles = "
        "1), not persistent = {}, q_tiles = {}: its 128 loader threads each walk the CTA's tiles "
        "in 32-40 registers",
        persistent_of(d), q_tiles_of(d));
  }
  if (d.flags.at("divisible") != 0) {
    return fmt::format(
        "forward/sm90a_wgmma on a KV cache needs divisible = 0: each sequence has its own length "
        "({})",
        d.str());
  }
  return std::nullopt;
}

int sm90_smem(const KernelDesc& d, int q_bufs) {
  if (on_kv_e4m3(d)) {
    // The loaders' e4m3 staging tile after the bf16 / f16 layout.
    return fj_forward_sm90_smem_bytes(d.config.at_int("block_m"), d.config.at_int("block_n"),
                                      tile_qk(d), tile_v(d), dtype_size(d.dtype),
                                      d.config.at_int("num_stages"), q_bufs) +
           fj_forward_sm90_kv_fp8_staging_bytes(d.config.at_int("block_n"), tile_qk(d), tile_v(d));
  }
  if (is_fp8(d)) {
    return fj_forward_sm90_fp8_smem_bytes(d.config.at_int("block_m"), d.config.at_int("block_n"),
                                          tile_qk(d), tile_v(d), d.config.at_int("num_stages"),
                                          q_bufs);
  }
  return fj_forward_sm90_smem_bytes(d.config.at_int("block_m"), d.config.at_int("block_n"),
                                    tile_qk(d), tile_v(d), dtype_size(d.dtype),
                                    d.config.at_int("num_stages"), q_bufs);
}

// Q buffers (the next tile's Q loads during the last one): two for persistent CTAs; with two
// query tiles per CTA two where shared memory holds them, else one; one otherwise.
int q_bufs_of(const KernelDesc& d) {
  if (persistent_of(d) == 1) return 2;
  return q_tiles_of(d) == 2 && sm90_smem(d, 2) <= cuda::max_smem_per_block(d.arch) ? 2 : 1;
}

int sm90_smem(const KernelDesc& d) {
  return sm90_smem(d, q_bufs_of(d));
}

// Persistent CTAs: as many as fit the GPU at once (one per SM), at most one per claim (a pair of
// query tiles with q_tiles 2, a tile with q_tiles 1; all of them where the SM count is unknown).
int64_t persistent_ctas(const KernelDesc& d, const ForwardInputs& in) {
  const int64_t bm = d.config.at("block_m");
  const int64_t m_blocks = (in.shape.seqlen_q + bm - 1) / bm;
  const int64_t claims =
      in.shape.batch * in.shape.heads_q * (q_tiles_of(d) == 2 ? (m_blocks + 1) / 2 : m_blocks);
  return std::max<int64_t>(1, in.sm_count > 0 ? std::min<int64_t>(claims, in.sm_count) : claims);
}

// Three consumer warpgroups (block_m 192) take a block mask as a union schedule: the shape of
// that schedule for the call (rows = the mask's batch x heads x query tiles, entries per row),
// none without a block mask or with 128-row tiles.
struct UnionShape {
  int64_t rows = 0, max_tiles = 0, num_m = 0;
  bool used() const { return rows > 0; }
};
UnionShape union_shape(const KernelDesc& d, const ForwardInputs& in) {
  const int64_t bm = d.config.at("block_m"), bn = d.config.at("block_n");
  if (in.block_mask == nullptr || bm != 192) return {};
  const BlockMask& m = in.block_mask->meta();
  UnionShape u;
  u.num_m = (in.shape.seqlen_q + bm - 1) / bm;
  u.rows = static_cast<int64_t>(m.batch) * m.heads * u.num_m;
  u.max_tiles = static_cast<int64_t>(m.num_kv_blocks) * (m.kv_block_size / bn);
  return u;
}

// KV tiles of block_n keys in a union schedule over the call's block mask (its kv blocks split);
// 0 without one.
int64_t union_tiles(const InputFacts& facts, int64_t block_n) {
  if (facts.mask_kv_block == 0 || facts.seqlen_kv < 0) return 0;
  return (facts.seqlen_kv + facts.mask_kv_block - 1) / facts.mask_kv_block *
         (facts.mask_kv_block / block_n);
}

// Where a call's union schedule lives (device/MaskScheduleCache.h): the buffer its block mask
// keeps, when ready (no builder; the forward's stream waits for it where another stream built
// it) or newly claimed (the builder writes it, then records that it did); else the workspace's
// slice for it (another call's claim not built yet, a capturing stream, a mask without a cache),
// written by the builder.
struct UnionPlacement {
  char* base = nullptr;
  bool build = true;
  std::function<void(runtime::CuStream)> after_build, before_forward;
};
UnionPlacement place_union_schedule(const ForwardInputs& in, const FjBlockMaskArgs& mask, int bm,
                                    int bn, const UnionShape& u, char* workspace_slice) {
  UnionPlacement p;
  p.base = workspace_slice;
  runtime::MaskScheduleCache* cache = runtime::schedule_cache_of(*in.block_mask);
  if (cache == nullptr) return p;
  runtime::UnionScheduleKey key;
  key.arrays = {mask.kv_num_blocks, mask.kv_indices, mask.full_kv_num_blocks, mask.full_kv_indices};
  key.generation = cache->generation();
  key.block_m = bm;
  key.block_n = bn;
  key.seqlen_q = in.shape.seqlen_q;
  key.max_tiles = u.max_tiles;
  if (void* kept = cache->ready(key)) {
    p.base = static_cast<char*>(kept);
    p.build = false;
    p.before_forward = [cache, key](runtime::CuStream st) { cache->wait_for(key, st); };
  } else if (void* claimed = cache->claim(
                 key, static_cast<size_t>(fj_forward_sm90_union_bytes(u.rows, u.max_tiles)),
                 in.stream)) {
    p.base = static_cast<char*>(claimed);
    p.after_build = [cache, key](runtime::CuStream st) { cache->built(key, st); };
  }
  return p;
}

// The step's workspace: the persistent CTAs' counter and tile slots, then (256-byte aligned) the
// union schedule.
int64_t persistent_bytes(const KernelDesc& d, const ForwardInputs& in) {
  if (persistent_of(d) != 1) return 0;
  return (fj_forward_sm90_persistent_workspace_bytes(static_cast<int>(persistent_ctas(d, in)),
                                                     q_bufs_of(d)) +
          255) /
         256 * 256;
}

// The union schedule's bytes in the workspace (256-byte aligned), 0 where the call has none.
int64_t union_bytes(const KernelDesc& d, const ForwardInputs& in) {
  const UnionShape u = union_shape(d, in);
  return u.used() ? (fj_forward_sm90_union_bytes(u.rows, u.max_tiles) + 255) / 256 * 256 : 0;
}

// e4m3: V^T (FjFp8VtArgs::vt), after the union schedule (no persistent counter with e4m3).
int64_t fp8_vt_bytes(const KernelDesc& d, const ForwardInputs& in) {
  if (!is_fp8(d)) return 0;
  const QkvShape& s = in.shape;
  return fj_forward_fp8_vt_bytes(static_cast<int>(s.batch), static_cast<int>(s.heads_kv),
                                 static_cast<int>(s.seqlen_kv), static_cast<int>(s.head_dim_v));
}

// Where ForwardSm90Wgmma::companions puts each companion, which launches() follows without the
// mods: e4m3's V^T pre-pass first, then the union schedule.
constexpr int kFp8VtCompanion = 0;
int union_companion(const KernelDesc& d) {
  return is_fp8(d) ? 1 : 0;
}

// The e4m3 forward's pre-pass (V^T into the workspace), its tensor map and FjFp8Args.
struct Fp8Launch {
  Launch vt;
  FjTmaDesc vt_map;
  FjFp8Args args;
};
Fp8Launch fp8_launch(const KernelDesc& d, const ForwardInputs& in, void* workspace) {
  FJ_ASSERT(workspace != nullptr, "the e4m3 forward launched without its V^T workspace");
  const QkvShape& s = in.shape;
  FjFp8VtArgs va{};
  va.v = static_cast<const unsigned char*>(in.v.data);
  va.v_stride_b = in.v.strides[0];
  va.v_stride_h = in.v.strides[1];
  va.v_stride_s = in.v.strides[2];
  va.vt = static_cast<unsigned char*>(workspace);
  va.heads_kv = static_cast<int>(s.heads_kv);
  va.seqlen_kv = static_cast<int>(s.seqlen_kv);
  va.skv_pad = static_cast<int>((s.seqlen_kv + 63) / 64 * 64);
  Fp8Launch f;
  // The companion's launch.
  const KernelDesc vd = fp8_vt_desc(d.arch, d.head_dim_v);
  std::vector<Launch> pre = Fp8VtBlockPer64Keys().launches(vd, {va, s.batch}, nullptr);
  FJ_ASSERT(pre.size() == 1, "the V^T pre-pass is one launch");
  f.vt = std::move(pre[0]);
  f.vt.companion = kFp8VtCompanion;
  // V^T [B, Hkv, Dv, skv_pad] e4m3, read as rows of Dv (the v tile's box rows; rows past Dv
  // read as zeros) and 128 keys a box.
  const TensorRef vt =
      TensorRef::contiguous(workspace, DType::E4M3, {s.batch, s.heads_kv, s.head_dim_v, va.skv_pad},
                            TensorRef::Device::CUDA, in.v.device_index);
  f.vt_map = runtime::encode_bhsd_tma(vt, tile_v(d), "V^T (the e4m3 forward's workspace)");
  const Fp8Descales& ds = in.descale;
  f.args = FjFp8Args{ds.q, ds.k, ds.v, ds.q_stride, ds.k_stride, ds.v_stride};
  return f;
}

Params make_config(int block_m, int block_n, int num_stages, int q_tiles, int persistent) {
  return {{"block_m", block_m},
          {"block_n", block_n},
          {"num_stages", num_stages},
          {"q_tiles", q_tiles},
          {"persistent", persistent}};
}

}  // namespace

std::optional<std::string> wgmma_problem_reason(const KernelDesc& p,
                                                std::initializer_list<int> head_dims) {
  if (!(p.arch.cc() == 90 && p.arch.accelerated)) {
    return fmt::format("wgmma and setmaxnreg need sm_90a, not {}", p.arch.str());
  }
  if (p.dtype == DType::E4M3 && p.family != Family::Forward) {
    return fmt::format(
        "e4m3 inputs run only in the forward (forward/sm90a_wgmma); {}/sm90a_wgmma takes bf16 "
        "and f16",
        to_string(p.family));
  }
  if (p.dtype != DType::BF16 && p.dtype != DType::F16 && p.dtype != DType::E4M3) {
    return fmt::format(
        "{} inputs run on the tf32 tensor cores of sm80_mma (this variant takes bf16 and f16)",
        to_string(p.dtype));
  }
  for (auto [what, d] : {std::pair{"head_dim_qk", p.head_dim_qk}, {"head_dim_v", p.head_dim_v}}) {
    if (auto r = head_dim_reason(fmt::format("{}/sm90a_wgmma", to_string(p.family)), what, d,
                                 head_dims)) {
      return r;
    }
  }
  if (p.gqa_ratio < 1) {
    return fmt::format("gqa_ratio (heads_q / heads_kv) must be at least 1, not {}", p.gqa_ratio);
  }
  return std::nullopt;
}

std::optional<std::string> wgmma_input_reason(const InputFacts& facts) {
  if (!facts.aligned16) {
    return fmt::format("TMA needs 16-byte aligned pointers and strides: {}",
                       facts.alignment_blocker);
  }
  if (!facts.tma_blocker.empty()) return facts.tma_blocker;
  return std::nullopt;
}

std::string sm90_config_struct(const Mods& mods, const KernelDesc& desc, int tile_qk, int tile_v,
                               std::vector<std::string> extra) {
  KernelDesc tiled = desc;
  tiled.head_dim_qk = tile_qk;
  tiled.head_dim_v = tile_v;
  extra.insert(extra.begin(), real_head_dims_line(desc.head_dim_qk, desc.head_dim_v));
  std::string s = ForwardSm80Mma::config_struct(mods, tiled, extra);
  // The comment line names the problem's own dims.
  const std::string said = tiled.str(), real = desc.str();
  if (said != real) {
    if (const size_t at = s.find(said); at != std::string::npos) s.replace(at, said.size(), real);
  }
  return s;
}

std::string_view ForwardSm90Wgmma::summary() const {
  return "FlashAttention-3 structure: TMA, wgmma, producer/consumer warpgroups with setmaxnreg; "
         "bf16/f16; head dims multiples of 8 up to 256 (tiles 64/128/192/256); KV caches (ragged "
         "lengths, pages of 1..256 keys; e4m3 K / V with bf16 / f16 q); sm_90a";
}

std::optional<std::string> ForwardSm90Wgmma::unsupported(const KernelDesc& problem,
                                                         const InputFacts& facts) const {
  if (auto r = problem_reason(problem)) return r;
  if (auto r = wgmma_input_reason(facts)) return r;
  if (!facts.scale_positive && !is_fp8(problem) && !on_kv_e4m3(problem)) {
    // Its softmax takes the row max of the raw scores and multiplies it by scale · log2(e):
    // the max of the scaled scores only where the scale is positive. (The e4m3 kernels, whose
    // scale meets its descales on the device, keep the path for any sign.)
    return std::string(
        "the softmax scale is not positive (this kernel folds a positive scale into the "
        "exponent after the row max)");
  }
  if (facts.mask_q_block != 0 && facts.mask_q_block % 128 != 0) {
    return fmt::format(
        "the block mask's q block size {} is not a multiple of this kernel's 128-row tiles",
        facts.mask_q_block);
  }
  if (facts.mask_kv_block != 0 && facts.mask_kv_block % 64 != 0) {
    return fmt::format(
        "the block mask's kv block size {} is not a multiple of 64 (this kernel's smallest KV "
        "tile)",
        facts.mask_kv_block);
  }
  if (auto r = kv_cache_reason(problem)) return r;
  if (is_fp8(problem) && facts.mask_kv_block != 0 && facts.mask_kv_block % 128 != 0) {
    return fmt::format(
        "the block mask's kv block size {} is not a multiple of 128 (the e4m3 kernel's KV tile)",
        facts.mask_kv_block);
  }
  return std::nullopt;
}

void ForwardSm90Wgmma::validate(const KernelDesc& d) const {
  if (auto r = problem_reason(d)) throw UnsupportedError(*r);
  for (const char* name : {"block_m", "block_n", "num_stages"}) {
    if (!d.config.has(name)) {
      throw UnsupportedError(
          fmt::format("forward/sm90a_wgmma needs config '{}' ({})", name, d.str()));
    }
  }
  if (d.config.items().size() !=
      3u + (d.config.has("q_tiles") ? 1u : 0u) + (d.config.has("persistent") ? 1u : 0u)) {
    throw UnsupportedError(fmt::format(
        "forward/sm90a_wgmma takes block_m, block_n, num_stages, q_tiles and persistent (its "
        "warpgroups follow from block_m); got {}",
        d.config.str()));
  }
  if (auto r = not_in("block_m", d.config.at("block_m"), kBlockMs)) throw UnsupportedError(*r);
  if (auto r = not_in("block_n", d.config.at("block_n"), kBlockNs)) throw UnsupportedError(*r);
  if (auto r = not_in("num_stages", d.config.at("num_stages"), kStages)) {
    throw UnsupportedError(*r);
  }
  if (auto r = not_in("q_tiles", q_tiles_of(d), kQTiles)) throw UnsupportedError(*r);
  if (auto r = not_in("persistent", persistent_of(d), kPersistent)) throw UnsupportedError(*r);
  for (const char* flag : {"divisible", "full_blocks"}) {
    auto v = d.flags.get(flag);
    if (!v || (*v != 0 && *v != 1)) {
      throw UnsupportedError(
          fmt::format("forward/sm90a_wgmma needs flag '{}' = 0 or 1 ({})", flag, d.str()));
    }
  }
  if (auto r = fast_math_flag_error(d)) throw UnsupportedError(*r);
  if (auto r = kv_cache_reason(d)) throw UnsupportedError(*r);
  if (auto r = kv_cache_config_reason(d)) throw UnsupportedError(*r);
  if (on_kv_e4m3(d) && !one_of(d.config.at("block_n"), {64, 128, 192})) {
    throw UnsupportedError(fmt::format(
        "forward/sm90a_wgmma on an e4m3 KV cache does not support block_n = {}; supported: 64, "
        "128, 192 (a KV tile's 16-byte units of e4m3 split over the 128 loader threads)",
        d.config.at("block_n")));
  }
  if (is_fp8(d) && (d.config.at("block_n") != 128 || q_tiles_of(d) != 1)) {
    throw UnsupportedError(fmt::format(
        "forward/sm90a_wgmma with e4m3 inputs runs block_m = 128 or 192, block_n = 128 (V^T "
        "tiles of 128-byte rows), q_tiles = 1 (persistent = 0 or 1); got {}",
        d.config.str()));
  }
  // Accumulators of S (block_n / 2) and O (the v tile dim / 2) plus P (block_n / 4) per thread
  // must fit the consumers' registers (240 with two consumer warpgroups, 160 with three) with
  // room for addresses and the softmax state. Three consumers at a v tile of 128 (and e4m3) run
  // the serial loop (forward_sm90.cuh, kOverlap), where S and P are not live beside O at once:
  // 128 x 128 tiles' 160 (e4m3 144) compile without spills.
  const bool three = d.config.at("block_m") == 192;
  const int64_t live = d.config.at("block_n") / 2 + tile_v(d) / 2 +
                       d.config.at("block_n") / (is_fp8(d) ? 8 : 4);  // e4m3 P: 4 per register
  const int64_t budget = three ? (is_fp8(d) || tile_v(d) > 64 ? 160 : 128) : 200;
  if (live > budget) {
    throw UnsupportedError(fmt::format(
        "block_n = {} with head_dim_v = {} (tile {}) needs {} accumulator and operand registers "
        "per consumer thread, more than the {} of {} this kernel allows with block_m = {}; use {}",
        d.config.at("block_n"), d.head_dim_v, tile_v(d), live, budget, three ? 160 : 240,
        d.config.at("block_m"), three ? "block_m = 128 or a smaller block_n" : "block_n = 64"));
  }
  const int smem = sm90_smem(d);
  const int limit = cuda::max_smem_per_block(d.arch);
  if (smem > limit) {
    throw UnsupportedError(fmt::format(
        "config {}x{} with {} stages needs {} bytes of shared memory for head dims {}/{} (tiles "
        "{}/{}), more than the {} bytes a block may use on {}; lower num_stages or block_n",
        d.config.at("block_m"), d.config.at("block_n"), d.config.at("num_stages"), smem,
        d.head_dim_qk, d.head_dim_v, tile_qk(d), tile_v(d), limit, d.arch.str()));
  }
}

Params ForwardSm90Wgmma::default_config(const KernelDesc& p) const {
  // By the tile dims: a head dim runs in its tile's layouts (kSm90ForwardTileDims).
  const int qk = tile_qk(p), v = tile_v(p);
  const int d = std::max(qk, v);
  // e4m3: 128 x 128 tiles (V^T's 128-byte rows), as many of 4 stages as fit (resolve_config);
  // half the bytes of a bf16 stage, so two more stages than bf16's 128 x 128 at d 128 fit.
  if (is_fp8(p)) return make_config(128, 128, 4, 1, 0);
  // Measured on an H100 (docs/kernels/forward_sm90.md "Design notes"): d = 128 noop 581 TFLOP/s
  // with 3 stages, 511 with 2 (causal 489 / 448), block_n 176 (2 stages fit) 520; d = 64 noop 396
  // with 4 stages, 378 with 3, 323 with 2 (causal 296-297 with 3 or 4). Persistent CTAs: d = 64
  // +4-6 % on all four of its cases (two Q buffers fit); at d = 128 (one Q buffer) noop gains and
  // the sparse masks lose 5-10 %, so there they stay off at 128 rows (192 rows: resolve_config).
  // Their claims are single query tiles, taken once a tile's loads are issued: against pairs
  // claimed a tile ahead, d = 64 noop +7 %, causal +3-5 %, document+causal +2-7 % (H200, v44).
  if (d <= 64) return make_config(128, 128, 4, 1, 1);
  if (d <= 128) return make_config(128, 128, 3, 1, 0);
  // qk tile 192 with v tile up to 128 (DeepSeek's 192 / 128): FlashAttention-3's 128 x 128 tile
  // for it, two stages in 209 KB (a 64-key tile would halve the work per barrier).
  if (qk == 192 && v <= 128) return make_config(128, 128, 2, 1, 0);
  return make_config(128, 64, 2, 1, 0);
}

std::vector<Params> ForwardSm90Wgmma::config_space(const KernelDesc& p) const {
  std::vector<Params> grid;
  if (is_fp8(p)) {
    for (int bm : kBlockMs)
      for (int s : kStages)
        for (int pe : kPersistent)
          grid.push_back(make_config(bm, 128, s, 1, pe));
    return valid_configs(*this, p, grid);
  }
  for (int bm : kBlockMs)
    for (int bn : kBlockNs)
      for (int s : kStages)
        for (int qt : kQTiles)
          for (int pe : kPersistent)
            grid.push_back(make_config(bm, bn, s, qt, pe));
  return valid_configs(*this, p, grid);
}

Params ForwardSm90Wgmma::resolve_config(const KernelDesc& problem, const Params& overrides,
                                        const InputFacts& facts) const {
  Params c = apply_overrides(*this, default_config(problem), overrides);
  // On a KV cache every loader thread walks the CTA's query tiles: one CTA per query tile, one
  // query tile per CTA (two spilled 8-88 B at d 64 and 128: the loaders' 40 registers).
  const bool kv_cache = on_kv_cache(problem);
  if (kv_cache && !overrides.has("persistent")) c.set("persistent", 0);
  if (kv_cache && !overrides.has("q_tiles") && c.at("persistent") == 0) c.set("q_tiles", 1);
  const int64_t rows192 = (facts.seqlen_q + 191) / 192 * 192;
  const int64_t rows128 = (facts.seqlen_q + 127) / 128 * 128;
  // At head dim 128 (e4m3: 64 or 128): three consumer warpgroups in the serial loop (192 rows,
  // 2 stages for bf16 / f16; with a block mask through the union schedule), faster than two in
  // the overlapped loop (H200, one call each): bf16 noop +4-8 %, causal +3-14 %,
  // document+causal +8-10 %, alibi+causal level; e4m3 noop +3-6 %, its masked mods +12-17 %
  // (docs/kernels/forward_sm90.md "Three consumer warpgroups at d 128", "FP8"). Where 192-row
  // tiles cover at most an eighth more rows and the caller fixed no tile key; not where the
  // mask_mod divides by a run-time value (chunked_local and dilated_sliding spill 180-308 B at
  // 192 rows). A KV cache (bf16 / f16 or e4m3) takes them as the contiguous kernel does
  // (docs/kernels/forward_sm90.md "192-row tiles on a cache": 16-key pages +13-23 %, e4m3 +27-30
  // %) unless the mask_mod loads a buffer at kv_idx (document_causal spilled 24 B there: the
  // sequence's length is one more register across the tile loop).
  // Head dims below that tile (d 80, 96,
  // 112; B=4 H=32 S=4096, H200, 192 / 128 rows, TFLOP/s): d 96 noop 509 / 504-528, causal
  // 472-476 / 419-432, document+causal 368-372 / 338-339; d 80 noop 504 / 437, causal 435 /
  // 381, document+causal 326 / 291; but alibi+causal 391-398 / 403-405 and 335 / 346, so a
  // score_mod that reads kv_idx keeps 128 rows there (level at d 128).
  const bool dims_192 =
      problem.head_dim_qk == problem.head_dim_v &&
      (is_fp8(problem)
           ? problem.head_dim_qk == 128 || problem.head_dim_qk == 64
           : problem.head_dim_qk == 128 || (tile_qk(problem) == 128 && !facts.score_mod_reads_kv));
  const bool tiles_free = !overrides.has("block_m") && !overrides.has("block_n") &&
                          !overrides.has("num_stages") && !overrides.has("q_tiles") &&
                          !overrides.has("persistent");
  if (tiles_free && dims_192 && facts.seqlen_q > 0 && !facts.mask_mod_divides &&
      (!kv_cache || !facts.mask_mod_loads_kv) && c.at("persistent") == 0 && c.at("q_tiles") == 1 &&
      8 * rows192 <= 9 * rows128 &&
      (facts.mask_kv_block == 0 ||
       (facts.mask_mod && union_tiles(facts, c.at("block_n")) <= kFjUnionMaxTiles))) {
    c.set("block_m", 192);
    // Persistent CTAs claiming single query tiles (two 48 KB Q buffers and 2 stages fit): the
    // next tile's Q and K / V load under the last one, and under a block mask the heaviest tiles
    // go first (FjWorkItems::decode). H200, one call against one CTA per tile: document+causal
    // +6-10 %, the other masked mods +0-6 %, noop level (docs/kernels/forward_sm90.md
    // "Persistent CTAs at 192 rows"); e4m3 q, k, v as well, each tile with its head's descales
    // (same page, "FP8"). Not on a KV cache (its loaders walk the tiles; persistent CTAs there
    // measured level, "KV caches").
    if (!kv_cache) c.set("persistent", 1);
  }
  // At head dim 64: three consumer warpgroups taking turns in rotation (block_m 192), the
  // softmax-bound tile's other lever: noop 430.9 TFLOP/s against 404.3 with 128 rows
  // (docs/kernels/forward_sm90.md "Design notes"); with a block mask, whose 128-row blocks each
  // 64-row warpgroup lies in, through the union schedule (same page, "Union schedule"). Only where
  // 192-row tiles cover at most an eighth more rows than 128-row ones (short or ragged query
  // lengths), and with the default block_n (a wider one does not fit 192 rows' registers).
  // Not where the mask_mod divides by a run-time value per score (passes/RuntimeDivision.h):
  // at 192 rows chunked_local ran 122 TFLOP/s against 174 with 128 (docs/kernels/forward_sm90.md
  // "Design notes").
  if (!overrides.has("block_m") && !overrides.has("block_n") && facts.seqlen_q > 0 && !kv_cache &&
      !is_fp8(problem) && !facts.mask_mod_divides &&
      std::max(problem.head_dim_qk, problem.head_dim_v) <= 64 && 8 * rows192 <= 9 * rows128 &&
      (facts.mask_kv_block == 0 ||
       (facts.mask_mod && union_tiles(facts, c.at("block_n")) <= kFjUnionMaxTiles))) {
    c.set("block_m", 192);
  }
  // A wider block_n asked for with the default stages: as many stages as fit (at least 2).
  if (!overrides.has("num_stages")) {
    KernelDesc d = problem;
    d.config = c;
    while (c.at("num_stages") > 2 && sm90_smem(d) > cuda::max_smem_per_block(problem.arch)) {
      c.set("num_stages", c.at("num_stages") - 1);
      d.config = c;
    }
    // An e4m3 cache's staging tile on top: where two stages of the default block_n do not fit
    // (head dims 192 / 128), 64-key tiles.
    if (on_kv_e4m3(problem) && !overrides.has("block_n") && c.at("block_n") > 64 &&
        sm90_smem(d) > cuda::max_smem_per_block(problem.arch)) {
      c.set("block_n", 64);
    }
  }
  if (facts.mask_kv_block == 0) return c;
  fit_tile_to_block(c, "block_n", facts.mask_kv_block, overrides, {128, 64});
  // 192-row tiles read a union schedule of the mask's q blocks (each warpgroup's 64 rows in one).
  const int64_t q_unit = mask_q_unit(c);
  if (c.at("block_m") == 192 && !facts.mask_mod) {
    throw UnsupportedError(
        "block_m = 192 with a block mask needs the call's mask_mod (the kernel reads the mask as a "
        "union schedule, whose loop it compiles with one); use block_m = 128");
  }
  if (c.at("block_m") == 192 && union_tiles(facts, c.at("block_n")) > kFjUnionMaxTiles) {
    throw UnsupportedError(fmt::format(
        "block_m = 192 with a block mask reads a union schedule of at most {} KV tiles; {} keys "
        "in tiles of {} make {}; use block_m = 128",
        kFjUnionMaxTiles, facts.seqlen_kv, c.at("block_n"), union_tiles(facts, c.at("block_n"))));
  }
  if (facts.mask_q_block % q_unit != 0 || facts.mask_kv_block % c.at("block_n") != 0) {
    throw UnsupportedError(fmt::format(
        "the block mask's sparse blocks ({}x{}) are not multiples of forward/sm90a_wgmma's "
        "{}x{} tiles; build the mask with a block size that is a multiple of 128, or pass a "
        "block_n that divides it",
        facts.mask_q_block, facts.mask_kv_block, c.at("block_m"), c.at("block_n")));
  }
  return c;
}

int64_t ForwardSm90Wgmma::mask_q_unit(const Params& config) const {
  const int64_t bm = config.get("block_m").value_or(0);
  return bm == 192 ? 64 : bm;
}

void ForwardSm90Wgmma::specialize(KernelDesc& d, const InputFacts& facts) const {
  specialize_divisible(d, facts);
  // On a KV cache every sequence has its own length: the key bounds stay.
  if (on_kv_cache(d)) d.flags.set("divisible", 0);
}

std::vector<TemplateText> ForwardSm90Wgmma::templates() const {
  std::vector<TemplateText> t = common_templates();
  for (const char* name : {"mma_sm80.cuh", "attention_sm80.cuh", "forward_common.cuh",
                           "wgmma_sm90.cuh", "forward_sm90.cuh"})
    t.push_back({name, embedded::template_text(name), false});
  return t;
}

cuda::GeneratedSource ForwardSm90Wgmma::generate(const Mods& mods, const KernelDesc& desc) const {
  validate(desc);
  mods.check();
  // The config struct (the same members as sm80_mma's; kNumWarps is the consumers' warps) and
  // the wgmma shapes the kernel uses: S (n = block_n) and O (n = the v tile dim).
  const int bm = desc.config.at_int("block_m");
  KernelDesc d = desc;
  d.config.set("num_warps", bm / 16);
  std::vector<std::string> extra = {
      fmt::format("static constexpr int kQTiles = {};", q_tiles_of(desc)),
      fmt::format("static constexpr int kPersistent = {};", persistent_of(desc)),
      fmt::format("static constexpr int kQBufs = {};", q_bufs_of(desc))};
  // On a KV cache the kernel takes FjKvCacheArgs (forward_sm90.cuh, FJ_FWD_KV_CACHE); without
  // one the source is what it always was.
  const bool kv_cache = on_kv_cache(desc);
  if (kv_cache) {
    extra.push_back(fmt::format("static constexpr int kPageSize = {};", kv_page_size(desc)));
  }
  std::string config = sm90_config_struct(mods, d, tile_qk(desc), tile_v(desc), extra);
  if (kv_cache) config = "#define FJ_FWD_KV_CACHE 1\n" + config;
  // An e4m3 cache: the loaders convert its tiles, the kernel takes FjFwdKvFp8Args.
  if (on_kv_e4m3(desc)) config = "#define FJ_FWD_KV_FP8 1\n" + config;
  // Three consumers with a score_mod that reads kv_idx: in the serial loop the score_mod gets a
  // copy per kind of tile, as 128-row tiles have (forward_sm90.cuh, kScoreCopies).
  if (bm == 192 && ir::reads_var(mods.score_mod, ir::VarKind::KvIdx)) {
    config = "#define FJ_FWD_SCORE_READS_KV 1\n" + config;
  }
  // e4m3 q, k, v: the kernel takes FjFp8Args and the module has the V^T pre-pass
  // (forward_sm90.cuh, FJ_FWD_FP8); without it the source is what it always was.
  if (is_fp8(desc)) config = "#define FJ_FWD_FP8 1\n" + config;
  const std::string wrappers =
      cuda::wgmma_wrappers(desc.dtype, {desc.config.at_int("block_n")}, {tile_v(desc)});
  config.push_back('\n');
  config.append(wrappers);
  return assemble_variant_source(*this, desc, mods, config,
                                 on_kv_e4m3(desc)
                                     ? "forward kernel `flexjit_forward` on an e4m3 KV cache"
                                 : kv_cache ? "forward kernel `flexjit_forward` on a KV cache"
                                            : "forward kernel `flexjit_forward`");
}

// In the order of kFp8VtCompanion and union_companion().
std::vector<KernelDesc> ForwardSm90Wgmma::companions(const KernelDesc& desc,
                                                     const Mods& mods) const {
  std::vector<KernelDesc> out;
  if (is_fp8(desc)) out.push_back(fp8_vt_desc(desc.arch, desc.head_dim_v));
  // Where launches() can run the union schedule (block_m 192 over a block mask, which takes a
  // mask_mod: kFjUnionSchedule); elsewhere it would be built for nothing.
  // (get, not at: called before validate(), whose error names a missing key)
  if (desc.config.get("block_m").value_or(0) == 192 && cuda::has_mask_mod(mods)) {
    out.push_back(union_schedule_desc(desc.arch));
  }
  return out;
}

unsigned ForwardSm90Wgmma::smem_bytes(const KernelDesc& desc) const {
  return static_cast<unsigned>(sm90_smem(desc));
}

size_t ForwardSm90Wgmma::workspace_bytes(const KernelDesc& desc, const ForwardInputs& in) const {
  return static_cast<size_t>(persistent_bytes(desc, in) + union_bytes(desc, in) +
                             fp8_vt_bytes(desc, in));
}

std::vector<Launch> ForwardSm90Wgmma::launches(const KernelDesc& desc, const ForwardInputs& in,
                                               void* workspace) const {
  const QkvShape& s = in.shape;
  FjFwdArgs a = make_fwd_args(in.q, in.k, in.v, in.out, in.lse ? &*in.lse : nullptr, s, in.scale);
  if (in.block_mask != nullptr) {
    a.mask = block_mask_args(*in.block_mask, desc.flags.at("full_blocks") != 0);
  }
  const int bm = desc.config.at_int("block_m");
  const int bn = desc.config.at_int("block_n");
  const bool kv_cache = on_kv_cache(desc);
  FJ_ASSERT(
      kv_cache == (in.seq_lens != nullptr || in.page_table != nullptr) &&
          kv_page_size(desc) == (in.page_table != nullptr ? in.page_size : 0),
      "forward/sm90a_wgmma launched with KV cache inputs that its description does not match");
  FjKvCacheArgs cache{};
  FjFwdTmaMaps maps{};
  maps.q = runtime::encode_bhsd_tma(in.q, bm, "q");
  // O out by TMA stores (the 16-bit kernels' epilogue): the variant runs only where out is
  // 16-byte aligned with strides of 16-byte multiples (InputFacts::aligned16), which is what a
  // tensor map asks.
  if (!is_fp8(desc)) maps.o = runtime::encode_bhsd_tma(in.out, 64, "out");
  std::vector<Launch> out;
  std::optional<FjFp8Args> fp8_args;
  if (is_fp8(desc)) {
    // Contiguous K / V only (fp8_problem_reason); V is read as V^T, written first (after the
    // union schedule in the workspace).
    Fp8Launch f = fp8_launch(
        desc, in,
        static_cast<char*>(workspace) + persistent_bytes(desc, in) + union_bytes(desc, in));
    maps.k = runtime::encode_bhsd_tma(in.k, bn, "k");
    maps.v = f.vt_map;
    fp8_args = f.args;
    out.push_back(std::move(f.vt));
  }
  const bool kv_e4m3 = on_kv_e4m3(desc);
  FJ_ASSERT(kv_e4m3 == (in.k_scale != nullptr) && kv_e4m3 == (in.v_scale != nullptr),
            "forward/sm90a_wgmma launched with e4m3 KV cache scales that its description does "
            "not match");
  if (in.page_table != nullptr) {
    // Pools [num_pages, page_size, Hkv, D] (any strides, D contiguous): the kernel's K / V
    // strides are the page's (b) and the slot's (s), and the tensor maps view the pool as
    // [num_pages, Hkv, page_size, D], so that a box's coordinates are (slot, kv head, page).
    // Where the tile does not divide the page every tile is gathered by cp.async and the map is
    // not read (it is encoded all the same, its box at most the page's rows).
    cache.page_table = in.page_table;
    cache.page_table_stride_b = in.page_table_stride_b;
    a.k_stride_b = in.k.strides[0], a.k_stride_s = in.k.strides[1], a.k_stride_h = in.k.strides[2];
    a.v_stride_b = in.v.strides[0], a.v_stride_s = in.v.strides[1], a.v_stride_h = in.v.strides[2];
    auto pages_view = [](TensorRef t) {
      t.shape = {t.shape[0], t.shape[2], t.shape[1], t.shape[3]};
      t.strides = {t.strides[0], t.strides[2], t.strides[1], t.strides[3]};
      return t;
    };
    const int box = std::min(in.page_size, bn);
    if (!kv_e4m3) {
      maps.k = runtime::encode_bhsd_tma(pages_view(in.k), box, "k");
      maps.v = runtime::encode_bhsd_tma(pages_view(in.v), box, "v");
    }
  } else if (!kv_e4m3 && !fp8_args) {
    maps.k = runtime::encode_bhsd_tma(in.k, bn, "k");
    maps.v = runtime::encode_bhsd_tma(in.v, bn, "v");
  }
  if (kv_e4m3) {
    // The loaders copy every e4m3 tile with cp.async: the K / V maps are not read.
    maps.k = FjTmaDesc{};
    maps.v = FjTmaDesc{};
  }
  cache.seq_lens = in.seq_lens;
  const UnionShape u = union_shape(desc, in);
  // Where the builder zeroed the persistent CTAs' work counter (else a memset does).
  bool counter_zeroed = false;
  std::function<void(runtime::CuStream)> wait_for_schedule;
  if (u.used()) {
    // The union schedule (FjUnionScheduleArgs), which the forward reads as its block mask:
    // block_m x block_n blocks, no full_* lists (the entries carry the status).
    FJ_ASSERT(workspace != nullptr, "the forward's union schedule launched without a workspace");
    FJ_ASSERT(u.max_tiles <= kFjUnionMaxTiles, "union schedule: more KV tiles than it takes");
    UnionPlacement place = place_union_schedule(
        in, a.mask, bm, bn, u, static_cast<char*>(workspace) + persistent_bytes(desc, in));
    wait_for_schedule = std::move(place.before_forward);
    FjUnionScheduleArgs ua{};
    ua.src = a.mask;
    ua.num = reinterpret_cast<int*>(place.base);
    ua.entries = reinterpret_cast<int*>(place.base + u.rows * kFjUnionRowInts * 4);
    const BlockMask& meta = in.block_mask->meta();
    ua.bm = meta.batch;
    ua.hm = meta.heads;
    ua.num_m = static_cast<int>(u.num_m);
    ua.max_tiles = static_cast<int>(u.max_tiles);
    ua.block_m = bm;
    ua.block_n = bn;
    ua.seqlen_q = static_cast<int>(s.seqlen_q);
    ua.zero = persistent_of(desc) == 1 ? static_cast<int*>(workspace) : nullptr;
    if (place.build) {
      // The companion's launch.
      const KernelDesc sd = union_schedule_desc(desc.arch);
      for (Launch& b : UnionScheduleBlockPerTile().launches(
               sd, {ua, u.rows, std::move(place.after_build)}, nullptr)) {
        b.companion = union_companion(desc);
        out.push_back(std::move(b));
      }
      counter_zeroed = ua.zero != nullptr;
    }
    // The forward's view (FjUnionScheduleArgs): a block mask of block_m x block_n blocks with
    // the entries as kv_indices and the row headers as kv_num_blocks (num strides in headers).
    BlockMask view;
    view.batch = meta.batch;
    view.heads = meta.heads;
    view.num_q_blocks = ua.num_m;
    view.num_kv_blocks = ua.max_tiles;
    view.q_block_size = bm;
    view.kv_block_size = bn;
    a.mask = block_mask_args(view, ua.num, ua.entries, nullptr, nullptr);
    a.mask.num_stride_b *= kFjUnionRowInts;
    a.mask.num_stride_h *= kFjUnionRowInts;
  }
  Launch l;
  l.entry_point = "flexjit_forward";
  const int64_t m_blocks = (s.seqlen_q + bm - 1) / bm;
  const int q_tiles = q_tiles_of(desc);
  if (persistent_of(desc) == 1) {
    l.grid = {static_cast<unsigned>(persistent_ctas(desc, in)), 1, 1};
    FJ_ASSERT(workspace != nullptr, "the persistent forward launched without its work counter");
    a.sched_counter = static_cast<int*>(workspace);
    // The counter (the tile slots are written before they are read): the union schedule's
    // kernel zeroes it where it runs, else a memset right before the launch.
    if (!counter_zeroed) {
      l.zero_first = workspace;
      l.zero_bytes = sizeof(int);
    }
  } else {
    l.grid = {static_cast<unsigned>((m_blocks + q_tiles - 1) / q_tiles),
              static_cast<unsigned>(s.heads_q), static_cast<unsigned>(s.batch)};
  }
  l.block = {static_cast<unsigned>((bm / 64 + 1) * 128), 1, 1};
  l.smem_bytes = smem_bytes(desc);
  l.args.add(a);
  l.args.add_bytes(in.mod_params.data(), in.mod_params.size() * sizeof(uint64_t));
  l.args.add(maps);
  if (kv_cache) l.args.add(cache);
  if (kv_e4m3) l.args.add(FjFwdKvFp8Args{in.k_scale, in.v_scale});
  if (fp8_args) l.args.add(*fp8_args);
  l.before = std::move(wait_for_schedule);
  out.push_back(std::move(l));
  return out;
}

}  // namespace flexjit::kernels
