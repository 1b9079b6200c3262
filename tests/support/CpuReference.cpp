#include "support/CpuReference.h"

#include "cpu/ForwardKernel.h"
#include "support/HostBindings.h"

namespace flexjit::test {

ReferenceResult cpu_reference_attention(const Mods& mods, const AttentionShape& s,
                                        const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, float scale,
                                        const ir::EvalEnv& bindings) {
  ReferenceResult r;
  const int64_t rows = int64_t{s.batch} * s.heads_q * s.seqlen_q;
  r.out.assign(static_cast<size_t>(rows * s.head_dim_v), 0.0);
  r.lse.assign(static_cast<size_t>(rows), 0.0);
  cpu::CpuForwardOptions o;
  o.scale = static_cast<double>(scale);
  auto view = [](const std::vector<float>& x, int64_t b, int64_t h, int64_t n, int64_t d) {
    return TensorRef::contiguous(const_cast<float*>(x.data()), DType::F32, {b, h, n, d});
  };
  cpu::cpu_attention_forward_f64(
      mods, host_bindings(mods, bindings), view(q, s.batch, s.heads_q, s.seqlen_q, s.head_dim_qk),
      view(k, s.batch, s.heads_kv, s.seqlen_kv, s.head_dim_qk),
      view(v, s.batch, s.heads_kv, s.seqlen_kv, s.head_dim_v), r.out.data(), r.lse.data(), o);
  return r;
}

}  // namespace flexjit::test
