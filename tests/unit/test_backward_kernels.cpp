// The backward kernel families without a GPU: the generated gradient hooks, the variants'
// descriptions, validation messages and config spaces, and NVRTC compiles of the three kernels
// for every arch, dtype and head dim.
#include <flexjit/error.h>
#include <flexjit/kernel.h>
#include <flexjit/mods.h>

#include "Pipeline.h"
#include "codegen/cuda/ModCodegen.h"
#include "jit/ResourceUsage.h"
#include "kernels/Registry.h"
#include "kernels/backward/Backward.h"
#include "kernels/backward/Sm80Backward.h"
#include "passes/TypeCheck.h"
#include "support/Parallel.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

using namespace flexjit;
using namespace flexjit::kernels;

namespace {

// The sm_80 variants' description (named: on sm_90a the sm90a_wgmma variants are the default).
KernelDesc bwd_desc(Family f, const std::string& arch, DType dtype, int dqk, int dv, int gqa = 1) {
  return Registry::global().complete(
      backward_problem(f, cuda::Arch::parse(arch), dtype, dqk, dv, gqa, true), {}, {},
      f == Family::BackwardPreprocess ? "" : "sm80_mma");
}

}  // namespace

TEST_CASE("gradient hooks: FjGradParams, fj_dscore and fj_bufgrad from the autodiff pass",
          "[backward][codegen]") {
  const Mods alibi = standard_mods("alibi");
  const std::string src = cuda::generate_mod_grad_functions(alibi);
  CHECK_THAT(src, Catch::Contains("float* grad_slopes;") &&
                      Catch::Contains("fj_i64 gstride_slopes[1];") &&
                      Catch::Contains("fj_i64 gextent_slopes[1];") &&
                      Catch::Contains("static constexpr bool kFjHasBufferGrads = true;") &&
                      Catch::Contains("kFjUniformGradSites = 1") && Catch::Contains("acc[0] += ") &&
                      Catch::Contains("fj_grad_add(gp.grad_slopes") &&
                      Catch::Contains("fj_clamp_index(h, gp.gextent_slopes[0])"));
  // relative_bias reads bias[q_idx - kv_idx + offset]: one address per element.
  const std::string rsrc = cuda::generate_mod_grad_functions(standard_mods("relative_bias"));
  CHECK_THAT(rsrc, Catch::Contains("kFjUniformGradSites = 0") &&
                       Catch::Contains("__all_sync(0xffffffffu, ds == 0.0f)") &&
                       Catch::Contains("fj_grad_add(gp.grad_bias"));
  // ... along the tile's diagonals: the sm_90a dK/dV kernel sums them (fj_bufgrad<true> leaves
  // the site out; the sm_80 kernel keeps fj_bufgrad<false>, which adds it per element).
  CHECK_THAT(rsrc, Catch::Contains("static constexpr bool kFjDiagGradSite = true;") &&
                       Catch::Contains("if constexpr (kDiagByCaller)") &&
                       Catch::Contains("void fj_bufgrad_diag_add_at(const FjModParams& mp, const "
                                       "FjGradParams& gp, int b, int h, int d, float v)") &&
                       Catch::Contains("const int q_idx = d, kv_idx = 0;") &&
                       Catch::Contains("atomicAdd(gp.grad_bias + (") &&
                       Catch::Contains("fj_clamp_index(t1, gp.gextent_bias[0])") &&
                       !Catch::Contains("kFjDiagSign"));
  CHECK_THAT(src, Catch::Contains("static constexpr bool kFjDiagGradSite = false;"));
  // The score_mod reads the site itself: the kernels load a tile's diagonals once and pass each
  // element its value (the overloads with fj_dl read no memory for it). kFjDiagLoad,
  // fj_diag_load_at and fj_score_mod's overload come with the mods (the forward's module, which
  // the backward's source includes); the gradient hooks add the other overloads, once each.
  const std::string rmods = cuda::generate_mod_functions(standard_mods("relative_bias"));
  CHECK_THAT(rmods,
             Catch::Contains("static constexpr bool kFjDiagLoad = true;") &&
                 Catch::Contains("float fj_diag_load_at(const FjModParams& mp, int b, int h, "
                                 "int d)") &&
                 Catch::Contains("score + fj_dl;"));
  CHECK_THAT(rsrc, !Catch::Contains("kFjDiagLoad") && !Catch::Contains("fj_diag_load_at(") &&
                       !Catch::Contains("float fj_score_mod("));
  auto once = [](const std::string& text, const std::string& needle) {
    const size_t at = text.find(needle);
    return at != std::string::npos && at == text.rfind(needle);
  };
  CHECK(once(rsrc,
             "float fj_dscore(const FjModParams& mp, float score, int b, int h, int "
             "q_idx, int kv_idx, float fj_dl)"));
  CHECK(once(rsrc,
             "float fj_bufgrad_diag_value(const FjModParams& mp, float ds, float score, "
             "int b, int h, int q_idx, int kv_idx, float fj_dl)"));
  CHECK_THAT(cuda::generate_mod_functions(alibi),
             Catch::Contains("static constexpr bool kFjDiagLoad = false;") &&
                 Catch::Contains("return (void)fj_dl, fj_score_mod(mp, score, b, h, q_idx, "
                                 "kv_idx);"));
  CHECK_THAT(src, Catch::Contains("return (void)fj_dl, fj_dscore(mp, score, b, h, q_idx, "
                                  "kv_idx);"));
  const cuda::GradParamLayout layout = cuda::grad_param_layout(alibi);
  REQUIRE(layout.entries.size() == 1);
  CHECK(layout.entries[0].offset == 0);
  CHECK(layout.entries[0].slice_offset() == 24);
  CHECK(layout.partials_offset == 32);
  CHECK(layout.size == 48);  // pointer, one stride, one extent, slice offset; partials, slice_elems

  // A mask-only mod set: no float buffer, no gradient, d score_mod / d score = 1.
  const Mods doc = standard_mods("document_causal");
  const std::string dsrc = cuda::generate_mod_grad_functions(doc);
  CHECK_THAT(dsrc, Catch::Contains("int unused_;") &&
                       Catch::Contains("kFjHasBufferGrads = false") &&
                       Catch::Contains("return 1.0f;") && !Catch::Contains("fj_grad_add("));
  CHECK(cuda::grad_param_layout(doc).entries.empty());
  CHECK(cuda::grad_param_layout(doc).size == 8);
  CHECK(cuda::grad_param_layout(doc).partials_offset == -1);

  // softcap: d/dscore of cap * tanh(score / cap) is 1 - tanh^2, no buffer.
  const std::string ssrc = cuda::generate_mod_grad_functions(standard_mods("softcap"));
  CHECK_THAT(ssrc, Catch::Contains("fj_tanh") && Catch::Contains("kFjHasBufferGrads = false"));
}

