// Values and gradients at NaN, +-inf, 0 and ordinary points, held to PyTorch's: the table in
// tests/ops/nan_inf_reference.inc is written by tools/parity/nan_inf_reference.py (PyTorch in f64
// on the CPU; `--check` compares the file with the installed torch). Each entry runs here on the
// CPU in f64 and on CUDA in f32, bf16 and f16. A NaN where PyTorch has a NaN, the same infinity
// where it has one, and finite values within the dtype's tolerance; the sign of a zero is not held.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/view.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace mt {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Reference {
  const char* op;
  int64_t rows, cols;
  std::vector<double> x, y;  // [rows, cols] each; y empty for a unary op
  std::vector<double> g;     // upstream gradient, the output's shape
  std::vector<double> out, dx, dy;
};

const std::vector<Reference>& references() {
  static const std::vector<Reference> table = {
#include "tests/ops/nan_inf_reference.inc"
  };
  return table;
}

// The op of a reference entry; "@..." names a variant of the upstream gradient only.
Tensor apply(std::string op, const Tensor& x, const Tensor& y) {
  op = op.substr(0, op.find('@'));
  const int64_t cols = x.shape().back();
  if (op == "neg") return neg(x);
  if (op == "exp") return exp(x);
  if (op == "log") return log(x);
  if (op == "sqrt") return sqrt(x);
  if (op == "rsqrt") return rsqrt(x);
  if (op == "abs") return abs(x);
  if (op == "tanh") return tanh(x);
  if (op == "sigmoid") return sigmoid(x);
  if (op == "relu") return relu(x);
  if (op == "silu") return silu(x);
  if (op == "gelu_erf") return gelu(x, GeluApproximation::none);
  if (op == "gelu_tanh") return gelu(x, GeluApproximation::tanh);
  if (op == "pow_2") return pow(x, 2.0);
  if (op == "pow_0.5") return pow(x, 0.5);
  if (op == "pow_0") return pow(x, 0.0);
  if (op == "add_scalar") return add(x, 1.5);
  if (op == "mul_scalar") return mul(x, 2.0);
  if (op == "rdiv_scalar") return rdiv(2.0, x);
  if (op == "dropout_p1") return dropout(x, 1.0, /*training=*/true);
  if (op == "add") return add(x, y);
  if (op == "sub") return sub(x, y);
  if (op == "mul") return mul(x, y);
  if (op == "div") return div(x, y);
  if (op == "max_dim1") return max(x, 1);
  if (op == "sum_dim1") return sum(x, {1});
  if (op == "mean_dim1") return mean(x, {1});
  if (op == "softmax_dim1") return softmax(x, 1);
  if (op == "log_softmax_dim1") return log_softmax(x, 1);
  const TensorOptions like = TensorOptions().dtype(x.dtype()).device(x.device());
  if (op == "layer_norm") return layer_norm(x, ones({cols}, like), zeros({cols}, like), 1e-5);
  if (op == "rms_norm") return rms_norm(x, ones({cols}, like), 1e-6);
  ADD_FAILURE() << "no op for reference entry " << op;
  return x;
}

// Relative tolerance per dtype for finite values; the absolute one is the same figure (values near 1).
double tolerance(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return 1e-12;
    case DType::f32:
      return 1e-5;
    case DType::bf16:
      return 1.6e-2;
    default:
      return 2e-3;  // f16
  }
}

void expect_matches(const std::vector<double>& got, const std::vector<double>& want, DType dtype,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double tol = tolerance(dtype);
  for (size_t i = 0; i < want.size(); ++i) {
    const std::string where = what + " element " + std::to_string(i);
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << where << ": PyTorch gives NaN, got " << got[i];
    } else if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << where;
    } else {
      EXPECT_TRUE(std::isfinite(got[i])) << where << ": PyTorch gives " << want[i] << ", got " << got[i];
      EXPECT_NEAR(got[i], want[i], tol + tol * std::fabs(want[i])) << where;
    }
  }
}

void check_entry(const Reference& r, Device device, DType dtype) {
  const std::string name = std::string(r.op) + " on " + device.str() + " in " + dtype_name(dtype);
  const TensorOptions options = TensorOptions().dtype(dtype).device(device);
  const Shape shape = {r.rows, r.cols};
  Tensor x = from_vector(r.x, shape, options).requires_grad_(true);
  Tensor y = r.y.empty() ? Tensor() : from_vector(r.y, shape, options).requires_grad_(true);
  const Tensor out = apply(r.op, x, y);
  expect_matches(raw::to(out, kCPU, DType::f64).to_vector<double>(), r.out, dtype, name + ": value");
  out.backward(from_vector(r.g, out.shape(), options));
  ASSERT_TRUE(x.grad().defined()) << name << ": no gradient for x";
  expect_matches(raw::to(x.grad(), kCPU, DType::f64).to_vector<double>(), r.dx, dtype, name + ": gradient of x");
  if (y.defined()) {
    ASSERT_TRUE(y.grad().defined()) << name << ": no gradient for y";
    expect_matches(raw::to(y.grad(), kCPU, DType::f64).to_vector<double>(), r.dy, dtype, name + ": gradient of y");
  }
}

std::string entry_name(size_t index) {
  std::string name = references()[index].op;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

std::vector<size_t> entries() {
  std::vector<size_t> ids(references().size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i;
  return ids;
}

class NanInfCpu : public ::testing::TestWithParam<size_t> {};

TEST_P(NanInfCpu, MatchesPyTorchInF64) { check_entry(references()[GetParam()], kCPU, DType::f64); }

INSTANTIATE_TEST_SUITE_P(Ops, NanInfCpu, ::testing::ValuesIn(entries()),
                         [](const ::testing::TestParamInfo<size_t>& info) { return entry_name(info.param); });

class NanInfCuda : public ::testing::TestWithParam<std::tuple<size_t, DType>> {};

TEST_P(NanInfCuda, MatchesPyTorch) {
  MT_SKIP_WITHOUT_CUDA();
  check_entry(references()[std::get<0>(GetParam())], cuda_device(0), std::get<1>(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Ops, NanInfCuda,
                         ::testing::Combine(::testing::ValuesIn(entries()),
                                            ::testing::Values(DType::f32, DType::bf16, DType::f16)),
                         [](const ::testing::TestParamInfo<std::tuple<size_t, DType>>& info) {
                           return entry_name(std::get<0>(info.param)) + "_" + dtype_name(std::get<1>(info.param));
                         });

// The same table on the CPU in f32: the host's own tanh (ops/math.h) and the vectorised loops
// serve f32 and not f64.
TEST(NanInfCpuF32, MatchesPyTorch) {
  for (const Reference& r : references()) check_entry(r, kCPU, DType::f32);
}

}  // namespace
}  // namespace mt
