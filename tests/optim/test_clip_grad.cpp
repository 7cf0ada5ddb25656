// clip_grad_norm_: the total norm against a hand computation, the exact scaling
// rule (above, below, non-finite), skipped and strided gradients, the returned
// tensor, errors; on CUDA, the multi-tensor kernels against the CPU over ~40
// tensors of mixed sizes, with the launch tables shrunk so that every
// launch-splitting branch is taken.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/view.h"
#include "ops/ops.h"
#include "optim/clip_grad.h"
#include "optim/clip_grad_kernels.h"
#include "tests/test_util.h"

namespace mt {
namespace {

// A leaf parameter (zeros) holding `grad` as its gradient.
Tensor param_with_grad(const Tensor& grad) {
  Tensor p = zeros(grad.shape(), TensorOptions().dtype(grad.dtype()).device(grad.device())).requires_grad_();
  p.set_grad(grad);
  return p;
}

double sum_of_squares(const Tensor& t) {
  double s = 0;
  for (const double v : t.to_vector<double>()) s += v * v;
  return s;
}

TEST(ClipGradNorm, TotalNormIsTheL2NormOverAllGradients) {
  Generator gen(11);
  std::vector<Tensor> params, originals;
  double expected = 0;
  for (const Shape& shape : {Shape{2, 3}, Shape{7}, Shape{1, 4, 5}, Shape{1}}) {
    const Tensor g = randn(shape, DType::f64, &gen);
    originals.push_back(raw::clone(g));
    params.push_back(param_with_grad(g));
    expected += sum_of_squares(g);
  }
  expected = std::sqrt(expected);
  const Tensor total = clip_grad_norm_(params, /*max_norm=*/1e9);
  EXPECT_NEAR(total.item(), expected, 1e-14 * expected);
  for (size_t i = 0; i < params.size(); ++i) {  // far below max_norm: untouched
    EXPECT_EQ(params[i].grad().to_vector<double>(), originals[i].to_vector<double>()) << i;
  }

  // The same in f32: squares accumulate in f32.
  std::vector<Tensor> params32;
  for (const Tensor& g : originals) params32.push_back(param_with_grad(raw::to(g, DType::f32)));
  double expected32 = 0;
  for (const Tensor& p : params32) expected32 += sum_of_squares(p.grad());
  EXPECT_NEAR(clip_grad_norm_(params32, 1e9).item(), std::sqrt(expected32), 1e-6 * std::sqrt(expected32));
}

TEST(ClipGradNorm, ScalesExactlyByMaxNormOverTotalPlusEpsWhenAbove) {
  // |[3, 4]|^2 + |[[12]]|^2 = 169: total 13.
  const Tensor a = param_with_grad(from_vector({3, 4}, {2}, DType::f64));
  const Tensor b = param_with_grad(from_vector({12}, {1, 1}, DType::f64));
  const Tensor total = clip_grad_norm_({a, b}, /*max_norm=*/2.0, /*eps=*/1e-6);
  EXPECT_EQ(total.item(), 13.0);
  const double coef = 2.0 / (13.0 + 1e-6);
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{3 * coef, 4 * coef}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{12 * coef}));
  // The clipped gradients now have norm max_norm (up to eps).
  EXPECT_NEAR(std::sqrt(sum_of_squares(a.grad()) + sum_of_squares(b.grad())), 2.0, 1e-6);

  // f32 and bf16: the coefficient comes from the f32 total and multiplies in f32.
  for (const DType dtype : {DType::f32, DType::bf16}) {
    const Tensor c = param_with_grad(from_vector({3, 4}, {2}, dtype));
    const Tensor d = param_with_grad(from_vector({12}, {1}, dtype));
    const Tensor t = clip_grad_norm_({c, d}, /*max_norm=*/1.0, /*eps=*/0.5);
    EXPECT_EQ(t.dtype(), DType::f32);
    EXPECT_EQ(t.item(), 13.0);
    const float coef32 = static_cast<float>(1.0 / 13.5);
    const auto round = [&](float v) { return raw::to(full({1}, v * coef32, DType::f32), dtype).item(); };
    EXPECT_EQ(c.grad().to_vector<double>(), (std::vector<double>{round(3), round(4)})) << dtype_name(dtype);
    EXPECT_EQ(d.grad().to_vector<double>(), (std::vector<double>{round(12)})) << dtype_name(dtype);
  }
}

