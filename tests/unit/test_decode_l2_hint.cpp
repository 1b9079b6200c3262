// The L2-hint split kernels (decode_split/sm80_ef, sm80_ef256: K / V cp.async with an
// L2::evict_first cache policy; docs/kernels/decode.md "L2 hints") without a GPU: NVRTC compiles
// of the configs the GPU tests and the tuner build, each within the register file and without
// spills beyond sm80_mma's. ptxas (CUDA 13.0) addressed some hinted copies as register + uniform
// register + immediate and gave those an odd uniform register as their 64-bit cache-policy
// descriptor (`LDGSTS [R19+UR0+0x8000], desc[UR1][R26.64]`), an illegal register pair that
// faults at run time with CUDA_ERROR_ILLEGAL_INSTRUCTION; NVRTC accepts such a cubin, so only
// the SASS shows it (fj_dec_cp_async_16 in templates/decode_split.cuh has the workaround). Where
// cuobjdump is found (CUOBJDUMP, else PATH) these tests disassemble every cubin and check that no
// instruction takes an odd-register descriptor, that no cache-policy LDGSTS is addressed
// [R+UR], and that the K / V copies carry the policy (LDGSTS with a descriptor other than the
// default c[0x0][0x208] one). Without cuobjdump (CI) only the compile checks run, and a warning
// says so.
//
//   CUOBJDUMP=/path/to/cuobjdump flexjit-tests "[l2hint]"          the test configs
//   CUOBJDUMP=/path/to/cuobjdump flexjit-tests "[l2hint_sweep]"    the broad sweep (hidden)
#include <flexjit/error.h>
#include <flexjit/kernel.h>
#include <flexjit/mods.h>

#include "Pipeline.h"
#include "kernels/Registry.h"
#include "kernels/decode/Decode.h"
#include "kernels/decode/DecodeSplit.h"
#include "support/Parallel.h"

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

using namespace flexjit;
using namespace flexjit::kernels;

namespace {

struct HintJob {
  std::string variant, mods, arch;
  DType dtype;  // q's
  int dqk, dv, gqa, sq, page;
  bool kv_e4m3;
  Params overrides;
  bool full_blocks = true;
};

// What the SASS of a cubin shows (scan_sass).
struct SassScan {
  int odd_descriptors = 0;         // instructions with desc[URn], n odd
  std::string first_odd;           // the first of them
  int policy_copies = 0;           // LDGSTS whose descriptor is not the default one
  int uniform_address_copies = 0;  // of those, addressed [Rn+URm...] (the form that had them)
  int default_copies = 0;          // LDGSTS with the default descriptor (the Q tile's copies)
};

// cuobjdump: $CUOBJDUMP, else one on PATH; empty when there is none.
std::string find_cuobjdump() {
  if (const char* env = std::getenv("CUOBJDUMP"); env != nullptr && *env != '\0') return env;
  if (const char* path = std::getenv("PATH")) {
    std::stringstream dirs(path);
    for (std::string dir; std::getline(dirs, dir, ':');) {
      const std::filesystem::path p = std::filesystem::path(dir) / "cuobjdump";
      if (!dir.empty() && ::access(p.c_str(), X_OK) == 0) return p.string();
    }
  }
  return {};
}

// `tool -sass` of the cubin (through a temp file); throws on any failure.
std::string disassemble(const std::string& tool, const std::vector<char>& cubin) {
  std::string path = (std::filesystem::temp_directory_path() / "flexjit-l2hint-XXXXXX").string();
  const int fd = ::mkstemp(path.data());
  if (fd < 0) throw Error(fmt::format("cannot create '{}': {}", path, std::strerror(errno)));
  const ssize_t n = ::write(fd, cubin.data(), cubin.size());
  ::close(fd);
  if (n != static_cast<ssize_t>(cubin.size())) {
    ::unlink(path.c_str());
    throw Error(fmt::format("cannot write the cubin to '{}'", path));
  }
  const std::string cmd = fmt::format("'{}' -sass '{}' 2>/dev/null", tool, path);
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    for (size_t got; (got = std::fread(buf, 1, sizeof(buf), p)) > 0;)
      out.append(buf, got);
    const int status = ::pclose(p);
    ::unlink(path.c_str());
    if (status != 0) throw Error(fmt::format("'{}' failed (status {})", cmd, status));
  } else {
    ::unlink(path.c_str());
    throw Error(fmt::format("cannot run '{}'", cmd));
  }
  if (out.find("Function : ") == std::string::npos) {
    throw Error(fmt::format("'{}' printed no kernel: not a SASS listing?", cmd));
  }
  return out;
}

