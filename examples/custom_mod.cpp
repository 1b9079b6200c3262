// A custom mod from C++ and the same mod from `.fx` text, run through flexjit: on the GPU when
// there is one, else on the CPU backend. Prints the checksum of the output and its error against
// the CPU backend's fp64 reference; exits 1 when the two front ends disagree or the error is
// too large.
#include <flexjit/flexjit.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using namespace flexjit;

namespace {

constexpr int64_t B = 1, H = 4, S = 256, D = 64;

// ALiBi with a learned-looking slope per head, soft-capped, under a causal mask.
Mods mods_from_cpp() {
  Buffer slopes("slopes", DType::F32, {"H"});
  Param cap("cap", ScalarType::F32, 30.0);
  return Mods::from(
      [&](Expr s, Expr b, Expr h, Expr q, Expr kv) {
        Expr biased = s + slopes[h] * (kv - q);
        return cap * tanh(biased / cap);
      },
      [](Expr b, Expr h, Expr q, Expr kv) { return q >= kv; });
}

const char* kModsText = R"(
buffer slopes: f32[H]
param cap: f32 = 30.0
score_mod = cap * tanh((score + slopes[h] * (kv_idx - q_idx)) / cap)
mask_mod = q_idx >= kv_idx
)";

double max_rel_error(const std::vector<float>& out, const std::vector<float>& ref) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(double(out[i]) - ref[i]));
    max_ref = std::max(max_ref, std::fabs(double(ref[i])));
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

}  // namespace

int main() {
  try {
    const Mods from_cpp = mods_from_cpp();
    const Mods from_text = parse_mods(kModsText, "example.fx");
    const bool same = equal(from_cpp, from_text) && from_cpp.hash() == from_text.hash();
    std::printf("mods from C++ and from text: %s (hash %016llx)\n", same ? "equal" : "DIFFERENT",
                static_cast<unsigned long long>(from_cpp.hash()));

    std::mt19937 rng(0);
    std::normal_distribution<float> normal;
    std::vector<float> q(B * H * S * D), k(q.size()), v(q.size()), slopes(H);
    for (auto* x : {&q, &k, &v})
      for (float& e : *x)
        e = normal(rng);
    for (int64_t h = 0; h < H; ++h)
      slopes[h] = std::exp2(-8.0f * (h + 1) / H);
    auto ref = [](std::vector<float>& x, std::vector<int64_t> shape) {
      return TensorRef::contiguous(x.data(), DType::F32, std::move(shape));
    };
    const std::vector<int64_t> shape = {B, H, S, D};

    AttentionOptions opts;
    opts.mods = from_text;
    opts.bindings.buffers = {{"slopes", ref(slopes, {H})}};
    opts.bindings.params = {{"cap", 20.0}};

    // The reference: the CPU backend in fp64, with the mods built in C++.
    AttentionOptions ref_opts = opts;
    ref_opts.mods = from_cpp;
    CpuRunOptions f64;
    f64.reference_f64 = true;
    const CpuAttentionResult expected =
        flex_attention_cpu(ref(q, shape), ref(k, shape), ref(v, shape), ref_opts, f64);

    std::vector<float> out(q.size());
    const char* device = "cpu";
    double tolerance = 1e-4;
    bool have_gpu = false;
    try {
      Context probe;
      have_gpu = true;
    } catch (const RuntimeError& e) {
      std::printf("no GPU (%s): running on the CPU backend\n", e.what());
    }
    if (have_gpu) {
      Context ctx;
      device = "cuda";
      tolerance = 2e-2;  // f32 inputs run on tf32 tensor cores
      auto up = [&](std::vector<float>& x, std::vector<int64_t> s) {
        return DeviceTensor::from_host(ctx, DType::F32, std::move(s), x.data());
      };
      DeviceTensor dq = up(q, shape), dk = up(k, shape), dv = up(v, shape), ds = up(slopes, {H});
      DeviceBlockMask bm = create_block_mask(ctx, from_text, B, 1, S, S);
      opts.bindings.buffers = {{"slopes", ds}};
      opts.block_mask = &bm;
      AttentionResult r = flex_attention(ctx, dq, dk, dv, opts);
      ctx.synchronize();
      r.out.copy_to_host(out.data());
    } else {
      flex_attention_cpu_into(ref(q, shape), ref(k, shape), ref(v, shape), ref(out, shape), nullptr,
                              opts);
    }

    double checksum = 0;
    for (float x : out)
      checksum += x;
    const double err = max_rel_error(out, expected.out);
    std::printf("device %s  out [%lld, %lld, %lld, %lld]  checksum %.6f\n", device,
                static_cast<long long>(B), static_cast<long long>(H), static_cast<long long>(S),
                static_cast<long long>(D), checksum);
    std::printf("max relative error vs the fp64 reference: %.3g (tolerance %.0e)\n", err,
                tolerance);
    const bool ok = same && err <= tolerance;
    std::printf("%s\n", ok ? "OK" : "FAILED");
    return ok ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "flexjit error: %s\n", e.what());
    return 1;
  }
}
