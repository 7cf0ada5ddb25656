// Helpers shared by the op-family tests in tests/ops (the op contract's own are in
// op_contract.h): error messages, relative errors, and one CUDA-against-the-CPU check of an op's
// output and input gradients. Header-only, inline, in mt::testing.
#pragma once

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/random.h"
#include "core/tensor.h"
#include "core/view.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace mt::testing {

using In = std::vector<Tensor>;

// The device the CUDA cases run on.
inline Device gpu() { return cuda_device(0); }

// The message of the mt::Error that fn throws, or "" when it throws none.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Every one of `parts` is in msg, which is not empty.
inline void expect_contains(const std::string& msg, const std::vector<std::string>& parts) {
  EXPECT_FALSE(msg.empty()) << "expected an error";
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

#define EXPECT_CONTAINS(haystack, needle)                          \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "'" << (haystack) << "' lacks '" << (needle) << "'"

// ||got - ref|| / ||ref|| over every element (infinite where only one of them is NaN at some
// element; NaNs in both are passed over).
inline double relative_norm_error(const Tensor& got, const Tensor& ref) {
  const std::vector<double> a = got.to_vector<double>(), b = ref.to_vector<double>();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
    if (std::isnan(a[i])) continue;
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}
// fn(inputs, extra) on CUDA in `dtype` against fn on the CPU in f64 from the same
// rounded inputs: the output and every input's gradient, by relative norm.
inline void expect_cuda_matches_f64(const std::string& name, const std::vector<Tensor>& inputs, const Tensor& extra,
                                    DType dtype, double tol, const std::function<Tensor(const In&)>& fn) {
  In ref, gpu;
  for (const Tensor& t : inputs) {
    const Tensor rounded = raw::to(t, dtype);
    ref.push_back(
        raw::clone(raw::to(rounded, DType::f64)).requires_grad_(true));  // fresh leaves: f64 -> f64 is no copy
    gpu.push_back(raw::to(rounded, cuda_device(0)).requires_grad_(true));
  }
  In ref_args = ref, gpu_args = gpu;
  if (extra.defined()) {
    ref_args.push_back(extra);
    gpu_args.push_back(raw::to(extra, cuda_device(0)));
  }
  const Tensor ref_out = fn(ref_args), gpu_out = fn(gpu_args);
  ASSERT_TRUE(gpu_out.is_cuda()) << name;
  EXPECT_LE(relative_norm_error(gpu_out, ref_out), tol) << name << " " << dtype_name(dtype) << ": forward";
  Generator gen(99);
  const Tensor w = raw::to(randn(ref_out.shape(), DType::f64, &gen), gpu_out.dtype());
  sum(ref_out * raw::to(w, DType::f64)).backward();
  sum(gpu_out * raw::to(w, cuda_device(0))).backward();
  for (size_t k = 0; k < gpu.size(); ++k) {
    ASSERT_TRUE(gpu[k].grad().defined()) << name << ": input " << k;
    EXPECT_LE(relative_norm_error(gpu[k].grad(), ref[k].grad()), tol)
        << name << " " << dtype_name(dtype) << ": gradient of input " << k;
  }
}

// The relative-norm tolerance of expect_cuda_matches_f64 in each dtype.
inline double tolerance_for(DType dtype) {
  return dtype == DType::f64 ? 1e-12 : dtype == DType::f32 ? 1e-5 : dtype == DType::bf16 ? 2e-2 : 4e-3;
}

}  // namespace mt::testing