TEST(ClipGradNorm, LeavesGradientsUntouchedWhenBelow) {
  const Tensor a = param_with_grad(from_vector({3, -4}, {2}, DType::f32));
  const Tensor b = param_with_grad(from_vector({0.1, 12}, {2}, DType::bf16));
  const std::vector<float> a0 = a.grad().to_vector<float>(), b0 = b.grad().to_vector<float>();
  const Tensor total = clip_grad_norm_({a, b}, /*max_norm=*/14.0);
  EXPECT_GT(total.item(), 13.0);
  EXPECT_LT(total.item(), 13.01);
  EXPECT_EQ(a.grad().to_vector<float>(), a0);
  EXPECT_EQ(b.grad().to_vector<float>(), b0);
}

TEST(ClipGradNorm, SkipsParametersWithoutGradient) {
  const Tensor a = param_with_grad(from_vector({3, 4}, {2}, DType::f64));
  const Tensor no_grad = full({3}, 100.0, DType::f64).requires_grad_();
  const Tensor frozen = full({2}, 100.0, DType::f64);  // does not require grad at all
  const Tensor total = clip_grad_norm_({no_grad, a, frozen}, /*max_norm=*/1.0);
  EXPECT_EQ(total.item(), 5.0);
  EXPECT_FALSE(no_grad.grad().defined());
  EXPECT_FALSE(frozen.grad().defined());
  EXPECT_EQ(no_grad.to_vector<double>(), (std::vector<double>{100, 100, 100}));
  EXPECT_DOUBLE_EQ(a.grad().to_vector<double>()[0], 3.0 / (5.0 + 1e-6));
}

TEST(ClipGradNorm, ReturnsAZeroDimTensorOnTheGradientsDevice) {
  const Tensor a = param_with_grad(from_vector({3, 4}, {2}, DType::f64));
  const Tensor total64 = clip_grad_norm_({a}, 1e9);
  EXPECT_EQ(total64.dim(), 0);
  EXPECT_EQ(total64.dtype(), DType::f64);  // every gradient f64
  EXPECT_EQ(total64.device(), kCPU);

  const Tensor b = param_with_grad(from_vector({12}, {1}, DType::f16));
  const Tensor mixed = clip_grad_norm_({a, b}, 1e9);
  EXPECT_EQ(mixed.dim(), 0);
  EXPECT_EQ(mixed.dtype(), DType::f32);
  EXPECT_EQ(mixed.item(), 13.0);

  // No gradient at all: zero, nothing touched.
  const Tensor none = clip_grad_norm_({zeros({2}).requires_grad_()}, 1.0);
  EXPECT_EQ(none.dim(), 0);
  EXPECT_EQ(none.item(), 0.0);
  EXPECT_EQ(clip_grad_norm_({}, 1.0).item(), 0.0);
}

TEST(ClipGradNorm, StridedGradientsAreClippedInPlace) {
  const Tensor base = from_vector({3, 0, 4, 0, 0, 12}, {2, 3}, DType::f32);
  const Tensor g = raw::transpose(base, 0, 1);  // [3, 2], not contiguous
  ASSERT_FALSE(g.is_contiguous());
  const Tensor p = param_with_grad(g);
  const uint64_t version = base.version();
  EXPECT_EQ(clip_grad_norm_({p}, /*max_norm=*/1.0, /*eps=*/0.0).item(), 13.0);
  const float coef = static_cast<float>(1.0 / 13.0);
  EXPECT_EQ(base.to_vector<float>(), (std::vector<float>{3 * coef, 0, 4 * coef, 0, 0, 12 * coef}));
  EXPECT_TRUE(p.grad().shares_storage_with(base));
  EXPECT_GT(base.version(), version);
}

