#include "kernels/backward/Sm80Backward.h"

#include <flexjit/error.h>

#include "codegen/cuda/ModCodegen.h"
#include "codegen/cuda/SourceWriter.h"
#include "kernels/BufferChecks.h"
#include "kernels/HeadDims.h"
#include "kernels/MathMode.h"
#include "kernels/forward/Forward.h"
#include "kernels/forward/Sm80Mma.h"
#include "util/Embedded.h"

#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>

namespace flexjit::kernels {

namespace {

bool one_of(int64_t v, std::initializer_list<int> allowed) {
  return std::find(allowed.begin(), allowed.end(), v) != allowed.end();
}

std::optional<std::string> not_in(const KernelDesc& d, const char* what, int64_t v,
                                  std::initializer_list<int> allowed) {
  if (one_of(v, allowed)) return std::nullopt;
  return fmt::format("{} does not support {} = {}; supported: {}", d.family_variant(), what, v,
                     fmt::join(allowed, ", "));
}

// The problem checks every backward variant shares (unsupported() and validate()); `variant`
// names the one asking (the problem's own is empty during selection).
std::optional<std::string> problem_reason(const KernelDesc& p, std::string_view variant) {
  try {
    cuda::Arch::parse(p.arch.str());
  } catch (const UnsupportedError& e) {
    return e.what();
  }
  if (p.dtype != DType::BF16 && p.dtype != DType::F16 && p.dtype != DType::F32) {
    return fmt::format("attention inputs must be bf16, f16 or f32, not {}", to_string(p.dtype));
  }
  for (auto [what, dim] : {std::pair{"head_dim_qk", p.head_dim_qk}, {"head_dim_v", p.head_dim_v}}) {
    if (auto r = head_dim_reason(fmt::format("{}/{}", to_string(p.family), variant), what, dim,
                                 kSm80BackwardTileDims)) {
      return r;
    }
  }
  if (p.gqa_ratio < 1) {
    return fmt::format("gqa_ratio (heads_q / heads_kv) must be at least 1, not {}", p.gqa_ratio);
  }
  return std::nullopt;
}

std::optional<std::string> alignment_reason(const InputFacts& facts) {
  if (facts.aligned16) return std::nullopt;
  return fmt::format(
      "the backward kernels need 16-byte aligned data pointers and strides: {}; make the tensor "
      "contiguous (or pad its rows) first",
      facts.alignment_blocker);
}

Params make_config(int block_m, int block_n, int num_warps, int num_stages) {
  return {{"block_m", block_m},
          {"block_n", block_n},
          {"num_warps", num_warps},
          {"num_stages", num_stages}};
}

// The dK/dV kernel's config: the tiles, and whether it also adds dQ (dq_atomic).
Params dkdv_config(int block_m, int block_n, int num_warps, int num_stages, int dq_atomic) {
  Params p = make_config(block_m, block_n, num_warps, num_stages);
  p.set("dq_atomic", dq_atomic);
  return p;
}

// The tile dim of a head dim (kSm80BackwardTileDims), or the dim itself when no tile takes it
// (a problem that problem_reason refuses; its checks come first).
int tile_of(int head_dim) {
  return tile_head_dim(head_dim, kSm80BackwardTileDims).value_or(head_dim);
}

// The generated `struct FjConfig` of the dK/dV and dQ kernels: the forward's fields with the
// tile dims as kHeadDimQK / kHeadDimV, the problem's as kRealDimQK / kRealDimV, the dQ
// accumulator's row width kDqAccumDim, kDqAtomic (whether the dK/dV kernel adds dQ) and
// kDeterministic (ordered buffer gradients).
std::string backward_config_struct(const Mods& mods, const KernelDesc& d) {
  KernelDesc tiled = d;
  tiled.head_dim_qk = tile_of(d.head_dim_qk);
  tiled.head_dim_v = tile_of(d.head_dim_v);
  std::string s = ForwardSm80Mma::config_struct(
      mods, tiled,
      {real_head_dims_line(d.head_dim_qk, d.head_dim_v),
       fmt::format("static constexpr int kDqAccumDim = {};", dq_accum_dim(d.head_dim_qk)),
       fmt::format("static constexpr bool kDqAtomic = {};",
                   d.config.get("dq_atomic").value_or(0) != 0 ? "true" : "false"),
       fmt::format("static constexpr bool kDeterministic = {};",
                   is_deterministic(d) ? "true" : "false")});
  // The comment line names the problem's own dims.
  const std::string said = tiled.str(), real = d.str();
  if (said != real) {
    if (const size_t at = s.find(said); at != std::string::npos) s.replace(at, said.size(), real);
  }
  return s;
}

int dkdv_smem(const KernelDesc& d) {
  return fj_bwd_dkdv_smem_bytes(d.config.at_int("block_m"), d.config.at_int("block_n"),
                                tile_of(d.head_dim_qk), tile_of(d.head_dim_v), dtype_size(d.dtype),
                                d.config.at_int("num_stages"), d.config.at_int("dq_atomic"));
}

int dq_smem(const KernelDesc& d) {
  return fj_bwd_dq_smem_bytes(d.config.at_int("block_m"), d.config.at_int("block_n"),
                              tile_of(d.head_dim_qk), tile_of(d.head_dim_v), dtype_size(d.dtype),
                              d.config.at_int("num_stages"));
}

std::string grads_section(const Mods& mods, const KernelDesc& desc) {
  return cuda::generate_mod_grad_functions(
      mods, math_functions(desc),
      is_deterministic(desc) ? cuda::GradAccumulation::Ordered : cuda::GradAccumulation::Atomic,
      buffer_checks(desc), bufgrad_smem_floats(desc));
}

// Every backward kernel's templates: one file, the entry point picked by a #define.
std::vector<TemplateText> backward_templates() {
  std::vector<TemplateText> t = common_templates();
  t.push_back({"mma_sm80.cuh", embedded::template_text("mma_sm80.cuh"), false});
  t.push_back({"attention_sm80.cuh", embedded::template_text("attention_sm80.cuh"), false});
  t.push_back({"backward_sm80.cuh", embedded::template_text("backward_sm80.cuh"), false});
  t.push_back({"sink_grad.cuh", embedded::template_text("sink_grad.cuh"), false});
  return t;
}

}  // namespace

// ---- the row kernels: backward_preprocess/sm80, backward_dq/atomic_convert ----------------------

template <Family F>
std::optional<std::string> BackwardRowKernelSm80<F>::unsupported(const KernelDesc& problem,
                                                                 const InputFacts& facts) const {
  if (auto r = problem_reason(problem, this->name())) return r;
  return alignment_reason(facts);
}

template <Family F>
void BackwardRowKernelSm80<F>::validate(const KernelDesc& d) const {
  if (auto r = problem_reason(d, this->name())) throw UnsupportedError(*r);
  if constexpr (F == Family::BackwardDq) {
    require_keys(d, {"dq_layout", "num_warps"});
    const int64_t layout = d.config.at("dq_layout");
    if (layout != 0 && layout != 1) {
      throw UnsupportedError(fmt::format(
          "{}: dq_layout is 0 (rows, sm80_mma's dK/dV) or 1 (64-row tiles in wgmma fragment "
          "order, sm90a_wgmma's), not {}",
          d.family_variant(), layout));
    }
  } else {
    require_keys(d, {"num_warps"});
  }
  if (d.config.at("num_warps") != 4) {
    throw UnsupportedError(fmt::format("{} runs 4 warps per block, not {}", d.family_variant(),
                                       d.config.at("num_warps")));
  }
}

template <Family F>
Params BackwardRowKernelSm80<F>::default_config(const KernelDesc&) const {
  // The dQ convert reads the accumulator in the layout of the dK/dV kernel that filled it
  // (dq_accum_layout, set by the backward plan).
  if constexpr (F == Family::BackwardDq) return {{"dq_layout", 0}, {"num_warps", 4}};
  return {{"num_warps", 4}};
}

template <Family F>
std::vector<Params> BackwardRowKernelSm80<F>::config_space(const KernelDesc& p) const {
  return {default_config(p)};
}

template <Family F>
std::vector<TemplateText> BackwardRowKernelSm80<F>::templates() const {
  return backward_templates();
}

template <Family F>
cuda::GeneratedSource BackwardRowKernelSm80<F>::generate(const Mods& mods,
                                                         const KernelDesc& desc) const {
  validate(desc);
  cuda::SourceWriter w;
  w.line(fmt::format("// Compile-time configuration: {}", desc.str()));
  w.line(fmt::format("#define {} 1", spec_.define));
  {
    auto s = w.block("struct FjConfig", ";");
    w.line(fmt::format("static constexpr int kHeadDimQK = {}, kHeadDimV = {};", desc.head_dim_qk,
                       desc.head_dim_v));
    // The dQ accumulator's row width (dq_accum_dim: the sm_90a dK/dV kernel's tile dim).
    w.line(fmt::format("static constexpr int kDqAccumDim = {};", dq_accum_dim(desc.head_dim_qk)));
    if constexpr (F == Family::BackwardDq) {
      w.line(fmt::format("static constexpr int kDqLayout = {};", desc.config.at("dq_layout")));
    }
    w.line(fmt::format("using Element = {};", element_type(desc.dtype)));
  }
  return assemble_variant_source(*this, desc, mods, w.str(), std::string(spec_.what), "mods",
                                 grads_section(mods, desc));
}

template <Family F>
std::vector<Launch> BackwardRowKernelSm80<F>::launches(const KernelDesc& desc,
                                                       const BackwardInputs& in,
                                                       void* workspace) const {
  FJ_ASSERT(workspace != nullptr,
            fmt::format("{} runs without the backward's workspace", desc.family_variant()));
  FJ_ASSERT(F != Family::BackwardDq || in.dq_atomic,
            "the dQ convert kernel runs without the dQ accumulator");
  const QkvShape& s = in.shape;
  Launch l;
  l.entry_point = std::string(spec_.entry_point);
  l.grid = {static_cast<unsigned>(backward_padded_seqlen_q(s.seqlen_q) / 64),
            static_cast<unsigned>(s.heads_q), static_cast<unsigned>(s.batch)};
  l.block = {static_cast<unsigned>(desc.config.at("num_warps") * 32), 1, 1};
  l.args.add(make_bwd_args(in, workspace, false));
  std::vector<Launch> out;
  out.push_back(std::move(l));
  return out;
}

template class BackwardRowKernelSm80<Family::BackwardPreprocess>;
template class BackwardRowKernelSm80<Family::BackwardDq>;

BackwardPreprocessSm80::BackwardPreprocessSm80()
    : BackwardRowKernelSm80({"sm80",
                             "lse2 = lse log2(e) and delta = rowsum(dO O) - dlse per q row "
                             "(fp32); sm_80 and newer",
                             "flexjit_bwd_preprocess", "FJ_BWD_PREPROCESS",
                             "backward preprocess kernel `flexjit_bwd_preprocess`", true}) {}

size_t BackwardPreprocessSm80::workspace_bytes(const KernelDesc&, const BackwardInputs& in) const {
  return backward_scratch_bytes(in.shape, in.dq_atomic,
                                in.deterministic ? in.bufgrad_slice_elems : 0);
}

BackwardDqAtomicConvert::BackwardDqAtomicConvert()
    : BackwardRowKernelSm80({"atomic_convert",
                             "dq = scale * the f32 accumulator of a dK/dV kernel with dq_atomic = "
                             "1; sm_80 and newer",
                             "flexjit_bwd_dq_convert", "FJ_BWD_DQ_CONVERT",
                             "backward dQ convert kernel `flexjit_bwd_dq_convert`", false}) {}

// ---- backward_dkdv/sm80_mma and backward_dq/sm80_mma ------------------------------------------

template <Family F>
std::string_view BackwardSm80Mma<F>::summary() const {
  if constexpr (F == Family::BackwardDkDv) {
    return "one CTA per KV tile over the GQA group's q tiles: S^T, dP^T, dV += P^T dO, dK += "
           "dS^T Q on mma.sync; buffer gradients by fp32 atomics, or (deterministic=1) per-warp "
           "partials and a fixed-order reduction; sm_80 and newer";
  } else {
    return "one CTA per q tile over its KV tiles: S, dP, dQ += dS K on mma.sync (no atomics); "
           "sm_80 and newer";
  }
}

template <Family F>
std::optional<std::string> BackwardSm80Mma<F>::unsupported(const KernelDesc& problem,
                                                           const InputFacts& facts) const {
  if (auto r = problem_reason(problem, this->name())) return r;
  return alignment_reason(facts);
}

template <Family F>
void BackwardSm80Mma<F>::validate(const KernelDesc& d) const {
  if (auto r = problem_reason(d, this->name())) throw UnsupportedError(*r);
  if constexpr (F == Family::BackwardDkDv) {
    require_keys(d, {"block_m", "block_n", "dq_atomic", "num_warps", "num_stages"});
  } else {
    require_keys(d, {"block_m", "block_n", "num_warps", "num_stages"});
  }
  const int64_t bm = d.config.at("block_m"), bn = d.config.at("block_n");
  const int64_t warps = d.config.at("num_warps"), stages = d.config.at("num_stages");
  if (auto r = not_in(d, "block_m", bm, {32, 64, 128})) throw UnsupportedError(*r);
  if (auto r = not_in(d, "block_n", bn, {32, 64, 128})) throw UnsupportedError(*r);
  if (auto r = not_in(d, "num_warps", warps, {2, 4, 8})) throw UnsupportedError(*r);
  if (auto r = not_in(d, "num_stages", stages, {1, 2})) throw UnsupportedError(*r);
  const int es = dtype_size(d.dtype);
  // The layouts are the tile dims' (a head dim runs in its tile's).
  const int tile_qk = tile_of(d.head_dim_qk), tile_v = tile_of(d.head_dim_v);
  const int elems_per_thread_row = 16 / es;  // elements per 16-byte copy
  auto check_copies = [&](int64_t rows, int dim, const char* what) {
    const int64_t chunks = dim / elems_per_thread_row;
    const int64_t threads = warps * 32;
    if (threads % chunks != 0 || rows % (threads / chunks) != 0) {
      throw UnsupportedError(fmt::format(
          "{}: {} rows of {} ({} elements) do not split evenly into 16-byte copies over {} threads",
          d.family_variant(), rows, what, dim, threads));
    }
  };
  if constexpr (F == Family::BackwardDkDv) {
    const int64_t row_warps = bn / 16;
    if (warps % row_warps != 0 || (warps / row_warps != 1 && warps / row_warps != 2)) {
      throw UnsupportedError(fmt::format(
          "{}: num_warps = {} must be block_n / 16 = {} or twice that (each 16 kv rows get one "
          "or two warps)",
          d.family_variant(), warps, row_warps));
    }
    const int64_t split = warps / row_warps;
    if (split == 2 && ((tile_qk / 2) * es / 16 % 8 != 0 || (tile_v / 2) * es / 16 % 8 != 0)) {
      throw UnsupportedError(fmt::format(
          "{}: two warps per 16 kv rows split the tile dims {}/{} (head dims {}/{}) into halves "
          "that are not whole 128-byte rows; use num_warps = block_n / 16",
          d.family_variant(), tile_qk, tile_v, d.head_dim_qk, d.head_dim_v));
    }
    if (bm / 4 > warps * 32 / 2) {
      throw UnsupportedError(
          fmt::format("{}: block_m = {} is too large for {} warps", d.family_variant(), bm, warps));
    }
    const int64_t dq_atomic = d.config.at("dq_atomic");
    if (dq_atomic != 0 && dq_atomic != 1) {
      throw UnsupportedError(
          fmt::format("{}: dq_atomic must be 0 or 1, not {}", d.family_variant(), dq_atomic));
    }
    if (dq_atomic == 1 && is_deterministic(d)) {
      throw UnsupportedError(fmt::format(
          "{}: deterministic=1 and dq_atomic=1 exclude each other: dQ added with fp32 atomics is "
          "not deterministic (dq_atomic=0 computes dQ in a second pass)",
          d.family_variant()));
    }
    if (dq_atomic == 1) {
      // Each 16-row q slice of the dS tile goes to num_warps / (block_m / 16) warps, which
      // split the head dim into whole 128-byte swizzle rows.
      const int64_t slices = bm / 16;
      const int64_t per_slice = warps / slices;
      const int64_t cols = per_slice > 0 ? tile_qk / per_slice : 0;
      if (warps % slices != 0 || cols % 16 != 0 ||
          (per_slice > 1 && (std::min<int64_t>(cols, 64) * es) % 128 != 0)) {
        throw UnsupportedError(fmt::format(
            "{}: dq_atomic with block_m = {} and num_warps = {} does not split the dQ products "
            "evenly (num_warps must be a multiple of block_m / 16 = {}, each warp's share of "
            "the qk tile dim {} a multiple of 128 bytes)",
            d.family_variant(), bm, warps, slices, tile_qk));
      }
    }
  } else {
    if (bm != 16 * warps) {
      throw UnsupportedError(
          fmt::format("{}: block_m = {} must be 16 * num_warps = {} (each warp owns 16 q rows)",
                      d.family_variant(), bm, 16 * warps));
    }
  }
  check_copies(bm, tile_qk, "q");
  check_copies(bm, tile_v, "dout");
  check_copies(bn, tile_qk, "k");
  check_copies(bn, tile_v, "v");
  for (const char* flag : {"divisible", "full_blocks"}) {
    auto v = d.flags.get(flag);
    if (!v || (*v != 0 && *v != 1)) {
      throw UnsupportedError(
          fmt::format("{} needs flag '{}' = 0 or 1 ({})", d.family_variant(), flag, d.str()));
    }
  }
  if (auto v = d.flags.get(kDeterministicFlag)) {
    if (F != Family::BackwardDkDv || (*v != 0 && *v != 1)) {
      throw UnsupportedError(fmt::format(
          "{}: flag '{}' = {}: only backward_dkdv takes it, as 0 or 1 (buffer gradients by fp32 "
          "atomics or ordered partials)",
          d.family_variant(), kDeterministicFlag, *v));
    }
  }
  check_bufgrad_smem_flag(d);
  if (auto r = fast_math_flag_error(d)) throw UnsupportedError(*r);
  const int smem = static_cast<int>(smem_bytes(d));
  const int limit = cuda::max_smem_per_block(d.arch);
  if (smem > limit) {
    throw UnsupportedError(fmt::format(
        "{}: config {} needs {} bytes of shared memory for head dims {}/{} (tiles {}/{}) in {}, "
        "more than the {} bytes a block may use on {}; lower num_stages, block_m or block_n",
        d.family_variant(), d.config.str(), smem, d.head_dim_qk, d.head_dim_v, tile_qk, tile_v,
        to_string(d.dtype), limit, d.arch.str()));
  }
}

template <Family F>
Params BackwardSm80Mma<F>::default_config(const KernelDesc& p) const {
  // By the tile dims: a head dim runs in its tile's layouts (kSm80BackwardTileDims).
  const int d = std::max(tile_of(p.head_dim_qk), tile_of(p.head_dim_v));
  const bool small_smem = p.arch.cc() == 86 || p.arch.cc() == 89;
  const bool f32 = p.dtype == DType::F32;
  if constexpr (F == Family::BackwardDkDv) {
    // Registers per thread ~ dK + dV accumulators (16 rows x d / 32 lanes each, halved with two
    // warps per row slice) + S^T and dP^T (16 x block_m / 32 each).
    if (d <= 64) return f32 ? dkdv_config(64, 64, 4, 2, 0) : dkdv_config(64, 128, 8, 2, 0);
    if (d <= 128) return f32 ? dkdv_config(32, 64, 4, 1, 0) : dkdv_config(64, 64, 4, 2, 0);
    if (f32) return dkdv_config(32, 32, 4, 1, 0);
    // Two warps per 16-row slice split both tile dims into halves of whole 128-byte rows, which
    // a 64 tile of 16-bit elements does not have (qk and v tiles 64 and 256): one warp per
    // slice then.
    const bool halves = std::min(tile_of(p.head_dim_qk), tile_of(p.head_dim_v)) >= 128;
    return dkdv_config(32, 64, halves ? 8 : 4, small_smem ? 1 : 2, 0);
  } else {
    if (d <= 64) return make_config(64, 64, 4, 2);
    if (d <= 128)
      return f32 ? make_config(64, 32, 4, small_smem ? 1 : 2) : make_config(64, 64, 4, 2);
    return f32 ? make_config(32, 32, 2, 1) : make_config(64, 32, 4, small_smem ? 1 : 2);
  }
}

template <Family F>
std::vector<Params> BackwardSm80Mma<F>::config_space(const KernelDesc& p) const {
  std::vector<Params> out;
  for (int bm : {32, 64, 128}) {
    for (int bn : {32, 64, 128}) {
      for (int w : {2, 4, 8}) {
        for (int s : {1, 2}) {
          for (int atomic : {0, 1}) {
            if (F != Family::BackwardDkDv && atomic == 1) continue;
            KernelDesc d = p;
            d.config = F == Family::BackwardDkDv ? dkdv_config(bm, bn, w, s, atomic)
                                                 : make_config(bm, bn, w, s);
            if (!d.flags.has("divisible")) d.flags.set("divisible", 0);
            if (!d.flags.has("full_blocks")) d.flags.set("full_blocks", 0);
            if (is_deterministic(d) && atomic == 1) continue;
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

template <Family F>
Params BackwardSm80Mma<F>::resolve_config(const KernelDesc& problem, const Params& overrides,
                                          const InputFacts& facts) const {
  Params c = apply_overrides(*this, default_config(problem), overrides);
  if constexpr (F == Family::BackwardDkDv) {
    // dq_atomic splits the dQ products over the warps of each 16-row q slice; where the default
    // tiles do not split evenly, take 64 x 64 tiles on 4 warps (one warp per slice).
    if (c.at("dq_atomic") == 1 && !overrides.has("num_warps") && !overrides.has("block_n")) {
      KernelDesc d = problem;
      d.config = c;
      d.flags.set("divisible", 0);
      if (!d.flags.has("full_blocks")) d.flags.set("full_blocks", 0);
      try {
        validate(d);
      } catch (const UnsupportedError&) {
        c.set("block_n", 64);
        c.set("num_warps", 4);
        if (!overrides.has("block_m")) c.set("block_m", 64);
      }
    }
  }
  if (facts.mask_q_block == 0) return c;
  // Tiles must divide the block mask's sparse blocks: shrink one the caller left open.
  fit_tile_to_block(c, "block_m", facts.mask_q_block, overrides, {128, 64, 32});
  fit_tile_to_block(c, "block_n", facts.mask_kv_block, overrides, {128, 64, 32});
  if (!overrides.has("num_warps")) {
    if constexpr (F == Family::BackwardDkDv) {
      const int64_t row_warps = c.at("block_n") / 16;
      const int64_t split =
          std::max<int64_t>(1, c.at("num_warps") / std::max<int64_t>(1, row_warps));
      c.set("num_warps", row_warps * std::min<int64_t>(split, 2));
    } else {
      c.set("num_warps", c.at("block_m") / 16);
    }
  }
  if (facts.mask_q_block % c.at("block_m") != 0 || facts.mask_kv_block % c.at("block_n") != 0) {
    throw UnsupportedError(fmt::format(
        "the block mask's sparse blocks ({}x{}) are not multiples of the {} tiles {}x{}; build the "
        "mask with a block size that is a multiple of 128 (or of 64 and 32)",
        facts.mask_q_block, facts.mask_kv_block, to_string(F), c.at("block_m"), c.at("block_n")));
  }
  return c;
}

template <Family F>
void BackwardSm80Mma<F>::specialize(KernelDesc& d, const InputFacts& facts) const {
  // The dK/dV kernel's only static shared memory is the private buffer-gradient copy.
  if constexpr (F == Family::BackwardDkDv) fit_bufgrad_smem(d, dkdv_smem(d));
  if (facts.seqlen_q < 0 || facts.seqlen_kv < 0) return;
  const bool divisible =
      facts.seqlen_q % d.config.at("block_m") == 0 && facts.seqlen_kv % d.config.at("block_n") == 0;
  d.flags.set("divisible", divisible ? 1 : 0);
}

template <Family F>
std::vector<TemplateText> BackwardSm80Mma<F>::templates() const {
  return backward_templates();
}

template <Family F>
std::vector<std::string> BackwardSm80Mma<F>::entry_points() const {
  if constexpr (F == Family::BackwardDkDv) {
    // The reduction of deterministic buffer gradients and the sink's gradient (sink_grad.cuh)
    // share the module (compiled in both modes, empty without a sink_mod).
    return {"flexjit_bwd_dkdv", "flexjit_bwd_bufgrad_reduce", "flexjit_bwd_sink_grad"};
  } else {
    return {"flexjit_bwd_dq"};
  }
}

template <Family F>
cuda::GeneratedSource BackwardSm80Mma<F>::generate(const Mods& mods, const KernelDesc& desc) const {
  validate(desc);
  mods.check();
  const bool dkdv = F == Family::BackwardDkDv;
  std::string config = fmt::format("#define {} 1\n", dkdv ? "FJ_BWD_DKDV" : "FJ_BWD_DQ");
  config += backward_config_struct(mods, desc);
  return assemble_variant_source(
      *this, desc, mods, config,
      dkdv ? "backward dK/dV kernel `flexjit_bwd_dkdv`" : "backward dQ kernel `flexjit_bwd_dq`",
      "mods", grads_section(mods, desc));
}

template <Family F>
unsigned BackwardSm80Mma<F>::smem_bytes(const KernelDesc& desc) const {
  return static_cast<unsigned>(F == Family::BackwardDkDv ? dkdv_smem(desc) : dq_smem(desc));
}

template <Family F>
std::vector<Launch> BackwardSm80Mma<F>::launches(const KernelDesc& desc, const BackwardInputs& in,
                                                 void* workspace) const {
  FJ_ASSERT(workspace != nullptr, "a backward kernel runs without the preprocess's workspace");
  const QkvShape& s = in.shape;
  const bool full = desc.flags.at("full_blocks") != 0;
  Launch l;
  l.block = {static_cast<unsigned>(desc.config.at("num_warps") * 32), 1, 1};
  l.smem_bytes = smem_bytes(desc);
  l.args.add(make_bwd_args(in, workspace, full));
  l.args.add_bytes(in.mod_params.data(), in.mod_params.size() * sizeof(uint64_t));
  if constexpr (F == Family::BackwardDkDv) {
    const int64_t bn = desc.config.at("block_n");
    l.entry_point = "flexjit_bwd_dkdv";
    l.grid = {static_cast<unsigned>((s.seqlen_kv + bn - 1) / bn), static_cast<unsigned>(s.heads_kv),
              static_cast<unsigned>(s.batch)};
    // Deterministic: the partial slices' address goes into FjGradParams::partials, and the
    // reduction follows on the same stream.
    std::vector<uint64_t> grad_params = in.grad_params;
    float* partials = backward_bufgrad_partials(in, workspace);
    FJ_ASSERT(!is_deterministic(desc) || in.deterministic,
              "a deterministic dK/dV kernel runs on inputs planned without partial slices");
    FJ_ASSERT(in.bufgrad_slice_elems <= bufgrad_smem_floats(desc) || bufgrad_smem_floats(desc) == 0,
              "the dK/dV kernel's private buffer-gradient copy is smaller than the bound buffers");
    if (partials != nullptr) {
      FJ_ASSERT(in.grad_partials_offset >= 0,
                "deterministic inputs without FjGradParams::partials");
      grad_params[static_cast<size_t>(in.grad_partials_offset) / 8] =
          reinterpret_cast<uint64_t>(partials);
    }
    l.args.add_bytes(grad_params.data(), grad_params.size() * sizeof(uint64_t));
    std::vector<Launch> out;
    out.push_back(std::move(l));
    if (partials != nullptr && is_deterministic(desc)) {
      Launch r;
      r.entry_point = "flexjit_bwd_bufgrad_reduce";
      r.grid = {static_cast<unsigned>((in.bufgrad_slice_elems + 31) / 32), 1, 1};
      r.block = {1024, 1, 1};
      r.args.add(make_bwd_args(in, workspace, full));
      r.args.add_bytes(grad_params.data(), grad_params.size() * sizeof(uint64_t));
      out.push_back(std::move(r));
    }
    if (in.sink_grads) {
      out.push_back(
          backward_sink_grad_launch(in, workspace, full, grad_params, is_deterministic(desc)));
    }
    return out;
  } else {
    const int64_t bm = desc.config.at("block_m");
    l.entry_point = "flexjit_bwd_dq";
    l.grid = {static_cast<unsigned>((s.seqlen_q + bm - 1) / bm), static_cast<unsigned>(s.heads_q),
              static_cast<unsigned>(s.batch)};
  }
  std::vector<Launch> out;
  out.push_back(std::move(l));
  return out;
}

template class BackwardSm80Mma<Family::BackwardDkDv>;
template class BackwardSm80Mma<Family::BackwardDq>;

}  // namespace flexjit::kernels
