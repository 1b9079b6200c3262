#include "util/PrivateFiles.h"

#include "util/Log.h"

#include <flexjit/error.h>

#include <fcntl.h>
#include <fmt/format.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>
#include <unordered_set>

namespace flexjit::files {

namespace fs = std::filesystem;

namespace {

std::string user_name(uid_t uid) {
  struct passwd pw;
  struct passwd* found = nullptr;
  char buf[1024];
  if (::getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found != nullptr) {
    return fmt::format("{} (uid {})", found->pw_name, static_cast<unsigned>(uid));
  }
  return fmt::format("uid {}", static_cast<unsigned>(uid));
}

std::string mode_str(mode_t mode) {
  return fmt::format("{:04o}", static_cast<unsigned>(mode & 07777));
}

DirCheck fail(DirState state, std::string problem) {
  return {state, std::move(problem)};
}

const char* file_type(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

}  // namespace

DirCheck check_private_dir(const fs::path& dir, std::string_view what) {
  const uid_t me = ::geteuid();
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return fail(DirState::Unusable, fmt::format("{} '{}' cannot be used: {}", what, dir.string(),
                                                std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return fail(DirState::Unusable, fmt::format("{} '{}' is not a directory", what, dir.string()));
  }
  if (st.st_uid != me) {
    return fail(
        DirState::Untrusted,
        fmt::format("{} '{}' is owned by {}, not by you ({}), so its files could come from "
                    "another user. Fix: use a directory of your own, or `chown -R {} '{}'` "
                    "if it is yours",
                    what, dir.string(), user_name(st.st_uid), user_name(me), me, dir.string()));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return fail(DirState::Untrusted,
                fmt::format("{} '{}' is writable by group or others (mode {}), so its files could "
                            "come from another user. Fix: `chmod 700 '{}'`",
                            what, dir.string(), mode_str(st.st_mode), dir.string()));
  }
  // Whoever can write to an ancestor can rename this directory away and put another in its
  // place; a sticky ancestor (/tmp) lets only the owner do that.
  std::error_code ec;
  fs::path real = fs::canonical(dir, ec);
  if (ec) {
    return fail(DirState::Unusable,
                fmt::format("{} '{}' cannot be resolved: {}", what, dir.string(), ec.message()));
  }
  for (fs::path p = real.parent_path();; p = p.parent_path()) {
    struct stat a;
    if (::stat(p.c_str(), &a) != 0) break;
    if (a.st_uid != 0 && a.st_uid != me) {
      return fail(
          DirState::Untrusted,
          fmt::format("{} '{}' is inside '{}', which is owned by {} (neither root nor you), "
                      "who could replace it. Fix: use a directory elsewhere",
                      what, dir.string(), p.string(), user_name(a.st_uid)));
    }
    if ((a.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (a.st_mode & S_ISVTX) == 0) {
      return fail(DirState::Untrusted,
                  fmt::format("{} '{}' is inside '{}', which is writable by group or others "
                              "(mode {}), so others could replace it. Fix: `chmod go-w '{}'`, or "
                              "use a directory elsewhere",
                              what, dir.string(), p.string(), mode_str(a.st_mode), p.string()));
    }
    if (p == p.parent_path()) break;
  }
  if (::faccessat(AT_FDCWD, dir.c_str(), R_OK | X_OK, AT_EACCESS) != 0) {
    return fail(DirState::Unusable, fmt::format("{} '{}' cannot be read: {}", what, dir.string(),
                                                std::strerror(errno)));
  }
  if (::faccessat(AT_FDCWD, dir.c_str(), W_OK, AT_EACCESS) != 0) {
    return fail(DirState::ReadOnly, fmt::format("{} '{}' is read-only here ({})", what,
                                                dir.string(), std::strerror(errno)));
  }
  return {DirState::Writable, {}};
}

DirCheck open_private_dir(const fs::path& dir, std::string_view what) {
  std::error_code ec;
  fs::path abs = fs::absolute(dir, ec);
  if (ec || dir.empty()) {
    return fail(DirState::Unusable, fmt::format("{} '{}' cannot be created: {}", what, dir.string(),
                                                ec ? ec.message() : "empty path"));
  }
  // mkdir -p, each missing level 0700 (umask can only narrow it).
  fs::path p;
  for (const fs::path& part : abs) {
    p /= part;
    if (p == p.root_path()) continue;
    if (::mkdir(p.c_str(), 0700) != 0 && errno != EEXIST) {
      return fail(DirState::Unusable, fmt::format("{} '{}' cannot be created: {}", what,
                                                  dir.string(), std::strerror(errno)));
    }
  }
  return check_private_dir(dir, what);
}

PrivateFile::PrivateFile(PrivateFile&& o) noexcept
    : fd(o.fd),
      size(o.size),
      missing(o.missing),
      untrusted(o.untrusted),
      problem(std::move(o.problem)) {
  o.fd = -1;
}

PrivateFile& PrivateFile::operator=(PrivateFile&& o) noexcept {
  if (this != &o) {
    if (fd >= 0) ::close(fd);
    fd = o.fd;
    size = o.size;
    missing = o.missing;
    untrusted = o.untrusted;
    problem = std::move(o.problem);
    o.fd = -1;
  }
  return *this;
}

PrivateFile::~PrivateFile() {
  if (fd >= 0) ::close(fd);
}

PrivateFile open_private_file(const fs::path& path, uint64_t max_bytes) {
  PrivateFile f;
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) {
      f.missing = true;
      f.problem = "does not exist";
    } else if (err == ELOOP) {
      f.untrusted = true;
      f.problem = "is a symbolic link";
    } else {
      f.untrusted = err == EACCES || err == EPERM;
      f.problem = fmt::format("cannot be opened: {}", std::strerror(err));
    }
    return f;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    f.problem = fmt::format("cannot be examined: {}", std::strerror(errno));
    ::close(fd);
    return f;
  }
  const uid_t me = ::geteuid();
  if (!S_ISREG(st.st_mode)) {
    f.untrusted = true;
    f.problem = fmt::format("is {}", file_type(st.st_mode));
  } else if (st.st_uid != me) {
    f.untrusted = true;
    f.problem = fmt::format("is owned by {}, not by you ({})", user_name(st.st_uid), user_name(me));
  } else if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    f.untrusted = true;
    f.problem = fmt::format("is writable by group or others (mode {})", mode_str(st.st_mode));
  } else if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    f.problem = fmt::format("is {} bytes, more than the limit of {}",
                            static_cast<uint64_t>(st.st_size), max_bytes);
  } else {
    f.fd = fd;
    f.size = static_cast<uint64_t>(st.st_size);
    return f;
  }
  ::close(fd);
  return f;
}