TEST_CASE("the diagonal buffer-gradient site: which loads qualify", "[backward][codegen]") {
  auto diag = [](const std::string& text) {
    return cuda::generate_mod_grad_functions(parse_mods(text));
  };
  // kv_idx - q_idx into a per-head table: both indices evaluated at q_idx = d, kv_idx = 0.
  const std::string rev = diag(
      "buffer rel: f32[H, R]\nparam off: i32\nscore_mod = score + 2.0 * rel[h, kv_idx - "
      "q_idx + off]");
  CHECK_THAT(rev, Catch::Contains("kFjDiagGradSite = true;") &&
                      Catch::Contains("fj_isub(kv_idx, q_idx)") &&
                      Catch::Contains("fj_clamp_index(h, gp.gextent_rel[0])") &&
                      Catch::Contains("fj_clamp_index(t1, gp.gextent_rel[1])"));
  // Any function of q_idx - kv_idx: T5's buckets (the head index kept), a scaled difference.
  const std::string t5 = cuda::generate_mod_grad_functions(standard_mods("t5_bucketed_bias"));
  CHECK_THAT(t5, Catch::Contains("kFjDiagGradSite = true;") &&
                     Catch::Contains("fj_clamp_index(h, gp.gextent_bias[0])") &&
                     Catch::Contains("fj_log") && Catch::Contains("fj_iabs("));
  CHECK_THAT(diag("buffer b1: f32[R]\nscore_mod = score + b1[2 * (q_idx - kv_idx) + 100]"),
             Catch::Contains("kFjDiagGradSite = true;"));
  // Not diagonal: a 2-D bias (positions in two indices), one position alone, their sum.
  for (const std::string& text :
       {std::string("buffer b2: f32[Q, K]\nscore_mod = score + b2[q_idx, kv_idx]"),
        std::string("buffer b1: f32[R]\nscore_mod = score + b1[q_idx]"),
        std::string("buffer b1: f32[R]\nscore_mod = score + b1[q_idx + kv_idx]")}) {
    INFO(text);
    CHECK_THAT(diag(text), Catch::Contains("kFjDiagGradSite = false;"));
  }
  // The deterministic (ordered) hooks never leave a site to the kernel.
  CHECK_THAT(
      cuda::generate_mod_grad_functions(standard_mods("relative_bias"), cuda::MathFunctions::Exact,
                                        cuda::GradAccumulation::Ordered),
      Catch::Contains("kFjDiagGradSite = false;"));
}

