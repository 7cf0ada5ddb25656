// CUDA kernels of the optimizers and the loss scaler: multi-tensor launches
// (optim/multi_tensor.cuh) over whole lists of parameters. The loss scale, the
// found-inf flag and the step counts stay in device memory: no host sync per
// step (DESIGN 4).
#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda/packed.cuh"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "optim/multi_tensor.cuh"
#include "optim/optim_kernels.h"
#include "optim/optim_math.h"

namespace mt::optim_kernels {

namespace {

// ---- multi-tensor ops (optim/multi_tensor.cuh runs them over whole lists) ----

// grad *= 1 / scale in place; raises found_inf if any result is inf or NaN.
template <typename T>
struct UnscaleOp {
  const float* scale;
  float* found_inf;
  __device__ void operator()(const MultiTensorBlock<1>& block) const {
    using A = acc_t<T>;
    const A inv_scale = static_cast<A>(1.0f / *scale);
    T* g = static_cast<T*>(block.ptr[0]);
    bool bad = false;
    for (int64_t i = block.begin + threadIdx.x; i < block.end; i += blockDim.x) {
      const A v = convert<A>(g[i]) * inv_scale;
      bad |= !isfinite(v);
      g[i] = convert<T>(v);
    }
    if (bad) *found_inf = 1.0f;  // a benign race: every writer stores the same value
  }
};

// Every element of each tensor set to 0.
template <typename T>
struct ZeroOp {
  __device__ void operator()(const MultiTensorBlock<1>& block) const {
    T* p = static_cast<T*>(block.ptr[0]);
    for (int64_t i = block.begin + threadIdx.x; i < block.end; i += blockDim.x) p[i] = T(0);
  }
};

// step += 1 for each slot (list 0 holds the one-element step counts), unless found_inf.
struct AdvanceStepOp {
  const float* found_inf;
  __device__ void operator()(const MultiTensorBlock<1>& block) const {
    if (threadIdx.x != 0 || (found_inf != nullptr && *found_inf != 0.0f)) return;
    *static_cast<int64_t*>(block.ptr[0]) += 1;
  }
};

// Whether p can be read and written as whole packs of kVec elements (cuda::aligned_to is the
// host's twin).
template <int kVec, typename E>
__device__ __forceinline__ bool vec_aligned(const E* p) {
  return reinterpret_cast<uintptr_t>(p) % sizeof(cuda::Pack<E, kVec>) == 0;
}

// Lists: param (T), grad (T), exp_avg (A), exp_avg_sq (A), step (i64, one element), and with
// kMaster the f32 master copy (A), or with a copy type C (not void) the parameter's copy in C
// that autocast is given (AdamWOptions::autocast_copies; f32 parameters only, never beside a
// master).
template <typename T, bool kMaster, typename C = void>
struct AdamWOp {
  static constexpr bool kCopy = !std::is_void_v<C>;
  static_assert(!(kMaster && kCopy), "a master copy's parameter is already narrow");
  using CopyT = std::conditional_t<kCopy, C, T>;  // an unused stand-in without a copy
  static constexpr int kDepth = 5 + (kMaster ? 1 : 0) + (kCopy ? 1 : 0);
  // Elements per thread and access: every load of a thread's kVec elements of all lists is in
  // flight at once, and a block moves 4x the bytes per round trip of one element at a time
  // (which left AdamW well short of the copy bandwidth).
  static constexpr int kVec = 4;
  AdamWArgs args;
  const float* found_inf;

  // Elements [i, i + n) in one go, n <= kVec; vectorised: whole-pack accesses (n == kVec).
  template <bool kVectorised>
  __device__ __forceinline__ void update(T* param, const T* grad, acc_t<T>* m, acc_t<T>* v, acc_t<T>* master,
                                         CopyT* copy, int64_t i, int n, const AdamWCoefficients& c) const {
    using A = acc_t<T>;
    cuda::Pack<T, kVec> p_low{}, g{};  // zeros past n: harmless values for the unrolled update
    cuda::Pack<A, kVec> mv{}, vv{}, p{};
    if constexpr (kVectorised) {
      g = *reinterpret_cast<const cuda::Pack<T, kVec>*>(grad + i);
      mv = *reinterpret_cast<const cuda::Pack<A, kVec>*>(m + i);
      vv = *reinterpret_cast<const cuda::Pack<A, kVec>*>(v + i);
      if constexpr (kMaster) p = *reinterpret_cast<const cuda::Pack<A, kVec>*>(master + i);
      if constexpr (!kMaster) p_low = *reinterpret_cast<const cuda::Pack<T, kVec>*>(param + i);
    } else {
      for (int k = 0; k < n; ++k) {
        g.v[k] = grad[i + k], mv.v[k] = m[i + k], vv.v[k] = v[i + k];
        if constexpr (kMaster) p.v[k] = master[i + k];
        if constexpr (!kMaster) p_low.v[k] = param[i + k];
      }
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      if (!kMaster) p.v[k] = convert<A>(p_low.v[k]);
      adamw_update<A>(p.v[k], convert<A>(g.v[k]), mv.v[k], vv.v[k], c);
      p_low.v[k] = convert<T>(p.v[k]);
    }
    if constexpr (kVectorised) {
      *reinterpret_cast<cuda::Pack<A, kVec>*>(m + i) = mv;
      *reinterpret_cast<cuda::Pack<A, kVec>*>(v + i) = vv;
      if constexpr (kMaster) *reinterpret_cast<cuda::Pack<A, kVec>*>(master + i) = p;
      *reinterpret_cast<cuda::Pack<T, kVec>*>(param + i) = p_low;
      if constexpr (kCopy) cuda::store_pack_from<kVec>(copy + i, p_low.v);  // as a cast of the stored value
    } else {
      for (int k = 0; k < n; ++k) {
        m[i + k] = mv.v[k], v[i + k] = vv.v[k], param[i + k] = p_low.v[k];
        if constexpr (kMaster) master[i + k] = p.v[k];
        if constexpr (kCopy) copy[i + k] = convert<C>(p_low.v[k]);
      }
    }
  }