bool read_exact(int fd, std::string& out, uint64_t n) {
  out.resize(static_cast<size_t>(n));
  size_t done = 0;
  while (done < out.size()) {
    ssize_t r = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    done += static_cast<size_t>(r);
  }
  return true;
}

std::string temp_suffix() {
  thread_local std::mt19937_64 rng{std::random_device{}() ^
                                   (static_cast<uint64_t>(::getpid()) << 32)};
  return fmt::format(".{}.{:016x}.tmp", static_cast<long>(::getpid()), rng());
}

void write_private_file(const fs::path& path, std::string_view bytes) {
  const fs::path temp = path.parent_path() /
                        fmt::format(".{}{}", path.filename().string().substr(0, 16), temp_suffix());
  auto fail = [&](const char* what, int err) {
    std::error_code ec;
    fs::remove(temp, ec);
    throw CacheError(fmt::format("cannot {} '{}': {}", what, path.string(), std::strerror(err)));
  };
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) fail("create", errno);
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      ::close(fd);
      fail("write", err);
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) fail("write", errno);
  if (::rename(temp.c_str(), path.c_str()) != 0) fail("rename into", errno);
}

void warn_once(std::string_view stage, const std::string& message) {
  static std::mutex mutex;
  static std::unordered_set<std::string> seen;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!seen.insert(message).second) return;
  }
  logging::write(stage, "warning: " + message);
}

}  // namespace flexjit::files