// The split kernel's memory descriptors: the default one is the uniform pair loaded from
// c[0x0][0x208]; a cache-policy copy names the pair its createpolicy value lives in. (The text
// is cuobjdump's: `LDGSTS.E.BYPASS.LTC256B.128 [R23], desc[UR6][R26.64], !P0`.)
SassScan scan_sass(const std::string& sass) {
  static const std::regex desc(R"(desc\[UR(\d+)\])");
  static const std::regex default_desc(R"(ULDC\.64 UR(\d+), c\[0x0\]\[0x208\])");
  static const std::regex uniform_address(R"(\[R\d+\+UR\d+)");
  SassScan s;
  std::set<int> defaults;
  std::vector<std::pair<int, bool>> copies;  // LDGSTS: descriptor, addressed [R+UR]
  std::stringstream lines(sass);
  for (std::string line; std::getline(lines, line);) {
    const size_t semi = line.find(';');
    if (semi == std::string::npos) continue;
    const std::string ins = line.substr(0, semi);
    std::smatch m;
    if (std::regex_search(ins, m, default_desc)) defaults.insert(std::stoi(m[1]));
    for (std::sregex_iterator it(ins.begin(), ins.end(), desc), end; it != end; ++it) {
      const int reg = std::stoi((*it)[1]);
      if (reg % 2 != 0 && s.odd_descriptors++ == 0) s.first_odd = ins;
      if (ins.find("LDGSTS") != std::string::npos) {
        copies.emplace_back(reg, std::regex_search(ins, uniform_address));
      }
    }
  }
  for (const auto& [reg, uniform] : copies) {
    if (defaults.count(reg)) {
      ++s.default_copies;
    } else {
      ++s.policy_copies;
      s.uniform_address_copies += uniform;
    }
  }
  return s;
}

KernelDesc hint_desc(const HintJob& j) {
  return Registry::global().complete(
      decode_split_problem(cuda::Arch::parse(j.arch), j.dtype, j.dqk, j.dv, j.gqa,
                           decode_rows(j.gqa, j.sq), j.page, j.full_blocks, j.kv_e4m3),
      InputFacts{}, j.overrides, j.variant);
}

