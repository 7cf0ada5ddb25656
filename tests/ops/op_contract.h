// The contract every differentiable op is tested against, written once:
//   1. gradcheck: on the CPU in f64, the gradient from backward() equals a
//      central finite difference of a random weighted sum of the output
//      (|analytic - numeric| <= 1e-6 + 1e-4 |numeric| per element, eps = 1e-6).
//   2. cuda_matches_cpu: for f32, bf16 and f16 inputs, the CUDA output and input
//      gradients match an f64 CPU reference computed from the same (rounded)
//      inputs, by relative norm ||cuda - ref|| / ||ref|| <= the dtype's tolerance
//      (kTolerance below, unless a case states its own).
// A family's test file registers its cases with MT_OP_CASE; test_op_contract.cpp
// instantiates both checks for every registered case.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/macros.h"
#include "core/tensor.h"

namespace mt::testing {

// How a case's floating inputs are drawn (all from a fixed seed).
enum class Values {
  normal,         // N(0, 1)
  positive,       // uniform in [0.5, 2): log, sqrt, rsqrt, pow, division
  away_from_zero  // |N(0,1)| + 0.1 with random sign: abs, relu, max (no kinks or ties within eps)
};

struct OpCase {
  using Fn = std::function<Tensor(const std::vector<Tensor>&)>;
  using Extra = std::function<std::vector<Tensor>()>;

  // op: the op this case covers (the coverage list's name); name: unique case name.
  OpCase(std::string op_name, std::string case_name) : op(std::move(op_name)), name(std::move(case_name)) {}
  OpCase& inputs(std::vector<Shape> s) {
    shapes = std::move(s);
    return *this;
  }
  OpCase& draw(Values v) {
    values = v;
    return *this;
  }
  OpCase& compute(Fn f) {
    fn = std::move(f);
    return *this;
  }
  OpCase& extra(Extra e) {
    extra_inputs = std::move(e);
    return *this;
  }
  OpCase& tolerances(double f32, double bf16, double f16) {
    tol_f32 = f32;
    tol_bf16 = bf16;
    tol_f16 = f16;
    return *this;
  }
  OpCase& no_cuda(std::string reason) {
    cuda = false;
    cuda_skip_reason = std::move(reason);
    return *this;
  }
  // The CUDA path computes zeros the CPU does not, or skips some it computes (cuDNN's convolutions
  // skip the padding that the CPU's im2col multiplies, and pad what the CPU skips), so a NaN or
  // inf input meets a different set of zeros: NonFiniteWhereTheCpuIsNonFinite then holds it only
  // to the rule that every output depending on the NaN input is NaN on CUDA too.
  OpCase& cuda_nonfinite_may_differ(std::string reason) {
    cuda_nonfinite_reason = std::move(reason);
    return *this;
  }
  // A fused CUDA kernel that orders its arithmetic otherwise may give +-inf where the CPU's exact
  // order gives NaN (inf - inf there, one inf here): NonFiniteWhereTheCpuIsNonFinite then accepts
  // either infinity for a NaN, every other rule unchanged (finite stays finite, non-finite stays
  // non-finite, so an overflow check still sees it).
  OpCase& cuda_inf_may_stand_for_nan(std::string reason) {
    cuda_inf_for_nan_reason = std::move(reason);
    return *this;
  }
  OpCase& no_gradcheck(std::string reason) {
    gradcheck_skip_reason = std::move(reason);
    return *this;
  }

  std::string op;
  std::string name;
  std::vector<Shape> shapes;  // one floating input per shape
  Values values = Values::normal;
  Fn fn;               // builds the output from the inputs (any device, any floating dtype)
  Extra extra_inputs;  // non-differentiable inputs (indices, masks), made on the CPU, passed after the floating ones
  double tol_f32 = 0, tol_bf16 = 0, tol_f16 = 0;  // relative-norm overrides for cuda_matches_cpu; 0 = default
  bool cuda = true;
  std::string cuda_skip_reason;
  std::string gradcheck_skip_reason;    // non-empty: the f64 gradcheck is skipped, with this reason
  std::string cuda_nonfinite_reason;    // non-empty: see cuda_nonfinite_may_differ
  std::string cuda_inf_for_nan_reason;  // non-empty: see cuda_inf_may_stand_for_nan
};

// Default relative-norm tolerances for cuda_matches_cpu: f32 keeps ~7 digits,
// but GEMMs and reductions reorder sums; bf16 has an 8-bit mantissa (2^-8 =
// 3.9e-3 per rounding, a few roundings per op); f16 has 11 bits (4.9e-4).
constexpr double kTolF32 = 1e-5;
constexpr double kTolBF16 = 2e-2;
constexpr double kTolF16 = 4e-3;

std::vector<OpCase>& op_cases();

struct RegisterOpCase {
  explicit RegisterOpCase(OpCase c) { op_cases().push_back(std::move(c)); }
};

}  // namespace mt::testing

// MT_OP_CASE(OpCase("add", "add_broadcast").inputs({{2, 3}, {3}}).compute(...));
#define MT_OP_CASE(...) static const ::mt::testing::RegisterOpCase MT_CONCAT(mt_op_case_, __LINE__)(__VA_ARGS__)
