#include "gpu/ForwardCheck.h"

#include <catch2/catch.hpp>

#include <cstdio>

namespace flexjit::test {

void check_forward_f64(const std::vector<float>& out, const std::vector<float>& lse,
                       const ReferenceResult& ref, const std::string& label, DType dtype) {
  const ErrorStats err = compare(out, ref.out);
  const LseStats lse_stats = compare_lse(lse, ref.lse);
  INFO(label << ": out " << err.str() << "; lse max rel err " << lse_stats.max_err);
  CHECK(err.nonfinite == 0);
  CHECK(err.rel <= tolerance(dtype));
  CHECK(lse_stats.mismatched_inf == 0);
  CHECK(lse_stats.max_err <= 1e-2);
  std::printf("  forward %s: out %s; lse max rel err %.3e\n", label.c_str(), err.str().c_str(),
              lse_stats.max_err);
}

}  // namespace flexjit::test
