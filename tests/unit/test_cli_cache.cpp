// `flexjit cache`, `compile` and `inspect --sass` against bad cache files, bad sizes, hostile
// labels and hostile temp directories ([cli][cache]).
#include "jit/DiskCache.h"
#include "support/CacheTest.h"
#include "support/CliPath.h"

#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <optional>
#include <string>

using namespace flexjit;
using namespace flexjit::test;
namespace fs = std::filesystem;

namespace {

struct Result {
  int code;
  std::string output;  // stdout and stderr together
};

// Runs `prefix flexjit args` through sh; prefix sets the environment (and may be `timeout 60`).
Result cli(const std::string& prefix, const std::string& args) {
  Result r;
  r.code = flexjit::test::run_cli(args, &r.output, prefix);
  return r;
}

std::string env_for(const fs::path& cache) {
  return "FLEXJIT_CACHE_DIR='" + cache.string() + "' timeout 120";
}

const char* kCompile = "compile --mods causal --head-dim 64 --arch sm_80 --json";

// A copy of the CLI in `bin`, both readable and executable by every user (mode 0755), wherever
// the build folder is and whatever the umask was when it was built.
fs::path copy_cli_for_others(const fs::path& bin) {
  constexpr fs::perms kRx = fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                            fs::perms::others_read | fs::perms::others_exec;
  fs::create_directory(bin);
  fs::permissions(bin, kRx);
  const fs::path exe = bin / "flexjit";
  fs::copy_file(cli_path(), exe);
  fs::permissions(exe, kRx);
  return exe;
}

// Whether `nobody` may execute `exe` (every ancestor directory searchable, the file executable).
bool others_can_run(const fs::path& exe) {
  return in_child([&] { return ::access(exe.c_str(), X_OK) == 0 ? 0 : 1; }, /*as_nobody=*/true) ==
         0;
}

fs::path only_entry(const fs::path& dir) {
  auto entries = files_with_suffix(dir, ".fjc");
  REQUIRE(entries.size() == 1);
  return entries[0];
}

}  // namespace

TEST_CASE("a FIFO or a huge sparse file in place of an entry hangs and kills nothing",
          "[cli][cache]") {
  TempDir dir;
  const std::string env = env_for(dir.path());
  REQUIRE(cli(env, kCompile).code == 0);
  const fs::path entry = only_entry(dir.path());

  fs::remove(entry);
  REQUIRE(::mkfifo(entry.c_str(), 0600) == 0);
  Result ls = cli(env, "cache ls");
  CHECK(ls.code == 0);
  Result r = cli(env, kCompile);
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("is a FIFO"));
  CHECK_THAT(r.output, Catch::Contains("\"cache\": \"compiled\""));
  CHECK(fs::is_regular_file(fs::symlink_status(entry)));  // replaced

  fs::remove(entry);
  write_all(entry, "");
  fs::resize_file(entry, 100ull << 30);  // sparse: 100 GB that take no space
  CHECK(cli(env, "cache ls").code == 0);
  r = cli(env, kCompile);
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("\"cache\": \"compiled\""));
  CHECK(fs::file_size(entry) < (1u << 20));

  // clear removes a FIFO entry too.
  fs::remove(entry);
  REQUIRE(::mkfifo(entry.c_str(), 0600) == 0);
  Result clear = cli(env, "cache clear");
  CHECK(clear.code == 0);
  CHECK_THAT(clear.output, Catch::Contains("removed 1 entries"));
  CHECK_FALSE(fs::exists(fs::symlink_status(entry)));
}