TEST_CASE("deterministic gradient hooks add into the warp's partial slice in a fixed order",
          "[backward][codegen][determ]") {
  const auto ordered = [](const Mods& m) {
    return cuda::generate_mod_grad_functions(m, cuda::MathFunctions::Exact,
                                             cuda::GradAccumulation::Ordered);
  };
  // ALiBi: one address per head, summed in a register, then added into the slice.
  const std::string a = ordered(standard_mods("alibi"));
  CHECK_THAT(a, Catch::Contains("fj_i64 gslice_slopes;") && Catch::Contains("float* partials;") &&
                    Catch::Contains("fj_i64 slice_elems;") && Catch::Contains("acc[0] += ") &&
                    Catch::Contains("fj_grad_add_ordered(gp.partials + (gp.gslice_slopes + ") &&
                    !Catch::Contains("fj_grad_add(") && !Catch::Contains("atomicAdd"));
  // The relative-bias table: every element into the slice, never an atomic.
  const std::string r = ordered(standard_mods("relative_bias"));
  CHECK_THAT(r, Catch::Contains("fj_grad_add_ordered(gp.partials + (gp.gslice_bias + ") &&
                    !Catch::Contains("fj_grad_add(gp."));
  // A 2-D bias: the row-major index within the buffer (the slice is contiguous, whatever the
  // gradient's strides), and the reduction's store through the strides.
  const Mods bias2d =
      parse_mods("buffer bias2d: f32[Q, K]\nscore_mod = score + bias2d[q_idx, kv_idx]");
  const std::string b = ordered(bias2d);
  CHECK_THAT(b, Catch::Contains("* gp.gextent_bias2d[1] + ") &&
                    Catch::Contains("fj_grad_add_ordered(gp.partials + (gp.gslice_bias2d + ") &&
                    Catch::Contains("void fj_bufgrad_store(") &&
                    Catch::Contains("gp.grad_bias2d[off] = v;"));
  // The atomic mode has the same struct and helpers (one layout for the runtime to pack).
  const std::string atomic = cuda::generate_mod_grad_functions(bias2d);
  CHECK_THAT(atomic, Catch::Contains("fj_grad_add(gp.grad_bias2d + (") &&
                         Catch::Contains("fj_i64 gslice_bias2d;") &&
                         Catch::Contains("fj_bufgrad_with_slice(") &&
                         !Catch::Contains("fj_grad_add_ordered("));
  // No float buffer: the helpers exist (the reduction compiles) and do nothing.
  const std::string none = ordered(standard_mods("causal"));
  CHECK_THAT(none, Catch::Contains("int unused_;") &&
                       Catch::Contains("return (void)gp, nullptr;") &&
                       Catch::Contains("(void)gp, (void)e, (void)v;"));
  // Two float buffers: slice offsets follow each other in the layout.
  const Mods two = parse_mods(
      "buffer a: f32[H]\nbuffer t: bf16[R, 4]\nscore_mod = score * a[h] + t[q_idx - kv_idx + 64, "
      "1]");
  const cuda::GradParamLayout l2 = cuda::grad_param_layout(two);
  REQUIRE(l2.entries.size() == 2);
  CHECK(l2.entries[0].slice_offset() == 24);
  CHECK(l2.entries[1].offset == 32);
  CHECK(l2.entries[1].slice_offset() == 32 + 8 * 5);
  CHECK(l2.partials_offset == 80);
  CHECK(l2.size == 96);
}

