#include "jit/DiskCache.h"

#include "jit/CacheKey.h"
#include "util/Log.h"
#include "util/PrivateFiles.h"

#include <flexjit/error.h>

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace flexjit::jit {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// File layout (little-endian; caches are machine-local):
//   magic "FJCUBIN\0" | u32 format version | u32 key length | u64 cubin length |
//   u64 metadata length | u64 XXH64(cubin ++ metadata) | key | cubin | metadata (JSON)
constexpr char kMagic[8] = {'F', 'J', 'C', 'U', 'B', 'I', 'N', '\0'};
constexpr size_t kHeaderSize = 8 + 4 + 4 + 8 + 8 + 8;
constexpr const char* kEntrySuffix = ".fjc";
constexpr const char* kTempSuffix = ".tmp";
constexpr const char* kLockSuffix = ".lock";
// Temp and lock files older than this were left by a killed process; prune removes them.
constexpr auto kStaleTempAge = std::chrono::hours(1);

struct Header {
  uint32_t version = 0;
  uint32_t key_len = 0;
  uint64_t cubin_len = 0;
  uint64_t meta_len = 0;
  uint64_t checksum = 0;
};

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
T get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

bool parse_header(const std::string& bytes, Header& h) {
  if (bytes.size() < kHeaderSize || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return false;
  }
  const char* p = bytes.data() + sizeof(kMagic);
  h.version = get<uint32_t>(p);
  h.key_len = get<uint32_t>(p + 4);
  h.cubin_len = get<uint64_t>(p + 8);
  h.meta_len = get<uint64_t>(p + 16);
  h.checksum = get<uint64_t>(p + 24);
  return true;
}

json usage_json(const ResourceUsage& u) {
  return {{"registers", u.registers},
          {"static_shared_bytes", u.static_shared_bytes},
          {"stack_frame_bytes", u.stack_frame_bytes},
          {"spill_store_bytes", u.spill_store_bytes},
          {"spill_load_bytes", u.spill_load_bytes},
          {"max_threads_per_block", u.max_threads_per_block},
          {"wgmma_serialized", u.wgmma_serialized}};
}

ResourceUsage usage_from_json(const json& j) {
  ResourceUsage u;
  u.registers = j.at("registers").get<int>();
  u.static_shared_bytes = j.at("static_shared_bytes").get<int>();
  u.stack_frame_bytes = j.at("stack_frame_bytes").get<int>();
  u.spill_store_bytes = j.at("spill_store_bytes").get<int>();
  u.spill_load_bytes = j.at("spill_load_bytes").get<int>();
  u.max_threads_per_block = j.at("max_threads_per_block").get<int>();
  // Entries written before the field existed: not known, read as not serialized.
  u.wgmma_serialized = j.value("wgmma_serialized", std::string());
  return u;
}

// Decodes a whole entry file; nullptr (with the reason) if anything is off.
std::shared_ptr<CompiledKernel> decode(const std::string& bytes, const std::string& key,
                                       std::string& why) {
  Header h;
  if (!parse_header(bytes, h)) {
    why = "bad magic or short header";
    return nullptr;
  }
  if (h.version != static_cast<uint32_t>(kCacheFormatVersion)) {
    why = fmt::format("format version {} (expected {})", h.version, kCacheFormatVersion);
    return nullptr;
  }
  uint64_t payload = bytes.size() - kHeaderSize;
  if (h.key_len > payload || h.cubin_len > payload || h.meta_len > payload ||
      uint64_t{h.key_len} + h.cubin_len + h.meta_len != payload) {
    why = "lengths do not match the file size (truncated?)";
    return nullptr;
  }
  const char* p = bytes.data() + kHeaderSize;
  if (std::string_view(p, h.key_len) != key) {
    why = "key echo does not match the file name";
    return nullptr;
  }
  p += h.key_len;
  if (XXH64(p, h.cubin_len + h.meta_len, 0) != h.checksum) {
    why = "checksum mismatch";
    return nullptr;
  }
  auto k = std::make_shared<CompiledKernel>();
  k->key = key;
  k->cubin.assign(p, p + h.cubin_len);
  try {
    json meta = json::parse(p + h.cubin_len, p + h.cubin_len + h.meta_len);
    k->arch = meta.at("arch").get<std::string>();
    k->kernel_name = meta.at("kernel_name").get<std::string>();
    k->label = meta.at("label").get<std::string>();
    k->log = meta.at("log").get<std::string>();
    k->compile_ms = meta.at("compile_ms").get<double>();
    k->usage = usage_from_json(meta.at("usage"));
  } catch (const json::exception& e) {
    why = fmt::format("bad metadata: {}", e.what());
    return nullptr;
  }
  return k;
}

std::string arch_tag(const std::string& arch) {
  std::string out;
  for (char c : arch) {
    if (std::isalnum(static_cast<unsigned char>(c))) out += c;
  }
  return out;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The key an entry file is for: the file name up to the first dot (keys are hex).
std::string key_of(const fs::path& p) {
  std::string name = p.filename().string();
  return name.substr(0, name.find('.'));
}

struct FileInfo {
  fs::path path;
  bool regular;  // else a symlink, FIFO, device...: never loaded, removed by clear and prune
  uint64_t size;
  fs::file_time_type mtime;
};

// Every "*.fjc" name in the directory, without following symlinks.
std::vector<FileInfo> entry_files(const fs::path& dir) {
  std::vector<FileInfo> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    std::string name = p.filename().string();
    if (!ends_with(name, kEntrySuffix) || name.front() == '.') continue;
    std::error_code e0, e1, e2;
    fs::file_type type = it->symlink_status(e0).type();
    if (e0) continue;  // removed by another process meanwhile
    if (type == fs::file_type::directory) continue;
    if (type != fs::file_type::regular) {
      out.push_back({p, false, 0, {}});
      continue;
    }
    uint64_t size = it->file_size(e1);
    auto mtime = it->last_write_time(e2);
    if (e1 || e2) continue;
    out.push_back({p, true, size, mtime});
  }
  return out;
}

// Temp files (".<key16>.<pid>.<random>.tmp") and lock files (".<key>.lock").
bool is_temp_or_lock(const std::string& name) {
  return name.front() == '.' && (ends_with(name, kTempSuffix) || ends_with(name, kLockSuffix));
}

}  // namespace