  // A skipped step leaves the parameter as it is, and its copy must still be its cast: the
  // first step's copy is new.
  __device__ __forceinline__ void copy_unchanged(const T* param, CopyT* copy, int64_t begin, int64_t end) const {
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) copy[i] = convert<CopyT>(param[i]);
  }

  __device__ void operator()(const MultiTensorBlock<kDepth>& block) const {
    using A = acc_t<T>;
    T* param = static_cast<T*>(block.ptr[0]);
    CopyT* copy = kCopy ? static_cast<CopyT*>(block.ptr[kDepth - 1]) : nullptr;
    if (found_inf != nullptr && *found_inf != 0.0f) {
      if constexpr (kCopy) copy_unchanged(param, copy, block.begin, block.end);
      return;
    }
    AdamWArgs now = args;
    if (now.lr_on_device != nullptr) now.lr = *now.lr_on_device;
    const AdamWCoefficients c = AdamWCoefficients::from(now, *static_cast<const int64_t*>(block.ptr[4]));
    const T* grad = static_cast<const T*>(block.ptr[1]);
    A* m = static_cast<A*>(block.ptr[2]);
    A* v = static_cast<A*>(block.ptr[3]);
    A* master = kMaster ? static_cast<A*>(block.ptr[kDepth - 1]) : nullptr;
    // A chunk starts at a multiple of the chunk size (a multiple of kVec), so whole-pack
    // accesses need only the tensors themselves aligned, as the allocator's are; views at an
    // odd offset take the element loop.
    const bool aligned = vec_aligned<kVec>(param) && vec_aligned<kVec>(grad) && vec_aligned<kVec>(m) &&
                         vec_aligned<kVec>(v) && (!kMaster || vec_aligned<kVec>(master)) &&
                         (!kCopy || vec_aligned<kVec>(copy)) && block.begin % kVec == 0;
    int64_t i = block.begin + static_cast<int64_t>(threadIdx.x) * kVec;
    if (aligned) {
      for (; i + kVec <= block.end; i += static_cast<int64_t>(blockDim.x) * kVec) {
        update<true>(param, grad, m, v, master, copy, i, kVec, c);
      }
    }
    // The rest: the tail of the last chunk (fewer than blockDim.x * kVec elements), or the
    // whole chunk when unaligned; each thread takes up to kVec consecutive elements per step.
    if (!aligned) i = block.begin + static_cast<int64_t>(threadIdx.x) * kVec;
    for (; i < block.end; i += static_cast<int64_t>(blockDim.x) * kVec) {
      update<false>(param, grad, m, v, master, copy, i, static_cast<int>(block.end - i < kVec ? block.end - i : kVec),
                    c);
    }
  }
};

__global__ void scaler_update_kernel(float* scale, int32_t* tracker, int32_t* skips, const float* found_inf,
                                     ScalerUpdateArgs args) {
  if (*found_inf != 0.0f) {
    *scale = static_cast<float>(*scale * args.backoff);
    *tracker = 0;
    *skips += 1;
    return;
  }
  *skips = 0;
  if (++*tracker >= args.interval) {
    *scale = static_cast<float>(*scale * args.growth);
    *tracker = 0;
  }
}

// Elements per block of the element-wise multi-tensor ops (unscale, AdamW): PyTorch's 65536 for a
// large model, fewer for a small one, so that its launch still has about kMinBlocks blocks (two
// per SM of an H100 or H200, and within one launch's table). A 4 x Linear(1024) MLP's 4.2M
// parameters made 68 blocks of 65536, fewer than the GPU's SMs.
template <size_t Depth>
MultiTensorConfig elementwise_config(const std::vector<std::array<Tensor, Depth>>& list) {
  constexpr int64_t kMinBlocks = 256, kGranule = 4096, kMaxChunk = 65536;
  int64_t total = 0;
  for (const auto& tensors : list) total += tensors[0].numel();
  MultiTensorConfig config;
  config.chunk_size = std::clamp((total / kMinBlocks + kGranule - 1) / kGranule * kGranule, kGranule, kMaxChunk);
  return config;
}

// fn(tag of T, list) for each floating dtype T among the tensors, with those of that dtype: one
// multi-tensor launch per dtype.
template <typename Fn>
void for_each_dtype(const std::vector<Tensor>& tensors, const char* name, Fn&& fn) {
  for (const DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    std::vector<std::array<Tensor, 1>> list;
    for (const Tensor& t : tensors) {
      if (t.dtype() == dtype) list.push_back({t});
    }
    if (list.empty()) continue;
    dispatch_floating(dtype, name, [&](auto tag) { fn(tag, list); });
  }
}

}  // namespace

