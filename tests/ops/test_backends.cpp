// The TF32 switches: defaults as in PyTorch, and on a GPU they really change
// which arithmetic runs (TF32 error ~1e-4..1e-3 vs f32's ~1e-7).
#include <cmath>

#include "core/view.h"
#include "ops/backends.h"
#include "ops/ops.h"
#include "tests/test_util.h"

namespace mt {
namespace {

TEST(Backends, Tf32DefaultsFollowPyTorch) {
  EXPECT_FALSE(backends::allow_tf32_matmul());
  EXPECT_TRUE(backends::allow_tf32_conv());
  {
    backends::TF32Guard guard(/*matmul=*/true, /*conv=*/false);
    EXPECT_TRUE(backends::allow_tf32_matmul());
    EXPECT_FALSE(backends::allow_tf32_conv());
  }
  EXPECT_FALSE(backends::allow_tf32_matmul());
  EXPECT_TRUE(backends::allow_tf32_conv());
}

double relative_error(const Tensor& got, const Tensor& ref) {
  const std::vector<double> a = got.to_vector<double>(), b = ref.to_vector<double>();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return std::sqrt(diff / norm);
}

TEST(Backends, Tf32SwitchChangesF32MatmulOnTheGpu) {
  MT_SKIP_WITHOUT_CUDA();
  Generator gen(3);
  const Tensor a = randn({256, 1024}, DType::f64, &gen), b = randn({1024, 256}, DType::f64, &gen);
  const Tensor ref = matmul(a, b);
  const Tensor a32 = raw::to(a, cuda_device(0), DType::f32), b32 = raw::to(b, cuda_device(0), DType::f32);
  const double exact = relative_error(matmul(a32, b32), ref);
  double tf32 = 0;
  {
    backends::TF32Guard guard(/*matmul=*/true, /*conv=*/true);
    tf32 = relative_error(matmul(a32, b32), ref);
  }
  std::printf("[ tf32 ] f32 matmul relative error: %.2e with TF32 off, %.2e with TF32 on\n", exact, tf32);
  EXPECT_LE(exact, 1e-6);
  EXPECT_GT(tf32, 1e-5);  // TF32 really ran
  EXPECT_LE(tf32, 1e-2);
}

TEST(Backends, Tf32SwitchChangesF32ConvOnTheGpu) {
  MT_SKIP_WITHOUT_CUDA();
  Generator gen(4);
  const Tensor x = randn({8, 64, 32, 32}, DType::f64, &gen), w = randn({64, 64, 3, 3}, DType::f64, &gen);
  const Tensor ref = conv2d(x, w, Tensor(), Conv2dOptions().padding(1));
  const Tensor x32 = raw::to(x, cuda_device(0), DType::f32), w32 = raw::to(w, cuda_device(0), DType::f32);
  double exact = 0, tf32 = 0;
  {
    backends::TF32Guard guard(/*matmul=*/false, /*conv=*/false);
    exact = relative_error(conv2d(x32, w32, Tensor(), Conv2dOptions().padding(1)), ref);
  }
  tf32 = relative_error(conv2d(x32, w32, Tensor(), Conv2dOptions().padding(1)), ref);  // the default: on
  std::printf("[ tf32 ] f32 conv2d relative error: %.2e with TF32 off, %.2e with TF32 on (default)\n", exact, tf32);
  EXPECT_LE(exact, 1e-6);
  EXPECT_LE(tf32, 1e-2);
}

}  // namespace
}  // namespace mt
