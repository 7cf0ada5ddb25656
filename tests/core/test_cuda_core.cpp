// CUDA against CPU for core/: random streams, transfers, dtype conversions and
// strided copies must give the CPU's bits; streams, events and the allocator
// keep their documented contracts. Every GPU case skips, with the reason, where
// no CUDA device is visible; the last tests check what a CPU-only machine says.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/cuda/dependent_launch.h"
#include "core/cuda_context.h"
#include "core/error.h"
#include "core/float_types.h"
#include "core/random.h"
#include "core/tensor.h"
#include "core/view.h"
#include "tests/test_util.h"

namespace {

using mt::DType;
using mt::Shape;
using mt::Tensor;
using mt::TensorOptions;

const mt::Device kCuda = mt::cuda_device(0);

const DType kAllDTypes[] = {DType::f64,    DType::f32, DType::f16, DType::bf16, DType::f8e4m3,
                            DType::f8e5m2, DType::i64, DType::i32, DType::u8,   DType::boolean};

std::string dtype_test_name(const ::testing::TestParamInfo<DType>& info) { return mt::dtype_name(info.param); }

// The bytes of a tensor's elements in row-major order, fetched to the host.
std::vector<uint8_t> host_bytes(const Tensor& t) {
  const Tensor c = mt::raw::contiguous(mt::raw::to(t, mt::kCPU));
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

// Index of the first differing element (of `element_size` bytes), or -1.
int64_t first_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, size_t element_size) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); i += element_size) {
    if (std::memcmp(&a[i], &b[i], element_size) != 0) return static_cast<int64_t>(i / element_size);
  }
  return -1;
}

// A CPU tensor of random bytes (0/1 for bool): every bit pattern of the dtype, NaNs included.
Tensor random_bits(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = mt::empty(shape, dtype);
  std::mt19937 rng(seed);
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(dtype == DType::boolean ? rng() & 1u : rng());
  return t;
}

// n f32 values: the edges of every narrow format first, then random bit patterns.
Tensor f32_with_specials(int64_t n, uint32_t seed) {
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f,
                            -0.0f,
                            inf,
                            -inf,
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            mt::bits::u32_to_f32(0x7f800001u),
                            mt::bits::u32_to_f32(0xffbfffffu),
                            std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::min(),
                            std::numeric_limits<float>::denorm_min(),
                            65504.0f,
                            65520.0f,
                            std::nextafter(65520.0f, 0.0f),
                            448.0f,
                            464.0f,
                            std::nextafter(464.0f, inf),
                            57344.0f,
                            61440.0f,
                            1e30f,
                            -1e30f,
                            std::ldexp(1.0f, -24),
                            std::ldexp(1.0f, -25),
                            std::ldexp(3.0f, -25),
                            std::ldexp(1.0f, -9),
                            std::ldexp(1.0f, -10),
                            std::ldexp(1.0f, -16),
                            std::ldexp(1.0f, -17),
                            std::ldexp(1.0f, -133),
                            std::ldexp(1.0f, -134),
                            1.0f + std::ldexp(1.0f, -11),
                            1.0f + std::ldexp(3.0f, -11),
                            1.0f + std::ldexp(1.0f, -8)};
  Tensor t = random_bits({n}, DType::f32, seed);
  auto* p = t.data<float>();
  for (size_t i = 0; i < std::size(specials) && static_cast<int64_t>(i) < n; ++i) p[i] = specials[i];
  return t;
}

// ---- random streams: the same (seed, offset) gives the same numbers on both devices ----

class CudaRandomTest : public ::testing::TestWithParam<DType> {};

TEST_P(CudaRandomTest, UniformIsBitwiseEqualToCpu) {
  MT_SKIP_WITHOUT_CUDA();
  mt::Generator on_cpu(/*seed=*/77), on_cuda(/*seed=*/77);
  on_cpu.set_offset(1000);
  on_cuda.set_offset(1000);
  const Shape shape = {1025, 1023};  // not a multiple of 4
  const Tensor c = mt::rand(shape, GetParam(), &on_cpu);
  const Tensor g = mt::rand(shape, TensorOptions().dtype(GetParam()).device(kCuda), &on_cuda);
  EXPECT_EQ(g.device(), kCuda);
  EXPECT_EQ(first_difference(host_bytes(c), host_bytes(g), c.element_size()), -1);
  EXPECT_EQ(on_cpu.offset(), on_cuda.offset());
}