std::string kernel_metadata_json(const CompiledKernel& k) {
  json meta = {{"arch", k.arch},
               {"kernel_name", k.kernel_name},
               {"label", k.label},
               {"usage", usage_json(k.usage)},
               {"log", k.log},
               {"compile_ms", k.compile_ms},
               {"nvrtc", nvrtc_version()}};
  return meta.dump(2);
}

// ---- KeyLock -----------------------------------------------------------------------------------

KeyLock::KeyLock(KeyLock&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) {
  o.fd_ = -1;
}

KeyLock& KeyLock::operator=(KeyLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

KeyLock::~KeyLock() {
  release();
}

void KeyLock::release() {
  if (fd_ < 0) return;
  // Remove the file while still holding the lock: a waiter that then gets the lock on the old
  // file sees that the path no longer names it and takes the lock again on a new one.
  ::unlink(path_.c_str());
  ::close(fd_);
  fd_ = -1;
}

// ---- DiskCache ---------------------------------------------------------------------------------

DiskCache::DiskCache(fs::path dir, uint64_t max_bytes)
    : dir_(std::move(dir)), max_bytes_(max_bytes) {
  files::DirCheck check = files::open_private_dir(dir_, "the kernel cache directory");
  switch (check.state) {
    case files::DirState::Writable:
      break;
    case files::DirState::ReadOnly:
      read_only_ = true;
      problem_ = check.problem;
      break;
    case files::DirState::Untrusted:
      trusted_ = false;
      problem_ = check.problem;
      break;
    case files::DirState::Unusable:
      throw CacheError(fmt::format(
          "{}. Set FLEXJIT_CACHE_DIR to a writable directory, or FLEXJIT_DISABLE_CACHE=1 to "
          "compile without a disk cache.",
          check.problem));
  }
}

void DiskCache::require_usable(bool writing) const {
  if (!trusted_) throw CacheError(problem_);
  if (writing && read_only_) throw CacheError(problem_);
}

std::string DiskCache::file_name(const std::string& key, const std::string& arch) {
  return fmt::format("{}.{}.nvrtc{}.v{}{}", key, arch_tag(arch), nvrtc_version(),
                     kCacheFormatVersion, kEntrySuffix);
}

std::shared_ptr<const CompiledKernel> DiskCache::load(const std::string& key,
                                                      const std::string& arch) {
  if (!trusted_) return nullptr;
  fs::path path = dir_ / file_name(key, arch);
  files::PrivateFile f = files::open_private_file(path, kMaxEntryBytes);
  if (f.missing) return nullptr;
  std::string why = f.problem;
  std::shared_ptr<CompiledKernel> k;
  if (f.ok()) {
    std::string bytes;
    if (files::read_exact(f.fd, bytes, f.size)) {
      k = decode(bytes, key, why);
    } else {
      why = "short read (truncated meanwhile?)";
    }
  }
  if (!k) {
    if (f.untrusted) {
      // Never loaded; store() replaces it (rename does not follow a symlink).
      files::warn_once("cache", fmt::format("not loading cache entry '{}': it {}. It is treated as "
                                            "a miss; `flexjit cache clear` removes it",
                                            path.string(), why));
      return nullptr;
    }
    FJ_LOG("cache", "removing corrupt entry {}: {}", path.string(), why);
    if (!read_only_) {
      std::error_code ec;
      fs::remove(path, ec);
    }
    return nullptr;
  }
  // Last use = mtime, for LRU eviction across processes. Failing to touch is harmless.
  if (!read_only_) ::futimens(f.fd, nullptr);
  return k;
}

std::shared_ptr<const CompiledKernel> DiskCache::load(const std::string& key) {
  if (!trusted_) return nullptr;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (!ends_with(name, kEntrySuffix) || key_of(it->path()) != key) continue;
    // The arch is in the name; load(key, arch) rebuilds and checks the full name.
    std::string rest = name.substr(key.size() + 1);
    std::string tag = rest.substr(0, rest.find('.'));
    if (tag.size() < 3 || tag.compare(0, 2, "sm") != 0) continue;
    std::string arch = "sm_" + tag.substr(2);
    if (file_name(key, arch) != name) continue;
    if (auto k = load(key, arch)) return k;
  }
  return nullptr;
}

