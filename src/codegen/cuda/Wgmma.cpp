#include "codegen/cuda/Wgmma.h"

#include <flexjit/error.h>

#include "codegen/cuda/SourceWriter.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace flexjit::cuda {

namespace {

// "{%0, %1, ..., %(n-1)}" for the accumulator registers.
std::string reg_list(int first, int count) {
  std::string s = "{";
  for (int i = 0; i < count; ++i)
    s += fmt::format("{}%{}", i ? ", " : "", first + i);
  return s + "}";
}

// "\"+f\"(d[0][0]), ..." for N / 2 accumulators.
std::string acc_operands(int n) {
  std::string s;
  for (int i = 0; i < n / 2; ++i)
    s += fmt::format("{}\"+f\"(d[{}][{}])", i ? ", " : "", i / 4, i % 4);
  return s;
}

void check_n(int n) {
  FJ_ASSERT(n >= 8 && n <= 256 && n % 8 == 0, "wgmma N must be a multiple of 8 in [8, 256]");
}

}  // namespace

std::string wgmma_wrappers(DType dtype, const std::vector<int>& ss_n, const std::vector<int>& rs_n,
                           const std::vector<int>& tt_n) {
  FJ_ASSERT(dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::E4M3,
            "wgmma wrappers are for bf16 / f16 / e4m3");
  // e4m3 is k32 and names no transpose operands (both shared-memory operands are K-major only,
  // PTX ISA "wgmma.mma_async"); bf16 / f16 are k16 with the transpose bits.
  const bool fp8 = dtype == DType::E4M3;
  FJ_ASSERT(!fp8 || tt_n.empty(), "e4m3 wgmma reads shared-memory operands K-major only");
  const char* ab = fp8 ? "e4m3" : dtype == DType::BF16 ? "bf16" : "f16";
  const int k = fp8 ? 32 : 16;
  SourceWriter w;
  w.line(fmt::format("// wgmma.mma_async m64nNk{1} .f32.{0}.{0} (codegen/cuda/Wgmma.h)", ab, k));
  // Both operands from shared memory: K-major (fj_wgmma_ss, transpose bits 0 0) or MN-major
  // (fj_wgmma_tt, 1 1).
  auto smem_form = [&](const char* name, int n, int trans) {
    check_n(n);
    const int acc = n / 2;
    auto f =
        w.block(fmt::format("FJ_DEVICE void {}(float (&d)[{}][4], unsigned long "
                            "long desc_a, unsigned long long desc_b, int accumulate)",
                            name, n / 8));
    w.line("asm volatile(");
    w.line("    \"{\\n .reg .pred p;\\n\"");
    w.line(fmt::format("    \" setp.ne.b32 p, %{}, 0;\\n\"", acc + 2));
    w.line(fmt::format("    \" wgmma.mma_async.sync.aligned.m64n{}k{}.f32.{}.{} \"", n, k, ab, ab));
    w.line(fmt::format("    \"{}, %{}, %{}, p, 1, 1{};\\n}}\\n\"", reg_list(0, acc), acc, acc + 1,
                       fp8 ? "" : fmt::format(", {}, {}", trans, trans)));
    w.line(fmt::format("    : {}", acc_operands(n)));
    w.line("    : \"l\"(desc_a), \"l\"(desc_b), \"r\"(accumulate));");
  };
  for (int n : std::set<int>(ss_n.begin(), ss_n.end()))
    smem_form("fj_wgmma_ss", n, 0);
  for (int n : std::set<int>(tt_n.begin(), tt_n.end()))
    smem_form("fj_wgmma_tt", n, 1);
  for (int n : std::set<int>(rs_n.begin(), rs_n.end())) {
    check_n(n);
    const int acc = n / 2;
    auto f =
        w.block(fmt::format("FJ_DEVICE void fj_wgmma_rs(float (&d)[{}][4], const fj_u32 (&a)[4], "
                            "unsigned long long desc_b, int accumulate)",
                            n / 8));
    w.line("asm volatile(");
    w.line("    \"{\\n .reg .pred p;\\n\"");
    w.line(fmt::format("    \" setp.ne.b32 p, %{}, 0;\\n\"", acc + 5));
    w.line(fmt::format("    \" wgmma.mma_async.sync.aligned.m64n{}k{}.f32.{}.{} \"", n, k, ab, ab));
    w.line(fmt::format("    \"{}, {{%{}, %{}, %{}, %{}}}, %{}, p, 1, 1{};\\n}}\\n\"",
                       reg_list(0, acc), acc, acc + 1, acc + 2, acc + 3, acc + 4,
                       fp8 ? "" : ", 1"));
    w.line(fmt::format("    : {}", acc_operands(n)));
    w.line(
        "    : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"l\"(desc_b), "
        "\"r\"(accumulate));");
  }
  return w.str();
}

}  // namespace flexjit::cuda
