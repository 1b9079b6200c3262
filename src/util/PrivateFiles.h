// Directories and files that flexjit keeps for itself (the kernel cache, FLEXJIT_DUMP_DIR, tuning
// data), treated the way ssh treats ~/.ssh: created private (0700 / 0600), used only when they
// are owned by the user and writable by no one else, and read without following a symlink or
// blocking on a FIFO. docs/caching.md ("Trust") describes the rules.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace flexjit::files {

enum class DirState {
  Writable,   // trusted, and this process may create and remove files in it
  ReadOnly,   // trusted, but not writable here (permissions, read-only file system)
  Untrusted,  // owned by another user, or it or an ancestor is writable by others
  Unusable,   // cannot be created, is not a directory, or cannot be read
};

struct DirCheck {
  DirState state = DirState::Unusable;
  // Empty when Writable; else one sentence naming the path, what is wrong and how to fix it.
  std::string problem;
  bool trusted() const { return state == DirState::Writable || state == DirState::ReadOnly; }
};

// Creates `dir` and its missing parents with mode 0700 (existing ones are left as they are), then
// checks it as check_private_dir does. `what` names the directory in messages ("kernel cache
// directory", "FLEXJIT_DUMP_DIR"). This is what the cache, dumps and tuning files go through.
DirCheck open_private_dir(const std::filesystem::path& dir, std::string_view what);

// A directory is trusted when it is owned by the user (effective uid), is not writable by group
// or others, and every ancestor is owned by root or the user and is not writable by group or
// others unless it is sticky (/tmp).
DirCheck check_private_dir(const std::filesystem::path& dir, std::string_view what);

// A file opened for reading by open_private_file.
struct PrivateFile {
  int fd = -1;  // -1 when the file was refused or missing
  uint64_t size = 0;
  bool missing = false;    // no such file: an ordinary miss, nothing to report
  bool untrusted = false;  // a symlink, not a regular file, foreign owner, loose mode
  std::string problem;     // why it was refused: "is a symbolic link", "is 3 GiB (limit ...)"
  PrivateFile() = default;
  PrivateFile(PrivateFile&& o) noexcept;
  PrivateFile& operator=(PrivateFile&& o) noexcept;
  ~PrivateFile();
  bool ok() const { return fd >= 0; }
};

// Opens `path` read-only with O_NOFOLLOW | O_NONBLOCK (a symlink is refused, a FIFO cannot hang
// the open) and accepts it only if fstat says: a regular file, owned by the user, not writable
// by group or others, at most max_bytes long.
PrivateFile open_private_file(const std::filesystem::path& path, uint64_t max_bytes);

// Reads exactly `n` bytes from the start of `fd` into `out`; false on a short read or an error.
bool read_exact(int fd, std::string& out, uint64_t n);

// Writes `bytes` to `path` (mode 0600) through a temp file in the same directory and rename(2):
// readers see the old file or the new one, never a part. Never follows a symlink at `path` (the
// rename replaces it). Throws CacheError naming the path and the OS error.
void write_private_file(const std::filesystem::path& path, std::string_view bytes);

// "<path>.<pid>.<random>.tmp" style suffix for temp files: ".<pid>.<16 hex>.tmp".
std::string temp_suffix();

// Writes "flexjit[stage] warning: message" to stderr the first time this process sees `message`;
// later calls with the same text are silent. Thread-safe.
void warn_once(std::string_view stage, const std::string& message);

}  // namespace flexjit::files
