#include "kernels/forward/Sm80Mma.h"

#include <flexjit/error.h>

#include "codegen/cuda/ModCodegen.h"
#include "codegen/cuda/SourceWriter.h"
#include "kernels/HeadDims.h"
#include "kernels/MathMode.h"
#include "kernels/forward/ForwardArgs.h"
#include "util/Embedded.h"

#include <flexjit_abi.h>
#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>

namespace flexjit::kernels {

namespace {

bool one_of(int64_t v, std::initializer_list<int> allowed) {
  return std::find(allowed.begin(), allowed.end(), v) != allowed.end();
}

std::string list_text(std::initializer_list<int> allowed) {
  return fmt::format("{}", fmt::join(allowed, ", "));
}

std::optional<std::string> not_in(const char* what, int64_t v, std::initializer_list<int> allowed) {
  if (one_of(v, allowed)) return std::nullopt;
  return fmt::format("the forward kernel does not support {} = {}; supported: {}", what, v,
                     list_text(allowed));
}

// The problem checks shared by unsupported() and validate().
std::optional<std::string> problem_reason(const KernelDesc& p) {
  try {
    cuda::Arch::parse(p.arch.str());  // a hand-built Arch is checked as strictly as text
  } catch (const UnsupportedError& e) {
    return e.what();
  }
  switch (p.dtype) {
    case DType::BF16:
    case DType::F16:
    case DType::F32:  // computed on tf32 tensor cores (docs/kernels/forward_sm80.md)
      break;
    case DType::I32:
    case DType::Bool:
      return fmt::format("attention inputs must be bf16, f16 or f32, not {}", to_string(p.dtype));
    case DType::E4M3:
      return "e4m3 q, k, v are supported only by forward/sm90a_wgmma (an sm_90a GPU); "
             "forward/sm80_mma takes bf16, f16 or f32";
  }
  if (auto r =
          head_dim_reason("forward/sm80_mma", "head_dim_qk", p.head_dim_qk, kSm80ForwardTileDims)) {
    return r;
  }
  if (auto r =
          head_dim_reason("forward/sm80_mma", "head_dim_v", p.head_dim_v, kSm80ForwardTileDims)) {
    return r;
  }
  if (p.gqa_ratio < 1) {
    return fmt::format("gqa_ratio (heads_q / heads_kv) must be at least 1, not {}", p.gqa_ratio);
  }
  if (on_kv_e4m3(p)) {
    return fmt::format(
        "forward/sm80_mma does not read e4m3 KV caches (flag kv_e4m3 = {}); forward/sm90a_wgmma "
        "reads them on sm_90a, the decode kernels on sm_89 and newer",
        p.flags.at("kv_e4m3"));
  }
  return std::nullopt;
}

// The tile dims of a problem's head dims (kSm80ForwardTileDims), or the dim itself when no tile
// takes it (a problem that problem_reason refuses; its checks come first).
int tile_qk(const KernelDesc& d) {
  return tile_head_dim(d.head_dim_qk, kSm80ForwardTileDims).value_or(d.head_dim_qk);
}
int tile_v(const KernelDesc& d) {
  return tile_head_dim(d.head_dim_v, kSm80ForwardTileDims).value_or(d.head_dim_v);
}

int fwd_smem(const KernelDesc& d) {
  return fj_forward_smem_bytes(d.config.at_int("block_m"), d.config.at_int("block_n"), tile_qk(d),
                               tile_v(d), dtype_size(d.dtype), d.config.at_int("num_stages"));
}

// The KV cache flags (Forward.h): page_size absent or a power of two up to 256, seq_lens 0 / 1,
// and no `divisible` with them (each sequence has its own length).
std::optional<std::string> kv_cache_flag_error(const KernelDesc& d) {
  const int64_t page = kv_page_size(d);
  if (page < 0 || page > 256 || (page & (page - 1)) != 0) {
    return fmt::format(
        "forward/sm80_mma does not support page_size = {}; supported: 0 (contiguous K / V) or a "
        "power of two from 1 to 256",
        page);
  }
  const int64_t lens = d.flags.get("seq_lens").value_or(0);
  if (lens != 0 && lens != 1) {
    return fmt::format("forward/sm80_mma needs flag 'seq_lens' = 0 or 1, not {}", lens);
  }
  if (on_kv_cache(d) && d.flags.at("divisible") != 0) {
    return fmt::format(
        "forward/sm80_mma on a KV cache needs divisible = 0: each sequence has its own length "
        "({})",
        d.str());
  }
  return std::nullopt;
}

Params make_config(int block_m, int block_n, int num_warps, int num_stages) {
  return {{"block_m", block_m},
          {"block_n", block_n},
          {"num_warps", num_warps},
          {"num_stages", num_stages}};
}

}  // namespace

ForwardSm80Mma::ForwardSm80Mma()
    : templates_{embedded::template_text("flexjit_abi.h"),
                 embedded::template_text("prelude.cuh"),
                 embedded::template_text("mma_sm80.cuh"),
                 embedded::template_text("attention_sm80.cuh"),
                 embedded::template_text("forward_common.cuh"),
                 embedded::template_text("forward_sm80.cuh")} {}

std::string_view ForwardSm80Mma::summary() const {
  return "FlashAttention-2 structure: mma.sync, ldmatrix, cp.async pipeline; bf16/f16, f32 on "
         "tf32; head dims multiples of 8 up to 256 (tiles 64/128/256); sm_80 and newer";
}

std::optional<std::string> ForwardSm80Mma::unsupported(const KernelDesc& problem,
                                                       const InputFacts& facts) const {
  if (auto r = problem_reason(problem)) return r;
  // The fast path (cp.async, 16-byte vector loads) is the only path.
  if (!facts.aligned16) {
    return fmt::format(
        "the forward kernel needs 16-byte aligned data pointers and strides: {}; make the "
        "tensor contiguous (or pad its rows) first",
        facts.alignment_blocker);
  }
  return std::nullopt;
}

void ForwardSm80Mma::validate(const KernelDesc& d) const {
  if (auto r = problem_reason(d)) throw UnsupportedError(*r);
  for (const char* name : {"block_m", "block_n", "num_warps", "num_stages"}) {
    if (!d.config.has(name)) {
      throw UnsupportedError(fmt::format("forward/sm80_mma needs config '{}' ({})", name, d.str()));
    }
  }
  if (d.config.items().size() != 4) {
    throw UnsupportedError(
        fmt::format("forward/sm80_mma takes block_m, block_n, num_warps and num_stages; got {}",
                    d.config.str()));
  }
  const int64_t bm = d.config.at("block_m"), bn = d.config.at("block_n");
  const int64_t warps = d.config.at("num_warps"), stages = d.config.at("num_stages");
  if (auto r = not_in("block_m", bm, {64, 128})) throw UnsupportedError(*r);
  if (auto r = not_in("block_n", bn, {32, 64, 128})) throw UnsupportedError(*r);
  if (auto r = not_in("num_warps", warps, {4, 8})) throw UnsupportedError(*r);
  if (auto r = not_in("num_stages", stages, {1, 2, 3})) throw UnsupportedError(*r);
  // Each warp owns whole m16 MMA row tiles of the Q block.
  if (bm % (16 * warps) != 0) {
    throw UnsupportedError(fmt::format(
        "block_m = {} with num_warps = {} gives {} query rows per warp; each warp needs a "
        "multiple of 16 rows (block_m must be a multiple of 16 * num_warps = {})",
        bm, warps, bm / warps, 16 * warps));
  }
  for (const char* flag : {"divisible", "full_blocks"}) {
    auto v = d.flags.get(flag);
    if (!v || (*v != 0 && *v != 1)) {
      throw UnsupportedError(
          fmt::format("forward/sm80_mma needs flag '{}' = 0 or 1 ({})", flag, d.str()));
    }
  }
  if (auto r = fast_math_flag_error(d)) throw UnsupportedError(*r);
  if (auto r = kv_cache_flag_error(d)) throw UnsupportedError(*r);
  const int smem = fwd_smem(d);
  const int limit = cuda::max_smem_per_block(d.arch);
  if (smem > limit) {
    throw UnsupportedError(fmt::format(
        "config {}x{} with {} stages needs {} bytes of shared memory for head dims {}/{} (tiles "
        "{}/{}) in {}, more than the {} bytes a block may use on {}; lower num_stages, block_n or "
        "block_m{}",
        bm, bn, stages, smem, d.head_dim_qk, d.head_dim_v, tile_qk(d), tile_v(d),
        to_string(d.dtype), limit, d.arch.str(),
        d.dtype == DType::F32 ? " (or convert q, k, v to bf16 or f16: f32 tiles take twice the "
                                "bytes)"
                              : ""));
  }
}

Params ForwardSm80Mma::default_config(const KernelDesc& p) const {
  // FlashAttention-2's choices for mma.sync kernels: wide KV tiles where registers allow,
  // narrower ones as the head dim grows. sm_86/sm_89 have 99 KB of shared memory per block.
  // By the tile dims: a head dim runs in its tile's layouts (kSm80ForwardTileDims).
  const int d = std::max(tile_qk(p), tile_v(p));
  const bool small_smem = p.arch.cc() == 86 || p.arch.cc() == 89;
  if (p.dtype == DType::F32) {
    // tf32 path: fp32 tiles take twice the shared memory (fj_forward_smem_bytes with 4-byte
    // elements), so the tiles shrink. nvcc 13.0 ptxas, sm_80 / sm_90a, causal mask: d=64 128x64
    // w4 s2 (96 KiB) 218 / 225 registers; d=128 64x64 w4 s2 (160 KiB) 207 / 212, s1 (96 KiB, for
    // sm_86/89) 200 / 225; d=256 64x32 w4 s1 (128 KiB) 255 / 254, s2 (192 KiB, sm_90 only) 255;
    // no spills. d=256 has no config within the 99 KiB of sm_86/89: validate() says so.
    if (d <= 64) return make_config(128, 64, 4, 2);
    if (d <= 128) return make_config(64, 64, 4, small_smem ? 1 : 2);
    return make_config(64, 32, 4, p.arch.cc() >= 90 ? 2 : 1);
  }
  if (on_kv_cache(p)) {
    // The page-table reads and the per-sequence bound take registers that 32 rows per warp do
    // not have: NVRTC 13, sm_80 / sm_90a, page sizes 1 / 16 / 256, causal, softcap, alibi,
    // sliding window, relative and T5 biases: 128x64 w4 spills 64-160 bytes at d=128 (4-48 at
    // d=64); 16 rows per warp (w8) none, 155-255 registers. d=256 keeps its default, except
    // on sm_86/89, where 1 stage spills 40-84 bytes and 64x32 with 2 stages (96 KiB) none.
    if (d <= 128) return make_config(128, 64, 8, 2);
    return small_smem ? make_config(64, 32, 4, 2) : make_config(64, 64, 4, 2);
  }
  if (d <= 64) return make_config(128, 64, 4, 2);
  // Measured on an H200 (docs/kernels/forward_sm80.md "Design notes"): 128x64 w4 343 TFLOP/s noop
  // against 325 for 128x128 w8; causal 281 against 285. 96 KiB of shared memory also fits sm_86/89.
  if (d <= 128) return make_config(128, 64, 4, 2);
  return make_config(64, 64, 4, small_smem ? 1 : 2);
}

std::vector<Params> ForwardSm80Mma::config_space(const KernelDesc& p) const {
  std::vector<Params> out;
  for (int bm : {64, 128}) {
    for (int bn : {32, 64, 128}) {
      for (int w : {4, 8}) {
        for (int s : {1, 2, 3}) {
          KernelDesc d = p;
          d.config = make_config(bm, bn, w, s);
          try {
            validate(d);
          } catch (const UnsupportedError&) {
            continue;
          }
          out.push_back(d.config);
        }
      }
    }
  }
  return out;
}

Params ForwardSm80Mma::resolve_config(const KernelDesc& problem, const Params& overrides,
                                      const InputFacts& facts) const {
  Params c = apply_overrides(*this, default_config(problem), overrides);
  if (facts.mask_q_block == 0) return c;
  // The block mask's sparse blocks must be multiples of the tiles: shrink a tile the caller
  // left open to the largest that divides them.
  if (fit_tile_to_block(c, "block_m", facts.mask_q_block, overrides, {128, 64}) &&
      !overrides.has("num_warps")) {
    c.set("num_warps", std::min<int64_t>(c.at("num_warps"), c.at("block_m") / 16));
  }
  fit_tile_to_block(c, "block_n", facts.mask_kv_block, overrides, {128, 64, 32});
  if (facts.mask_q_block % c.at("block_m") != 0 || facts.mask_kv_block % c.at("block_n") != 0) {
    throw UnsupportedError(fmt::format(
        "the block mask's sparse blocks ({}x{}) are not multiples of the kernel's {}x{} tiles; "
        "build the mask with a block size that is a multiple of 128 (or of 64 and 32), or pass a "
        "config whose block_m / block_n divide it",
        facts.mask_q_block, facts.mask_kv_block, c.at("block_m"), c.at("block_n")));
  }
  return c;
}

void ForwardSm80Mma::specialize(KernelDesc& d, const InputFacts& facts) const {
  if (facts.seqlen_q < 0 || facts.seqlen_kv < 0) return;  // keep what the caller said
  // On a KV cache every sequence has its own length: the key bounds stay.
  const bool divisible = !on_kv_cache(d) && facts.seqlen_q % d.config.at("block_m") == 0 &&
                         facts.seqlen_kv % d.config.at("block_n") == 0;
  d.flags.set("divisible", divisible ? 1 : 0);
}

std::vector<TemplateText> ForwardSm80Mma::templates() const {
  return {{"flexjit_abi.h", templates_.abi, true},
          {"prelude.cuh", templates_.prelude, true},
          {"mma_sm80.cuh", templates_.mma, false},
          {"attention_sm80.cuh", templates_.attention, false},
          {"forward_common.cuh", templates_.common, false},
          {"forward_sm80.cuh", templates_.kernel, false}};
}

std::string ForwardSm80Mma::config_struct(const Mods& mods, const KernelDesc& d,
                                          const std::vector<std::string>& extra) {
  cuda::SourceWriter w;
  w.line(fmt::format("// Compile-time configuration: {}", d.str()));
  {
    auto s = w.block("struct FjConfig", ";");
    w.line(fmt::format(
        "static constexpr int kBlockM = {}, kBlockN = {}, kNumWarps = {}, kNumStages = {};",
        d.config.at("block_m"), d.config.at("block_n"), d.config.at("num_warps"),
        d.config.at("num_stages")));
    w.line(fmt::format("static constexpr int kHeadDimQK = {}, kHeadDimV = {}, kGqaRatio = {};",
                       d.head_dim_qk, d.head_dim_v, d.gqa_ratio));
    auto b = [](bool v) { return v ? "true" : "false"; };
    w.line(fmt::format("static constexpr bool kIsDivisible = {}, kHasFullBlocks = {};",
                       b(d.flags.at("divisible") != 0), b(d.flags.at("full_blocks") != 0)));
    w.line(fmt::format("static constexpr bool kHasScoreMod = {}, kHasMaskMod = {};",
                       b(cuda::has_score_mod(mods)), b(cuda::has_mask_mod(mods))));
    for (const std::string& line : extra)
      w.line(line);
    w.line(fmt::format("using Element = {};", element_type(d.dtype)));
  }
  return w.str();
}

cuda::GeneratedSource ForwardSm80Mma::generate(const Mods& mods, const KernelDesc& desc) const {
  validate(desc);
  mods.check();
  // kHeadDimQK / kHeadDimV are the tile dims (the layouts), kRealDimQK / kRealDimV the problem's
  // (forward_sm80.cuh); the comment line names the problem.
  KernelDesc tiled = desc;
  tiled.head_dim_qk = tile_qk(desc);
  tiled.head_dim_v = tile_v(desc);
  std::vector<std::string> extra = {real_head_dims_line(desc.head_dim_qk, desc.head_dim_v)};
  auto config_text = [&] {
    std::string s = config_struct(mods, tiled, extra);
    const std::string said = tiled.str(), real = desc.str();
    if (said != real) {
      if (const size_t at = s.find(said); at != std::string::npos) s.replace(at, said.size(), real);
    }
    return s;
  };
  if (!on_kv_cache(desc)) {
    return assemble_variant_source(*this, desc, mods, config_text(),
                                   "forward kernel `flexjit_forward`");
  }
  // On a KV cache the kernel takes FjKvCacheArgs (forward_sm80.cuh, FJ_FWD_KV_CACHE).
  extra.push_back(fmt::format("static constexpr int kPageSize = {};", kv_page_size(desc)));
  const std::string config = "#define FJ_FWD_KV_CACHE 1\n" + config_text();
  return assemble_variant_source(*this, desc, mods, config,
                                 "forward kernel `flexjit_forward` on a KV cache");
}

unsigned ForwardSm80Mma::smem_bytes(const KernelDesc& desc) const {
  return static_cast<unsigned>(fwd_smem(desc));
}

std::vector<Launch> ForwardSm80Mma::launches(const KernelDesc& desc, const ForwardInputs& in,
                                             void*) const {
  const QkvShape& s = in.shape;
  FjFwdArgs a = make_fwd_args(in.q, in.k, in.v, in.out, in.lse ? &*in.lse : nullptr, s, in.scale);
  if (in.block_mask != nullptr) {
    a.mask = block_mask_args(*in.block_mask, desc.flags.at("full_blocks") != 0);
  }
  const bool kv_cache = on_kv_cache(desc);
  FJ_ASSERT(kv_cache == (in.seq_lens != nullptr || in.page_table != nullptr) &&
                kv_page_size(desc) == (in.page_table != nullptr ? in.page_size : 0),
            "forward/sm80_mma launched with KV cache inputs that its description does not match");
  FjKvCacheArgs cache{};
  if (kv_cache) {
    cache.page_table = in.page_table;
    cache.page_table_stride_b = in.page_table_stride_b;
    cache.seq_lens = in.seq_lens;
    if (in.page_table != nullptr) {  // pools [num_pages, page_size, Hkv, D]: b strides pages
      a.k_stride_b = in.k.strides[0], a.k_stride_s = in.k.strides[1],
      a.k_stride_h = in.k.strides[2];
      a.v_stride_b = in.v.strides[0], a.v_stride_s = in.v.strides[1],
      a.v_stride_h = in.v.strides[2];
    }
  }
  const int64_t bm = desc.config.at("block_m");
  Launch l;
  l.entry_point = "flexjit_forward";
  l.grid = {static_cast<unsigned>((s.seqlen_q + bm - 1) / bm), static_cast<unsigned>(s.heads_q),
            static_cast<unsigned>(s.batch)};
  l.block = {static_cast<unsigned>(desc.config.at("num_warps") * 32), 1, 1};
  l.smem_bytes = smem_bytes(desc);
  l.args.add(a);
  l.args.add_bytes(in.mod_params.data(), in.mod_params.size() * sizeof(uint64_t));
  if (kv_cache) l.args.add(cache);
  std::vector<Launch> out;
  out.push_back(std::move(l));
  return out;
}

}  // namespace flexjit::kernels