// Compiles every job; checks registers and spills, and with cuobjdump the descriptors.
// spill_slack: spill bytes a hinted build may add to sm80_mma's (the sweep's: at d = 256 and 255
// registers, the per-copy xor of the workaround costs one document build a 4-byte slot).
void check_jobs(const std::vector<HintJob>& jobs, int spill_slack = 0) {
  const std::string cuobjdump = find_cuobjdump();
  if (cuobjdump.empty()) {
    WARN(
        "no cuobjdump (set CUOBJDUMP): the SASS of the L2-hint kernels is not scanned for "
        "odd-register cache-policy descriptors");
  }
  jit::CacheSettings settings = jit::CacheSettings::from_env();  // FLEXJIT_DUMP_DIR
  settings.enabled = false;
  KernelBuilder builder(settings);
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<std::string> names(jobs.size());
  std::vector<int> registers(jobs.size(), -1), spills(jobs.size(), -1);
  std::vector<int> base_spills(jobs.size(), 0);  // sm80_mma's, where the hint's build spills
  std::vector<std::optional<SassScan>> scans(jobs.size());
  test::run_parallel(jobs.size(), [&](size_t i) {
    const HintJob& j = jobs[i];
    try {
      const KernelDesc d = hint_desc(j);
      names[i] = j.mods + " " + d.str();
      BuiltKernel k = builder.build(standard_mods(j.mods), d);
      registers[i] = k.compiled.kernel->usage.registers;
      spills[i] = k.compiled.kernel->usage.spill_store_bytes;
      if (spills[i] > 0) {
        // Some configs spill without the hint too (d = 256 with 32-key tiles on one warp
        // along M, 128-key tiles on 4 warps): the hint must not add to it.
        KernelDesc plain = d;
        plain.variant = "sm80_mma";
        base_spills[i] =
            builder.build(standard_mods(j.mods), plain).compiled.kernel->usage.spill_store_bytes;
      }
      if (!cuobjdump.empty())
        scans[i] = scan_sass(disassemble(cuobjdump, k.compiled.kernel->cubin));
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(fmt::format("{} {} {}: {}", j.variant, j.mods, j.arch, e.what()));
    }
  });
  for (const auto& f : failures)
    FAIL_CHECK(f);
  int odd = 0, uniform = 0, scanned = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    INFO(names[i] << ": " << registers[i] << " registers, " << spills[i]
                  << " spill bytes (sm80_mma: " << base_spills[i] << ")");
    CHECK(registers[i] > 0);
    CHECK(registers[i] <= 255);
    CHECK(spills[i] <= base_spills[i] + spill_slack);
    if (!scans[i]) continue;
    const SassScan& s = *scans[i];
    ++scanned;
    odd += s.odd_descriptors > 0;
    uniform += s.uniform_address_copies > 0;
    INFO("SASS: " << s.odd_descriptors << " odd-register descriptors (first: " << s.first_odd
                  << "), " << s.policy_copies << " LDGSTS with the cache policy, "
                  << s.default_copies << " with the default descriptor, "
                  << s.uniform_address_copies << " addressed [R+UR]");
    CHECK(s.odd_descriptors == 0);
    CHECK(s.uniform_address_copies == 0);
    // K / V copies with the policy (bulk copies, kv_copy 1 / 2, have none: no LDGSTS).
    if (jobs[i].overrides.get("kv_copy").value_or(0) == 0) CHECK(s.policy_copies > 0);
  }
  if (!cuobjdump.empty()) {
    std::printf(
        "l2hint: %zu kernels compiled, %d scanned with %s: %d with odd descriptors, %d with "
        "policy copies addressed [R+UR]\n",
        jobs.size(), scanned, cuobjdump.c_str(), odd, uniform);
  }
}

const char* const kVariants[] = {"sm80_ef", "sm80_ef256"};

}  // namespace

