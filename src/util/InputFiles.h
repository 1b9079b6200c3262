// Files the user hands to flexjit (.npy tensors, tuning manifests, .fx mods files), opened so
// that no input can hang the process or make it read without bound: regular files only (a FIFO
// or a device such as /dev/zero is refused before anything is read; opening uses O_NONBLOCK, so
// a FIFO cannot block the open), sizes known before reading, text reads capped. Errors are
// flexjit::Error with a message that starts with the caller's `prefix` ("x.npy", "cannot read
// mods file 'm.fx'") and names the file type or size and the limit.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace flexjit::files {

// Upper bounds of text inputs (docs/attention.md "`flexjit run`", its input files; docs/tuning.md
// "Manifests").
constexpr uint64_t kMaxManifestBytes = uint64_t{16} << 20;  // a tuning manifest (JSON)
constexpr uint64_t kMaxModsFileBytes = uint64_t{1} << 20;   // a .fx mods file

// A regular file opened for reading, and its size when it was opened.
class InputFile {
 public:
  // Throws Error "<prefix>: <reason>": it cannot be opened (the OS error), or it is a directory,
  // a FIFO, a device or a socket.
  InputFile(const std::string& path, std::string prefix);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  uint64_t size() const { return size_; }
  // Reads exactly n bytes at `offset` into dst; throws Error naming the file when it has fewer
  // (it shrank since it was opened) or the read fails.
  void read_at(uint64_t offset, char* dst, size_t n) const;

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string prefix_;
};

// The whole text of `path`, refused with an Error "<prefix>: it is 3.0 GiB, more than the 16 MiB
// that <what> may have" when longer than max_bytes (checked before anything is read; the read
// takes the size fstat gave, so a file that grows meanwhile cannot make it longer).
std::string read_text_file(const std::string& path, const std::string& prefix,
                           std::string_view what, uint64_t max_bytes);

// "512 bytes", "16 MiB", "3.0 GiB": a byte count as messages print it.
std::string human_size(uint64_t bytes);

}  // namespace flexjit::files