TEST_CASE("deterministic backward: descriptions, validation and workspace sizing",
          "[backward][kernels][determ]") {
  const Registry& reg = Registry::global();
  const cuda::Arch arch = cuda::Arch::parse("sm_90a");
  const KernelDesc d = reg.complete(
      backward_problem(Family::BackwardDkDv, arch, DType::BF16, 128, 128, 4, true, true), {}, {});
  CHECK(d.str() ==
        "backward_dkdv/sm80_mma sm_90a bf16 d=128/128 gqa=4 deterministic=1 divisible=0 "
        "fast_math=1 full_blocks=1 | block_m=64 block_n=64 dq_atomic=0 num_stages=2 num_warps=4");
  CHECK(is_deterministic(d));
  CHECK(KernelDesc::parse(d.str()) == d);
  CHECK(KernelDesc::from_json(d.to_json()) == d);
  // The flag reaches the hash (the memo and tuning keys) and the source (the disk cache key).
  const KernelDesc atomic =
      reg.complete(backward_problem(Family::BackwardDkDv, arch, DType::BF16, 128, 128, 4, true), {},
                   {}, "sm80_mma");
  CHECK_FALSE(is_deterministic(atomic));
  CHECK(d.hash() != atomic.hash());
  const Mods alibi = standard_mods("alibi_causal");
  const Variant& v = *reg.find(Family::BackwardDkDv, "sm80_mma");
  const std::string det_src = v.generate(alibi, d).source;
  CHECK_THAT(det_src, Catch::Contains("static constexpr bool kDeterministic = true;") &&
                          Catch::Contains("fj_grad_add_ordered(gp.partials"));
  CHECK_THAT(v.generate(alibi, atomic).source,
             Catch::Contains("static constexpr bool kDeterministic = false;"));
  CHECK(v.entry_points() == std::vector<std::string>{"flexjit_bwd_dkdv",
                                                     "flexjit_bwd_bufgrad_reduce",
                                                     "flexjit_bwd_sink_grad"});
  // Only the dK/dV problem carries it.
  CHECK_FALSE(backward_problem(Family::BackwardDq, arch, DType::BF16, 128, 128, 1, true, true)
                  .flags.has(kDeterministicFlag));
  CHECK_FALSE(
      backward_problem(Family::BackwardPreprocess, arch, DType::BF16, 128, 128, 1, true, true)
          .flags.has(kDeterministicFlag));

  // dQ by atomics is refused beside it, by name; so is a flag value other than 0 / 1 and the
  // flag on the dQ kernel.
  CHECK_THROWS_WITH(
      reg.complete(backward_problem(Family::BackwardDkDv, arch, DType::BF16, 64, 64, 1, true, true),
                   {}, {{"dq_atomic", 1}}),
      Catch::Contains("deterministic=1 and dq_atomic=1 exclude each other"));
  KernelDesc two = d;
  two.flags.set(kDeterministicFlag, 2);
  CHECK_THROWS_WITH(v.validate(two), Catch::Contains("flag 'deterministic' = 2"));
  KernelDesc dq =
      reg.complete(backward_problem(Family::BackwardDq, arch, DType::BF16, 128, 128, 1, true), {},
                   {}, "sm80_mma");
  dq.flags.set(kDeterministicFlag, 1);
  CHECK_THROWS_WITH(reg.find(Family::BackwardDq, "sm80_mma")->validate(dq),
                    Catch::Contains("only backward_dkdv takes it"));
  // The tuner's space for it has no dq_atomic = 1 config.
  for (const Params& p : v.config_space(d))
    CHECK(p.at("dq_atomic") == 0);

  // Workspace: the partial slices follow lse2 / delta (and the dQ accumulator), one per 16 kv
  // rows of round_up(Skv, 128) per (b, kv head), each holding every float buffer (rounded to 4).
  QkvShape s;
  s.batch = 2, s.heads_q = 8, s.heads_kv = 2, s.seqlen_q = 200, s.seqlen_kv = 321;
  s.head_dim_qk = s.head_dim_v = 128;
  CHECK(backward_bufgrad_slices(s) == 2 * 2 * (384 / 16));
  CHECK(backward_bufgrad_slice_elems({{8}}) == 8);
  CHECK(backward_bufgrad_slice_elems({{8}, {641}}) == 652);
  CHECK(backward_bufgrad_slice_elems({{200, 321}}) == 64200);
  const size_t base = 4 * 2 * 8 * 256 * 2;  // lse2 + delta: [B * Hq, round_up(Sq, 128)]
  CHECK(backward_scratch_bytes(s, false) == base);
  CHECK(backward_scratch_bytes(s, false, 652) == base + 4 * 96 * 652);
  BackwardInputs in;
  in.shape = s;
  in.bufgrad_slice_elems = 652;
  std::vector<char> ws(backward_scratch_bytes(s, false, 652));
  CHECK(backward_bufgrad_partials(in, ws.data()) == nullptr);  // not deterministic
  in.deterministic = true;
  CHECK(reinterpret_cast<char*>(backward_bufgrad_partials(in, ws.data())) == ws.data() + base);
  const auto& pre = variant_as<BackwardPreprocessVariant>(
      reg, reg.complete(
               backward_problem(Family::BackwardPreprocess, arch, DType::BF16, 128, 128, 4, true),
               {}, {}));
  CHECK(pre.workspace_bytes({}, in) == base + 4 * 96 * 652);
  in.deterministic = false;
  CHECK(pre.workspace_bytes({}, in) == base);
}