TEST(ClipGradNorm, NonFiniteTotalsFollowPyTorch) {
  const double inf = std::numeric_limits<double>::infinity();
  // inf total: coefficient 0, finite gradients become 0 and the inf one NaN.
  const Tensor a = param_with_grad(from_vector({1, -2}, {2}, DType::f32));
  const Tensor b = param_with_grad(from_vector({inf, 3}, {2}, DType::f32));
  EXPECT_EQ(clip_grad_norm_({a, b}, 1.0).item(), inf);
  EXPECT_EQ(a.grad().to_vector<float>(), (std::vector<float>{0, -0.0f}));
  EXPECT_TRUE(std::isnan(b.grad().to_vector<float>()[0]));
  EXPECT_EQ(b.grad().to_vector<float>()[1], 0.0f);

  // NaN total: every gradient becomes NaN.
  const Tensor c = param_with_grad(from_vector({1, -2}, {2}, DType::bf16));
  const Tensor d = param_with_grad(from_vector({std::nan(""), 3}, {2}, DType::f32));
  EXPECT_TRUE(std::isnan(clip_grad_norm_({c, d}, 1.0).item()));
  for (const Tensor& p : {c, d}) {
    for (const float v : p.grad().to_vector<float>()) EXPECT_TRUE(std::isnan(v));
  }
}

TEST(ClipGradNorm, BadArgumentsGiveClearErrors) {
  const Tensor a = param_with_grad(from_vector({3, 4}, {2}, DType::f32));
  EXPECT_THROW(clip_grad_norm_({a}, -1.0), Error);
  EXPECT_THROW(clip_grad_norm_({a}, std::nan("")), Error);
  EXPECT_THROW(clip_grad_norm_({a}, 1.0, -1e-6), Error);
  EXPECT_THROW(clip_grad_norm_({a, Tensor()}, 1.0), Error);

  Tensor ints = zeros({2}).requires_grad_();
  ints.set_grad(from_vector({1, 2}, {2}, DType::i64));
  try {
    clip_grad_norm_({a, ints}, 1.0);
    FAIL() << "expected a DTypeError";
  } catch (const DTypeError& e) {
    EXPECT_NE(std::string(e.what()).find("the gradient of parameter 1 is i64[2] on cpu"), std::string::npos)
        << e.what();
  }
  // Nothing was written before the error.
  EXPECT_EQ(a.grad().to_vector<float>(), (std::vector<float>{3, 4}));
}

TEST(ClipGradNorm, CpuChunkingMatchesTheHandComputation) {
  Generator gen(5);
  std::vector<Tensor> grads;
  double expected = 0;
  for (const int64_t n : {1, 999, 1000, 1001, 5000}) {
    grads.push_back(randn({n}, DType::f32, &gen));
    expected += sum_of_squares(grads.back());
  }
  optim_kernels::MultiTensorConfig config;
  config.chunk_size = 1000;
  const Tensor total = optim_kernels::clip_grad_norm_cpu(grads, 1e9, 1e-6, DType::f32, config);
  EXPECT_NEAR(total.item(), std::sqrt(expected), 1e-6 * std::sqrt(expected));
}

// ---- multi-tensor launch planning (the host side of the CUDA path) ----

