// Errors. Two channels, both exceptions:
//   MT_CHECK(cond, ...)        for what a user caused (bad shapes, dtypes, devices, files).
//   MT_INTERNAL_ASSERT(cond)   for our own bugs.
// The message is built only when the check fails. By convention a user-facing
// message starts with the op or function name: "matmul: shapes [2, 3] and [4, 5] ...".
// Typed errors let a caller catch one family (e.g. OutOfMemoryError) and let others pass.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace mt {

// `text` as it may be printed: valid UTF-8 sequences, tabs and newlines kept; every other byte
// (a control character, or one that is not part of valid UTF-8) written as \xNN. Messages quote
// names and values from files, and a stray byte there must not make stderr itself invalid.
std::string printable(std::string_view text);

// Every message goes through printable(), so no error can carry raw file bytes to a terminal.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(printable(message)) {}
};
class ShapeError : public Error {
  using Error::Error;
};
class DTypeError : public Error {
  using Error::Error;
};
class DeviceError : public Error {
  using Error::Error;
};
class OutOfMemoryError : public DeviceError {
  using DeviceError::DeviceError;
};
class FileError : public Error {
  using Error::Error;
};
class DistributedError : public Error {
  using Error::Error;
};
class NotImplementedError : public Error {
  using Error::Error;
};
// Thrown by a vendor library checker (CUDA, cuBLASLt, cuDNN, NCCL, MPI).
class VendorError : public Error {
  using Error::Error;
};
class InternalError : public Error {
  using Error::Error;
};

namespace detail {

template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

[[noreturn]] void throw_internal(const char* cond, const char* file, int line, const std::string& msg);

// Throws FileError("<path>: <args...>"): every reader's message names the file first.
template <typename... Args>
[[noreturn]] void fail_file(const std::string& path, Args&&... args) {
  throw FileError(str_cat(path, ": ", std::forward<Args>(args)...));
}

}  // namespace detail
}  // namespace mt

// MT_CHECK(cond, "op: message ", value, ...) throws mt::Error (or the type given to MT_CHECK_T).
#define MT_CHECK_T(ErrorType, cond, ...)                   \
  do {                                                     \
    if (!(cond)) {                                         \
      throw ErrorType(::mt::detail::str_cat(__VA_ARGS__)); \
    }                                                      \
  } while (0)

#define MT_CHECK(cond, ...) MT_CHECK_T(::mt::Error, cond, __VA_ARGS__)

#define MT_INTERNAL_ASSERT(cond, ...)                                                                 \
  do {                                                                                                \
    if (!(cond)) {                                                                                    \
      ::mt::detail::throw_internal(#cond, __FILE__, __LINE__, ::mt::detail::str_cat("" __VA_ARGS__)); \
    }                                                                                                 \
  } while (0)
