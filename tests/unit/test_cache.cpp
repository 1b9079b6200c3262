// Cache keys, the memory LRU, the disk cache, env knobs and dumps ([cache]).
#include "jit/KernelCompiler.h"
#include "support/CacheTest.h"
#include "util/Log.h"

#include <flexjit/error.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>

using namespace flexjit;
using namespace flexjit::jit;
namespace fs = std::filesystem;

using namespace flexjit::test;

TEST_CASE("the cache key changes with everything that shapes the binary", "[cache]") {
  CompileRequest base = small_request();
  base.options = {"-DA=1", "-DB=2"};
  const std::string k = cache_key(base);
  CHECK(k.size() == 64);
  CHECK(k.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(cache_key(base) == k);

  CompileRequest reordered = base;
  reordered.options = {"-DB=2", "-DA=1"};
  CHECK(cache_key(reordered) == k);
  CompileRequest relabeled = base;
  relabeled.label = "another name";
  CHECK(cache_key(relabeled) == k);

  CompileRequest r = base;
  r.source += " ";
  CHECK(cache_key(r) != k);
  r = base;
  r.arch = "sm_90a";
  CHECK(cache_key(r) != k);
  r = base;
  r.options.push_back("--use_fast_math");
  CHECK(cache_key(r) != k);
  r = base;
  r.kernel_name = "scale2";
  CHECK(cache_key(r) != k);
  // Fields are length-prefixed: moving a character between two options changes the key.
  r = base;
  r.options = {"-DA=1-", "DB=2"};
  CHECK(cache_key(r) != k);
}

TEST_CASE("memory cache evicts the least recently used entry", "[cache]") {
  MemoryCache m(2);
  auto a = std::make_shared<const CompiledKernel>(fake_kernel(fake_key('a'), 1));
  auto b = std::make_shared<const CompiledKernel>(fake_kernel(fake_key('b'), 1));
  auto c = std::make_shared<const CompiledKernel>(fake_kernel(fake_key('c'), 1));
  m.put("a", a);
  m.put("b", b);
  CHECK(m.get("a") == a);  // a is now the most recent
  m.put("c", c);
  CHECK(m.size() == 2);
  CHECK(m.get("b") == nullptr);
  CHECK(m.get("a") == a);
  CHECK(m.get("c") == c);
  m.clear();
  CHECK(m.get("a") == nullptr);
}

TEST_CASE("a compile misses, then hits memory, then hits disk in a new compiler", "[cache]") {
  TempDir dir;
  CompileRequest req = small_request();
  std::vector<char> cubin;
  {
    KernelCompiler c(settings_in(dir.path()));
    CompileResult first = c.compile(req);
    CHECK(first.outcome == CacheOutcome::Compiled);
    CHECK(first.kernel->key == cache_key(req));
    cubin = first.kernel->cubin;
    CompileResult second = c.compile(req);
    CHECK(second.outcome == CacheOutcome::MemoryHit);
    CHECK(second.kernel == first.kernel);
    c.clear_memory();
    CHECK(c.compile(req).outcome == CacheOutcome::DiskHit);
  }
  auto files = files_with_suffix(dir.path(), ".fjc");
  REQUIRE(files.size() == 1);
  CHECK(files[0].filename().string() ==
        cache_key(req) + ".sm80.nvrtc" + nvrtc_version() + ".v1.fjc");

  KernelCompiler fresh(settings_in(dir.path()));
  CompileResult hit = fresh.compile(req);
  CHECK(hit.outcome == CacheOutcome::DiskHit);
  CHECK(hit.kernel->cubin == cubin);
  CHECK(hit.kernel->kernel_name == "scale");
  CHECK(hit.kernel->label == req.label);
  CHECK(hit.kernel->usage.registers > 0);
  CHECK(fresh.compile(req).outcome == CacheOutcome::MemoryHit);
  // Lookup by key alone (the CLI's view) finds the same entry.
  auto by_key = fresh.disk()->load(cache_key(req));
  REQUIRE(by_key != nullptr);
  CHECK(by_key->cubin == cubin);
  auto listed = fresh.disk()->list();
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].key == cache_key(req));
  CHECK(listed[0].arch == "sm_80");
  CHECK(listed[0].label == req.label);
  DiskStats st = fresh.disk()->stats();
  CHECK(st.entries == 1);
  CHECK(st.bytes == fs::file_size(files[0]));
}