// Runs the planner with a launch that decodes every block as the kernel does and
// counts how often each element of each tensor is visited.
void expect_plan_covers_every_element_once(const std::vector<int64_t>& sizes,
                                           const optim_kernels::MultiTensorConfig& config) {
  std::vector<std::array<Tensor, 2>> slots;
  for (const int64_t n : sizes) slots.push_back({zeros({n}), zeros({n}, DType::f64)});
  std::vector<std::vector<int>> visits(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) visits[i].assign(static_cast<size_t>(sizes[i]), 0);

  int launches = 0;
  int64_t next_index = 0;
  optim_kernels::plan_multi_tensor_launches<2>(
      slots, config, [&](const optim_kernels::TensorListMetadata<2>& meta, int blocks) {
        ++launches;
        ASSERT_GT(blocks, 0);
        ASSERT_LE(blocks, std::min(config.max_blocks, optim_kernels::TensorListMetadata<2>::kMaxBlocks));
        int tensors = 0;
        for (int b = 0; b < blocks; ++b) tensors = std::max(tensors, meta.block_to_tensor[b] + 1);
        ASSERT_LE(tensors, std::min(config.max_tensors, optim_kernels::TensorListMetadata<2>::kMaxTensors));
        for (int b = 0; b < blocks; ++b) {
          const optim_kernels::MultiTensorBlock<2> block = optim_kernels::multi_tensor_block(meta, b);
          ASSERT_EQ(block.index, next_index++);
          size_t slot = 0;
          while (slot < slots.size() && slots[slot][0].data_ptr() != block.ptr[0]) ++slot;
          ASSERT_LT(slot, slots.size()) << "block " << block.index << " points at no tensor";
          ASSERT_EQ(block.ptr[1], slots[slot][1].data_ptr()) << "the lists of slot " << slot << " disagree";
          ASSERT_LT(block.begin, block.end);
          ASSERT_LE(block.end, sizes[slot]);
          ASSERT_LE(block.end - block.begin, config.chunk_size);
          for (int64_t k = block.begin; k < block.end; ++k) ++visits[slot][static_cast<size_t>(k)];
        }
      });
  EXPECT_EQ(next_index, optim_kernels::multi_tensor_block_count(sizes, config.chunk_size));
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t wrong = std::count_if(visits[i].begin(), visits[i].end(), [](int v) { return v != 1; });
    EXPECT_EQ(wrong, 0) << "tensor " << i << " of " << sizes[i] << " elements";
  }
  std::printf("[ multi_tensor ] %zu tensors, chunk %lld, tables of %d tensors x %d blocks: %d launches\n", sizes.size(),
              static_cast<long long>(config.chunk_size),
              std::min(config.max_tensors, optim_kernels::TensorListMetadata<2>::kMaxTensors),
              std::min(config.max_blocks, optim_kernels::TensorListMetadata<2>::kMaxBlocks), launches);
}

TEST(MultiTensorPlan, EveryElementOnceWhateverTheTableSizes) {
  const std::vector<int64_t> sizes = {1, 10, 0, 9, 100, 101, 3, 250, 0, 1, 64, 65, 7, 1000, 2, 33};
  for (const auto& [tensors, blocks] :
       std::vector<std::pair<int, int>>{{1, 1}, {1, 5}, {3, 1}, {3, 4}, {5, 7}, {16, 1000}, {1000, 1000}}) {
    optim_kernels::MultiTensorConfig config;
    config.chunk_size = 10;
    config.max_tensors = tensors;
    config.max_blocks = blocks;
    expect_plan_covers_every_element_once(sizes, config);
  }
  // The real table sizes: more tensors than one table holds, and one tensor spread
  // over more blocks than one table holds.
  optim_kernels::MultiTensorConfig config;
  config.chunk_size = 16;
  expect_plan_covers_every_element_once(std::vector<int64_t>(150, 40), config);
  expect_plan_covers_every_element_once({5, 16 * 1000 + 3, 7}, config);
}

// ---- CUDA ----

// ~40 sizes: empty, around a warp and a block, around a chunk (65536), several chunks.
std::vector<int64_t> mixed_sizes() {
  return {1,    2,    31,   32,    33,     255,    256,   257,   511,   512,   513,    1000,   1023, 1024,
          1025, 3000, 4095, 4096,  4097,   10000,  0,     65535, 65536, 65537, 100000, 131072, 7,    17,
          77,   777,  7777, 77777, 200003, 300000, 12345, 54321, 3,     5,     640,    1 << 18};
}

struct ClipCase {
  std::vector<Tensor> cpu, gpu;  // the same gradients on each device
};

