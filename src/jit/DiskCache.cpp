#include "jit/DiskCache.h"

#include "jit/CacheKey.h"
#include "util/Log.h"

#include <flexjit/error.h>

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

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
// Temp files older than this were left by a killed process; prune and clear remove them.
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

bool read_file(const fs::path& path, std::string& out, int* fd_out = nullptr) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (ok) {
    out.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (ok && done < out.size()) {
      ssize_t n = ::read(fd, out.data() + done, out.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        ok = false;
      else
        done += static_cast<size_t>(n);
    }
  }
  if (ok && fd_out != nullptr) {
    *fd_out = fd;
  } else {
    ::close(fd);
  }
  return ok;
}

json usage_json(const ResourceUsage& u) {
  return {{"registers", u.registers},
          {"static_shared_bytes", u.static_shared_bytes},
          {"stack_frame_bytes", u.stack_frame_bytes},
          {"spill_store_bytes", u.spill_store_bytes},
          {"spill_load_bytes", u.spill_load_bytes},
          {"max_threads_per_block", u.max_threads_per_block}};
}

ResourceUsage usage_from_json(const json& j) {
  ResourceUsage u;
  u.registers = j.at("registers").get<int>();
  u.static_shared_bytes = j.at("static_shared_bytes").get<int>();
  u.stack_frame_bytes = j.at("stack_frame_bytes").get<int>();
  u.spill_store_bytes = j.at("spill_store_bytes").get<int>();
  u.spill_load_bytes = j.at("spill_load_bytes").get<int>();
  u.max_threads_per_block = j.at("max_threads_per_block").get<int>();
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
  uint64_t size;
  fs::file_time_type mtime;
};

std::vector<FileInfo> entry_files(const fs::path& dir) {
  std::vector<FileInfo> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    std::string name = p.filename().string();
    if (!ends_with(name, kEntrySuffix) || name.front() == '.') continue;
    std::error_code e1, e2;
    uint64_t size = it->file_size(e1);
    auto mtime = it->last_write_time(e2);
    if (e1 || e2) continue;  // removed by another process meanwhile
    out.push_back({p, size, mtime});
  }
  return out;
}

std::string temp_suffix() {
  thread_local std::mt19937_64 rng{std::random_device{}() ^
                                   (static_cast<uint64_t>(::getpid()) << 32)};
  return fmt::format(".{}.{:016x}{}", ::getpid(), rng(), kTempSuffix);
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

DiskCache::DiskCache(fs::path dir, uint64_t max_bytes)
    : dir_(std::move(dir)), max_bytes_(max_bytes) {
  auto fail = [&](const std::string& what) {
    throw CacheError(fmt::format(
        "flexjit cache directory '{}' {}. Set FLEXJIT_CACHE_DIR to a writable directory, or "
        "FLEXJIT_DISABLE_CACHE=1 to compile without a disk cache.",
        dir_.string(), what));
  };
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) fail(fmt::format("cannot be created: {}", ec.message()));
  if (!fs::is_directory(dir_, ec)) fail("is not a directory");
  if (::access(dir_.c_str(), W_OK | X_OK) != 0) {
    fail(fmt::format("is not writable: {}", std::strerror(errno)));
  }
}

std::string DiskCache::file_name(const std::string& key, const std::string& arch) {
  return fmt::format("{}.{}.nvrtc{}.v{}{}", key, arch_tag(arch), nvrtc_version(),
                     kCacheFormatVersion, kEntrySuffix);
}

std::shared_ptr<const CompiledKernel> DiskCache::load(const std::string& key,
                                                      const std::string& arch) {
  fs::path path = dir_ / file_name(key, arch);
  std::string bytes;
  int fd = -1;
  if (!read_file(path, bytes, &fd)) return nullptr;
  std::string why;
  auto k = decode(bytes, key, why);
  if (!k) {
    ::close(fd);
    FJ_LOG("cache", "removing corrupt entry {}: {}", path.string(), why);
    std::error_code ec;
    fs::remove(path, ec);
    return nullptr;
  }
  // Last use = mtime, for LRU eviction across processes. Failing to touch is harmless.
  ::futimens(fd, nullptr);
  ::close(fd);
  return k;
}

std::shared_ptr<const CompiledKernel> DiskCache::load(const std::string& key) {
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
  std::string meta = kernel_metadata_json(k);
  std::string bytes;
  bytes.reserve(kHeaderSize + k.key.size() + k.cubin.size() + meta.size());
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
  fs::path temp_path = dir_ / ("." + k.key.substr(0, 16) + temp_suffix());
  auto fail = [&](const char* what) {
    int err = errno;
    std::error_code ec;
    fs::remove(temp_path, ec);
    throw CacheError(
        fmt::format("cannot {} cache entry '{}': {}. Set FLEXJIT_CACHE_DIR to a "
                    "writable directory, or FLEXJIT_DISABLE_CACHE=1.",
                    what, temp_path.string(), std::strerror(err)));
  };
  int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail("create");
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      fail("write");
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) fail("write");
  if (::rename(temp_path.c_str(), final_path.c_str()) != 0) fail("rename");
  FJ_LOG("cache", "stored {} ({} bytes)", final_path.filename().string(), bytes.size());

  if (max_bytes_ > 0) {
    uint64_t total = 0;
    for (const auto& f : entry_files(dir_))
      total += f.size;
    if (total > max_bytes_) prune(max_bytes_);
  }
}

std::vector<DiskEntryInfo> DiskCache::list() const {
  std::vector<DiskEntryInfo> out;
  for (const auto& f : entry_files(dir_)) {
    std::string bytes;
    if (!read_file(f.path, bytes)) continue;
    std::string why;
    auto k = decode(bytes, key_of(f.path), why);
    if (!k) continue;
    out.push_back({k->key, k->arch, k->kernel_name, k->label, f.size, f.mtime});
  }
  return out;
}

DiskStats DiskCache::stats() const {
  DiskStats s;
  s.dir = dir_;
  s.max_bytes = max_bytes_;
  for (const auto& f : entry_files(dir_)) {
    ++s.entries;
    s.bytes += f.size;
  }
  return s;
}

void DiskCache::clear() {
  std::error_code ec;
  for (const auto& f : entry_files(dir_))
    fs::remove(f.path, ec);
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    std::error_code e;
    if (name.front() == '.' && ends_with(name, kTempSuffix)) fs::remove(it->path(), e);
  }
}

uint64_t DiskCache::prune(uint64_t max_bytes) {
  std::vector<FileInfo> files = entry_files(dir_);
  uint64_t total = 0;
  for (const auto& f : files)
    total += f.size;
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
  // Temp files of writers that died mid-write.
  auto now = fs::file_time_type::clock::now();
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.front() != '.' || !ends_with(name, kTempSuffix)) continue;
    std::error_code e;
    auto mtime = it->last_write_time(e);
    if (!e && now - mtime > kStaleTempAge && fs::remove(it->path(), e)) {
      FJ_LOG("cache", "removed stale temp file {}", name);
    }
  }
  if (freed > 0) FJ_LOG("cache", "pruned {} bytes from {}", freed, dir_.string());
  return freed;
}

}  // namespace flexjit::jit
