// Shared helpers for mixtrain's tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "core/cuda_context.h"
#include "core/error.h"

// CUDA cases call this first: on a machine without a GPU (or a CPU-only build)
// the case is reported as skipped, with the reason, instead of passing silently.
#define MT_SKIP_WITHOUT_CUDA()                                                                 \
  do {                                                                                         \
    if (!::mt::cuda::built_with_cuda()) GTEST_SKIP() << "mixtrain was built without CUDA";     \
    if (!::mt::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible on this machine"; \
  } while (0)

// The message of the mt::Error that f throws, or "(no error)".
inline std::string error_message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ::mt::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// ||got - want|| / ||want|| over equal-length values (1 when the lengths differ; 0 for two zeros).
inline double relative_l2(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return 1.0;
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The names of the entries of `dir`, sorted (to see that a failed write left nothing behind).
inline std::vector<std::string> dir_entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A whole file's bytes, and writing bytes to a file (for building malformed inputs).
inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "could not write " << path;
}