// Gradients of the sizes above, dtypes taken in turn from `dtypes`.
ClipCase make_case(const std::vector<DType>& dtypes, uint64_t seed) {
  Generator gen(seed);
  ClipCase c;
  const std::vector<int64_t> sizes = mixed_sizes();
  for (size_t i = 0; i < sizes.size(); ++i) {
    const Tensor g = raw::to(randn({sizes[i]}, DType::f32, &gen), dtypes[i % dtypes.size()]);
    c.cpu.push_back(g);
    c.gpu.push_back(raw::to(g, cuda_device(0)));
  }
  return c;
}

// CUDA against CPU: the norms within 1e-6 relative, the clipped gradients within
// 1e-6 relative (f32) or one unit in the last place (f16, bf16).
void expect_cuda_matches_cpu(const ClipCase& c, const Tensor& cpu_total, const Tensor& gpu_total, const char* what) {
  ASSERT_TRUE(gpu_total.is_cuda());
  ASSERT_EQ(gpu_total.dim(), 0);
  ASSERT_EQ(gpu_total.dtype(), cpu_total.dtype());
  const double a = cpu_total.item(), b = gpu_total.item();
  std::printf("[ clip_grad_norm_ ] %s: total norm CPU %.9g, CUDA %.9g, relative difference %.2e (tolerance 1e-6)\n",
              what, a, b, std::fabs(a - b) / a);
  EXPECT_LE(std::fabs(a - b), 1e-6 * a) << what;
  for (size_t i = 0; i < c.cpu.size(); ++i) {
    const std::vector<double> x = c.cpu[i].to_vector<double>(), y = c.gpu[i].to_vector<double>();
    ASSERT_EQ(x.size(), y.size());
    // One ulp relative; f16 results below its smallest normal (2^-14) have a fixed ulp of 2^-24.
    const DType dt = c.cpu[i].dtype();
    const double tol = dt == DType::f32 ? 1e-6 : (dt == DType::bf16 ? 1.0 / 128 : 1.0 / 1024);
    const double floor = dt == DType::f16 ? std::ldexp(1.0, -14) : 0.0;
    int64_t bad = 0;
    for (size_t k = 0; k < x.size(); ++k)
      bad += std::fabs(x[k] - y[k]) > tol * std::max(std::fabs(x[k]), floor) ? 1 : 0;
    EXPECT_EQ(bad, 0) << what << ": tensor " << i << " (" << x.size() << " elements, " << dtype_name(c.cpu[i].dtype())
                      << ")";
  }
}

double hand_norm(const std::vector<Tensor>& grads) {
  double s = 0;
  for (const Tensor& g : grads) s += sum_of_squares(g);
  return std::sqrt(s);
}

TEST(ClipGradNorm, CudaMatchesCpuOnFortyTensorsOfMixedSizes) {
  MT_SKIP_WITHOUT_CUDA();
  for (const auto& [dtypes, name] : std::vector<std::pair<std::vector<DType>, const char*>>{
           {{DType::f32}, "f32"}, {{DType::bf16}, "bf16"}, {{DType::f32, DType::bf16, DType::f16}, "mixed"}}) {
    ClipCase c = make_case(dtypes, 21);
    const double expected = hand_norm(c.cpu);
    std::vector<Tensor> cpu_params, gpu_params;
    for (size_t i = 0; i < c.cpu.size(); ++i) {
      cpu_params.push_back(param_with_grad(c.cpu[i]));
      gpu_params.push_back(param_with_grad(c.gpu[i]));
    }
    const Tensor cpu_total = clip_grad_norm_(cpu_params, /*max_norm=*/1.0);
    const Tensor gpu_total = clip_grad_norm_(gpu_params, /*max_norm=*/1.0);
    EXPECT_NEAR(gpu_total.item(), expected, 1e-6 * expected) << name;
    expect_cuda_matches_cpu(c, cpu_total, gpu_total, name);
  }
}