TEST_P(CudaRandomTest, NormalMatchesCpuToAFewUlps) {
  MT_SKIP_WITHOUT_CUDA();
  mt::Generator on_cpu(/*seed=*/78), on_cuda(/*seed=*/78);
  const Shape shape = {1 << 20};
  const std::vector<double> c = mt::randn(shape, GetParam(), &on_cpu).to_vector<double>();
  const std::vector<double> g =
      mt::randn(shape, TensorOptions().dtype(GetParam()).device(kCuda), &on_cuda).to_vector<double>();
  ASSERT_EQ(c.size(), g.size());
  int64_t bad = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    // logf / sinf / cosf differ in the last bits between the host and the device.
    if (!(std::fabs(c[i] - g[i]) <= 1e-6 * std::max(1.0, std::fabs(c[i]))) && ++bad <= 5) {
      ADD_FAILURE() << "element " << i << ": cpu " << c[i] << ", cuda " << g[i];
    }
  }
  EXPECT_EQ(bad, 0);
}

INSTANTIATE_TEST_SUITE_P(Floating, CudaRandomTest, ::testing::Values(DType::f32, DType::f64), dtype_test_name);

TEST(CudaRandom, ManualSeedSeedsTheCudaGenerator) {
  MT_SKIP_WITHOUT_CUDA();
  mt::manual_seed(123);
  const Tensor c = mt::rand({4099});
  const Tensor g = mt::rand({4099}, kCuda);
  EXPECT_EQ(host_bytes(c), host_bytes(g));
  EXPECT_EQ(mt::default_generator(kCuda).offset(), mt::default_generator(mt::kCPU).offset());
  EXPECT_EQ(mt::default_generator(kCuda).seed(), 123u);
}

// arange is made on the device (a captured graph must not copy from host memory), with the
// host's rounding: every dtype, fractional and negative steps, bitwise equal to the CPU's.
// Values stay inside what each dtype holds (converting others to an integer is undefined).
TEST(CudaFactories, ArangeIsBitwiseEqualToTheCpuOne) {
  MT_SKIP_WITHOUT_CUDA();
  for (const DType dtype : kAllDTypes) {
    if (dtype == DType::boolean) continue;
    std::vector<std::tuple<double, double, double>> ranges = {{0.0, 250.0, 1.0}, {0.1, 7.3, 0.3}};
    if (dtype != DType::u8) ranges.emplace_back(5.0, -3.0, -0.7);
    if (dtype != DType::u8 && dtype != DType::f8e4m3) ranges.emplace_back(0.0, 4099.0, 1.0);
    for (const auto& [start, end, step] : ranges) {
      const Tensor c = mt::arange(start, end, step, TensorOptions().dtype(dtype));
      const Tensor g = mt::arange(start, end, step, TensorOptions().dtype(dtype).device(kCuda));
      EXPECT_TRUE(g.is_cuda());
      EXPECT_EQ(host_bytes(g), host_bytes(c)) << mt::dtype_name(dtype) << " start " << start << " step " << step;
    }
  }
}

// ---- transfers and conversions ----

class CudaDTypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(CudaDTypeTest, ToCudaAndBackRoundTripsEveryBit) {
  MT_SKIP_WITHOUT_CUDA();
  const Tensor cpu = random_bits({257, 33}, GetParam(), /*seed=*/11);
  const Tensor gpu = mt::raw::to(cpu, kCuda);
  EXPECT_EQ(gpu.device(), kCuda);
  EXPECT_EQ(gpu.dtype(), GetParam());
  EXPECT_EQ(gpu.shape(), cpu.shape());
  EXPECT_EQ(host_bytes(gpu), host_bytes(cpu));
  // Non-contiguous on either side: a transposed view travels as its elements.
  EXPECT_EQ(host_bytes(mt::raw::transpose(gpu, 0, 1)), host_bytes(mt::raw::transpose(cpu, 0, 1)));
  EXPECT_EQ(host_bytes(mt::raw::to(mt::raw::slice(cpu, 1, 1, 33, 3), kCuda)),
            host_bytes(mt::raw::slice(cpu, 1, 1, 33, 3)));
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, CudaDTypeTest, ::testing::ValuesIn(kAllDTypes), dtype_test_name);

class CudaConvertTest : public ::testing::TestWithParam<DType> {};

TEST_P(CudaConvertTest, F32ToNarrowAndBackIsBitwiseEqualToCpu) {
  MT_SKIP_WITHOUT_CUDA();
  const DType dtype = GetParam();
  const Tensor src = f32_with_specials(int64_t{1} << 22, /*seed=*/12);
  const Tensor src_gpu = mt::raw::to(src, kCuda);
  const Tensor narrow_cpu = mt::raw::to(src, dtype);
  const Tensor narrow_gpu = mt::raw::to(src_gpu, dtype);
  ASSERT_TRUE(narrow_gpu.is_cuda());
  const int64_t at = first_difference(host_bytes(narrow_cpu), host_bytes(narrow_gpu), narrow_cpu.element_size());
  EXPECT_EQ(at, -1) << "f32 -> " << mt::dtype_name(dtype) << " differs first at element " << at << ", input bits 0x"
                    << std::hex << (at >= 0 ? mt::bits::f32_to_u32(src.data<float>()[at]) : 0u);
  // And back: narrow -> f32 decodes the same on both devices.
  EXPECT_EQ(first_difference(host_bytes(mt::raw::to(narrow_cpu, DType::f32)),
                             host_bytes(mt::raw::to(narrow_gpu, DType::f32)), 4),
            -1);
}

INSTANTIATE_TEST_SUITE_P(Targets, CudaConvertTest,
                         ::testing::Values(DType::f16, DType::bf16, DType::f8e4m3, DType::f8e5m2, DType::f64),
                         dtype_test_name);

// ---- strided copies ----

// A sequence of strided, converting and broadcasting copies on `device`; returns the
// bytes of every destination so that the devices can be compared.
std::vector<std::vector<uint8_t>> strided_copies(const Tensor& host_src, mt::Device device) {
  using namespace mt::raw;
  const Tensor src = to(host_src, device);  // [37, 53] f32
  auto zeros = [&](const Shape& shape, DType dtype) {
    return mt::zeros(shape, TensorOptions().dtype(dtype).device(device));
  };
  Tensor d1 = zeros({53, 37}, DType::f16);
  d1.copy_(transpose(src, 0, 1));  // transposed source, converted
  Tensor d2 = zeros({60, 40}, DType::f32);
  narrow(narrow(transpose(d2, 0, 1), 0, 2, 37), 1, 3, 53).copy_(src);  // transposed, offset destination
  Tensor d3 = zeros({37, 27}, DType::f64);
  d3.copy_(slice(src, 1, 0, 53, 2));  // stepped source
  Tensor d4 = zeros({74, 53}, DType::bf16);
  slice(d4, 0, 1, 74, 2).copy_(src);  // stepped destination
  Tensor d5 = zeros({3, 37, 53}, DType::f32);
  d5.copy_(src);                                    // broadcast over a new leading dim
  narrow(d5, 2, 0, 1).copy_(narrow(src, 1, 5, 1));  // a column into a strided column
  Tensor d6 = zeros({53, 2, 37}, DType::f8e4m3);
  permute(d6, {2, 1, 0}).copy_(unsqueeze(src, 1));  // permuted destination, expanded source
  Tensor d7 = zeros({37, 53}, DType::f32);
  transpose(d7, 0, 1).copy_(transpose(src, 0, 1));  // both transposed: same layout
  // Rows of a wider buffer, same dtype (the 2-D copy path): into a window, out of one,
  // and 3-D windows whose leading dims merge into one row dimension.
  Tensor d8 = zeros({37, 3 * 53}, DType::f32);
  narrow(d8, 1, 53, 53).copy_(src);
  Tensor d9 = zeros({37, 20}, DType::f32);
  d9.copy_(narrow(src, 1, 10, 20));
  Tensor d10 = zeros({2, 18, 2 * 53}, DType::f32);
  narrow(d10, 2, 53, 53).copy_(reshape(narrow(src, 0, 0, 36), {2, 18, 53}));
  Tensor d11 = zeros({2, 37, 2 * 53}, DType::f32);
  narrow(d11, 2, 0, 53).copy_(expand(unsqueeze(src, 0), {2, 37, 53}));  // expanded: not one row stride
  return {host_bytes(d1), host_bytes(d2), host_bytes(d3), host_bytes(d4),  host_bytes(d5), host_bytes(d6),
          host_bytes(d7), host_bytes(d8), host_bytes(d9), host_bytes(d10), host_bytes(d11)};
}

