// The conversions of core/float_types.h compiled for the device: they must give
// the CPU's bits for every input (Note [Conversion rule]), and agree with CUDA's
// own conversions (__float2half_rn, __float2bfloat16_rn, __nv_cvt_float_to_fp8
// with __NV_SATFINITE) on every non-NaN input. For NaN both must be NaN: ours
// keeps the sign and payload, CUDA's is canonical.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/packed.cuh"
#include "core/float_types.h"
#include "tests/test_util.h"

namespace {

// One narrow format: the library's conversions (host and device) and CUDA's (device).
struct F16 {
  using Type = mt::Half;
  static constexpr const char* kName = "f16";
  static constexpr bool kSaturates = false;  // overflow, inf included, clips to the largest finite
  static constexpr uint32_t kPatterns = 1u << 16;
  MT_HOST_DEVICE static uint32_t encode(float f) { return mt::bits::f32_to_f16(f); }
  MT_HOST_DEVICE static float decode(uint32_t b) { return mt::bits::f16_to_f32(static_cast<uint16_t>(b)); }
  __device__ static uint32_t cuda_encode(float f) { return __half_as_ushort(__float2half_rn(f)); }
  __device__ static float cuda_decode(uint32_t b) { return __half2float(__ushort_as_half(static_cast<uint16_t>(b))); }
};

struct BF16 {
  using Type = mt::BFloat16;
  static constexpr const char* kName = "bf16";
  static constexpr bool kSaturates = false;  // overflow, inf included, clips to the largest finite
  static constexpr uint32_t kPatterns = 1u << 16;
  MT_HOST_DEVICE static uint32_t encode(float f) { return mt::bits::f32_to_bf16(f); }
  MT_HOST_DEVICE static float decode(uint32_t b) { return mt::bits::bf16_to_f32(static_cast<uint16_t>(b)); }
  __device__ static uint32_t cuda_encode(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
  __device__ static float cuda_decode(uint32_t b) {
    return __bfloat162float(__ushort_as_bfloat16(static_cast<uint16_t>(b)));
  }
};

struct F8E4M3 {
  using Type = mt::Float8E4M3;
  static constexpr const char* kName = "f8e4m3";
  static constexpr bool kSaturates = true;  // overflow, inf included, clips to the largest finite
  static constexpr uint32_t kPatterns = 1u << 8;
  MT_HOST_DEVICE static uint32_t encode(float f) { return mt::bits::f32_to_f8e4m3(f); }
  MT_HOST_DEVICE static float decode(uint32_t b) { return mt::bits::f8e4m3_to_f32(static_cast<uint8_t>(b)); }
  __device__ static uint32_t cuda_encode(float f) { return __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3); }
  __device__ static float cuda_decode(uint32_t b) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3)));
  }
};

struct F8E5M2 {
  using Type = mt::Float8E5M2;
  static constexpr const char* kName = "f8e5m2";
  static constexpr bool kSaturates = true;  // overflow, inf included, clips to the largest finite
  static constexpr uint32_t kPatterns = 1u << 8;
  MT_HOST_DEVICE static uint32_t encode(float f) { return mt::bits::f32_to_f8e5m2(f); }
  MT_HOST_DEVICE static float decode(uint32_t b) { return mt::bits::f8e5m2_to_f32(static_cast<uint8_t>(b)); }
  __device__ static uint32_t cuda_encode(float f) { return __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2); }
  __device__ static float cuda_decode(uint32_t b) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E5M2)));
  }
};

// The strided sweep over all 2^32 f32 patterns: i * 257 for i in [0, kSweepCount).
// 257 divides 2^32 - 1, so the sweep starts at 0x00000000 and ends at 0xffffffff.
constexpr uint32_t kSweepStep = 257;
constexpr uint32_t kSweepCount = 0xffffffffu / kSweepStep + 1;  // 16,711,936
static_assert(uint64_t{kSweepStep} * (kSweepCount - 1) == 0xffffffffu, "the sweep ends on the last pattern");

// ---- kernels ----

// For every pattern b of the format: our decode (as f32 bits), our re-encode, CUDA's decode.
template <typename Format>
__global__ void every_pattern_kernel(uint32_t* decoded, uint32_t* round_trip, uint32_t* cuda_decoded) {
  const uint32_t b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= Format::kPatterns) return;
  const float f = Format::decode(b);
  decoded[b] = __float_as_uint(f);
  round_trip[b] = Format::encode(f);
  cuda_decoded[b] = __float_as_uint(Format::cuda_decode(b));
}

