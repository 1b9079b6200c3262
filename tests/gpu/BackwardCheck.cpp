#include "gpu/BackwardCheck.h"

#include "cpu/BackwardKernel.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <cstdio>
#include <utility>
#include <vector>

namespace flexjit::test {

TensorRef host_ref(const HostTensor& t) {
  return TensorRef::contiguous(const_cast<float*>(t.values.data()), DType::F32, t.shape);
}

void check_backward_f64(const Mods& mods, const ModBindings& host_bindings, const HostTensor& q,
                        const HostTensor& k, const HostTensor& v, const HostTensor& dout,
                        const AttentionResult& fwd, const BackwardResult& g,
                        const std::string& label, double tol) {
  std::vector<double> out64, lse64;
  for (float x : download(fwd.out))
    out64.push_back(x);
  for (float x : download(fwd.lse))
    lse64.push_back(x);
  const cpu::CpuGradients<double> ref =
      cpu::cpu_attention_backward_f64(mods, host_bindings, host_ref(q), host_ref(k), host_ref(v),
                                      out64.data(), lse64.data(), host_ref(dout), {});
  std::vector<std::pair<std::string, ErrorStats>> checks = {
      {"dq", compare(download(g.dq), ref.dq)},
      {"dk", compare(download(g.dk), ref.dk)},
      {"dv", compare(download(g.dv), ref.dv)}};
  for (const auto& [name, t] : g.buffer_grads) {
    auto it = ref.buffers.find(name);
    REQUIRE(it != ref.buffers.end());
    checks.push_back({"d" + name, compare(download(t), it->second)});
  }
  std::string line = "  backward " + label + ":";
  for (const auto& [name, err] : checks) {
    INFO(name << ": " << err.str());
    CHECK(err.nonfinite == 0);
    CHECK(err.rel <= tol);
    line += fmt::format(" {} rel {:.2e};", name, err.rel);
  }
  std::printf("%s\n", line.c_str());
}

}  // namespace flexjit::test