TEST_CASE("cache prune rejects sizes that are not finite and in range", "[cli][cache]") {
  TempDir dir;
  const std::string env = env_for(dir.path());
  REQUIRE(cli(env, kCompile).code == 0);
  for (const char* bad : {"inf", "-inf", "1e30G", "nan", "-1", "1e400", "2e19", "abc", "5Q"}) {
    INFO(bad);
    Result r = cli(env, std::string("cache prune --max-size '") + bad + "'");
    CHECK(r.code == 1);
    CHECK_THAT(r.output, Catch::Contains(bad));
    CHECK(files_with_suffix(dir.path(), ".fjc").size() == 1);  // nothing deleted
  }
  Result keep = cli(env, "cache prune --max-size 1G");
  CHECK(keep.code == 0);
  CHECK(files_with_suffix(dir.path(), ".fjc").size() == 1);
  Result all = cli(env, "cache prune --max-size 0");
  CHECK(all.code == 0);
  CHECK(files_with_suffix(dir.path(), ".fjc").empty());
}

TEST_CASE("cache ls shows control bytes of labels escaped", "[cli][cache]") {
  TempDir dir;
  {
    jit::DiskCache disk(dir.path(), 1 << 20);
    jit::CompiledKernel k = fake_kernel(fake_key('e'), 100);
    k.label = "evil\x1b]0;owned\x07\x1b[2J\r\xc2\x9b label";
    k.arch = "sm_80\x1b[1m";
    disk.store(k);
  }
  Result r = cli(env_for(dir.path()), "cache ls");
  CHECK(r.code == 0);
  CHECK(r.output.find('\x1b') == std::string::npos);
  CHECK(r.output.find('\x07') == std::string::npos);
  CHECK(r.output.find('\r') == std::string::npos);
  CHECK(r.output.find('\x9b') == std::string::npos);
  CHECK_THAT(r.output, Catch::Contains("evil\\x1b]0;owned\\x07\\x1b[2J\\x0d\\xc2\\x9b label"));
  Result j = cli(env_for(dir.path()), "cache ls --json");
  CHECK(j.code == 0);
  CHECK(j.output.find('\x1b') == std::string::npos);
}

TEST_CASE("cache commands refuse an untrusted directory; compile goes on without it",
          "[cli][cache]") {
  TempDir dir;
  const std::string env = env_for(dir.path());
  REQUIRE(cli(env, kCompile).code == 0);
  fs::permissions(dir.path(), fs::perms::all);
  for (const char* cmd : {"cache ls", "cache stats", "cache clear", "cache prune"}) {
    INFO(cmd);
    Result r = cli(env, cmd);
    CHECK(r.code == 1);
    CHECK_THAT(r.output, Catch::Contains("writable by group or others (mode 0777)"));
    CHECK_THAT(r.output, Catch::Contains("chmod 700"));
  }
  CHECK(files_with_suffix(dir.path(), ".fjc").size() == 1);  // clear removed nothing
  Result r = cli(env, kCompile);
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("\"cache\": \"compiled\""));
  CHECK_THAT(r.output, Catch::Contains("without the disk cache"));
  fs::permissions(dir.path(), fs::perms::owner_all);
}