void DiskCache::store(const CompiledKernel& k) {
  FJ_ASSERT(!k.key.empty(), "storing a kernel without a cache key");
  require_usable(true);
  std::string meta = kernel_metadata_json(k);
  const uint64_t total = kHeaderSize + k.key.size() + k.cubin.size() + meta.size();
  if (total > kMaxEntryBytes) {
    throw CacheError(
        fmt::format("not storing {}: the entry would be {} bytes, more than the "
                    "limit of {}",
                    k.label, total, kMaxEntryBytes));
  }
  std::string bytes;
  bytes.reserve(total);
  bytes.append(kMagic, sizeof(kMagic));
  put<uint32_t>(bytes, kCacheFormatVersion);
  put<uint32_t>(bytes, static_cast<uint32_t>(k.key.size()));
  put<uint64_t>(bytes, k.cubin.size());
  put<uint64_t>(bytes, meta.size());
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  XXH64_update(state, k.cubin.data(), k.cubin.size());
  XXH64_update(state, meta.data(), meta.size());
  put<uint64_t>(bytes, XXH64_digest(state));
  XXH64_freeState(state);
  bytes += k.key;
  bytes.append(k.cubin.data(), k.cubin.size());
  bytes += meta;

  // Readers never see a partial file: they open either the old complete file or the new one.
  fs::path final_path = dir_ / file_name(k.key, k.arch);
  try {
    files::write_private_file(final_path, bytes);
  } catch (const CacheError& e) {
    throw CacheError(
        fmt::format("{}. Set FLEXJIT_CACHE_DIR to a writable directory, or "
                    "FLEXJIT_DISABLE_CACHE=1.",
                    e.what()));
  }
  FJ_LOG("cache", "stored {} ({} bytes)", final_path.filename().string(), bytes.size());

  if (max_bytes_ > 0) {
    uint64_t used = 0;
    for (const auto& f : entry_files(dir_))
      used += f.size;
    if (used > max_bytes_) prune(max_bytes_);
  }
}