// e4m3 caches: the configs of tests/unit/test_decode_fp8.cpp and tests/gpu/test_decode_fp8.cpp.
std::vector<HintJob> fp8_jobs(const std::string& v) {
  std::vector<HintJob> jobs;
  const Params none;
  auto cfg = [](int bn, int warps, int stages) {
    Params p;
    if (bn) p.set("block_n", bn);
    if (warps) p.set("num_warps", warps);
    if (stages) p.set("num_stages", stages);
    return p;
  };
  const DType bf = DType::BF16, f16 = DType::F16;
  for (const std::string arch : {"sm_89", "sm_90a"}) {
    jobs.push_back({v, "noop", arch, bf, 128, 128, 4, 1, 0, true, none});
    jobs.push_back({v, "noop", arch, f16, 128, 128, 4, 4, 16, true, none});
    jobs.push_back({v, "alibi_causal", arch, bf, 64, 64, 3, 5, 1, true, none});
    jobs.push_back({v, "document_causal", arch, bf, 64, 64, 8, 16, 64, true, none});
    jobs.push_back({v, "relative_bias", arch, f16, 256, 256, 1, 1, 256, true, none});
    jobs.push_back({v, "softcap", arch, bf, 128, 64, 7, 3, 32, true, none});
    jobs.push_back({v, "noop", arch, bf, 96, 96, 2, 8, 128, true, none});
    jobs.push_back({v, "noop", arch, bf, 128, 128, 4, 1, 0, true, cfg(32, 2, 1)});
    jobs.push_back({v, "alibi", arch, bf, 80, 48, 4, 1, 16, true, none});
    jobs.push_back({v, "noop", arch, f16, 208, 112, 2, 2, 0, true, none});
    jobs.push_back({v, "alibi", arch, bf, 256, 256, 4, 1, 16, true, none});
    jobs.push_back({v, "sliding_window", arch, bf, 128, 128, 4, 1, 16, true, cfg(128, 4, 2)});
  }
  // The GPU tests (sm_90a), both q dtypes.
  for (const DType q : {bf, f16}) {
    const std::string a = "sm_90a";
    jobs.push_back({v, "noop", a, q, 128, 128, 4, 1, 0, true, none});
    jobs.push_back({v, "alibi", a, q, 128, 128, 4, 4, 0, true, none});
    jobs.push_back({v, "noop", a, q, 128, 128, 4, 1, 16, true, none});
    jobs.push_back({v, "causal", a, q, 128, 128, 4, 4, 16, true, none});
    jobs.push_back({v, "softcap", a, q, 128, 128, 5, 1, 1, true, none});
    jobs.push_back({v, "relative_bias", a, q, 64, 64, 3, 2, 2, true, none});
    jobs.push_back({v, "sliding_window", a, q, 128, 64, 7, 3, 32, true, none});
    jobs.push_back({v, "document_causal", a, q, 64, 64, 8, 16, 64, true, none});
    jobs.push_back({v, "t5_bucketed_bias", a, q, 96, 96, 2, 8, 128, true, none});
    jobs.push_back({v, "noop", a, q, 256, 256, 1, 1, 256, true, none});
    jobs.push_back({v, "noop", a, q, 128, 128, 4, 1, 16, true, cfg(0, 0, 1)});
    jobs.push_back({v, "alibi", a, q, 128, 128, 4, 1, 0, true, cfg(32, 2, 0)});
    jobs.push_back({v, "noop", a, q, 128, 128, 4, 1, 0, true, cfg(128, 0, 2)});
    jobs.push_back({v, "noop", a, q, 128, 128, 2, 40, 16, true, none});
    for (const auto& [dqk, dv] : std::vector<std::pair<int, int>>{
             {64, 64}, {48, 48}, {80, 112}, {208, 96}, {240, 256}, {128, 64}, {256, 256}}) {
      jobs.push_back({v, dqk == 80 ? "alibi" : "noop", a, q, dqk, dv, 4, dqk == 48 ? 3 : 1,
                      dqk == 208 ? 16 : 0, true, none});
    }
    for (int page : {0, 1, 16})
      jobs.push_back({v, "alibi", a, q, 64, 64, 3, 2, page, true, cfg(0, 0, page == 16 ? 1 : 3)});
  }
  return jobs;
}

