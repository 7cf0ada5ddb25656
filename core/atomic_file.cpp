#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/error.h"

namespace mt {
namespace {

// The temporary file of one write: closed and removed unless committed.
class TempFile {
 public:
  explicit TempFile(std::string path) : path_(std::move(path)) {}
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (file_ != nullptr) std::fclose(file_);
    if (created_ && !committed_) ::unlink(path_.c_str());
  }
  bool open() {
    // A leftover from a crashed write by a process with the same pid is overwritten (a container's
    // trainer often has the same pid every run); O_NOFOLLOW: never write through a link left there.
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    created_ = true;
    file_ = ::fdopen(fd, "wb");
    if (file_ == nullptr) {
      const int err = errno;
      ::close(fd);
      errno = err;
      return false;
    }
    return true;
  }
  std::FILE* file() const { return file_; }
  // fclose, reporting its error (the last chance to see a deferred write error).
  bool close() {
    std::FILE* f = file_;
    file_ = nullptr;
    return std::fclose(f) == 0;
  }
  void commit() { committed_ = true; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  bool created_ = false;
  bool committed_ = false;
};

// Makes a completed rename durable. EINVAL: the filesystem cannot sync directories;
// the data itself is already synced.
void fsync_parent_directory(const std::string& path, const std::string& what) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int err = errno;
  int rc = -1;
  if (dir_fd >= 0) {
    rc = ::fsync(dir_fd);
    err = errno;
    ::close(dir_fd);
  }
  if (dir_fd < 0 || (rc != 0 && err != EINVAL)) {
    throw FileError(detail::str_cat(path, ": cannot save ", what, ": cannot ", dir_fd < 0 ? "open" : "fsync",
                                    " directory '", dir, "': ", std::strerror(err)));
  }
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& what,
                           const std::function<void(const ChunkWriter& write)>& produce) {
  TempFile tmp(detail::str_cat(path, ".tmp.", ::getpid()));
  const auto fail_errno = [&](const std::string& step) {
    const int err = errno;
    throw FileError(detail::str_cat(path, ": cannot save ", what, ": ", step, ": ", std::strerror(err)));
  };
  if (!tmp.open()) fail_errno(detail::str_cat("cannot create temporary file '", tmp.path(), "'"));
  produce([&](const void* data, size_t n) {
    if (n != 0 && std::fwrite(data, 1, n, tmp.file()) != n) {
      fail_errno(detail::str_cat("cannot write temporary file '", tmp.path(), "'"));
    }
  });
  if (std::fflush(tmp.file()) != 0) fail_errno(detail::str_cat("cannot flush '", tmp.path(), "'"));
  if (::fsync(::fileno(tmp.file())) != 0) fail_errno(detail::str_cat("cannot fsync '", tmp.path(), "'"));
  if (!tmp.close()) fail_errno(detail::str_cat("cannot close '", tmp.path(), "'"));
  if (std::rename(tmp.path().c_str(), path.c_str()) != 0) {
    fail_errno(detail::str_cat("cannot rename '", tmp.path(), "' over it"));
  }
  tmp.commit();
  fsync_parent_directory(path, what);
}

void write_file_atomically(const std::string& path, const std::string& what, const std::string& content) {
  write_file_atomically(path, what, [&](const ChunkWriter& write) { write(content.data(), content.size()); });
}

}  // namespace mt