TEST_CASE("a corrupt disk entry is a miss and is replaced by a valid one", "[cache]") {
  TempDir dir;
  CompileRequest req = small_request();
  std::vector<char> cubin;
  {
    KernelCompiler c(settings_in(dir.path()));
    cubin = c.compile(req).kernel->cubin;
  }
  const fs::path entry = files_with_suffix(dir.path(), ".fjc").at(0);
  const std::string good = read_all(entry);

  // Another key's valid file under this key's name: its key echo does not match.
  std::string other_key_file;
  {
    TempDir other;
    KernelCompiler c(settings_in(other.path()));
    c.compile(small_request(1));
    other_key_file = read_all(files_with_suffix(other.path(), ".fjc").at(0));
  }

  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x40;  // inside the cubin
  std::string bad_magic = good;
  bad_magic[0] = 'X';
  std::string bad_version = good;
  bad_version[8] = 99;
  const std::vector<std::pair<const char*, std::string>> corruptions = {
      {"truncated", good.substr(0, good.size() - 100)},
      {"truncated header", good.substr(0, 20)},
      {"empty", ""},
      {"flipped byte", flipped},
      {"wrong magic", bad_magic},
      {"wrong format version", bad_version},
      {"wrong key echo", other_key_file},
      {"trailing garbage", good + "xyz"},
  };
  for (const auto& [what, bytes] : corruptions) {
    INFO(what);
    write_all(entry, bytes);
    KernelCompiler c(settings_in(dir.path()));
    CompileResult r = c.compile(req);
    CHECK(r.outcome == CacheOutcome::Compiled);
    CHECK(r.kernel->cubin == cubin);
    // Replaced by a valid entry that the next process loads.
    CHECK(read_all(entry).size() > 1000);
    KernelCompiler again(settings_in(dir.path()));
    CompileResult hit = again.compile(req);
    CHECK(hit.outcome == CacheOutcome::DiskHit);
    CHECK(hit.kernel->cubin == cubin);
  }
  CHECK(files_with_suffix(dir.path(), ".tmp").empty());
}

TEST_CASE("an unusable cache directory is a CacheError naming the path and the way out",
          "[cache]") {
  TempDir dir;
  fs::path file = dir.path() / "a-file";
  write_all(file, "x");
  for (const fs::path& bad : {file, file / "cache"}) {
    INFO(bad);
    try {
      KernelCompiler c(settings_in(bad));
      FAIL("expected a CacheError");
    } catch (const CacheError& e) {
      std::string msg = e.what();
      CHECK_THAT(msg, Catch::Contains(bad.string()));
      CHECK_THAT(msg, Catch::Contains("FLEXJIT_CACHE_DIR"));
      CHECK_THAT(msg, Catch::Contains("FLEXJIT_DISABLE_CACHE"));
    }
  }
  // With the cache disabled the same path is never touched.
  CacheSettings off = settings_in(file / "cache");
  off.enabled = false;
  KernelCompiler c(off);
  CHECK(c.disk() == nullptr);
}