// 2-byte caches: the shapes of tests/gpu/test_decode.cpp ([gpu][decode]; its first case draws
// the mod, the head dims, GQA and the query tokens: `mods` x `dims` x the (gqa, sq) pairs here).
std::vector<HintJob> bf16_jobs(const std::string& v, const std::vector<std::string>& mods) {
  std::vector<HintJob> jobs;
  const Params none;
  const DType bf = DType::BF16, f16 = DType::F16;
  const std::string a = "sm_90a";
  const std::vector<std::pair<int, int>> dims = {{64, 64}, {128, 128}, {256, 256}, {128, 64}};
  size_t n = 0;
  for (const std::string& m : mods) {
    for (const auto& [dqk, dv] : dims) {
      // 128 packed rows (GQA 5 x 16 tokens: the build that faulted) and one more row count.
      const std::pair<int, int> other[] = {{4, 1}, {3, 5}, {8, 4}, {2, 8}};
      for (const auto& [gqa, sq] : {std::pair<int, int>{5, 16}, other[n % 4]})
        jobs.push_back({v, m, a, n++ % 2 ? f16 : bf, dqk, dv, gqa, sq, 0, false, none});
    }
  }
  // The paged shapes.
  for (const int d : {64, 128}) {
    jobs.push_back({v, "noop", a, bf, d, d, 1, 1, 16, false, none});
    jobs.push_back({v, "alibi", a, f16, d, d, 3, 4, 16, false, none});
    jobs.push_back({v, "softcap", a, bf, d, d, 5, 1, 1, false, none});
    jobs.push_back({v, "causal", a, f16, d, d, 6, 2, 256, false, none});
    jobs.push_back({v, "relative_bias", a, bf, d, d, 7, 16, 1, false, none});
    jobs.push_back({v, "sliding_window", a, f16, d, d, 8, 16, 256, false, none});
    jobs.push_back({v, "t5_bucketed_bias", a, bf, d, d, 2, 8, 16, false, none});
    jobs.push_back({v, "document_causal", a, f16, d, d, 4, 3, 64, false, none});
  }
  // Config corners, ragged head dims, the block-mask cases (no full blocks).
  jobs.push_back({v, "alibi", a, bf, 128, 128, 4, 4, 0, false, Params{{"num_stages", 1}}});
  jobs.push_back({v, "softcap", a, bf, 128, 128, 4, 1, 0, false,
                  Params{{"block_n", 32}, {"num_warps", 2}, {"num_stages", 4}}});
  jobs.push_back({v, "noop", a, bf, 128, 128, 4, 1, 0, false,
                  Params{{"block_n", 128}, {"num_warps", 4}, {"num_stages", 2}}});
  jobs.push_back({v, "causal", a, bf, 40, 72, 3, 2, 0, false, none});
  jobs.push_back({v, "relative_bias", a, bf, 128, 128, 4, 1, 16, false, Params{{"num_stages", 4}}});
  jobs.push_back({v, "document_causal", a, bf, 128, 64, 8, 16, 64, false, none});
  jobs.push_back({v, "sliding_window", a, bf, 256, 256, 6, 2, 256, false, none});
  jobs.push_back({v, "t5_bucketed_bias", a, bf, 96, 96, 2, 8, 32, false,
                  Params{{"block_n", 32}, {"num_warps", 2}}});
  jobs.push_back({v, "causal", a, bf, 128, 128, 2, 4, 0, false, none, /*full_blocks=*/false});
  jobs.push_back({v, "causal", a, bf, 128, 128, 4, 4, 16, false, none, /*full_blocks=*/false});
  // Bulk copies (kv_copy 1, 2: cp.async.bulk with the policy; the GPU suite runs them with the
  // variants enabled), the shapes of its bulk-copy case.
  for (const int kv_copy : {1, 2}) {
    auto cfg = [&](Params p) {
      p.set("kv_copy", kv_copy);
      return p;
    };
    jobs.push_back({v, "noop", a, bf, 128, 128, 4, 1, 0, false, cfg({})});
    jobs.push_back({v, "alibi", a, bf, 128, 128, 4, 4, 0, false, cfg({{"num_stages", 1}})});
    jobs.push_back({v, "softcap", a, bf, 128, 128, 4, 1, 0, false,
                    cfg({{"block_n", 32}, {"num_warps", 2}, {"num_stages", 4}})});
    jobs.push_back({v, "noop", a, bf, 128, 128, 4, 1, 0, false,
                    cfg({{"block_n", 128}, {"num_warps", 4}, {"num_stages", 2}})});
    jobs.push_back({v, "causal", a, bf, 40, 72, 3, 2, 0, false, cfg({})});
    jobs.push_back({v, "softcap", a, bf, 128, 128, 5, 1, 1, false, cfg({})});
    jobs.push_back({v, "noop", a, bf, 64, 64, 1, 4, 16, false, cfg({})});
    jobs.push_back(
        {v, "relative_bias", a, bf, 128, 128, 4, 1, 16, false, cfg({{"num_stages", 4}})});
    jobs.push_back({v, "document_causal", a, bf, 128, 64, 8, 16, 64, false, cfg({})});
    jobs.push_back({v, "sliding_window", a, bf, 256, 256, 6, 2, 256, false, cfg({})});
    jobs.push_back({v, "t5_bucketed_bias", a, bf, 96, 96, 2, 8, 32, false,
                    cfg({{"block_n", 32}, {"num_warps", 2}})});
  }
  return jobs;
}

