#include "core/error.h"

namespace mt::detail {

void throw_internal(const char* cond, const char* file, int line, const std::string& msg) {
  throw InternalError(str_cat("internal error (a mixtrain bug, please report it): ", cond, " failed at ", file, ":",
                              line, msg.empty() ? "" : ": ", msg));
}

}  // namespace mt::detail