TEST_CASE("backward variants: registration, descriptions and validation", "[backward][kernels]") {
  const Registry& reg = Registry::global();
  REQUIRE(reg.find(Family::BackwardPreprocess, "sm80") != nullptr);
  REQUIRE(reg.find(Family::BackwardDkDv, "sm80_mma") != nullptr);
  REQUIRE(reg.find(Family::BackwardDq, "sm80_mma") != nullptr);

  const KernelDesc d = bwd_desc(Family::BackwardDkDv, "sm_90a", DType::BF16, 128, 128, 4);
  CHECK(d.str() ==
        "backward_dkdv/sm80_mma sm_90a bf16 d=128/128 gqa=4 divisible=0 fast_math=1 full_blocks=1 "
        "| block_m=64 block_n=64 dq_atomic=0 num_stages=2 num_warps=4");
  // dq_atomic = 1 where the default tiles do not split the dQ products: 64 x 64 on 4 warps.
  const KernelDesc a64 =
      reg.complete(backward_problem(Family::BackwardDkDv, cuda::Arch::parse("sm_90a"), DType::BF16,
                                    64, 64, 1, true),
                   {}, {{"dq_atomic", 1}}, "sm80_mma");
  CHECK(a64.config.str() == "block_m=64 block_n=64 dq_atomic=1 num_stages=2 num_warps=4");
  CHECK(reg.find(Family::BackwardDq, "atomic_convert") != nullptr);
  CHECK_FALSE(reg.find(Family::BackwardDq, "atomic_convert")->auto_select());
  // The convert reads the accumulator in the layout of the dK/dV kernel that filled it.
  {
    const KernelDesc cp = backward_problem(Family::BackwardDq, cuda::Arch::parse("sm_90a"),
                                           DType::BF16, 128, 128, 1, true);
    CHECK(reg.complete(cp, {}, {}, "atomic_convert").config.str() == "dq_layout=0 num_warps=4");
    CHECK(reg.complete(cp, {}, {{"dq_layout", 1}}, "atomic_convert").config.str() ==
          "dq_layout=1 num_warps=4");
    CHECK_THROWS_WITH(reg.complete(cp, {}, {{"dq_layout", 2}}, "atomic_convert"),
                      Catch::Contains("dq_layout is 0 (rows") && Catch::Contains("not 2"));
    KernelDesc k80 = cp, k90 = cp;
    k80.variant = "sm80_mma", k90.variant = "sm90a_wgmma";
    CHECK(dq_accum_layout(k80) == 0);
    CHECK(dq_accum_layout(k90) == 1);
  }
  CHECK(KernelDesc::parse(d.str()) == d);
  CHECK(KernelDesc::from_json(d.to_json()) == d);
  const KernelDesc p = bwd_desc(Family::BackwardPreprocess, "sm_80", DType::F16, 64, 128);
  CHECK(p.str() == "backward_preprocess/sm80 sm_80 f16 d=64/128 gqa=1 | num_warps=4");

  // Shared memory beyond sm_86's 99 KiB: a precise message.
  CHECK_THROWS_WITH(bwd_desc(Family::BackwardDq, "sm_86", DType::F32, 256, 256),
                    Catch::Contains("131072 bytes of shared memory") &&
                        Catch::Contains("the 101376 bytes a block may use on sm_86"));
  KernelDesc bad = d;
  bad.config.set("num_warps", 2);
  CHECK_THROWS_WITH(reg.find(Family::BackwardDkDv, "sm80_mma")->validate(bad),
                    Catch::Contains("num_warps = 2 must be block_n / 16 = 4 or twice that"));
  KernelDesc dq = bwd_desc(Family::BackwardDq, "sm_80", DType::BF16, 64, 64);
  dq.config.set("block_m", 128);
  CHECK_THROWS_WITH(reg.find(Family::BackwardDq, "sm80_mma")->validate(dq),
                    Catch::Contains("block_m = 128 must be 16 * num_warps = 64"));
  KernelDesc d100 = backward_problem(Family::BackwardDq, cuda::Arch::parse("sm_80"), DType::BF16,
                                     100, 100, 1, false);
  CHECK_THROWS_WITH(reg.complete(d100, {}, {}),
                    Catch::Contains("head_dim_qk = 100; supported: multiples of 8 from 8 to 256"));

  // Every config of the space validates; the defaults are in it.
  for (Family f : {Family::BackwardDkDv, Family::BackwardDq}) {
    for (int dim : {64, 128, 256}) {
      const KernelDesc def = bwd_desc(f, "sm_90a", DType::BF16, dim, dim);
      const auto space = reg.find(f, "sm80_mma")->config_space(def);
      CHECK(std::find(space.begin(), space.end(), def.config) != space.end());
    }
  }
}

