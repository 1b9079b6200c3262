#include "runtime/ReferenceAttention.h"

#include <flexjit/error.h>

#include "Pipeline.h"
#include "codegen/cuda/ReferenceSource.h"
#include "runtime/ContextImpl.h"
#include "runtime/FwdArgs.h"
#include "runtime/ModArgs.h"

#include <flexjit_abi.h>
#include <fmt/format.h>

#include <cmath>

namespace flexjit::runtime {

void reference_attention_into(Context& ctx, const TensorRef& q, const TensorRef& k,
                              const TensorRef& v, const TensorRef& out, const TensorRef* lse,
                              const Mods& mods, const ModBindings& bindings,
                              std::optional<float> scale) {
  const QkvShape s = validate_qkv(q, k, v);
  const std::vector<int64_t> out_shape = {s.batch, s.heads_q, s.seqlen_q, s.head_dim_v};
  if (out.shape != out_shape || out.dtype != q.dtype || !out.is_last_dim_contiguous()) {
    throw RuntimeError(
        fmt::format("reference: out is {}; expected {} [B, Hq, Sq, Dv] with a "
                    "contiguous last dim",
                    out.str(), to_string(q.dtype)));
  }
  if (lse != nullptr && (lse->shape != std::vector<int64_t>{s.batch, s.heads_q, s.seqlen_q} ||
                         lse->dtype != DType::F32 || !lse->is_last_dim_contiguous())) {
    throw RuntimeError(fmt::format(
        "reference: lse is {}; expected f32 [B, Hq, Sq], last dim contiguous", lse->str()));
  }
  Device& device = *ctx.impl().device;
  const std::vector<uint64_t> params = pack_mod_params(mods, bindings, device.index());
  if (s.batch == 0 || s.heads_q == 0 || s.seqlen_q == 0) return;
  if (s.seqlen_q > 2147483647 || s.seqlen_kv > 2147483647 || s.heads_q > 65535 || s.batch > 65535) {
    throw RuntimeError("reference: Sq, Skv below 2^31 and Hq, B at most 65535");
  }

  cuda::ReferenceSpec spec;
  spec.dtype = q.dtype;
  spec.head_dim_qk = static_cast<int>(s.head_dim_qk);
  spec.head_dim_v = static_cast<int>(s.head_dim_v);
  spec.gqa_ratio = static_cast<int>(s.heads_q / s.heads_kv);
  const std::string arch = ctx.arch();
  const cuda::GeneratedSource src = cuda::generate_reference(lower_mods(mods), spec, arch);
  const jit::CompileResult compiled =
      ctx.impl().builder.compile(src, arch, "reference " + mods.name + " " + spec.str());
  const Kernel kernel = ctx.impl().load(compiled);

  // The workspace holds every score; a zero-length KV still gets one float so that the pointer
  // is valid (the kernel writes zeros and -inf without reading it).
  const size_t ws_floats = static_cast<size_t>(s.batch * s.heads_q * s.seqlen_q) *
                           static_cast<size_t>(std::max<int64_t>(s.seqlen_kv, 1));
  DeviceBuffer workspace(device, ws_floats * sizeof(float));

  FjFwdArgs a = make_fwd_args(q, k, v, out, lse, s, scale);
  float* ws = static_cast<float*>(workspace.data());
  void* args[] = {&a, const_cast<uint64_t*>(params.data()), &ws};
  launch(kernel,
         Dim3{static_cast<unsigned>(s.seqlen_q), static_cast<unsigned>(s.heads_q),
              static_cast<unsigned>(s.batch)},
         Dim3{128, 1, 1}, 0, nullptr, args);
  device.synchronize();
}

}  // namespace flexjit::runtime