TEST_CASE("a read-only cache directory with valid entries works for compile and cache ls",
          "[cli][cache]") {
  TempDir dir;
  fs::path cache = dir.path() / "cache";
  REQUIRE(cli(env_for(cache), kCompile).code == 0);
  // Root ignores permission bits: run as `nobody`, who then owns the directory.
  std::string runner;
  std::optional<ScopedEnv> cli_copy;
  if (is_root()) {
    fs::permissions(dir.path(), fs::perms::owner_all | fs::perms::others_exec);
    for (const auto& p : fs::recursive_directory_iterator(dir.path()))
      REQUIRE(::chown(p.path().c_str(), kNobody, kNogroup) == 0);
    // The build folder may sit in a directory that only root can enter (a checkout under
    // `mktemp -d` or /root), so `nobody` runs a copy of the CLI from the test's own directory.
    const fs::path exe = copy_cli_for_others(dir.path() / "bin");
    if (!others_can_run(exe)) {
      WARN("skipped the run as nobody: nobody cannot reach " << exe.string()
                                                             << " (is TMPDIR under a directory "
                                                                "that only root can enter?)");
      return;
    }
    cli_copy.emplace("FLEXJIT_CLI", exe.c_str());
    runner = "setpriv --reuid=65534 --regid=65534 --clear-groups ";
  }
  fs::permissions(cache, fs::perms::owner_read | fs::perms::owner_exec);
  const std::string env = runner + "env HOME=/nonexistent " + env_for(cache);
  Result ls = cli(env, "cache ls");
  CHECK(ls.code == 0);
  CHECK_THAT(ls.output, Catch::Contains("forward/sm80_mma causal"));
  Result hit = cli(env, kCompile);
  CHECK(hit.code == 0);
  CHECK_THAT(hit.output, Catch::Contains("\"cache\": \"disk-hit\""));
  Result other = cli(env, "compile --mods alibi --head-dim 64 --arch sm_80 --json");
  CHECK(other.code == 0);
  CHECK_THAT(other.output, Catch::Contains("\"cache\": \"compiled\""));
  CHECK_THAT(other.output, Catch::Contains("read-only"));
  Result clear = cli(env, "cache clear");
  CHECK(clear.code == 1);
  CHECK_THAT(clear.output, Catch::Contains("read-only"));
  fs::permissions(cache, fs::perms::owner_all);
  CHECK(files_with_suffix(cache, ".fjc").size() == 1);
}

TEST_CASE("two CLI processes compiling the same kernel compile it once", "[cli][cache]") {
  TempDir dir;
  const std::string exe = "'" + cli_path() + "' " + kCompile;
  const std::string script = "export FLEXJIT_CACHE_DIR='" + dir.path().string() + "'; " + exe +
                             " > '" + (dir.path() / "a.json").string() + "' & " + exe + " > '" +
                             (dir.path() / "b.json").string() + "' & wait";
  REQUIRE(std::system(("sh -c \"" + script + "\"").c_str()) == 0);
  std::string a = read_all(dir.path() / "a.json"), b = read_all(dir.path() / "b.json");
  int compiled = (a.find("\"cache\": \"compiled\"") != std::string::npos) +
                 (b.find("\"cache\": \"compiled\"") != std::string::npos);
  int hits = (a.find("\"cache\": \"disk-hit\"") != std::string::npos) +
             (b.find("\"cache\": \"disk-hit\"") != std::string::npos);
  CHECK(compiled == 1);
  CHECK(hits == 1);
}

TEST_CASE("inspect --sass uses a private temp file and runs the disassembler without a shell",
          "[cli][cache]") {
  TempDir dir;
  // A fake cuobjdump that reports its arguments and the temp file's mode.
  fs::path bin = dir.path() / "bin";
  fs::create_directory(bin);
  write_all(bin / "cuobjdump",
            "#!/bin/sh\necho \"ARGC=$# FLAG=$1\"\necho \"FILE=$2\"\nstat -c 'MODE=%a' \"$2\"\n");
  fs::permissions(bin / "cuobjdump", fs::perms::owner_all);
  // A TMPDIR whose name would run a command if it reached a shell.
  fs::path tmp = dir.path() / "t'$(touch PWNED)\"`touch PWNED2`";
  fs::create_directory(tmp);
  std::string path = bin.string() + ":" + std::getenv("PATH");
  Result r;
  {
    ScopedEnv p("PATH", path.c_str()), t("TMPDIR", tmp.c_str());
    r = cli("cd '" + dir.path().string() + "' && " + env_for(dir.path() / "cache"),
            "inspect --mods causal --head-dim 64 --arch sm_80 --sass");
  }
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("ARGC=2 FLAG=--dump-sass"));
  CHECK_THAT(r.output, Catch::Contains("FILE=" + tmp.string() + "/flexjit-inspect-"));
  CHECK_THAT(r.output, Catch::Contains("MODE=600"));
  CHECK_FALSE(fs::exists(dir.path() / "PWNED"));
  CHECK_FALSE(fs::exists(dir.path() / "PWNED2"));
  CHECK(fs::is_empty(tmp));  // the temp file is removed
}