KeyLock DiskCache::lock(const std::string& key, std::chrono::milliseconds wait) {
  KeyLock lock;
  if (!trusted_ || read_only_) return lock;
  const fs::path path = dir_ / ("." + key + kLockSuffix);
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    if (fd < 0) {
      FJ_LOG("cache", "cannot create lock file {}: {}", path.string(), std::strerror(errno));
      return lock;
    }
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
      ::close(fd);
      FJ_LOG("cache", "not using lock file {}: not a regular file of yours", path.string());
      return lock;
    }
    while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) {
        ::close(fd);
        return lock;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        ::close(fd);
        FJ_LOG("cache", "gave up waiting for {} after {} ms; compiling anyway", path.string(),
               wait.count());
        return lock;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    // The holder before us removes the file on release: the lock counts only if the path still
    // names the file we locked.
    struct stat now;
    if (::stat(path.c_str(), &now) == 0 && now.st_ino == st.st_ino && now.st_dev == st.st_dev) {
      lock.fd_ = fd;
      lock.path_ = path;
      return lock;
    }
    ::close(fd);
  }
}

std::vector<DiskEntryInfo> DiskCache::list() const {
  require_usable(false);
  std::vector<DiskEntryInfo> out;
  for (const auto& f : entry_files(dir_)) {
    if (!f.regular) continue;
    files::PrivateFile file = files::open_private_file(f.path, kMaxEntryBytes);
    std::string bytes;
    if (!file.ok() || !files::read_exact(file.fd, bytes, file.size)) continue;
    std::string why;
    auto k = decode(bytes, key_of(f.path), why);
    if (!k) continue;
    out.push_back({k->key, k->arch, k->kernel_name, k->label, f.size, f.mtime});
  }
  return out;
}

DiskStats DiskCache::stats() const {
  require_usable(false);
  DiskStats s;
  s.dir = dir_;
  s.max_bytes = max_bytes_;
  for (const auto& f : entry_files(dir_)) {
    if (!f.regular) continue;
    ++s.entries;
    s.bytes += f.size;
  }
  return s;
}

uint64_t DiskCache::clear() {
  require_usable(true);
  uint64_t removed = 0;
  std::error_code ec;
  for (const auto& f : entry_files(dir_)) {
    if (fs::remove(f.path, ec)) ++removed;
  }
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e;
    if (is_temp_or_lock(it->path().filename().string())) fs::remove(it->path(), e);
  }
  return removed;
}

uint64_t DiskCache::prune(uint64_t max_bytes) {
  require_usable(true);
  std::vector<FileInfo> files = entry_files(dir_);
  uint64_t total = 0;
  for (const auto& f : files) {
    std::error_code ec;
    if (!f.regular && fs::remove(f.path, ec)) {
      FJ_LOG("cache", "removed {}: not a regular file", f.path.string());
    }
    total += f.size;
  }
  std::erase_if(files, [](const FileInfo& f) { return !f.regular; });
  std::sort(files.begin(), files.end(),
            [](const FileInfo& a, const FileInfo& b) { return a.mtime < b.mtime; });
  uint64_t freed = 0;
  for (const auto& f : files) {
    if (total <= max_bytes) break;
    std::error_code ec;
    // Another process may have removed it already; it no longer counts either way.
    if (fs::remove(f.path, ec)) freed += f.size;
    total -= f.size;
  }
  // Temp files of writers that died mid-write, lock files of holders that died.
  auto now = fs::file_time_type::clock::now();
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (!is_temp_or_lock(name)) continue;
    std::error_code e;
    // A temp or lock name that is not a regular file was not made by flexjit: stale at once.
    bool stale = fs::symlink_status(it->path(), e).type() != fs::file_type::regular ||
                 now - it->last_write_time(e) > kStaleTempAge;
    if (!e && stale && fs::remove(it->path(), e)) {
      FJ_LOG("cache", "removed stale file {}", name);
    }
  }
  if (freed > 0) FJ_LOG("cache", "pruned {} bytes from {}", freed, dir_.string());
  return freed;
}

}  // namespace flexjit::jit
