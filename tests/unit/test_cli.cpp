// The CLI as users meet it: exit codes and messages for good and bad input.
#include <catch2/catch.hpp>

#include "support/CliPath.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

struct Result {
  int code;
  std::string output;  // stdout and stderr together
};

Result run_cli(const std::string& args, const std::string& env = "") {
  std::string cmd = env + " '" + flexjit::test::cli_path() + "' " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0)
    out.append(buf.data(), n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

std::filesystem::path temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() /
           ("flexjit-cli-test-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace

TEST_CASE("emit prints a self-describing CUDA source", "[cli]") {
  Result r = run_cli("emit --score-mod alibi --mask-mod causal --arch sm_90a");
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::StartsWith("// flexjit"));
  CHECK_THAT(r.output, Catch::Contains("source key:"));
  CHECK_THAT(r.output, Catch::Contains("score_mod = score + slopes[h] * float(kv_idx - q_idx)"));
  CHECK_THAT(r.output, Catch::Contains("flexjit_forward"));
  CHECK(r.output.find("#include") == std::string::npos);
}

TEST_CASE("emit takes the sm_90a forward's schedule: persistent CTAs and query tiles", "[cli]") {
  // d 64: persistent CTAs claiming single query tiles (two Q buffers) by default; --persistent 0
  // gives one CTA per query tile; --q-tiles 2 claims pairs; --persistent 1 at d 128 claims
  // single tiles.
  Result r = run_cli("emit --mods causal --arch sm_90a -d 64");
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("kPersistent = 1;") && Catch::Contains("kQBufs = 2;") &&
                           Catch::Contains("kQTiles = 1;"));
  r = run_cli("emit --mods causal --arch sm_90a -d 64 --persistent 0");
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("kPersistent = 0;") && Catch::Contains("kQBufs = 1;") &&
                           Catch::Contains("kQTiles = 1;"));
  r = run_cli("emit --mods causal --arch sm_90a -d 64 --q-tiles 2");
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("kPersistent = 1;") && Catch::Contains("kQBufs = 2;") &&
                           Catch::Contains("kQTiles = 2;"));
  r = run_cli("emit --mods causal --arch sm_90a -d 128 --persistent 1");
  REQUIRE(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("kPersistent = 1;") && Catch::Contains("kQBufs = 2;") &&
                           Catch::Contains("kQTiles = 1;"));
}