TEST_CASE("the deterministic dK/dV kernels compile for sm_80 and sm_90a with every float buffer",
          "[backward][nvrtc][determ]") {
  // Every standard mod with a float buffer, and a 2-D bias, at the default tiles. At d = 128 the
  // tiles use all 255 registers and the atomic kernels already spill a few bytes on some mods;
  // the deterministic ones may spill a little more (below), nothing at d = 64 / 256.
  std::vector<std::pair<std::string, Mods>> mods;
  for (const std::string& name : standard_mod_names()) {
    const Mods m = standard_mods(name);
    bool has_float = false;
    for (const Buffer& b : m.buffers)
      has_float = has_float || b.dtype() == DType::F32 || b.dtype() == DType::F16 ||
                  b.dtype() == DType::BF16;
    if (has_float) mods.emplace_back(name, m);
  }
  REQUIRE(mods.size() >= 5);
  mods.emplace_back(
      "bias2d", parse_mods("buffer bias2d: f32[Q, K]\nscore_mod = score + bias2d[q_idx, kv_idx]"));
  struct Job {
    std::string arch, label;
    Mods mods;
    DType dtype;
    int dim;
  };
  // d = 128 (bf16 for every mod, f32 for the relative bias): the register-tight tiles, where
  // the atomic kernels already spill a little; d = 64 and 256 for the three addressing kinds.
  std::vector<Job> jobs;
  for (const char* arch : {"sm_80", "sm_90a"}) {
    for (const auto& [label, m] : mods) {
      jobs.push_back({arch, label, m, DType::BF16, 128});
      if (label == "alibi_causal" || label == "relative_bias_causal" || label == "bias2d") {
        jobs.push_back({arch, label, m, DType::BF16, 64});
        jobs.push_back({arch, label, m, DType::BF16, 256});
      }
      if (label == "relative_bias_causal") jobs.push_back({arch, label, m, DType::F32, 128});
    }
  }
  jit::CacheSettings settings;
  settings.enabled = false;
  KernelBuilder builder(settings);
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<std::string> resources;
  test::run_parallel(jobs.size(), [&](size_t i) {
    const Job& j = jobs[i];
    try {
      const cuda::Arch arch = cuda::Arch::parse(j.arch);
      const KernelDesc det = Registry::global().complete(
          backward_problem(Family::BackwardDkDv, arch, j.dtype, j.dim, j.dim, 1, true, true), {},
          {});
      // The atomic twin on the same variant (on sm_90a the default is sm90a_wgmma).
      const KernelDesc atomic = Registry::global().complete(
          backward_problem(Family::BackwardDkDv, arch, j.dtype, j.dim, j.dim, 1, true), {}, {},
          "sm80_mma");
      const BuiltKernel k = builder.build(j.mods, det);
      const BuiltKernel ka = builder.build(j.mods, atomic);
      const auto& u = k.compiled.kernel->usage;
      const auto& ua = ka.compiled.kernel->usage;
      // The reduction kernel of the same module (1024 threads: at most 64 registers).
      const jit::ResourceUsage ur =
          jit::usage_from_ptxas_log(k.compiled.kernel->log, "flexjit_bwd_bufgrad_reduce");
      std::lock_guard<std::mutex> lock(mu);
      resources.push_back(fmt::format("{} {} {} d={}: {} (atomic: {}); reduction: {}", j.arch,
                                      j.label, to_string(j.dtype), j.dim, u.str(), ua.str(),
                                      ur.str()));
      if (ur.registers < 0 || ur.registers > 64 || ur.spill_store_bytes != 0) {
        failures.push_back(
            fmt::format("{} {}: flexjit_bwd_bufgrad_reduce: {}", det.str(), j.label, ur.str()));
      }
      // The suite's bound for the backward kernels (64 bytes of spill stores), or the atomic
      // twin's spills and 16 bytes (the slice pointer) where that is more.
      if (u.spill_store_bytes > std::max(64, ua.spill_store_bytes + 16)) {
        failures.push_back(fmt::format("{} {}: {} bytes of spill stores, atomic {}", det.str(),
                                       j.label, u.spill_store_bytes, ua.spill_store_bytes));
      }
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(j.arch + " " + j.label + " d=" + std::to_string(j.dim) + ": " + e.what());
    }
  });
  std::sort(resources.begin(), resources.end());
  for (const std::string& r : resources)
    UNSCOPED_INFO(r);
  if (std::getenv("FLEXJIT_PRINT_RESOURCES") != nullptr) {
    for (const std::string& r : resources)
      std::printf("  %s\n", r.c_str());
  }
  for (const std::string& f : failures)
    FAIL_CHECK(f);
  CHECK(failures.empty());
}

