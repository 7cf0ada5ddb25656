// Helpers shared by the matmul family's tests (test_matmul.cpp, test_matmul_epilogues.cpp):
// a naive f64 product to check values against, random inputs, element-wise closeness, the
// ShapeError text of a call, and the tanh GELU's derivative. In mt::testing::matmul_test, apart
// from the other op tests' helpers (ops_test_util.h), whose expect_contains differs.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/random.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace mt::testing::matmul_test {

// [..., M, K] @ [..., K, N] with equal batch dims (or none on b), by the definition, in f64.
inline std::vector<double> naive_matmul(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const int64_t batch = a.numel() / (m * k);
  const bool b_batched = b.dim() > 2;
  std::vector<double> out(static_cast<size_t>(batch * m * n), 0.0);
  for (int64_t i = 0; i < batch; ++i) {
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < n; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < k; ++j) {
          acc += x[static_cast<size_t>(i * m * k + r * k + j)] *
                 y[static_cast<size_t>((b_batched ? i * k * n : 0) + j * n + c)];
        }
        out[static_cast<size_t>(i * m * n + r * n + c)] = acc;
      }
    }
  }
  return out;
}

inline Tensor random(const Shape& shape, DType dtype = DType::f64, uint64_t seed = 7) {
  Generator gen(seed);
  return randn(shape, TensorOptions().dtype(dtype), &gen);
}

inline void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << "element " << i;
  }
}

inline std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ShapeError& e) {
    return e.what();
  }
  return "(no ShapeError thrown)";
}

inline void expect_contains(const std::string& msg, const std::vector<std::string>& parts) {
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' missing in: " << msg;
}

// d/dx of 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), written out here as the reference.
inline double gelu_tanh_derivative(double x) {
  const double k = 0.79788456080286535588, t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

}  // namespace mt::testing::matmul_test
