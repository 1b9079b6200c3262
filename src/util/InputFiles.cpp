#include "util/InputFiles.h"

#include <flexjit/error.h>

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace flexjit::files {

namespace {

// Why a file of this type cannot be read as an input, or nullptr for a regular file.
const char* refusal(mode_t mode) {
  if (S_ISREG(mode)) return nullptr;
  if (S_ISDIR(mode)) return "it is a directory, not a file";
  if (S_ISFIFO(mode)) {
    return "it is a FIFO (named pipe); flexjit reads regular files only, whose size it can "
           "check before reading";
  }
  if (S_ISCHR(mode) || S_ISBLK(mode)) {
    return "it is a device; flexjit reads regular files only, whose size it can check before "
           "reading";
  }
  if (S_ISSOCK(mode)) return "it is a socket; flexjit reads regular files only";
  return "it is not a regular file";
}

}  // namespace

std::string human_size(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  uint64_t whole = bytes;
  while (whole >= 1024 && whole % 1024 == 0 && u < 6) {
    whole /= 1024;
    ++u;
  }
  if (u > 0 || bytes < 1024) return fmt::format("{} {}", whole, kUnits[u]);
  double b = static_cast<double>(bytes);
  while (b >= 1024 && u < 6) {
    b /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", b, kUnits[u]);
}

InputFile::InputFile(const std::string& path, std::string prefix) : prefix_(std::move(prefix)) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd_ < 0) throw Error(fmt::format("{}: {}", prefix_, std::strerror(errno)));
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw Error(fmt::format("{}: cannot be examined: {}", prefix_, std::strerror(err)));
  }
  if (const char* why = refusal(st.st_mode)) {
    ::close(fd_);
    throw Error(fmt::format("{}: {}", prefix_, why));
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_at(uint64_t offset, char* dst, size_t n) const {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_, dst + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw Error(fmt::format("{}: read failed: {}", prefix_, std::strerror(errno)));
    if (r == 0) {
      throw Error(
          fmt::format("{}: the file ended after {} bytes while {} were expected (did it "
                      "change while it was read?)",
                      prefix_, offset + done, offset + n));
    }
    done += static_cast<size_t>(r);
  }
}

std::string read_text_file(const std::string& path, const std::string& prefix,
                           std::string_view what, uint64_t max_bytes) {
  InputFile f(path, prefix);
  if (f.size() > max_bytes) {
    throw Error(fmt::format("{}: it is {}, more than the {} that {} may have", prefix,
                            human_size(f.size()), human_size(max_bytes), what));
  }
  std::string text(static_cast<size_t>(f.size()), '\0');
  f.read_at(0, text.data(), text.size());
  return text;
}

}  // namespace flexjit::files
