#include "kernels/decode/DecodeSplit.h"

#include <flexjit/error.h>

#include "codegen/cuda/ModCodegen.h"
#include "codegen/cuda/SourceWriter.h"
#include "kernels/HeadDims.h"
#include "kernels/MathMode.h"
#include "kernels/forward/Forward.h"
#include "kernels/forward/ForwardArgs.h"
#include "util/Embedded.h"

#include <flexjit_abi.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>

namespace flexjit::kernels {

namespace {

bool one_of(int64_t v, std::initializer_list<int> allowed) {
  return std::find(allowed.begin(), allowed.end(), v) != allowed.end();
}

std::optional<std::string> not_in(const char* what, int64_t v, std::initializer_list<int> allowed) {
  if (one_of(v, allowed)) return std::nullopt;
  return fmt::format("the decode kernel does not support {} = {}; supported: {}", what, v,
                     fmt::join(allowed, ", "));
}

bool is_pow2(int64_t v) {
  return v > 0 && (v & (v - 1)) == 0;
}

// The problem checks shared by unsupported() and validate(); `variant` names the one asking.
std::optional<std::string> problem_reason(const KernelDesc& p, std::string_view variant) {
  try {
    cuda::Arch::parse(p.arch.str());
  } catch (const UnsupportedError& e) {
    return e.what();
  }
  if (p.dtype != DType::BF16 && p.dtype != DType::F16) {
    return fmt::format("the decode kernel runs on bf16 or f16 inputs, not {}", to_string(p.dtype));
  }
  for (auto [what, dim] : {std::pair{"head_dim_qk", p.head_dim_qk}, {"head_dim_v", p.head_dim_v}}) {
    if (auto r = head_dim_reason(fmt::format("decode_split/{}", variant), what, dim,
                                 kDecodeSplitTileDims)) {
      return r;
    }
  }
  if (p.gqa_ratio < 1) {
    return fmt::format("gqa_ratio (heads_q / heads_kv) must be at least 1, not {}", p.gqa_ratio);
  }
  for (const char* flag : {"rows", "page_size", "full_blocks"}) {
    if (!p.flags.has(flag)) {
      return fmt::format("decode_split/sm80_mma needs flag '{}' ({})", flag, p.str());
    }
  }
  if (auto r = not_in("rows", p.flags.at("rows"), {16, 32, 64, 128})) return r;
  const int64_t page = p.flags.at("page_size");
  if (page != 0 && (!is_pow2(page) || page > 256)) {
    return fmt::format(
        "the decode kernel does not support page_size = {}; supported: 0 (contiguous K / V) or a "
        "power of two from 1 to 256",
        page);
  }
  const int64_t full = p.flags.at("full_blocks");
  if (full != 0 && full != 1) {
    return fmt::format("decode_split/sm80_mma needs flag 'full_blocks' = 0 or 1 ({})", p.str());
  }
  if (auto r = fast_math_flag_error(p)) return r;
  if (const int64_t fp8 = p.flags.get("kv_e4m3").value_or(0); fp8 != 0) {
    if (fp8 != 1) {
      return fmt::format("decode_split/{} needs flag 'kv_e4m3' = 1 or absent ({})", variant,
                         p.str());
    }
    if (p.arch.cc() < 89) {
      return fmt::format(
          "an e4m3 KV cache needs sm_89 or newer (the kernel converts e4m3 with "
          "cvt.f16x2.e4m3x2), not {}",
          p.arch.str());
    }
    for (auto [what, dim] :
         {std::pair{"head_dim_qk", p.head_dim_qk}, {"head_dim_v", p.head_dim_v}}) {
      if (dim % 16 != 0) {
        return fmt::format(
            "an e4m3 KV cache needs head dims that are multiples of 16 (16-byte rows of e4m3); "
            "{} is {}",
            what, dim);
      }
    }
  }
  return std::nullopt;
}

bool kv_fp8(const KernelDesc& d) {
  return d.flags.get("kv_e4m3").value_or(0) != 0;
}

// The tile dim of a head dim (kDecodeSplitTileDims), or the dim itself when no tile takes it (a
// problem that problem_reason refuses; its checks come first).
int tile_of(int head_dim) {
  return tile_head_dim(head_dim, kDecodeSplitTileDims).value_or(head_dim);
}

int split_smem(const KernelDesc& d) {
  return fj_decode_split_smem_bytes_kv(
      d.flags.at_int("rows"), d.config.at_int("block_n"), tile_of(d.head_dim_qk),
      tile_of(d.head_dim_v), dtype_size(d.dtype), d.config.at_int("num_stages"),
      d.config.at_int("num_warps"), d.config.at_int("kv_copy"), kv_fp8(d));
}

// Warps for `rows` packed rows and `block_n` keys: one per m16 row block, times up to 4 along N
// while each keeps 16 keys.
int default_warps(int rows, int block_n) {
  return std::max(rows / 16, std::min(4, block_n / 16));
}

Params make_config(int block_n, int num_warps, int num_stages, int num_splits, int kv_copy = 0) {
  return {{"block_n", block_n},
          {"num_warps", num_warps},
          {"num_stages", num_stages},
          {"num_splits", num_splits},
          {"kv_copy", kv_copy}};
}

// The kv_copy modes the tuner searches: cp.async only. The bulk copies (1, 2; sm_90 on, 2-byte
// K / V) stay selectable by name (`--param kv_copy=N`), but the H100 measured them at 55-59 % of
// the copy bandwidth against cp.async's 84 % on the anchors' decode shape (docs/kernels/decode.md
// "Bulk K / V copies", v26 in docs/perf/NOTES.md), so searching them only costs tuning time.
std::initializer_list<int> kv_copy_modes(const KernelDesc&) {
  static constexpr std::initializer_list<int> kCpAsync = {0};
  return kCpAsync;
}

// Shared memory that leaves room for two CTAs per SM on sm_80 (164 KB) and sm_90 (228 KB).
constexpr int kTwoPerSmBytes = 113 * 1024;

}  // namespace

std::string_view DecodeSplitSm80Mma::name() const {
  switch (kv_hint_) {
    case 1:
      return "sm80_ef";
    case 2:
      return "sm80_ef256";
    default:
      return "sm80_mma";
  }
}

std::string_view DecodeSplitSm80Mma::summary() const {
  switch (kv_hint_) {
    case 1:
      return "split-KV decoding as sm80_mma, K/V copies with an L2::evict_first cache policy "
             "(experimental)";
    case 2:
      return "split-KV decoding as sm80_mma, K/V copies with an L2::evict_first cache policy "
             "and the L2::256B prefetch size (experimental)";
    default:
      return "split-KV decoding: GQA group x query tokens packed into mma.sync M, cp.async K/V "
             "pipeline (e4m3 K/V with an L2::evict_first policy), contiguous or paged K/V; "
             "bf16/f16; head dims multiples of 8 up to 256 (tiles 64/128/256); sm_80 and newer";
  }
}

std::optional<std::string> DecodeSplitSm80Mma::unsupported(const KernelDesc& problem,
                                                           const InputFacts& facts) const {
  if (auto r = problem_reason(problem, name())) return r;
  if (!facts.aligned16) {
    return fmt::format("the decode kernel needs 16-byte aligned data pointers and strides: {}",
                       facts.alignment_blocker);
  }
  if (facts.mask_q_block > 0 && facts.seqlen_q > facts.mask_q_block) {
    return fmt::format(
        "the decode kernel reads one query block of the block mask, but Sq = {} spans more than "
        "its q block size {}",
        facts.seqlen_q, facts.mask_q_block);
  }
  if (facts.mask_kv_block > 0 && facts.mask_kv_block % 32 != 0) {
    return fmt::format(
        "the decode kernel's KV tiles (32, 64 or 128 keys) must divide the block mask's kv block "
        "size {}",
        facts.mask_kv_block);
  }
  return std::nullopt;
}

void DecodeSplitSm80Mma::validate(const KernelDesc& d) const {
  if (auto r = problem_reason(d, name())) throw UnsupportedError(*r);
  for (const char* name : {"block_n", "num_warps", "num_stages", "num_splits", "kv_copy"}) {
    if (!d.config.has(name)) {
      throw UnsupportedError(
          fmt::format("decode_split/sm80_mma needs config '{}' ({})", name, d.str()));
    }
  }
  if (d.config.items().size() != 5) {
    throw UnsupportedError(
        fmt::format("decode_split/sm80_mma takes block_n, num_warps, num_stages, num_splits and "
                    "kv_copy; got {}",
                    d.config.str()));
  }
  const int64_t rows = d.flags.at("rows"), bn = d.config.at("block_n");
  const int64_t warps = d.config.at("num_warps"), stages = d.config.at("num_stages");
  const int64_t splits = d.config.at("num_splits");
  if (auto r = not_in("block_n", bn, {32, 64, 128})) throw UnsupportedError(*r);
  if (auto r = not_in("num_warps", warps, {2, 4, 8})) throw UnsupportedError(*r);
  if (auto r = not_in("num_stages", stages, {1, 2, 3, 4})) throw UnsupportedError(*r);
  const int64_t kv_copy = d.config.at("kv_copy");
  if (auto r = not_in("kv_copy", kv_copy, {0, 1, 2})) throw UnsupportedError(*r);
  if (kv_copy != 0 && d.arch.cc() < 90) {
    throw UnsupportedError(fmt::format(
        "kv_copy = {} (cp.async.bulk K / V copies with mbarriers) needs sm_90 or newer, not {}; "
        "kv_copy = 0 (cp.async) runs on every arch",
        kv_copy, d.arch.str()));
  }
  if (kv_copy != 0 && kv_fp8(d)) {
    throw UnsupportedError(fmt::format(
        "kv_copy = {} does not take an e4m3 KV cache (its tiles are converted from the chunks each "
        "thread copied); use kv_copy = 0",
        kv_copy));
  }
  if (splits < 0 || splits > kMaxSplitsConfig) {
    throw UnsupportedError(fmt::format(
        "num_splits = {} is out of range; 0 (chosen from the SM count and the KV length) or "
        "1..{}",
        splits, kMaxSplitsConfig));
  }
  const int64_t warps_m = rows / 16;
  if (warps % warps_m != 0) {
    throw UnsupportedError(fmt::format(
        "num_warps = {} cannot cover {} packed rows: each warp owns 16 rows, so num_warps must be "
        "a multiple of {}",
        warps, rows, warps_m));
  }
  const int64_t warp_keys = bn / (warps / warps_m);
  if (warp_keys % 16 != 0 || warp_keys == 0) {
    throw UnsupportedError(fmt::format(
        "block_n = {} over {} warps along the keys gives {} keys per warp; each warp needs a "
        "multiple of 16 (raise block_n or lower num_warps)",
        bn, warps / warps_m, bn / (warps / warps_m)));
  }
  const int threads = static_cast<int>(warps) * 32;
  for (int dim : {d.head_dim_qk, d.head_dim_v}) {
    // 16-byte copies per thread: 2-byte chunks (cp.async); e4m3 chunks (each thread converts
    // the ones it copied; with more threads than chunks some copy none) always split.
    if (kv_copy == 0 && !kv_fp8(d) && bn * (tile_of(dim) * 2 / 16) % threads != 0) {
      throw UnsupportedError(fmt::format(
          "a {}-key tile of head dim {} (tile {}) does not split into 16-byte copies over {} "
          "threads",
          bn, dim, tile_of(dim), threads));
    }
  }
  const int smem = split_smem(d);
  const int limit = cuda::max_smem_per_block(d.arch);
  if (smem > limit) {
    throw UnsupportedError(fmt::format(
        "decode config block_n = {} with {} stages (kv_copy = {}{}) needs {} bytes of shared "
        "memory for head dims {}/{} (tiles {}/{}), more than the {} bytes a block may use on {}; "
        "lower num_stages or block_n",
        bn, stages, kv_copy, kv_fp8(d) ? ", e4m3 K / V" : "", smem, d.head_dim_qk, d.head_dim_v,
        tile_of(d.head_dim_qk), tile_of(d.head_dim_v), limit, d.arch.str()));
  }
}

Params DecodeSplitSm80Mma::default_config(const KernelDesc& p) const {
  // Keys per tile: 64 (32 for d = 256, whose 64-key tiles take 64 KB a stage), at most 32 per
  // warp. Stages: the most (up to 2; 3 on a paged cache and for d = 256's 32-key tiles) that
  // leave room for two CTAs per SM, else the most that fit. 2 rather than 3 without pages at
  // d <= 128 (H100, the anchors' shape: 2.517 against 2.497 TB/s with the same 4 splits; the
  // tuner's search had picked 2 stages too); through 16-key pages 2 stages measured 2.36 against
  // 3's 2.43 (the page table's lookups want the deeper ring); d = 256 keeps 3, unmeasured
  // (docs/kernels/decode.md "Design notes").
  // Warps: 4 (8 from 64 rows on; d = 256: one per 16 rows, at least 2), so that each keeps at
  // most 32 keys of a tile (64 keys per warp reach 255 registers with a mask_mod that loads
  // buffers: nvcc 13.0 ptxas, document_causal, 128 rows, sm_80).
  const int rows = static_cast<int>(p.flags.get("rows").value_or(16));
  // By the tile dims: a head dim runs in its tile's layouts (kDecodeSplitTileDims).
  const int qk = tile_of(p.head_dim_qk), v = tile_of(p.head_dim_v);
  const bool wide = std::max(qk, v) > 128;
  const int warps_m = rows / 16;
  const int warps = wide ? std::max(warps_m, 2) : (warps_m <= 2 ? 4 : 8);
  const int bn = std::min(wide ? 32 : 64, 32 * (warps / warps_m));
  const int limit = cuda::max_smem_per_block(p.arch);
  const int es = dtype_size(p.dtype == DType::F16 ? DType::F16 : DType::BF16);
  const bool paged = p.flags.get("page_size").value_or(0) != 0;
  // e4m3 K / V: up to 4 stages (a stage is half the bytes; the ring keeps 3 tiles in flight
  // within two CTAs per SM at the anchors' shape: 4 KB of Q + 4 x 16 KB, converted in registers).
  // Not measured yet (docs/kernels/decode.md "FP8 KV caches").
  const bool fp8 = kv_fp8(p);
  int stages = 1;
  for (int s = fp8 ? 4 : wide || paged ? 3 : 2; s > 1; --s) {
    const int smem = fj_decode_split_smem_bytes_kv(rows, bn, qk, v, es, s, warps, 0, fp8);
    if (smem <= std::min(limit, kTwoPerSmBytes)) {
      stages = s;
      break;
    }
  }
  return make_config(bn, warps, stages, 0);
}

std::vector<Params> DecodeSplitSm80Mma::config_space(const KernelDesc& p) const {
  std::vector<Params> out;
  for (int bn : {32, 64, 128}) {
    for (int w : {2, 4, 8}) {
      for (int s : {2, 3, 4}) {
        for (int splits : {0, 1, 2, 4, 8, 16, 32, 64, 128}) {
          for (int kv_copy : kv_copy_modes(p)) {
            KernelDesc d = p;
            d.config = make_config(bn, w, s, splits, kv_copy);
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
  }
  return out;
}

Params DecodeSplitSm80Mma::resolve_config(const KernelDesc& problem, const Params& overrides,
                                          const InputFacts& facts) const {
  Params c = apply_overrides(*this, default_config(problem), overrides);
  const int rows = static_cast<int>(problem.flags.get("rows").value_or(16));
  if (fit_tile_to_block(c, "block_n", facts.mask_kv_block, overrides, {128, 64, 32}) &&
      !overrides.has("num_warps")) {
    c.set("num_warps", default_warps(rows, static_cast<int>(c.at("block_n"))));
  }
  if (facts.mask_kv_block > 0 && facts.mask_kv_block % c.at("block_n") != 0) {
    throw UnsupportedError(fmt::format(
        "the block mask's kv block size {} is not a multiple of the decode kernel's block_n = {}",
        facts.mask_kv_block, c.at("block_n")));
  }
  return c;
}

std::vector<TemplateText> DecodeSplitSm80Mma::templates() const {
  std::vector<TemplateText> t = common_templates();
  t.push_back({"mma_sm80.cuh", embedded::template_text("mma_sm80.cuh"), false});
  t.push_back({"decode_split.cuh", embedded::template_text("decode_split.cuh"), false});
  return t;
}

std::string DecodeSplitSm80Mma::config_struct(const Mods& mods, const KernelDesc& d, int kv_hint) {
  cuda::SourceWriter w;
  w.line(fmt::format("// Compile-time configuration: {}", d.str()));
  {
    auto s = w.block("struct FjConfig", ";");
    w.line(fmt::format(
        "static constexpr int kRows = {}, kBlockN = {}, kNumWarps = {}, kNumStages = {};",
        d.flags.at("rows"), d.config.at("block_n"), d.config.at("num_warps"),
        d.config.at("num_stages")));
    // The tile dims (the layouts) and the problem's head dims (decode_split.cuh).
    w.line(fmt::format(
        "static constexpr int kHeadDimQK = {}, kHeadDimV = {}, kGqaRatio = {}, kPageSize = {};",
        tile_of(d.head_dim_qk), tile_of(d.head_dim_v), d.gqa_ratio, d.flags.at("page_size")));
    w.line(real_head_dims_line(d.head_dim_qk, d.head_dim_v));
    auto b = [](bool v) { return v ? "true" : "false"; };
    w.line(fmt::format("static constexpr bool kHasFullBlocks = {};",
                       b(d.flags.at("full_blocks") != 0)));
    w.line(fmt::format("static constexpr bool kHasScoreMod = {}, kHasMaskMod = {};",
                       b(cuda::has_score_mod(mods)), b(cuda::has_mask_mod(mods))));
    w.line(fmt::format("static constexpr int kKvHint = {}, kKvCopy = {};", kv_hint,
                       d.config.at("kv_copy")));
    w.line(fmt::format("static constexpr bool kKvFp8 = {};", b(kv_fp8(d))));
    w.line(fmt::format("using Element = {};", element_type(d.dtype)));
  }
  return w.str();
}

cuda::GeneratedSource DecodeSplitSm80Mma::generate(const Mods& mods, const KernelDesc& desc) const {
  validate(desc);
  mods.check();
  // num_splits is a launch parameter (the grid's x and the partials' layout): the source is the
  // one of num_splits = 0 for every value, so the configs that differ only in it (the tuner's
  // split-count candidates) share one compile and one cache entry.
  KernelDesc source_desc = desc;
  source_desc.config.set("num_splits", 0);
  return assemble_variant_source(
      *this, source_desc, mods, config_struct(mods, source_desc, kv_hint_),
      fmt::format("split-KV decoding kernel `{}` (any num_splits: a launch parameter)", kEntry));
}

unsigned DecodeSplitSm80Mma::smem_bytes(const KernelDesc& desc) const {
  return static_cast<unsigned>(split_smem(desc));
}

size_t DecodeSplitSm80Mma::workspace_bytes(const KernelDesc& desc, const DecodeInputs& in) const {
  return decode_workspace_bytes(in, resolve_num_splits(desc, in));
}

FjDecodeArgs make_decode_args(const DecodeInputs& in, int splits, int rows, void* workspace) {
  FjDecodeArgs a{};
  a.q = in.q.data;
  a.k = in.k.data;
  a.v = in.v.data;
  a.q_stride_b = in.q.strides[0], a.q_stride_h = in.q.strides[1], a.q_stride_s = in.q.strides[2];
  if (in.page_table != nullptr) {  // pools [num_pages, page_size, Hkv, D]
    a.k_stride_b = in.k.strides[0], a.k_stride_s = in.k.strides[1], a.k_stride_h = in.k.strides[2];
    a.v_stride_b = in.v.strides[0], a.v_stride_s = in.v.strides[1], a.v_stride_h = in.v.strides[2];
  } else {
    a.k_stride_b = in.k.strides[0], a.k_stride_h = in.k.strides[1], a.k_stride_s = in.k.strides[2];
    a.v_stride_b = in.v.strides[0], a.v_stride_h = in.v.strides[1], a.v_stride_s = in.v.strides[2];
  }
  a.page_table = in.page_table;
  a.page_table_stride_b = in.page_table_stride_b;
  a.seq_lens = in.seq_lens;
  a.k_scale = in.kv_fp8 ? in.k_scale : nullptr;
  a.v_scale = in.kv_fp8 ? in.v_scale : nullptr;
  if (workspace != nullptr) {
    const size_t packed = static_cast<size_t>(in.batch * in.heads_q * in.seqlen_q) * splits;
    a.o_part = static_cast<float*>(workspace);
    a.lse_part = a.o_part + packed * static_cast<size_t>(in.head_dim_v);
  }
  a.batch = static_cast<int>(in.batch);
  a.heads_q = static_cast<int>(in.heads_q);
  a.heads_kv = static_cast<int>(in.heads_kv);
  a.seqlen_q = static_cast<int>(in.seqlen_q);
  a.seqlen_kv = static_cast<int>(in.seqlen_kv);
  a.num_splits = splits;
  a.row_groups = static_cast<int>(
      decode_row_groups(in.heads_q / std::max<int64_t>(1, in.heads_kv), in.seqlen_q, rows));
  a.scale = in.scale ? *in.scale
                     : static_cast<float>(1.0 / std::sqrt(static_cast<double>(in.head_dim_qk)));
  return a;
}

std::vector<Launch> DecodeSplitSm80Mma::launches(const KernelDesc& desc, const DecodeInputs& in,
                                                 void* workspace) const {
  const int rows = desc.flags.at_int("rows");
  const int splits = resolve_num_splits(desc, in);
  FjDecodeArgs a = make_decode_args(in, splits, rows, workspace);
  if (in.block_mask != nullptr) {
    a.mask = block_mask_args(*in.block_mask, desc.flags.at("full_blocks") != 0);
  }
  Launch l;
  l.entry_point = kEntry;
  l.grid = {static_cast<unsigned>(splits), static_cast<unsigned>(in.heads_kv * a.row_groups),
            static_cast<unsigned>(in.batch)};
  l.block = {static_cast<unsigned>(desc.config.at("num_warps") * 32), 1, 1};
  l.smem_bytes = smem_bytes(desc);
  l.args.add(a);
  l.args.add_bytes(in.mod_params.data(), in.mod_params.size() * sizeof(uint64_t));
  std::vector<Launch> out;
  out.push_back(std::move(l));
  return out;
}

}  // namespace flexjit::kernels