TEST_CASE("compile reports resources and hits the disk cache the second time", "[cli]") {
  auto dir = temp_dir("cache");
  std::string env = "FLEXJIT_CACHE_DIR='" + dir.string() + "'";
  Result a = run_cli("compile --mods causal --head-dim 64 --arch sm_80 --json", env);
  REQUIRE(a.code == 0);
  CHECK_THAT(a.output, Catch::Contains("\"cache\": \"compiled\""));
  CHECK_THAT(a.output, Catch::Contains("\"spill_store_bytes\": 0"));
  // ptxas's serialized-wgmma remark: none here (an sm_80 kernel has no wgmma).
  CHECK_THAT(a.output, Catch::Contains("\"wgmma_serialized\": \"\""));
  Result b = run_cli("compile --mods causal --head-dim 64 --arch sm_80 --json", env);
  REQUIRE(b.code == 0);
  CHECK_THAT(b.output, Catch::Contains("\"cache\": \"disk-hit\""));
  Result ls = run_cli("cache ls --json", env);
  REQUIRE(ls.code == 0);
  CHECK_THAT(ls.output, Catch::Contains("\"arch\": \"sm_80\""));
  Result clear = run_cli("cache clear", env);
  CHECK(clear.code == 0);
  CHECK_THAT(clear.output, Catch::Contains("removed 1 entries"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("bad input exits with 1 and says what and where", "[cli][errors]") {
  auto dir = temp_dir("bad");
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  struct Case {
    std::string args;
    std::string expected;
  };
  std::vector<Case> cases = {
      {"emit --arch sm_90a --mods '" + write("parse.fx", "score_mod = score +\n") + "'",
       "parse.fx:1:"},
      {"emit --arch sm_90a --mods '" + write("unknown.fx", "mask_mod = q_idx >= kv_id\n") + "'",
       "did you mean 'kv_idx'"},
      {"emit --arch sm_90a --mods '" + write("float_mask.fx", "mask_mod = float(q_idx)\n") + "'",
       "mask_mod must return bool"},
      {"emit --arch sm_90a --mods '" +
           write("float_index.fx", "buffer bias: f32[S]\nscore_mod = score + bias[score]\n") + "'",
       "must be i32"},
      {"emit --arch sm_90a --mods '" +
           write("rank.fx", "buffer bias: f32[H, S]\nscore_mod = score + bias[h]\n") + "'",
       "has 2 dims but is indexed with 1"},
      {"emit --arch sm_90a --mods no_such_mod", "no_such_mod"},
      {"emit --arch sm_90a --head-dim 100", "head_dim_qk = 100"},
      {"emit --arch sm_90a --dtype f64", "f64"},
      {"emit --arch sm_75", "sm_75"},
      {"emit", "--arch"},
      // bench --shape: checked before anything needs a GPU.
      {"bench --shape 8,16,16,2048", "five values B,Hq,Hkv,S,D"},
      {"bench --shape 8,16,x,2048,64", "Hkv must be a positive integer"},
      {"bench --shape 8,16,15,2048,64", "Hq = 16 is not a multiple of Hkv = 15"},
      {"bench --shape 8,16,16,2048,192/x", "Dv must be a positive integer"},
      {"bench --shape 8,16,16,2048,192/128,1", "Dv must be a positive integer"},
      {"bench --shape 8,16,16,2048,64 --only-extra", "--shape replaces the standard cases"},
      {"bench --shape 8,16,16,2048,64 --fp8", "--shape replaces the standard cases"},
      // --case: a name no case or group has, with the cases and groups it could name.
      {"bench --case nonsense", "groups: main, gqa, d64, long, decode (with --extra or --decode)"},
      // --mods without --shape: one case at the main shape, so the standard groups conflict.
      {"bench --mods causal --extra", "--mods / --score-mod / --mask-mod replaces the standard"},
  };
  for (const auto& c : cases) {
    Result r = run_cli(c.args, "FLEXJIT_CACHE_DIR='" + dir.string() + "/cache'");
    INFO(c.args << "\n" << r.output);
    CHECK(r.code == 1);
    CHECK_THAT(r.output, Catch::Contains(c.expected));
    CHECK_THAT(r.output, !Catch::Contains("terminate called"));
    CHECK_THAT(r.output, !Catch::Contains("internal error"));
  }
  // A parse error shows the line and a caret under the column.
  Result caret = run_cli("emit --arch sm_90a --mods '" + (dir / "unknown.fx").string() + "'");
  CHECK_THAT(caret.output, Catch::Contains("mask_mod = q_idx >= kv_id\n"));
  CHECK_THAT(caret.output, Catch::Contains("^"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("an unusable cache directory is a clear error, not a crash", "[cli][errors]") {
  auto dir = temp_dir("unusable");
  std::ofstream(dir / "file") << "not a directory";
  Result r = run_cli("compile --mods causal --arch sm_80",
                     "FLEXJIT_CACHE_DIR='" + (dir / "file").string() + "'");
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains((dir / "file").string()));
  CHECK_THAT(r.output, Catch::Contains("FLEXJIT_CACHE_DIR"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a corrupt cache entry is a miss that gets replaced", "[cli][cache]") {
  auto dir = temp_dir("corrupt");
  std::string env = "FLEXJIT_CACHE_DIR='" + dir.string() + "'";
  REQUIRE(run_cli("compile --mods causal --head-dim 64 --arch sm_80", env).code == 0);
  int corrupted = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".fjc") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(e.file_size() / 2));
    f.put('\x5a');
    ++corrupted;
  }
  REQUIRE(corrupted == 1);
  Result r = run_cli("compile --mods causal --head-dim 64 --arch sm_80 --json", env);
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("\"cache\": \"compiled\""));
  Result again = run_cli("compile --mods causal --head-dim 64 --arch sm_80 --json", env);
  CHECK_THAT(again.output, Catch::Contains("\"cache\": \"disk-hit\""));
  std::filesystem::remove_all(dir);
}

namespace {

// A hand-built .npy file (format 1.0) of float32 with the given shape text and payload size.
std::string npy_bytes(const std::string& shape, bool fortran, size_t payload) {
  std::string header =
      "{'descr': '<f4', 'fortran_order': " + std::string(fortran ? "True" : "False") +
      ", 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64 != 0)
    header += ' ';
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  return out + header + std::string(payload, '\0');
}

}  // namespace

TEST_CASE("CPU and CLI inputs of absurd sizes are clear errors (issue 14)", "[cli][errors][cpu]") {
  auto dir = temp_dir("sizes");
  auto file = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return (dir / name).string();
  };
  const std::string huge =
      file("huge.npy", npy_bytes("(7623851, 1229673, 3935371, 64)", false, 256));
  const std::string fortran = file("fortran.npy", npy_bytes("(4611686018427387904, 8)", true, 64));
  const std::string digits = file("digits.npy", npy_bytes("(99999999999999999999999,)", false, 0));
  const std::string p62 = file("p62.npy", npy_bytes("(1, 1, 4611686018427387904, 4)", false, 0));
  const std::string out = (dir / "o.npy").string();
  struct Case {
    std::string args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      // 1. size products that overflow int64
      {"run --device cpu --mods noop --random 11357979,3528238,460321,64",
       "--random 11357979,3528238,460321,64: 11357979 x 3528238 x 460321 x 64 elements is more "
       "than 2^63 bytes"},
      {"run --device cpu --mods noop --q " + huge + " --k " + huge + " --v " + huge,
       huge + ": shape (7623851, 1229673, 3935371, 64) has more than 2^63 bytes"},
      {"run --device cpu --mods noop --random 16777216,16777216,16777216,16777216 --out " + out,
       "--random 16777216,16777216,16777216,16777216:"},
      // 2. Fortran order with a huge first dimension
      {"mask show --cpu --mask-mod document --seqlen 256 --buffer doc_id=" + fortran,
       fortran + ": shape (4611686018427387904, 8) has more than"},
      {"run --device cpu --mods document --random 1,1,64,16 --buffer doc_id=" + fortran,
       fortran + ": shape (4611686018427387904, 8) has more than"},
      // 8. what used to be "unexpected error" (std::out_of_range, std::bad_alloc)
      {"run --device cpu --mods noop --q " + digits + " --k " + digits + " --v " + digits,
       digits + ": malformed .npy header: dimension 99999999999999999999999 is too large"},
      {"mask show --cpu --mask-mod causal --seqlen 2147483647",
       "--seqlen 2147483647 --block-size 128: 1 x 1 x 16777216 x 16777216 tiles"},
      {"run --device cpu --mods noop --random 1,1,16777216,16777216",
       "--random 1,1,16777216,16777216: cannot allocate"},
      {"run --device cpu --mods noop --q " + p62 + " --k " + p62 + " --v " + p62,
       p62 + ": shape (1, 1, 4611686018427387904, 4) has more than 2^63 bytes"},
      // 12. a zero length is named with the range it must be in
      {"mask show --cpu --mask-mod causal --seqlen 0",
       "--seqlen: Value 0 not in range 1 to 2147483647"},
  };
  for (const Case& c : cases) {
    Result r = run_cli(c.args);
    INFO(c.args << "\n" << r.output);
    CHECK(r.code == 1);
    CHECK_THAT(r.output, Catch::Contains(c.expected));
    CHECK_THAT(r.output, !Catch::Contains("unexpected error"));
    CHECK(r.output.size() < 400);
  }
  CHECK(!std::filesystem::exists(out));
  // 9. a block size near INT_MAX is one tile, not "0 x 0 tiles"
  Result big = run_cli("mask show --cpu --mask-mod causal --seqlen 512 --block-size 2147483647");
  CHECK(big.code == 0);
  CHECK_THAT(big.output, Catch::Contains("1 x 1 tiles of 2147483647x2147483647 (Sq=512, Skv=512)"));
  CHECK_THAT(big.output, Catch::Contains("density 100.00%"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("mistyped names get the closest match and the list (issue 34)", "[cli][errors]") {
  struct Case {
    std::string args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      // CLI11 said only "A subcommand is required".
      {"emti --mods causal",
       "flexjit: unknown subcommand 'emti' for 'flexjit' (did you mean "
       "'emit'?); the subcommands are: mods, emit, compile"},
      {"cache lss", "unknown subcommand 'lss' for 'flexjit cache' (did you mean 'ls'?)"},
      {"cache", "flexjit: 'flexjit cache' needs a subcommand: ls, stats, clear, prune"},
      // CLI11 said "The following arguments were not expected: 64 --head-dm".
      {"compile --mods causal --head-dm 64 --arch sm_80",
       "flexjit: unknown flag '--head-dm' for 'flexjit compile' (did you mean '--head-dim'?); "
       "'flexjit compile --help' lists its flags"},
      {"compile --mods causl --head-dim 64 --arch sm_80",
       "'causl' is not a standard mod (did you mean 'causal'?)"},
      {"compile --mods causal --head-dim 64 --arch sm90a",
       "unsupported CUDA arch 'sm90a' (did you mean 'sm_90a'?)"},
      // The library's "pass a host tensor for it in bindings.buffers", in the CLI's terms.
      {"mask show --cpu --mask-mod document_causal --seqlen 1024",
       "flexjit: the mask_mod of 'document_causal' reads buffer 'doc_id' (i32[S]); give it with "
       "--buffer doc_id=FILE.npy"},
  };
  for (const Case& c : cases) {
    Result r = run_cli(c.args);
    INFO(c.args << "\n" << r.output);
    CHECK(r.code == 1);
    CHECK_THAT(r.output, Catch::Contains(c.expected));
    CHECK_THAT(r.output, !Catch::Contains("bindings.buffers"));
  }
}

TEST_CASE("inputs are checked before they are read: regular files only, bounded (issue 34)",
          "[cli][errors][cpu]") {
  auto dir = temp_dir("bounded");
  auto file = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return (dir / name).string();
  };
  const std::string k = file("k.npy", npy_bytes("(1, 1, 4, 16)", false, 4 * 16 * 4));
  const std::string fifo = (dir / "f.npy").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string fifo_json = (dir / "m.json").string();
  REQUIRE(::mkfifo(fifo_json.c_str(), 0600) == 0);
  // A 1 TiB sparse file whose header says so: refused from its header, nothing read.
  const std::string sparse = file("sparse.npy", npy_bytes("(256, 1073741824)", false, 0));
  std::filesystem::resize_file(sparse, std::filesystem::file_size(sparse) + (uint64_t{1} << 40));
  const std::string zero_mods =
      file("zero_mods.json", R"({"workloads": [{"mods_file": "/dev/zero", "shapes": [{"heads": 8, )"
                             R"("seqlen": 128}]}]})");
  const std::string huge_shape =
      file("huge_shape.json",
           R"({"workloads": [{"mods": "causal", "shapes": [{"heads": 8, "seqlen": 128, )"
           R"("batch": 9223372036854775807}]}]})");
  const std::string big_json = file("big.json", "");
  std::filesystem::resize_file(big_json, 17 << 20);
  const std::string d = dir.string();
  struct Case {
    std::string args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"run --device cpu --mods causal --q /dev/zero --k " + k + " --v " + k,
       "/dev/zero: cannot open for reading: it is a device; flexjit reads regular files only"},
      {"run --device cpu --mods causal --q " + fifo + " --k " + k + " --v " + k,
       fifo + ": cannot open for reading: it is a FIFO (named pipe)"},
      {"run --device cpu --mods causal --q " + d + " --k " + k + " --v " + k,
       d + ": cannot open for reading: it is a directory, not a file"},
      {"run --device cpu --mods causal --q " + sparse + " --k " + k + " --v " + k,
       sparse + ": cannot allocate 1.0 TiB for an array of f32 [256, 1073741824]"},
      {"tune --manifest /dev/zero --arch sm_90a --dry-run",
       "/dev/zero: cannot read the manifest: it is a device"},
      {"tune --manifest " + fifo_json + " --arch sm_90a --dry-run",
       fifo_json + ": cannot read the manifest: it is a FIFO"},
      {"tune --manifest " + d + " --arch sm_90a --dry-run",
       d + ": cannot read the manifest: it is a directory, not a file"},
      {"tune --manifest " + big_json + " --arch sm_90a --dry-run",
       big_json + ": cannot read the manifest: it is 17 MiB, more than the 16 MiB that a "
                  "manifest may have"},
      {"tune --manifest " + zero_mods + " --arch sm_90a --dry-run",
       "cannot read mods file '/dev/zero': it is a device"},
      {"tune --manifest " + huge_shape + " --arch sm_90a --dry-run",
       "shape field 'batch' is 9223372036854775807; it must be a positive integer of at most "
       "2147483647 (2^31 - 1)"},
      {"run --device cpu --mods causal --random 1,1,100000000,64",
       "--random '1,1,100000000,64': S = 100000000 is more than 16777216 (2^24), the largest "
       "extent --random makes"},
      {"run --device cpu --mods causal --random 1,-2,64,64",
       "--random '1,-2,64,64': H = -2 is negative"},
      {"run --device cpu --mods causal --random 1,1,6x,64",
       "--random '1,1,6x,64': '6x' is not an integer"},
      {"run --device cpu --mods alibi --q " + k + " --k " + k + " --v " + k,
       "the mods 'alibi' capture buffer 'slopes' (f32[H]); give it with --buffer "
       "slopes=FILE.npy"},
  };
  for (const Case& c : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    Result r = run_cli(c.args, "timeout 30");
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO(c.args << "\n" << r.output);
    CHECK(r.code == 1);
    CHECK_THAT(r.output, Catch::Contains(c.expected));
    CHECK_THAT(r.output, !Catch::Contains("bad_alloc"));
    CHECK(seconds < 10);  // nothing was read whole
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("run --device cpu: NaN in, NaN out, and --check fails on NaN mismatches (issue 34)",
          "[cli][cpu][nan]") {
  auto dir = temp_dir("nan");
  // Row 2 of the scores holds +inf: PyTorch's softmax gives NaN for the whole row.
  Result r = run_cli(
      "run --device cpu --repeat 0 --check --random 1,1,64,16 --mods "
      "'score_mod = where(q_idx == 2 && kv_idx == 5, exp(100.0), score)'");
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains(", 16 NaN"));  // one row of D = 16
  CHECK_THAT(r.output, Catch::Contains("max relative error vs the fp64 CPU reference"));
  CHECK_THAT(r.output, !Catch::Contains("NaN in one and not the other"));
  // Scores of 4e40 overflow to +inf in fp32 but not in fp64 (no score_mod, which would see them
  // rounded to f32): fp32 rows are NaN where the fp64 reference has numbers, and --check says so
  // (std::max used to drop the NaN).
  std::string big(16 * 4, '\0');
  const float v = 1e20f;
  for (int d = 0; d < 16; ++d)
    std::memcpy(&big[static_cast<size_t>(d) * 4], &v, 4);
  std::string payload;
  for (int s = 0; s < 4; ++s)
    payload += big;
  {
    std::ofstream f(dir / "big.npy", std::ios::binary);
    f << npy_bytes("(1, 1, 4, 16)", false, 0) << payload;
  }
  const std::string b = (dir / "big.npy").string();
  Result c = run_cli("run --device cpu --repeat 0 --check --mods 'mask_mod = kv_idx >= 0' --q " +
                     b + " --k " + b + " --v " + b);
  INFO(c.output);
  // Every output is NaN: no "max |out| 0.000000", and --check fails (it used to exit 0).
  CHECK(c.code == 1);
  CHECK_THAT(c.output, Catch::Contains("max |out| -: no finite values"));
  CHECK_THAT(c.output, Catch::Contains(", 64 NaN"));
  CHECK_THAT(c.output, Catch::Contains("(and 64 outputs NaN or inf in one and not the other)"));
  CHECK_THAT(c.output, Catch::Contains("--check: 64 outputs are NaN or inf where the fp64 CPU "
                                       "reference is not the same; the first is out[0, 0, 0, 0] "
                                       "= NaN where the reference has 1e+20"));
  Result j = run_cli(
      "run --device cpu --repeat 0 --check --json --mods 'mask_mod = kv_idx >= 0' "
      "--q " +
      b + " --k " + b + " --v " + b);
  CHECK(j.code == 1);
  CHECK_THAT(j.output, Catch::Contains("\"nonfinite_mismatches_vs_fp64\": 64"));
  CHECK_THAT(j.output, Catch::Contains("\"finite\": 0"));
  std::filesystem::remove_all(dir);
}