// The tuner's search (DecodeSplitSm80Mma::config_space, splits aside: a launch parameter) on the
// anchors' shape, contiguous and through 16-key pages, 2-byte and e4m3 caches.
std::vector<HintJob> tuner_jobs(const std::string& v, const std::string& arch) {
  std::vector<HintJob> jobs;
  const Variant& split = Registry::global().get(Family::DecodeSplit, "sm80_mma");
  for (const bool fp8 : {false, true}) {
    if (fp8 && cuda::Arch::parse(arch).cc() < 89) continue;  // e4m3 needs sm_89
    for (const int page : {0, 16}) {
      const KernelDesc p = decode_split_problem(cuda::Arch::parse(arch), DType::BF16, 128, 128, 4,
                                                decode_rows(4, 1), page, true, fp8);
      std::set<std::string> seen;
      for (Params c : split.config_space(p)) {
        c.set("num_splits", 0);
        if (!seen.insert(c.str()).second) continue;
        jobs.push_back({v, "noop", arch, DType::BF16, 128, 128, 4, 1, page, fp8, c});
      }
    }
  }
  return jobs;
}

// The e4m3 configs the GPU tests run on the H100 (bf16 q) and the 2-byte ones whose builds had
// odd descriptors before the workaround (128 packed rows, 32-key tiles, 8 warps: the sweep's 8
// configs of 324, each in both variants; docs/kernels/decode.md "L2 hints").
TEST_CASE("decode L2 hint: the evict_first splits compile for the GPU tests' configs",
          "[decode][nvrtc][variants][l2hint]") {
  std::vector<HintJob> jobs;
  const Params none;
  for (const char* v : kVariants) {
    for (HintJob& j : fp8_jobs(v))
      if (j.arch == "sm_90a" && j.dtype == DType::BF16) jobs.push_back(j);
    const std::string a = "sm_90a";
    jobs.push_back({v, "document_causal", a, DType::BF16, 128, 64, 8, 16, 64, false, none});
    jobs.push_back({v, "relative_bias", a, DType::BF16, 64, 64, 7, 16, 1, false, none});
    jobs.push_back({v, "sliding_window", a, DType::F16, 64, 64, 8, 16, 256, false, none});
    jobs.push_back({v, "noop", a, DType::BF16, 128, 128, 5, 16, 0, false, none});
  }
  // The default variant hints its e4m3 copies too (decode_split.cuh's kPolicy).
  for (HintJob& j : fp8_jobs("sm80_mma"))
    if (j.arch == "sm_90a" && j.dtype == DType::BF16) jobs.push_back(j);
  check_jobs(jobs);
}

TEST_CASE("decode L2 hint: the sweep of mods, head dims, rows, pages and tuner configs",
          "[.][l2hint_sweep]") {
  std::vector<HintJob> jobs;
  for (const char* v : kVariants) {
    for (HintJob& j : fp8_jobs(v))
      jobs.push_back(j);
    for (HintJob& j : bf16_jobs(v, standard_mod_names()))
      jobs.push_back(j);
    for (const char* arch : {"sm_80", "sm_90a"}) {
      for (HintJob& j : tuner_jobs(v, arch))
        jobs.push_back(j);
    }
  }
  for (HintJob& j : fp8_jobs("sm80_mma"))  // the default hints e4m3 copies too
    jobs.push_back(j);
  check_jobs(jobs, /*spill_slack=*/4);
}