// Input i is sweep pattern i for i < kSweepCount, then edges[i - kSweepCount].
__device__ __host__ inline uint32_t sweep_input(uint32_t i, const uint32_t* edges) {
  return i < kSweepCount ? i * kSweepStep : edges[i - kSweepCount];
}

template <typename Format>
__global__ void convert_kernel(const uint32_t* edges, uint32_t n, uint32_t* ours, uint32_t* theirs) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float x = __uint_as_float(sweep_input(i, edges));
    ours[i] = Format::encode(x);
    theirs[i] = Format::cuda_encode(x);
  }
}

// The same inputs through cuda::store_pack_from in packs of 8, as the norm and loss kernels store
// theirs: two values per instruction for the half types, a pack holding a NaN element by element.
// Only whole packs: n / 8 of them.
template <typename Format>
__global__ void pack_kernel(const uint32_t* edges, uint32_t n, uint32_t* out) {
  using E = typename Format::Type;
  for (uint32_t p = blockIdx.x * blockDim.x + threadIdx.x; p < n / 8; p += gridDim.x * blockDim.x) {
    float in[8];
    for (int k = 0; k < 8; ++k) in[k] = __uint_as_float(sweep_input(p * 8 + k, edges));
    alignas(16) E packed[8];
    mt::cuda::store_pack_from<8>(packed, in);
    for (int k = 0; k < 8; ++k) out[p * 8 + k] = packed[k].x;
  }
}

// ---- host helpers ----

// A cudaMalloc'd array of n T, freed on scope exit.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) { MT_CUDA_CHECK(cudaMalloc(&ptr_, n * sizeof(T))); }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    MT_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceArray() {
    const cudaError_t status = cudaFree(ptr_);
    if (status != cudaSuccess) ADD_FAILURE() << "cudaFree: " << cudaGetErrorString(status);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return ptr_; }
  std::vector<T> to_host() const {
    std::vector<T> host(n_);
    MT_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

std::string hex(uint32_t v) {
  std::ostringstream out;
  out << "0x" << std::hex << v;
  return out.str();
}

// Edge inputs for one format: every finite value, its f32 neighbours, and the
// midpoint (a tie) between it and the next pattern; plus the f32 specials.
template <typename Format>
std::vector<uint32_t> edge_inputs() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<uint32_t> edges = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
                                 0x7f800001u, 0xffbfffffu, 0x7f7fffffu, 0xff7fffffu, 0x00800000u, 0x00000001u,
                                 0x477ff000u, 0x43e80000u, 0x47700000u, 0x477fefffu, 0x43e80001u, 0x476fffffu};
  for (uint32_t b = 0; b < Format::kPatterns; ++b) {
    const float v = Format::decode(b);
    if (!std::isfinite(v)) continue;
    for (float x : {v, std::nextafter(v, inf), std::nextafter(v, -inf)}) edges.push_back(mt::bits::f32_to_u32(x));
    const float next = Format::decode(b + 1);
    if (b + 1 < Format::kPatterns && std::isfinite(next) && std::signbit(next) == std::signbit(v)) {
      const float mid = static_cast<float>((static_cast<double>(v) + next) / 2);
      for (float x : {mid, std::nextafter(mid, inf), std::nextafter(mid, -inf)}) {
        edges.push_back(mt::bits::f32_to_u32(x));
      }
    }
  }
  return edges;
}

template <typename Format>
class ConvertCudaTest : public ::testing::Test {};

struct FormatNames {
  template <typename Format>
  static std::string GetName(int) {
    return Format::kName;
  }
};

using Formats = ::testing::Types<F16, BF16, F8E4M3, F8E5M2>;
TYPED_TEST_SUITE(ConvertCudaTest, Formats, FormatNames);

