// The disk cache as an attacker or a careless user meets it ([cache][security]): private
// directories, ownership and mode checks, every kind of bad entry file, read-only directories and
// write errors. docs/caching.md ("Trust") states the rules these tests pin.
#include "jit/KernelCompiler.h"
#include "support/CacheTest.h"
#include "util/PrivateFiles.h"

#include <flexjit/error.h>

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>

using namespace flexjit;
using namespace flexjit::jit;
using namespace flexjit::test;
namespace fs = std::filesystem;

namespace {

unsigned mode_of(const fs::path& p) {
  struct stat st;
  REQUIRE(::lstat(p.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

// A valid entry for small_request(variant), made in a scratch directory: its bytes.
std::string valid_entry_bytes(int variant) {
  TempDir scratch;
  KernelCompiler c(settings_in(scratch.path()));
  c.compile(small_request(variant));
  return read_all(files_with_suffix(scratch.path(), ".fjc").at(0));
}

fs::path entry_path(const fs::path& dir, const CompileRequest& req) {
  return dir / DiskCache::file_name(cache_key(req), req.arch);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("flexjit creates its cache and dump directories 0700 and its files 0600",
          "[cache][security]") {
  TempDir dir;
  CacheSettings s = settings_in(dir.path() / "a" / "b" / "cache");
  s.dump_dir = dir.path() / "dumps" / "x";
  KernelCompiler c(s);
  c.compile(small_request());
  for (const fs::path& d :
       {dir.path() / "a", dir.path() / "a" / "b", s.dir, dir.path() / "dumps", s.dump_dir}) {
    INFO(d);
    CHECK(mode_of(d) == 0700);
  }
  auto entries = files_with_suffix(s.dir, ".fjc");
  REQUIRE(entries.size() == 1);
  CHECK(mode_of(entries[0]) == 0600);
  auto dumps = files_with_suffix(s.dump_dir, ".cu");
  REQUIRE(dumps.size() == 1);
  CHECK(mode_of(dumps[0]) == 0600);

  // The helper the tuning files use: an existing private directory is used as it is.
  files::DirCheck again = files::open_private_dir(s.dir, "the tuning directory");
  CHECK(again.state == files::DirState::Writable);
  CHECK(again.problem.empty());
}

TEST_CASE("without HOME the cache falls back to a per-user directory, checked like any other",
          "[cache][security]") {
  TempDir tmp;
  ScopedEnv a("FLEXJIT_CACHE_DIR", nullptr), b("XDG_CACHE_HOME", nullptr), c("HOME", nullptr),
      d("TMPDIR", tmp.path().c_str());
  const fs::path expected = tmp.path() / ("flexjit-cache-" + std::to_string(::geteuid()));
  CHECK(CacheSettings::from_env().dir == expected);
  {
    ScopedEnv x("XDG_CACHE_HOME", "relative/dir");  // ignored, as the XDG spec says
    CHECK(CacheSettings::from_env().dir == expected);
  }
  {
    ScopedEnv x("TMPDIR", "/nonexistent/tmp");  // not an exception: /tmp instead
    CHECK(CacheSettings::from_env().dir ==
          fs::path("/tmp") / ("flexjit-cache-" + std::to_string(::geteuid())));
  }

  // Another user got there first and planted a valid entry in a directory anyone can write.
  fs::create_directory(expected);
  const CompileRequest req = small_request(3);
  write_all(entry_path(expected, req), valid_entry_bytes(3));
  fs::permissions(expected, fs::perms::all);
  if (is_root()) {
    REQUIRE(::chown(expected.c_str(), kNobody, kNogroup) == 0);
    REQUIRE(::chown(entry_path(expected, req).c_str(), kNobody, kNogroup) == 0);
  }
  CaptureStderr err;
  KernelCompiler compiler;
  std::string warning = err.text();
  CHECK(compiler.disk() == nullptr);
  CHECK_THAT(warning, Catch::Contains(expected.string()));
  CHECK_THAT(warning, Catch::Contains("without the disk cache"));
  CHECK(compiler.compile(req).outcome == CacheOutcome::Compiled);  // never the planted entry
}

TEST_CASE("an untrusted cache directory is one warning, then no disk cache", "[cache][security]") {
  struct Case {
    const char* what;
    fs::perms mode;
    bool foreign_owner;
    const char* message;
  };
  std::vector<Case> cases = {
      {"writable by others", fs::perms::owner_all | fs::perms::others_all, false,
       "writable by group or others (mode 0707)"},
      {"writable by group", fs::perms::owner_all | fs::perms::group_all, false,
       "writable by group or others (mode 0770)"},
  };
  if (is_root()) {
    cases.push_back({"owned by another user", fs::perms::owner_all, true, "is owned by nobody"});
  } else {
    WARN("not root: the foreign-owner case is not run (the mode cases are)");
  }
  const CompileRequest req = small_request(4);
  const std::string planted = valid_entry_bytes(4);
  for (const Case& c : cases) {
    INFO(c.what);
    TempDir dir;
    fs::path cache = dir.path() / "cache";
    fs::create_directory(cache);
    write_all(entry_path(cache, req), planted);
    fs::permissions(cache, c.mode);
    if (c.foreign_owner) REQUIRE(::chown(cache.c_str(), kNobody, kNogroup) == 0);

    CaptureStderr err;
    KernelCompiler compiler(settings_in(cache));
    KernelCompiler second(settings_in(cache));
    err.restore();
    std::string warning = err.text();
    CHECK_THAT(warning, Catch::Contains(cache.string()));
    CHECK_THAT(warning, Catch::Contains(c.message));
    CHECK_THAT(warning, Catch::Contains("Fix:"));
    // Said once per process, however many compilers open the directory.
    CHECK(std::count(warning.begin(), warning.end(), '\n') == 1);
    CHECK(compiler.disk() == nullptr);
    CHECK_THAT(compiler.disk_problem(), Catch::Contains(c.message));
    CompileResult r = compiler.compile(req);
    CHECK(r.outcome == CacheOutcome::Compiled);
    CHECK(compiler.compile(req).outcome == CacheOutcome::MemoryHit);
    CHECK(read_all(entry_path(cache, req)) == planted);  // nothing written there either
    // DiskCache used directly refuses as well.
    DiskCache disk(cache, 1 << 20);
    CHECK_FALSE(disk.trusted());
    CHECK(disk.load(cache_key(req), req.arch) == nullptr);
    CHECK_THROWS_AS(disk.list(), CacheError);
    CHECK_THROWS_AS(disk.clear(), CacheError);
    fs::permissions(cache, fs::perms::owner_all);
  }
}

TEST_CASE("a cache directory inside a directory others can write is untrusted unless sticky",
          "[cache][security]") {
  TempDir dir;
  fs::path parent = dir.path() / "shared";
  fs::create_directory(parent);
  fs::permissions(parent, fs::perms::all);  // 0777, no sticky bit
  fs::path cache = parent / "cache";
  CaptureStderr err;
  KernelCompiler loose(settings_in(cache));
  err.restore();
  CHECK(loose.disk() == nullptr);
  CHECK_THAT(err.text(), Catch::Contains("is inside '" + parent.string() + "'"));
  CHECK(mode_of(cache) == 0700);

  fs::permissions(parent, fs::perms::all | fs::perms::sticky_bit);  // like /tmp
  KernelCompiler sticky(settings_in(cache));
  CHECK(sticky.disk() != nullptr);
}

TEST_CASE("every kind of bad entry file is a miss, never loaded, never a crash or a hang",
          "[cache][security]") {
  TempDir dir;
  const CompileRequest req = small_request();
  std::vector<char> cubin;
  {
    KernelCompiler c(settings_in(dir.path()));
    cubin = c.compile(req).kernel->cubin;
  }
  const fs::path entry = entry_path(dir.path(), req);
  const std::string good = read_all(entry);
  const fs::path elsewhere = dir.path() / "elsewhere.bin";
  write_all(elsewhere, good);

  struct Case {
    const char* what;
    std::function<void()> make;
    const char* warning;  // expected on stderr; nullptr: a quiet miss (a corrupt file)
  };
  auto make_sparse = [&](uint64_t size) {
    return [&entry, size] {
      fs::remove(entry);
      write_all(entry, "");
      fs::resize_file(entry, size);
    };
  };
  std::vector<Case> cases = {
      {"a symlink to a valid entry", [&] { fs::create_symlink(elsewhere, entry); },
       "is a symbolic link"},
      // The same path and problem as the case before: said once per process, so no warning.
      {"a dangling symlink", [&] { fs::create_symlink(dir.path() / "nothing", entry); }, nullptr},
      {"a FIFO", [&] { REQUIRE(::mkfifo(entry.c_str(), 0600) == 0); }, "is a FIFO"},
      {"a directory", [&] { fs::create_directory(entry); }, "is a directory"},
      {"writable by others",
       [&] {
         write_all(entry, good);
         fs::permissions(entry,
                         fs::perms::owner_read | fs::perms::owner_write | fs::perms::others_write);
       },
       "is writable by group or others (mode 0602)"},
      {"writable by group",
       [&] {
         write_all(entry, good);
         fs::permissions(entry,
                         fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_write);
       },
       "is writable by group or others (mode 0620)"},
      {"a sparse 100 GB file", make_sparse(100ull << 30), nullptr},
      {"one byte over the size limit", make_sparse(DiskCache::kMaxEntryBytes + 1), nullptr},
      {"zero length", [&] { write_all(entry, ""); }, nullptr},
  };
  if (is_root()) {
    cases.push_back({"owned by another user",
                     [&] {
                       write_all(entry, good);
                       REQUIRE(::chown(entry.c_str(), kNobody, kNogroup) == 0);
                     },
                     "is owned by nobody"});
    cases.push_back({"a character device",
                     [&] { REQUIRE(::mknod(entry.c_str(), S_IFCHR | 0600, makedev(1, 3)) == 0); },
                     "is a device"});
  }
  for (const Case& c : cases) {
    INFO(c.what);
    std::error_code ec;
    fs::remove_all(entry, ec);
    c.make();
    auto t0 = std::chrono::steady_clock::now();
    CaptureStderr err;
    KernelCompiler compiler(settings_in(dir.path()));
    CompileResult r = compiler.compile(req);
    err.restore();
    CHECK(seconds_since(t0) < 20);
    CHECK(r.outcome == CacheOutcome::Compiled);
    if (c.warning != nullptr) {
      CHECK_THAT(err.text(), Catch::Contains(entry.string()));
      CHECK_THAT(err.text(), Catch::Contains(c.warning));
    }
    CHECK(r.kernel->cubin == cubin);
    // A directory in the way cannot be replaced by rename; everything else is.
    if (fs::is_directory(fs::symlink_status(entry))) continue;
    // Replaced by a regular file of ours that the next process loads.
    CHECK(fs::is_regular_file(fs::symlink_status(entry)));
    KernelCompiler next(settings_in(dir.path()));
    CompileResult hit = next.compile(req);
    CHECK(hit.outcome == CacheOutcome::DiskHit);
    CHECK(hit.kernel->cubin == cubin);
  }
  CHECK(read_all(elsewhere) == good);  // a symlink's target is never written through
  CHECK(files_with_suffix(dir.path(), ".tmp").empty());
}

TEST_CASE("cache clear and prune remove entries that are FIFOs, symlinks or stale lock files",
          "[cache][security]") {
  TempDir dir;
  DiskCache disk(dir.path(), 1 << 20);
  disk.store(fake_kernel(fake_key('a'), 100));
  const fs::path fifo = dir.path() / DiskCache::file_name(fake_key('b'), "sm_80");
  const fs::path link = dir.path() / DiskCache::file_name(fake_key('c'), "sm_80");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  fs::create_symlink("/etc/passwd", link);
  write_all(dir.path() / ("." + fake_key('d') + ".lock"), "");
  CHECK(disk.stats().entries == 1);  // only the regular entry counts
  CHECK(disk.list().size() == 1);    // and listing does not hang on the FIFO
  CHECK(disk.clear() == 3);
  CHECK(fs::is_empty(dir.path()));
  CHECK(fs::exists("/etc/passwd"));

  disk.store(fake_kernel(fake_key('a'), 100));
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  fs::create_symlink("/etc/passwd", link);
  disk.prune(1 << 20);  // everything fits, but the FIFO and the symlink are junk
  CHECK_FALSE(fs::exists(fs::symlink_status(fifo)));
  CHECK_FALSE(fs::exists(fs::symlink_status(link)));
  CHECK(disk.load(fake_key('a'), "sm_80") != nullptr);
}

TEST_CASE("a read-only cache directory is used read-only", "[cache][security]") {
  TempDir dir;
  fs::path cache = dir.path() / "cache";
  const CompileRequest known = small_request(5);
  const CompileRequest unknown = small_request(6);
  {
    KernelCompiler c(settings_in(cache));
    c.compile(known);
  }
  // Root ignores permission bits, so the check runs as `nobody`, who then owns the directory.
  const bool as_nobody = is_root();
  if (as_nobody) {
    fs::permissions(dir.path(),
                    fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
    for (const auto& p : fs::recursive_directory_iterator(dir.path()))
      REQUIRE(::chown(p.path().c_str(), kNobody, kNogroup) == 0);
  }
  fs::permissions(cache, fs::perms::owner_read | fs::perms::owner_exec);
  int status = in_child(
      [&]() -> int {
        KernelCompiler c(settings_in(cache));
        if (c.disk() == nullptr || !c.disk()->read_only()) return 1;
        if (c.compile(known).outcome != CacheOutcome::DiskHit) return 2;
        if (c.compile(unknown).outcome != CacheOutcome::Compiled) return 3;
        if (c.disk()->list().size() != 1) return 4;
        if (c.disk()->stats().entries != 1) return 5;
        try {
          c.disk()->clear();
          return 6;
        } catch (const CacheError&) {
        }
        return 0;
      },
      as_nobody);
  CHECK(status == 0);
  fs::permissions(cache, fs::perms::owner_all);
  CHECK(files_with_suffix(cache, ".fjc").size() == 1);
  CHECK(files_with_suffix(cache, ".tmp").empty());
}

TEST_CASE("a write error (a full disk) is a warning and the kernel still runs",
          "[cache][security]") {
  TempDir dir;
  const fs::path log = dir.path() / "stderr.txt";
  const fs::path cache = dir.path() / "cache";
  // RLIMIT_FSIZE makes every write past 512 bytes fail (EFBIG), as a full disk fails (ENOSPC).
  int status = in_child([&]() -> int {
    KernelCompiler c(settings_in(cache));
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 2);
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit limit = {512, 512};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    CompileResult r = c.compile(small_request(8));
    if (r.outcome != CacheOutcome::Compiled || r.kernel->cubin.size() <= 512) return 1;
    if (c.compile(small_request(8)).outcome != CacheOutcome::MemoryHit) return 2;
    return 0;
  });
  CHECK(status == 0);
  std::string err = read_all(log);
  CHECK_THAT(err, Catch::Contains("warning: cannot write"));
  CHECK_THAT(err, Catch::Contains("File too large"));
  CHECK(files_with_suffix(cache, ".fjc").empty());
  CHECK(files_with_suffix(cache, ".tmp").empty());
}

TEST_CASE("an untrusted FLEXJIT_DUMP_DIR is a warning and nothing is dumped", "[cache][security]") {
  TempDir dir;
  CacheSettings s = settings_in(dir.path() / "cache");
  s.dump_dir = dir.path() / "dumps";
  fs::create_directory(s.dump_dir);
  fs::permissions(s.dump_dir, fs::perms::all);
  CaptureStderr err;
  KernelCompiler c(s);
  CompileResult r = c.compile(small_request(9));
  err.restore();
  CHECK(r.outcome == CacheOutcome::Compiled);
  CHECK_THAT(err.text(), Catch::Contains("FLEXJIT_DUMP_DIR '" + s.dump_dir.string() + "'"));
  CHECK_THAT(err.text(), Catch::Contains("nothing is dumped"));
  CHECK(fs::is_empty(s.dump_dir));
}
