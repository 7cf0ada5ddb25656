// Helpers shared by the libFuzzer targets.
//
// The safetensors and token-file readers take a path, so each input is written to one
// scratch file per process (the pid in its name keeps parallel fuzzing jobs apart),
// which is removed when the process exits normally.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace mt::fuzz {

// Stops the run with a message: libFuzzer reports the abort and saves the input.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz target: %s\n", what.c_str());
  std::abort();
}

class ScratchFile {
 public:
  explicit ScratchFile(const char* stem) {
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/" + stem + "." + std::to_string(::getpid());
  }
  ~ScratchFile() { ::unlink(path_.c_str()); }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  // Replaces the file's content with the input. A harness that cannot write its own
  // scratch file would report every input as passing, so it stops the run instead.
  const std::string& write(const uint8_t* data, size_t size) const {
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    bool ok = fd >= 0;
    for (size_t done = 0; ok && done < size;) {
      const ssize_t n = ::write(fd, data + done, size - done);
      ok = n > 0;
      if (ok) done += static_cast<size_t>(n);
    }
    if (fd >= 0) ok = ::close(fd) == 0 && ok;
    if (!ok) fail("cannot write the scratch file " + path_ + ": " + std::strerror(errno));
    return path_;
  }

 private:
  std::string path_;
};

}  // namespace mt::fuzz