TEST_CASE("the backward kernels compile for every arch, dtype and head dim", "[backward][nvrtc]") {
  struct Job {
    Family family;
    std::string arch, mods;
    DType dtype;
    int dqk, dv;
    bool dq_atomic = false;  // dK/dV: dq_atomic = 1; dQ: the convert kernel in dq_layout
    int dq_layout = 0;
  };
  std::vector<Job> jobs;
  const Family families[] = {Family::BackwardPreprocess, Family::BackwardDkDv, Family::BackwardDq};
  // The dQ convert in both accumulator layouts (sm80_mma's rows, sm90a_wgmma's fragment blocks).
  for (int layout : {0, 1}) {
    for (int d : {64, 128})
      jobs.push_back({Family::BackwardDq, "sm_90a", "noop", DType::BF16, d, d, true, layout});
  }
  jobs.push_back({Family::BackwardDq, "sm_80", "noop", DType::F32, 128, 128, true, 0});
  for (Family f : families) {
    for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"})
      jobs.push_back({f, arch, "alibi_causal", DType::BF16, 128, 128});
    for (DType dt : {DType::F16, DType::F32}) {
      for (auto [dqk, dv] : {std::pair{64, 64}, std::pair{128, 64}, std::pair{256, 256}})
        jobs.push_back({f, "sm_80", "relative_bias_causal", dt, dqk, dv});
    }
  }
  for (const char* mods :
       {"noop", "softcap_causal", "t5_bucketed_bias", "document_causal", "sliding_window"}) {
    jobs.push_back({Family::BackwardDkDv, "sm_90a", mods, DType::BF16, 64, 64});
    jobs.push_back({Family::BackwardDq, "sm_90a", mods, DType::BF16, 256, 128});
  }
  jit::CacheSettings settings;
  settings.enabled = false;
  KernelBuilder builder(settings);
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::vector<std::string> failures;
  auto worker = [&] {
    for (size_t i; (i = next++) < jobs.size();) {
      const Job& j = jobs[i];
      try {
        KernelDesc d = bwd_desc(j.family, j.arch, j.dtype, j.dqk, j.dv);
        if (j.dq_atomic) {
          const KernelDesc p =
              backward_problem(j.family, cuda::Arch::parse(j.arch), j.dtype, j.dqk, j.dv, 1, true);
          d = j.family == Family::BackwardDkDv
                  ? Registry::global().complete(p, {}, {{"dq_atomic", 1}})
                  : Registry::global().complete(p, {}, {{"dq_layout", j.dq_layout}},
                                                "atomic_convert");
        }
        const BuiltKernel k = builder.build(standard_mods(j.mods), d);
        if (k.compiled.kernel->usage.spill_store_bytes > 64) {
          std::lock_guard<std::mutex> lock(mu);
          failures.push_back(fmt::format("{} {}: {} bytes of spill stores", d.str(), j.mods,
                                         k.compiled.kernel->usage.spill_store_bytes));
        }
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back(std::string(to_string(j.family)) + " " + j.arch + " " + j.mods + ": " +
                           e.what());
      }
    }
  };
  std::vector<std::thread> pool;
  const unsigned n = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
  for (unsigned t = 0; t < n; ++t)
    pool.emplace_back(worker);
  for (auto& t : pool)
    t.join();
  for (const std::string& f : failures)
    FAIL_CHECK(f);
  CHECK(failures.empty());
}