TYPED_TEST(ConvertCudaTest, EveryPatternRoundTripsOnTheDeviceAndDecodesLikeTheCpuAndCuda) {
  MT_SKIP_WITHOUT_CUDA();
  using Format = TypeParam;
  const uint32_t n = Format::kPatterns;
  DeviceArray<uint32_t> decoded(n), round_trip(n), cuda_decoded(n);
  every_pattern_kernel<Format><<<(n + 255) / 256, 256>>>(decoded.get(), round_trip.get(), cuda_decoded.get());
  MT_CUDA_CHECK_LAUNCH();
  MT_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint32_t> dec = decoded.to_host(), back = round_trip.to_host(), cuda_dec = cuda_decoded.to_host();
  int failures = 0;
  for (uint32_t b = 0; b < n && failures < 10; ++b) {
    const float cpu = Format::decode(b);
    const uint32_t cpu_bits = mt::bits::f32_to_u32(cpu);
    const float cuda = mt::bits::u32_to_f32(cuda_dec[b]);
    // Every pattern comes back, except f8e5m2's +-inf: it saturates to +-max, the pattern just below.
    const uint32_t expected = std::isinf(cpu) && Format::kSaturates ? b - 1 : b;
    const bool ok_round_trip = back[b] == expected;
    const bool ok_cpu = dec[b] == cpu_bits;
    const bool ok_cuda = std::isnan(cpu) ? std::isnan(cuda) : cuda_dec[b] == cpu_bits;
    if (!(ok_round_trip && ok_cpu && ok_cuda)) {
      ++failures;
      ADD_FAILURE() << Format::kName << " pattern " << hex(b) << ": device round trip " << hex(back[b])
                    << ", device decode " << hex(dec[b]) << ", cpu decode " << hex(cpu_bits) << ", CUDA decode "
                    << hex(cuda_dec[b]);
    }
  }
}

TYPED_TEST(ConvertCudaTest, F32SweepMatchesTheCpuBitwiseAndCudaOnNonNaN) {
  MT_SKIP_WITHOUT_CUDA();
  using Format = TypeParam;
  const std::vector<uint32_t> edges = edge_inputs<Format>();
  const auto n = static_cast<uint32_t>(kSweepCount + edges.size());
  const DeviceArray<uint32_t> edges_dev(edges);
  DeviceArray<uint32_t> ours_dev(n), theirs_dev(n);
  convert_kernel<Format><<<132 * 16, 256>>>(edges_dev.get(), n, ours_dev.get(), theirs_dev.get());
  MT_CUDA_CHECK_LAUNCH();
  MT_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint32_t> ours = ours_dev.to_host(), theirs = theirs_dev.to_host();

  int64_t cpu_mismatches = 0, cuda_mismatches = 0, nans = 0;
  std::string first;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t bits = sweep_input(i, edges.data());
    const float x = mt::bits::u32_to_f32(bits);
    const uint32_t cpu = Format::encode(x);
    if (ours[i] != cpu && ++cpu_mismatches <= 5) {
      first += "\n  input " + hex(bits) + ": device " + hex(ours[i]) + ", cpu " + hex(cpu);
    }
    bool agrees;
    if (std::isnan(x)) {
      ++nans;
      agrees = std::isnan(Format::decode(ours[i])) && std::isnan(Format::decode(theirs[i]));
    } else {
      agrees = ours[i] == theirs[i];
    }
    if (!agrees && ++cuda_mismatches <= 5) {
      first += "\n  input " + hex(bits) + ": ours " + hex(ours[i]) + ", CUDA " + hex(theirs[i]);
    }
  }
  EXPECT_EQ(cpu_mismatches, 0) << Format::kName << ", " << n << " inputs:" << first;
  EXPECT_EQ(cuda_mismatches, 0) << Format::kName << ", " << n << " inputs:" << first;
  EXPECT_GT(nans, 0) << "the sweep reaches NaN inputs";
}

TYPED_TEST(ConvertCudaTest, PackedStoresGiveTheElementwiseBits) {
  MT_SKIP_WITHOUT_CUDA();
  using Format = TypeParam;
  const std::vector<uint32_t> edges = edge_inputs<Format>();
  const auto n = static_cast<uint32_t>(kSweepCount + edges.size()) / 8 * 8;
  const DeviceArray<uint32_t> edges_dev(edges);
  DeviceArray<uint32_t> out_dev(n);
  pack_kernel<Format><<<132 * 16, 256>>>(edges_dev.get(), n, out_dev.get());
  MT_CUDA_CHECK_LAUNCH();
  MT_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint32_t> out = out_dev.to_host();
  int64_t mismatches = 0, packs_with_nan = 0;
  std::string first;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t bits = sweep_input(i, edges.data());
    const uint32_t expected = Format::encode(mt::bits::u32_to_f32(bits));
    if (out[i] != expected && ++mismatches <= 5) {
      first += "\n  input " + hex(bits) + ": packed " + hex(out[i]) + ", element by element " + hex(expected);
    }
    if (i % 8 == 0) {
      int nan = 0;
      for (uint32_t k = i; k < i + 8; ++k) nan += std::isnan(mt::bits::u32_to_f32(sweep_input(k, edges.data())));
      packs_with_nan += nan > 0 && nan < 8;
    }
  }
  EXPECT_EQ(mismatches, 0) << Format::kName << ", " << n << " inputs:" << first;
  EXPECT_GT(packs_with_nan, 0) << "some packs mix NaN and other values";
}

}  // namespace
