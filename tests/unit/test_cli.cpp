// The CLI as users meet it: exit codes and messages for good and bad input.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

struct Result {
  int code;
  std::string output;  // stdout and stderr together
};

Result run_cli(const std::string& args, const std::string& env = "") {
  std::string cmd = env + " '" FLEXJIT_CLI_PATH "' " + args + " 2>&1";
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

TEST_CASE("compile reports resources and hits the disk cache the second time", "[cli]") {
  auto dir = temp_dir("cache");
  std::string env = "FLEXJIT_CACHE_DIR='" + dir.string() + "'";
  Result a = run_cli("compile --mods causal --head-dim 64 --arch sm_80 --json", env);
  REQUIRE(a.code == 0);
  CHECK_THAT(a.output, Catch::Contains("\"cache\": \"compiled\""));
  CHECK_THAT(a.output, Catch::Contains("\"spill_store_bytes\": 0"));
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
      {"emit --arch sm_90a --head-dim 96", "96"},
      {"emit --arch sm_90a --dtype f64", "f64"},
      {"emit --arch sm_75", "sm_75"},
      {"emit", "--arch"},
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