// ---- entry points ----

void unscale_cuda(const std::vector<Tensor>& grads, const Tensor& scale, const Tensor& found_inf) {
  if (grads.empty()) return;
  const cuda::Stream stream = cuda::current_stream(scale.device().index);
  for_each_dtype(grads, "unscale_", [&](auto tag, const std::vector<std::array<Tensor, 1>>& list) {
    using T = typename decltype(tag)::type;
    multi_tensor_apply<1>(list, UnscaleOp<T>{scale.data<float>(), found_inf.data<float>()}, stream.handle(),
                          elementwise_config(list));
  });
}

void zero_cuda(const std::vector<Tensor>& tensors) {
  if (tensors.empty()) return;
  const cuda::Stream stream = cuda::current_stream(tensors.front().device().index);
  for_each_dtype(tensors, "zero_grad", [&](auto tag, const std::vector<std::array<Tensor, 1>>& list) {
    using T = typename decltype(tag)::type;
    multi_tensor_apply<1>(list, ZeroOp<T>{}, stream.handle(), elementwise_config(list));
  });
}

void adamw_cuda(const std::vector<AdamWTensors>& list, const AdamWArgs& args, const Tensor& found_inf) {
  if (list.empty()) return;
  const cuda::Stream stream = cuda::current_stream(list.front().param.device().index);
  const float* flag = found_inf.defined() ? found_inf.data<float>() : nullptr;
  std::vector<std::array<Tensor, 1>> steps;
  for (const AdamWTensors& t : list) steps.push_back({t.step});
  multi_tensor_apply<1>(steps, AdvanceStepOp{flag}, stream.handle(), MultiTensorConfig{/*chunk_size=*/1});
  // One apply per (parameter dtype, master or not): each op instantiation sees one type per list.
  for (const DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    for (const bool with_master : {false, true}) {
      std::vector<std::array<Tensor, 5>> plain;
      std::vector<std::array<Tensor, 6>> mastered;
      for (const AdamWTensors& t : list) {
        if (t.param.dtype() != dtype || t.master.defined() != with_master || t.copy.defined()) continue;
        if (with_master) {
          mastered.push_back({t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.step, t.master});
        } else {
          plain.push_back({t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.step});
        }
      }
      if (plain.empty() && mastered.empty()) continue;
      dispatch_floating(dtype, "adamw", [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (with_master) {
          multi_tensor_apply<6>(mastered, AdamWOp<T, true>{args, flag}, stream.handle(), elementwise_config(mastered));
        } else {
          multi_tensor_apply<5>(plain, AdamWOp<T, false>{args, flag}, stream.handle(), elementwise_config(plain));
        }
      });
    }
  }
  // f32 parameters with a copy for autocast, one apply per copy dtype.
  for (const DType copy_dtype : {DType::bf16, DType::f16}) {
    std::vector<std::array<Tensor, 6>> copied;
    for (const AdamWTensors& t : list) {
      if (!t.copy.defined() || t.copy.dtype() != copy_dtype) continue;
      MT_INTERNAL_ASSERT(t.param.dtype() == DType::f32 && !t.master.defined(), "adamw: a copy of a ",
                         dtype_name(t.param.dtype()), " parameter");
      copied.push_back({t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.step, t.copy});
    }
    if (copied.empty()) continue;
    if (copy_dtype == DType::bf16) {
      multi_tensor_apply<6>(copied, AdamWOp<float, false, BFloat16>{args, flag}, stream.handle(),
                            elementwise_config(copied));
    } else {
      multi_tensor_apply<6>(copied, AdamWOp<float, false, Half>{args, flag}, stream.handle(),
                            elementwise_config(copied));
    }
  }
}

void scaler_update_cuda(const Tensor& scale, const Tensor& growth_tracker, const Tensor& consecutive_skips,
                        const Tensor& found_inf, const ScalerUpdateArgs& args) {
  const cuda::Stream stream = cuda::current_stream(scale.device().index);
  scaler_update_kernel<<<1, 1, 0, stream.handle()>>>(scale.data<float>(), growth_tracker.data<int32_t>(),
                                                     consecutive_skips.data<int32_t>(), found_inf.data<float>(), args);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::optim_kernels