TEST(CudaCopy, StridedCopiesMatchTheCpu) {
  MT_SKIP_WITHOUT_CUDA();
  const Tensor src = mt::uniform({37, 53}, -500.0, 500.0);
  const auto on_cpu = strided_copies(src, mt::kCPU);
  const auto on_gpu = strided_copies(src, kCuda);
  ASSERT_EQ(on_cpu.size(), on_gpu.size());
  for (size_t i = 0; i < on_cpu.size(); ++i) EXPECT_EQ(on_cpu[i], on_gpu[i]) << "destination d" << i + 1;
}

TEST(CudaCopy, AcrossDevicesIntoStridedViews) {
  MT_SKIP_WITHOUT_CUDA();
  const Tensor src = mt::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  // CPU source into a transposed CUDA view, with conversion.
  Tensor gpu = mt::zeros({3, 2}, TensorOptions().dtype(DType::bf16).device(kCuda));
  mt::raw::transpose(gpu, 0, 1).copy_(src);
  EXPECT_EQ(gpu.to_vector<double>(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
  // Transposed CUDA source into a stepped CPU view.
  Tensor cpu = mt::zeros({6, 2}, DType::i32);
  mt::raw::slice(cpu, 0, 0, 6, 2).copy_(mt::raw::transpose(mt::raw::to(src, kCuda), 0, 1));
  EXPECT_EQ(cpu.to_vector<int32_t>(), (std::vector<int32_t>{1, 4, 0, 0, 2, 5, 0, 0, 3, 6, 0, 0}));
  // Broadcast across devices.
  Tensor rows = mt::zeros({2, 3}, kCuda);
  rows.copy_(mt::from_vector({7, 8, 9}, {3}));
  EXPECT_EQ(rows.to_vector<double>(), (std::vector<double>{7, 8, 9, 7, 8, 9}));
}

TEST(CudaViews, WritesThroughViewsReachTheBase) {
  MT_SKIP_WITHOUT_CUDA();
  Tensor base = mt::raw::to(mt::raw::view(mt::arange(0.0, 24.0), {2, 3, 4}), kCuda);
  mt::raw::narrow(base, 2, 1, 2).fill_(-1.0);
  mt::raw::transpose(mt::raw::slice(base, 1, 0, 3, 2), 1, 2).copy_(mt::full({2, 4, 2}, 50.0));
  const std::vector<double> got = base.to_vector<double>();
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      for (int k = 0; k < 4; ++k) {
        const double expected = j % 2 == 0 ? 50.0 : (k == 1 || k == 2) ? -1.0 : 12 * i + 4 * j + k;
        EXPECT_EQ(got[static_cast<size_t>(12 * i + 4 * j + k)], expected) << i << "," << j << "," << k;
      }
    }
  }
  // And the other way: a write to the base shows in a view made before it.
  const Tensor view = mt::raw::permute(base, {2, 0, 1});
  base.fill_(3.0);
  EXPECT_EQ(view.to_vector<double>(), std::vector<double>(24, 3.0));
}