TEST_CASE("cache settings come from the environment", "[cache]") {
  ScopedEnv a("FLEXJIT_CACHE_DIR", nullptr), b("XDG_CACHE_HOME", nullptr),
      c("FLEXJIT_DISABLE_CACHE", nullptr), d("FLEXJIT_DUMP_DIR", nullptr), e("HOME", "/home/u");
  CHECK(CacheSettings::from_env().dir == fs::path("/home/u/.cache/flexjit"));
  CHECK(CacheSettings::from_env().enabled);
  CHECK(CacheSettings::from_env().dump_dir.empty());
  {
    ScopedEnv x("XDG_CACHE_HOME", "/xdg");
    CHECK(CacheSettings::from_env().dir == fs::path("/xdg/flexjit"));
    ScopedEnv y("FLEXJIT_CACHE_DIR", "/explicit");
    CHECK(CacheSettings::from_env().dir == fs::path("/explicit"));
  }
  ScopedEnv off("FLEXJIT_DISABLE_CACHE", "1");
  ScopedEnv dump("FLEXJIT_DUMP_DIR", "/dumps");
  CHECK_FALSE(CacheSettings::from_env().enabled);
  CHECK(CacheSettings::from_env().dump_dir == fs::path("/dumps"));
}

TEST_CASE("FLEXJIT_DISABLE_CACHE=1 compiles every time and writes nothing", "[cache]") {
  TempDir dir;
  fs::path cache = dir.path() / "cache";
  ScopedEnv a("FLEXJIT_CACHE_DIR", cache.c_str()), b("FLEXJIT_DISABLE_CACHE", "1");
  KernelCompiler c;
  CHECK(c.compile(small_request()).outcome == CacheOutcome::Compiled);
  CHECK(c.compile(small_request()).outcome == CacheOutcome::Compiled);
  CHECK_FALSE(fs::exists(cache));
}

TEST_CASE("the disk cache evicts least recently used entries beyond its size", "[cache]") {
  TempDir dir;
  DiskCache disk(dir.path(), 35 * 1024);
  const auto now = fs::file_time_type::clock::now();
  for (char c : {'a', 'b', 'c'})
    disk.store(fake_kernel(fake_key(c), 10 * 1024));
  // Last use a < b < c, set explicitly: coarse file clocks make back-to-back writes tie.
  int age = 300;
  for (char c : {'a', 'b', 'c'}) {
    fs::last_write_time(dir.path() / DiskCache::file_name(fake_key(c), "sm_80"),
                        now - std::chrono::seconds(age));
    age -= 100;
  }
  REQUIRE(disk.load(fake_key('a'), "sm_80") != nullptr);  // a becomes the most recent
  disk.store(fake_kernel(fake_key('d'), 10 * 1024));      // over 35 KB: b goes
  CHECK(disk.load(fake_key('b'), "sm_80") == nullptr);
  CHECK(disk.load(fake_key('a'), "sm_80") != nullptr);
  CHECK(disk.load(fake_key('c'), "sm_80") != nullptr);
  CHECK(disk.load(fake_key('d'), "sm_80") != nullptr);
  CHECK(disk.stats().entries == 3);
  CHECK(disk.stats().bytes <= 35 * 1024);

  const uint64_t before = disk.stats().bytes;
  uint64_t freed = disk.prune(0);
  CHECK(freed == before);
  CHECK(disk.stats().entries == 0);
}

TEST_CASE("clear removes entries and stale temp files but nothing else", "[cache]") {
  TempDir dir;
  DiskCache disk(dir.path(), 1 << 20);
  disk.store(fake_kernel(fake_key('a'), 100));
  write_all(dir.path() / ".aaaa.123.0000000000000000.tmp", "partial");
  write_all(dir.path() / "notes.txt", "user file");
  disk.clear();
  CHECK(disk.stats().entries == 0);
  CHECK(files_with_suffix(dir.path(), ".tmp").empty());
  CHECK(fs::exists(dir.path() / "notes.txt"));
}