// Small tables: launches split on the tensor table (5), on the block table (7, with a tensor
// carried over into the next launch), and big tensors take hundreds of chunks of 1000. One table
// size per case: under compute-sanitizer the one-block launches take minutes.
class ClipGradNormCudaTables : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(ClipGradNormCudaTables, LaunchSplittingReachesEveryChunk) {
  MT_SKIP_WITHOUT_CUDA();
  const auto [tensors, blocks] = GetParam();
  ClipCase c = make_case({DType::f32, DType::bf16}, 33);
  optim_kernels::MultiTensorConfig config;
  config.chunk_size = 1000;
  config.max_tensors = tensors;
  config.max_blocks = blocks;
  const double expected = hand_norm(c.cpu);
  const Tensor cpu_total = optim_kernels::clip_grad_norm_cpu(c.cpu, 0.5, 1e-6, DType::f32, config);
  const Tensor gpu_total = optim_kernels::clip_grad_norm_cuda(c.gpu, 0.5, 1e-6, DType::f32, config);
  EXPECT_NEAR(gpu_total.item(), expected, 1e-6 * expected);
  const std::string what = "tables of " + std::to_string(tensors) + " tensors, " + std::to_string(blocks) + " blocks";
  expect_cuda_matches_cpu(c, cpu_total, gpu_total, what.c_str());
}

INSTANTIATE_TEST_SUITE_P(Tables, ClipGradNormCudaTables,
                         ::testing::Values(std::make_pair(5, 7), std::make_pair(1, 1), std::make_pair(3, 320),
                                           std::make_pair(110, 2)),
                         [](const ::testing::TestParamInfo<std::pair<int, int>>& info) {
                           return std::to_string(info.param.first) + "_tensors_" + std::to_string(info.param.second) +
                                  "_blocks";
                         });

TEST(ClipGradNorm, CudaBelowMaxNormLeavesGradientsBitwiseEqual) {
  MT_SKIP_WITHOUT_CUDA();
  ClipCase c = make_case({DType::f32, DType::bf16}, 44);
  std::vector<Tensor> params;
  for (const Tensor& g : c.gpu) params.push_back(param_with_grad(raw::clone(g)));
  clip_grad_norm_(params, /*max_norm=*/1e9);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].grad().to_vector<float>(), c.cpu[i].to_vector<float>()) << i;
  }
}

TEST(ClipGradNorm, CudaF64AndNonFiniteAndDeviceErrors) {
  MT_SKIP_WITHOUT_CUDA();
  const Device gpu = cuda_device(0);
  // f64: exact rule, as on the CPU.
  const Tensor a = param_with_grad(from_vector({3, 4}, {2}, TensorOptions().dtype(DType::f64).device(gpu)));
  const Tensor b = param_with_grad(from_vector({12}, {1, 1}, TensorOptions().dtype(DType::f64).device(gpu)));
  const Tensor total = clip_grad_norm_({a, b}, 2.0);
  EXPECT_EQ(total.dtype(), DType::f64);
  EXPECT_EQ(total.item(), 13.0);
  const double coef = 2.0 / (13.0 + 1e-6);
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{3 * coef, 4 * coef}));

  // NaN: every gradient NaN.
  const Tensor c = param_with_grad(from_vector({1, 2}, {2}, TensorOptions().dtype(DType::bf16).device(gpu)));
  const Tensor d = param_with_grad(from_vector({std::nan(""), 3}, {2}, TensorOptions().dtype(DType::f32).device(gpu)));
  EXPECT_TRUE(std::isnan(clip_grad_norm_({c, d}, 1.0).item()));
  for (const Tensor& p : {c, d}) {
    for (const float v : p.grad().to_vector<float>()) EXPECT_TRUE(std::isnan(v));
  }

  // Gradients on two devices.
  const Tensor on_cpu = param_with_grad(from_vector({1, 2}, {2}, DType::f32));
  EXPECT_THROW(clip_grad_norm_({on_cpu, d}, 1.0), DeviceError);
}

}  // namespace
}  // namespace mt