// ---- streams and events ----

TEST(CudaStreams, StreamGuardSetsAndRestoresTheCurrentStream) {
  MT_SKIP_WITHOUT_CUDA();
  const mt::cuda::Stream before = mt::cuda::current_stream(0);
  ASSERT_NE(before.handle(), nullptr) << "the default stream is a created stream, never the legacy null stream";
  const mt::cuda::Stream a = mt::cuda::Stream::create(0);
  const mt::cuda::Stream b = mt::cuda::Stream::create(0, mt::cuda::Stream::Priority::high);
  EXPECT_FALSE(a == before);
  EXPECT_FALSE(a == b);
  {
    mt::cuda::StreamGuard guard_a(a);
    EXPECT_TRUE(mt::cuda::current_stream(0) == a);
    {
      mt::cuda::StreamGuard guard_b(b);
      EXPECT_TRUE(mt::cuda::current_stream(0) == b);
    }
    EXPECT_TRUE(mt::cuda::current_stream(0) == a);
    Tensor t = mt::full({1000}, 2.0, kCuda);  // work on `a`
    a.synchronize();
    EXPECT_TRUE(a.query());
  }
  EXPECT_TRUE(mt::cuda::current_stream(0) == before);
}

TEST(CudaStreams, EventOrdersACopyAcrossStreams) {
  MT_SKIP_WITHOUT_CUDA();
  const mt::cuda::Stream producer = mt::cuda::Stream::create(0), consumer = mt::cuda::Stream::create(0);
  const int64_t n = int64_t{1} << 24;
  mt::cuda::Event ready(0);
  Tensor x;
  {
    mt::cuda::StreamGuard guard(producer);
    x = mt::empty({n}, kCuda);
    // Many passes, so that the consumer would see a stale value if it did not wait.
    for (int pass = 0; pass < 40; ++pass) x.fill_(pass);
    x.fill_(1234.0);
    ready.record(producer);
  }
  Tensor y;
  {
    mt::cuda::StreamGuard guard(consumer);
    ready.wait_on(consumer);
    y = mt::empty({n}, kCuda);
    y.copy_(x);
  }
  consumer.synchronize();
  EXPECT_TRUE(ready.query());
  const std::vector<float> got = y.to_vector<float>();
  EXPECT_EQ(std::count(got.begin(), got.end(), 1234.0f), n);
  producer.synchronize();
}

TEST(CudaStreams, EventTiming) {
  MT_SKIP_WITHOUT_CUDA();
  const mt::cuda::Stream s = mt::cuda::Stream::create(0);
  mt::cuda::Event start(0, mt::cuda::Event::Timing::enabled), stop(0, mt::cuda::Event::Timing::enabled);
  mt::cuda::StreamGuard guard(s);
  Tensor t = mt::empty({int64_t{1} << 22}, kCuda);
  start.record(s);
  for (int i = 0; i < 10; ++i) t.fill_(i);
  stop.record(s);
  stop.synchronize();
  EXPECT_TRUE(stop.query());
  const float ms = start.elapsed_ms(stop);
  EXPECT_GE(ms, 0.0f);
  EXPECT_LT(ms, 10000.0f);
  mt::cuda::Event moved = std::move(start);  // move-only, still usable
  EXPECT_GE(moved.elapsed_ms(stop), 0.0f);
}

// ---- memory ----

TEST(CudaMemory, StatsFollowTensorLifetimes) {
  MT_SKIP_WITHOUT_CUDA();
  const size_t bytes = size_t{4} << 20;
  const mt::cuda::MemoryStats before = mt::cuda::memory_stats(0);
  {
    const Tensor t = mt::empty({static_cast<int64_t>(bytes / 4)}, kCuda);
    const mt::cuda::MemoryStats during = mt::cuda::memory_stats(0);
    EXPECT_EQ(during.allocated, before.allocated + bytes);
    EXPECT_GE(during.peak_allocated, during.allocated);
    EXPECT_GE(during.reserved, during.allocated);
    EXPECT_GT(during.device_total, 0u);
    EXPECT_LE(during.device_free, during.device_total);
  }
  const mt::cuda::MemoryStats after = mt::cuda::memory_stats(0);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_GE(after.peak_allocated, before.allocated + bytes);
  mt::cuda::reset_peak_memory(0);
  EXPECT_EQ(mt::cuda::memory_stats(0).peak_allocated, after.allocated);
  mt::cuda::empty_cache(0);
  EXPECT_EQ(mt::cuda::memory_stats(0).allocated, after.allocated);
}

