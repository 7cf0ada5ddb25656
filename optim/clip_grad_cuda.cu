// Gradient-norm clipping on CUDA in three steps, all on the current stream and
// with no host sync (optim/clip_grad_kernels.h says what is computed):
//   1. per dtype, multi-tensor launches write one sum of squares per block (chunk)
//      into an f64 buffer;
//   2. one block adds the buffer up, writes the total and the clip coefficient;
//   3. per dtype, multi-tensor launches multiply every gradient by the coefficient,
//      read from device memory.
// The block -> partial slot map is fixed, so the result is deterministic.
#include "core/cuda/check.h"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "optim/clip_grad_kernels.h"
#include "optim/multi_tensor.cuh"

namespace mt::optim_kernels {

namespace {

// ---- kernels ----

constexpr int kWarpSize = 32;
static_assert(kMultiTensorThreads % kWarpSize == 0 && kMultiTensorThreads <= kWarpSize * kWarpSize,
              "block_sum needs whole warps and at most one warp of warp sums");

// Sum over the block; the result is valid in thread 0. `scratch` is __shared__
// room for one value per warp. Every thread of the block must call it once.
template <typename A>
__device__ A block_sum(A v, A* scratch) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = static_cast<int>(blockDim.x) / kWarpSize;
    v = lane < warps ? scratch[lane] : A(0);
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// Step 1: partials[block.index] = sum of g^2 over the block's chunk, in acc_t.
template <typename T>
struct SumSquaresOp {
  double* partials;  // [blocks of this dtype's apply]
  __device__ void operator()(const MultiTensorBlock<1>& block) const {
    using A = acc_t<T>;
    // Squares in acc_t, sums in f64: the CPU and CUDA totals then agree to ~1e-15
    // whatever their summation order (an f32 sum of 65536 squares does not).
    __shared__ double scratch[kMultiTensorThreads / kWarpSize];
    const T* g = static_cast<const T*>(block.ptr[0]);
    double acc = 0;
    for (int64_t i = block.begin + threadIdx.x; i < block.end; i += blockDim.x) {
      const A v = convert<A>(g[i]);
      acc += static_cast<double>(v * v);
    }
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) partials[block.index] = acc;
  }
};

// Step 2 (one block): total = sqrt(sum of partials), rounded to Out; coef from it.
template <typename Out>
__global__ void __launch_bounds__(kMultiTensorThreads)
    clip_total_kernel(const double* partials, int64_t count, double max_norm, double eps, Out* total, double* coef) {
  __shared__ double scratch[kMultiTensorThreads / kWarpSize];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) {
    const Out rounded = static_cast<Out>(sqrt(acc));
    *total = rounded;
    *coef = clip_coefficient(static_cast<double>(rounded), max_norm, eps);
  }
}

// Step 3: g *= coef in acc_t; nothing written when the coefficient is 1.
template <typename T>
struct ScaleOp {
  const double* coef;  // [1]
  __device__ void operator()(const MultiTensorBlock<1>& block) const {
    using A = acc_t<T>;
    const A c = static_cast<A>(*coef);
    if (c == A(1)) return;
    T* g = static_cast<T*>(block.ptr[0]);
    for (int64_t i = block.begin + threadIdx.x; i < block.end; i += blockDim.x) g[i] = convert<T>(convert<A>(g[i]) * c);
  }
};

// ---- launchers ----

using TensorList = std::vector<std::array<Tensor, 1>>;

// The gradients grouped by dtype, in a fixed order (one op instantiation each).
std::vector<std::pair<DType, TensorList>> group_by_dtype(const std::vector<Tensor>& grads) {
  std::vector<std::pair<DType, TensorList>> groups;
  for (const DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    TensorList list;
    for (const Tensor& g : grads) {
      if (g.dtype() == dtype && g.numel() > 0) list.push_back(std::array<Tensor, 1>{g});
    }
    if (!list.empty()) groups.emplace_back(dtype, std::move(list));
  }
  return groups;
}

int64_t block_count(const TensorList& list, int64_t chunk_size) {
  std::vector<int64_t> numels;
  for (const auto& slot : list) numels.push_back(slot[0].numel());
  return multi_tensor_block_count(numels, chunk_size);
}

}  // namespace

// ---- entry point ----

Tensor clip_grad_norm_cuda(const std::vector<Tensor>& grads, double max_norm, double eps, DType out_dtype,
                           const MultiTensorConfig& config) {
  MT_INTERNAL_ASSERT(!grads.empty() && config.chunk_size > 0);
  MT_INTERNAL_ASSERT(out_dtype == DType::f32 || out_dtype == DType::f64);
  const Device device = grads.front().device();
  const cuda::DeviceGuard guard(device.index);
  const cudaStream_t stream = cuda::current_stream(device.index).handle();
  const auto groups = group_by_dtype(grads);

  int64_t blocks = 0;
  for (const auto& group : groups) blocks += block_count(group.second, config.chunk_size);
  const Tensor partials = empty({std::max<int64_t>(blocks, 1)}, TensorOptions().dtype(DType::f64).device(device));
  const Tensor total = empty({}, TensorOptions().dtype(out_dtype).device(device));
  const Tensor coef = empty({1}, TensorOptions().dtype(DType::f64).device(device));

  // 1. Sums of squares, one partial per block; each dtype's blocks follow the previous ones.
  int64_t offset = 0;
  for (const auto& group : groups) {
    const TensorList& list = group.second;
    dispatch_floating(group.first, "clip_grad_norm_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      multi_tensor_apply<1>(list, SumSquaresOp<T>{partials.data<double>() + offset}, stream, config);
    });
    offset += block_count(list, config.chunk_size);
  }
  MT_INTERNAL_ASSERT(offset == blocks);

  // 2. The total and the coefficient (blocks == 0 only when every gradient is empty).
  const auto total_launch = [&](auto* out) {
    clip_total_kernel<<<1, kMultiTensorThreads, 0, stream>>>(partials.data<double>(), blocks, max_norm, eps, out,
                                                             coef.data<double>());
    MT_CUDA_CHECK_LAUNCH();
  };
  if (out_dtype == DType::f64) {
    total_launch(total.data<double>());
  } else {
    total_launch(total.data<float>());
  }

  // 3. Scale.
  for (const auto& group : groups) {
    const TensorList& list = group.second;
    dispatch_floating(group.first, "clip_grad_norm_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      multi_tensor_apply<1>(list, ScaleOp<T>{coef.data<double>()}, stream, config);
    });
  }
  return total;
}

}  // namespace mt::optim_kernels