TEST_CASE("several processes share one cache directory safely", "[cache]") {
  TempDir dir;
  constexpr int kChildren = 4;
  constexpr int kRounds = 40;
  std::vector<pid_t> pids;
  for (int child = 0; child < kChildren; ++child) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int status = 0;
      try {
        DiskCache disk(dir.path(), 1ull << 30);
        for (int round = 0; round < kRounds; ++round) {
          // Shared keys written by every child, plus one key per child.
          for (char c : {'s', 't', static_cast<char>('0' + child)}) {
            disk.store(fake_kernel(fake_key(c), 64 * 1024, c));
            auto k = disk.load(fake_key(c), "sm_80");
            // Another child may replace the file at any moment, never with a partial one.
            if (k && (k->cubin.size() != 64 * 1024 || k->cubin[1000] != c)) status = 2;
          }
        }
        // And one real compile into the shared directory, same key in every child.
        KernelCompiler compiler(settings_in(dir.path()));
        if (!compiler.compile(small_request(7)).kernel) status = 3;
      } catch (...) {
        status = 1;
      }
      ::_exit(status);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  CHECK(files_with_suffix(dir.path(), ".tmp").empty());
  auto entries = files_with_suffix(dir.path(), ".fjc");
  CHECK(entries.size() == 2 + kChildren + 1);
  DiskCache disk(dir.path(), 1ull << 30);
  CHECK(disk.list().size() == entries.size());  // every file decodes
  KernelCompiler compiler(settings_in(dir.path()));
  CHECK(compiler.compile(small_request(7)).outcome == CacheOutcome::DiskHit);
}

TEST_CASE("FLEXJIT_DUMP_DIR writes source, log and usage of every compile", "[cache]") {
  TempDir dir;
  CacheSettings s = settings_in(dir.path() / "cache");
  s.dump_dir = dir.path() / "dumps";
  KernelCompiler c(s);
  CompileRequest req = small_request();
  req.label = "forward alibi/bf16 d128";
  CompiledKernel k = *c.compile(req).kernel;
  fs::path base = s.dump_dir / ("forward_alibi_bf16_d128-" + k.key.substr(0, 12));
  CHECK(read_all(fs::path(base).concat(".cu")) == req.source);
  CHECK(read_all(fs::path(base).concat(".log")) == k.log);
  auto j = nlohmann::json::parse(read_all(fs::path(base).concat(".json")));
  CHECK(j["usage"]["registers"] == k.usage.registers);
  CHECK(j["key"] == k.key);
  CHECK(j["ok"] == true);
  CHECK(j["compile_ms"].get<double>() > 0);
  CHECK(j["options"].size() >= 2);

  // A failed compile is dumped too, with the error.
  CompileRequest bad{"extern \"C\" __global__ void f() { nope; }", "f", "sm_80", {}, "bad"};
  CHECK_THROWS_AS(c.compile(bad), JitError);
  fs::path bad_base = s.dump_dir / ("bad-" + cache_key(bad).substr(0, 12));
  CHECK_THAT(read_all(fs::path(bad_base).concat(".log")), Catch::Contains("nope"));
  CHECK(nlohmann::json::parse(read_all(fs::path(bad_base).concat(".json")))["ok"] == false);
  // A failed compile leaves no cache entry.
  CHECK(c.disk()->stats().entries == 1);
}

TEST_CASE("FLEXJIT_LOG enables the named stages", "[cache]") {
  {
    ScopedEnv e("FLEXJIT_LOG", "jit, cache");
    logging::reload();
    CHECK(logging::enabled("jit"));
    CHECK(logging::enabled("cache"));
    CHECK_FALSE(logging::enabled("tune"));
  }
  {
    ScopedEnv e("FLEXJIT_LOG", "all");
    logging::reload();
    CHECK(logging::enabled("tune"));
  }
  logging::reload();
  CHECK_FALSE(logging::enabled("jit"));
}

TEST_CASE("a cache directory that breaks after start-up costs a warning, not the kernel",
          "[cache]") {
  TempDir dir;
  fs::path cache = dir.path() / "cache";
  KernelCompiler c(settings_in(cache));
  fs::remove_all(cache);
  write_all(cache, "now a file");
  CompileResult r = c.compile(small_request());
  CHECK(r.outcome == CacheOutcome::Compiled);
  CHECK_FALSE(r.kernel->cubin.empty());
  CHECK(c.compile(small_request()).outcome == CacheOutcome::MemoryHit);
}