TEST(CudaMemory, OversizedAllocationThrowsOutOfMemoryWithTheFigures) {
  MT_SKIP_WITHOUT_CUDA();
  const int64_t four_tib = int64_t{1} << 42;
  const size_t allocated = mt::cuda::memory_stats(0).allocated;
  try {
    mt::empty({four_tib}, TensorOptions().dtype(DType::u8).device("cuda"));
    FAIL() << "a 4 TiB allocation succeeded";
  } catch (const mt::OutOfMemoryError& e) {
    const std::string msg = e.what();
    for (const std::string& part :
         {std::string("tried to allocate"), std::string("cuda:0"), std::string("allocated"), std::string("reserved"),
          std::string("peak"), mt::cuda::format_bytes(static_cast<size_t>(four_tib))}) {
      EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
    }
  }
  EXPECT_EQ(mt::cuda::memory_stats(0).allocated, allocated) << "a failed allocation is not counted";
  EXPECT_EQ(mt::full({4}, 1.0, kCuda).to_vector<double>(), std::vector<double>(4, 1.0)) << "the device still works";
}

// ---- runs everywhere ----

// The guard sets the dependent launch for a scope and restores it, nested, in every build: a
// CPU-only build keeps the setting too (it launches nothing), so code that sets it reads it back.
TEST(DependentLaunch, GuardSetsAndRestoresTheSetting) {
  const bool before = mt::cuda::dependent_launch_requested();
  {
    const mt::cuda::DependentLaunchGuard off(false);
    EXPECT_FALSE(mt::cuda::dependent_launch_requested());
    {
      const mt::cuda::DependentLaunchGuard on(true);
      EXPECT_TRUE(mt::cuda::dependent_launch_requested());
    }
    EXPECT_FALSE(mt::cuda::dependent_launch_requested());
  }
  EXPECT_EQ(mt::cuda::dependent_launch_requested(), before);
}

TEST(CudaFormat, FormatBytes) {
  EXPECT_EQ(mt::cuda::format_bytes(0), "0 B");
  EXPECT_EQ(mt::cuda::format_bytes(1023), "1023 B");
  EXPECT_EQ(mt::cuda::format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(mt::cuda::format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(mt::cuda::format_bytes(size_t{3} << 30), "3.00 GiB");
  EXPECT_EQ(mt::cuda::format_bytes(size_t{1} << 42), "4.00 TiB");
  EXPECT_EQ(mt::cuda::format_bytes(size_t{1} << 50), "1024.00 TiB");
}

TEST(CudaUnavailable, CudaTensorsThrowDeviceError) {
  if (mt::cuda::is_available()) GTEST_SKIP() << "a CUDA device is present; this checks machines without one";
  EXPECT_EQ(mt::cuda::device_count(), 0);
  try {
    mt::empty({2}, "cuda");
    FAIL() << "made a CUDA tensor without a CUDA device";
  } catch (const mt::DeviceError& e) {
    std::string msg = e.what();
    std::transform(msg.begin(), msg.end(), msg.begin(), [](unsigned char c) { return std::tolower(c); });
    EXPECT_NE(msg.find("cuda"), std::string::npos) << e.what();
  }
  EXPECT_THROW(mt::rand({2}, kCuda), mt::DeviceError);
  EXPECT_THROW(mt::raw::to(mt::zeros({2}), kCuda), mt::DeviceError);
  EXPECT_THROW(mt::cuda::memory_stats(0), mt::DeviceError);
}

}  // namespace
