#include "support/CpuReference.h"

#include "cpu/CpuAttention.h"

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
  cpu::cpu_attention_forward_f64(mods, bindings,
                                 cpu::CpuTensor::contiguous(q.data(), DType::F32, s.batch,
                                                            s.heads_q, s.seqlen_q, s.head_dim_qk),
                                 cpu::CpuTensor::contiguous(k.data(), DType::F32, s.batch,
                                                            s.heads_kv, s.seqlen_kv, s.head_dim_qk),
                                 cpu::CpuTensor::contiguous(v.data(), DType::F32, s.batch,
                                                            s.heads_kv, s.seqlen_kv, s.head_dim_v),
                                 r.out.data(), r.lse.data(), o);
  return r;
}

}  // namespace flexjit::test
