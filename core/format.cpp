#include "core/format.h"

#include <cstdio>
#include <string>

#include "core/cuda_context.h"

namespace mt {

std::string with_commas(int64_t n) {
  std::string s = std::to_string(n);
  const int first = s[0] == '-' ? 1 : 0;
  for (int i = static_cast<int>(s.size()) - 3; i > first; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

}  // namespace mt

namespace mt::cuda {

std::string format_bytes(size_t nbytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(nbytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace mt::cuda
