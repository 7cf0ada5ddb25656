// CUDA cross-entropy: one block per row of the contiguous logits [rows, C] for
// the forward (max, then sum of exp, both block reductions in acc_t) and the
// backward; one block for the reduction to a scalar. Nothing here waits for the
// device: the count of non-ignored rows stays in device memory and the backward
// reads it there.
#include <limits>
#include <type_traits>

#include "core/cuda/check.h"
#include "core/cuda/launch.h"
#include "core/cuda/packed.cuh"
#include "core/cuda_context.h"
#include "core/dispatch.h"
#include "ops/loss/loss_kernels.h"
#include "ops/math.h"
#include "ops/softmax/block_reduce.cuh"

namespace mt::ops {

namespace {

constexpr const char* kOp = "cross_entropy";
constexpr int kReduceThreads = 512;

// d(row loss)/d(logit) for a unit loss: softmax - onehot; 0 for an ignored row, NaN for an
// out-of-range target (not checked on CUDA: see loss.h).
template <typename A>
__device__ __forceinline__ A unit_loss_grad(A logit, A lse, bool is_target, bool ignored, bool invalid) {
  if (ignored) return A(0);
  if (invalid) return std::numeric_limits<A>::quiet_NaN();
  return math::exp(logit - lse) - (is_target ? A(1) : A(0));
}

template <typename T, typename I>
__global__ void cross_entropy_forward_kernel(acc_t<T>* loss, acc_t<T>* lse, const T* logits, const I* target,
                                             int64_t rows, int64_t classes, int64_t ignore_index) {
  using A = acc_t<T>;
  __shared__ A scratch[rowwise::kWarpSize];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = logits + r * classes;
    A m = rowwise::Max::identity<A>();
    for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) m = rowwise::Max{}(m, convert<A>(x[c]));
    m = rowwise::block_reduce(m, rowwise::Max{}, scratch);
    A s = 0;
    for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) s += math::exp(convert<A>(x[c]) - m);
    s = rowwise::block_reduce(s, rowwise::Sum{}, scratch);
    if (threadIdx.x == 0) {
      const A log_s = math::log(s);
      lse[r] = m + log_s;
      const auto k = static_cast<int64_t>(target[r]);
      if (k == ignore_index) {
        loss[r] = A(0);
      } else if (k < 0 || k >= classes) {
        loss[r] = std::numeric_limits<A>::quiet_NaN();  // not checked on CUDA (no host sync): see loss.h
      } else {
        loss[r] = log_s - (convert<A>(x[k]) - m);
      }
    }
  }
}

// One block: out = sum(loss) (/ count for mean); count = rows not ignored.
template <typename A, typename I>
__global__ void cross_entropy_reduce_kernel(A* out, int64_t* count, const A* loss, const I* target, int64_t rows,
                                            int64_t ignore_index, bool mean) {
  __shared__ A scratch[rowwise::kWarpSize];
  __shared__ long long scratch_n[rowwise::kWarpSize];
  A total = 0;
  long long n = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    total += loss[r];
    n += static_cast<int64_t>(target[r]) != ignore_index ? 1 : 0;
  }
  total = rowwise::block_reduce(total, rowwise::Sum{}, scratch);
  n = rowwise::block_reduce(n, rowwise::Sum{}, scratch_n);
  if (threadIdx.x == 0) {
    *count = static_cast<int64_t>(n);
    *out = mean ? total / static_cast<A>(n) : total;  // 0/0 = NaN when every row is ignored
  }
}

// grad: [rows] read with stride 1 (none) or a scalar read with stride 0; count
// (mean only, else null) divides it.
template <typename T, typename I>
__global__ void cross_entropy_backward_kernel(T* dlogits, const T* logits, const I* target, const acc_t<T>* lse,
                                              const acc_t<T>* grad, int64_t grad_stride, const int64_t* count,
                                              int64_t rows, int64_t classes, int64_t ignore_index) {
  using A = acc_t<T>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = logits + r * classes;
    T* dx = dlogits + r * classes;
    const auto k = static_cast<int64_t>(target[r]);
    A g = grad[r * grad_stride];
    if (count != nullptr) g = g / static_cast<A>(*count);
    const A l = lse[r];
    const bool ignored = k == ignore_index;
    const bool invalid = !ignored && (k < 0 || k >= classes);
    for (int64_t c = threadIdx.x; c < classes; c += blockDim.x) {
      // An ignored row's gradient is 0 even when g is not finite (a mean over no rows).
      dx[c] = convert<T>(ignored ? A(0) : unit_loss_grad(convert<A>(x[c]), l, c == k, ignored, invalid) * g);
    }
  }
}

// e^x for the fused head's softmax. f32: the hardware's 2^x (ex2.approx.ftz, a few ulp) of
// x log2(e), two instructions where expf takes about ten. The kernel below runs two exponentials
// per logit, and with expf and a branch per element it was bound by instruction issue rather than
// by memory. Results below 2^-126 flush to 0, which a sum whose largest term is 1 cannot see.
__device__ __forceinline__ float softmax_exp(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
  return y;
}
__device__ __forceinline__ double softmax_exp(double x) { return math::exp(x); }

// One block per row: per-thread running (max, sum of exp) over the row, merged across the
// block, then the row rewritten in place as softmax - onehot. Each thread takes packs of N
// logits (16-byte loads and stores when Packed: the row length is a multiple of the pack and
// rows aligned): the pack's maximum first, so that the running sum is rescaled at most once a
// pack and the exponentials have no branch between them. A NaN logit makes the row's loss NaN.
template <typename T, typename I, bool Packed>
__global__ void __launch_bounds__(1024)
    cross_entropy_unit_grad_kernel(acc_t<T>* loss, acc_t<T>* lse, T* logits, const I* target, int64_t rows,
                                   int64_t classes, int64_t ignore_index) {
  using A = acc_t<T>;
  constexpr int N = Packed ? cuda::pack_size<T>() : 1;
  constexpr A kMinusInf = -std::numeric_limits<A>::infinity();
  __shared__ A scratch[rowwise::kWarpSize];
  const int64_t packs = classes / N;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    A m = kMinusInf, s = 0;
    for (int64_t c = threadIdx.x; c < packs; c += blockDim.x) {
      A a[N];
      cuda::load_pack_as<N>(logits + r * classes + c * N, a);
      A pack_max = kMinusInf;
#pragma unroll
      for (int k = 0; k < N; ++k) pack_max = a[k] > pack_max || a[k] != a[k] ? a[k] : pack_max;  // NaN wins
      if (pack_max == kMinusInf) continue;  // every term is 0 (and exp(-inf - -inf) would be NaN)
      if (!(pack_max <= m)) {               // a new maximum, or NaN
        s = s == A(0) ? A(0) : s * softmax_exp(m - pack_max);
        m = pack_max;
      }
#pragma unroll
      for (int k = 0; k < N; ++k) s += softmax_exp(a[k] - m);
    }
    const A row_max = rowwise::block_reduce(m, rowwise::Max{}, scratch);
    const A scaled = s == A(0) ? A(0) : s * softmax_exp(m - row_max);
    const A row_sum = rowwise::block_reduce(scaled, rowwise::Sum{}, scratch);
    const A l = row_max + math::log(row_sum);
    const auto t = static_cast<int64_t>(target[r]);
    const bool ignored = t == ignore_index;
    const bool invalid = !ignored && (t < 0 || t >= classes);
    if (threadIdx.x == 0) {
      lse[r] = l;
      loss[r] = ignored   ? A(0)
                : invalid ? std::numeric_limits<A>::quiet_NaN()
                          : l - convert<A>(logits[r * classes + t]);
    }
    __syncthreads();  // thread 0 read logits[t] above; the row is rewritten below
    // d(row loss)/d(logit): 0 for an ignored row, NaN for an out-of-range target (not checked
    // on CUDA: see loss.h), else softmax - onehot.
    const A fill = ignored ? A(0) : std::numeric_limits<A>::quiet_NaN();
    for (int64_t c = threadIdx.x; c < packs; c += blockDim.x) {
      T* at_pack = logits + r * classes + c * N;
      A p[N];
      if (ignored || invalid) {
#pragma unroll
        for (int k = 0; k < N; ++k) p[k] = fill;
      } else {
        cuda::load_pack_as<N>(at_pack, p);
#pragma unroll
        for (int k = 0; k < N; ++k) p[k] = softmax_exp(p[k] - l);
        const int64_t at = t - c * N;  // the target's place in this pack, if it is in it
        if (at >= 0 && at < N) {
#pragma unroll
          for (int k = 0; k < N; ++k) p[k] -= k == at ? A(1) : A(0);  // constant indices: p stays in registers
        }
      }
      cuda::store_pack_from<N>(at_pack, p);
    }
  }
}

// out = in * g (/ count): in is T or acc_t<T> (see loss_kernels.h).
template <typename T, typename In>
__global__ void scale_by_loss_grad_kernel(T* out, const In* in, const acc_t<T>* grad, const int64_t* count, int64_t n) {
  using A = acc_t<T>;
  A g = *grad;
  // A mean over no rows: the loss is NaN, but every gradient is 0 (the rows are all ignored).
  if (count != nullptr) g = *count == 0 ? A(0) : g / static_cast<A>(*count);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{blockDim.x} * gridDim.x) {
    out[i] = convert<T>(convert<A>(in[i]) * g);
  }
}

}  // namespace

void cross_entropy_forward_cuda(const Tensor& loss, const Tensor& lse, const Tensor& logits, const Tensor& target,
                                int64_t ignore_index) {
  const int64_t rows = logits.shape()[0], classes = logits.shape()[1];
  if (rows == 0) return;
  const cuda::Stream stream = cuda::current_stream(logits.device().index);
  dispatch_floating(logits.dtype(), kOp, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    dispatch_index(target.dtype(), kOp, [&](auto index_tag) {
      using I = typename decltype(index_tag)::type;
      cross_entropy_forward_kernel<T, I>
          <<<rowwise::row_grid(rows), rowwise::row_block_threads(classes), 0, stream.handle()>>>(
              static_cast<A*>(loss.data_ptr()), static_cast<A*>(lse.data_ptr()),
              static_cast<const T*>(logits.data_ptr()), static_cast<const I*>(target.data_ptr()), rows, classes,
              ignore_index);
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

void cross_entropy_reduce_cuda(const Tensor& out, const Tensor& count, const Tensor& loss, const Tensor& target,
                               int64_t ignore_index, Reduction reduction) {
  const cuda::Stream stream = cuda::current_stream(loss.device().index);
  const int64_t rows = loss.numel();
  dispatch_loss_dtype(loss.dtype(), [&](auto tag) {
    using A = typename decltype(tag)::type;
    dispatch_index(target.dtype(), kOp, [&](auto index_tag) {
      using I = typename decltype(index_tag)::type;
      cross_entropy_reduce_kernel<A, I><<<1, kReduceThreads, 0, stream.handle()>>>(
          static_cast<A*>(out.data_ptr()), static_cast<int64_t*>(count.data_ptr()),
          static_cast<const A*>(loss.data_ptr()), static_cast<const I*>(target.data_ptr()), rows, ignore_index,
          reduction == Reduction::mean);
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

void cross_entropy_backward_cuda(const Tensor& dlogits, const Tensor& grad, const Tensor& logits, const Tensor& target,
                                 const Tensor& lse, const Tensor& count, int64_t ignore_index, Reduction reduction) {
  const int64_t rows = logits.shape()[0], classes = logits.shape()[1];
  if (rows == 0) return;
  const cuda::Stream stream = cuda::current_stream(logits.device().index);
  const int64_t grad_stride = reduction == Reduction::none ? 1 : 0;
  const int64_t* count_ptr = reduction == Reduction::mean ? static_cast<const int64_t*>(count.data_ptr()) : nullptr;
  dispatch_floating(logits.dtype(), kOp, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    dispatch_index(target.dtype(), kOp, [&](auto index_tag) {
      using I = typename decltype(index_tag)::type;
      cross_entropy_backward_kernel<T, I>
          <<<rowwise::row_grid(rows), rowwise::row_block_threads(classes), 0, stream.handle()>>>(
              static_cast<T*>(dlogits.data_ptr()), static_cast<const T*>(logits.data_ptr()),
              static_cast<const I*>(target.data_ptr()), static_cast<const A*>(lse.data_ptr()),
              static_cast<const A*>(grad.data_ptr()), grad_stride, count_ptr, rows, classes, ignore_index);
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

void cross_entropy_unit_grad_inplace_cuda(const Tensor& loss, const Tensor& lse, const Tensor& logits,
                                          const Tensor& target, int64_t ignore_index) {
  const int64_t rows = logits.shape()[0], classes = logits.shape()[1];
  if (rows == 0) return;
  const cuda::Stream stream = cuda::current_stream(logits.device().index);
  dispatch_floating(logits.dtype(), kOp, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    constexpr int N = cuda::pack_size<T>();
    const bool packed = classes % N == 0 && cuda::aligned_to(logits.data_ptr(), 16);
    dispatch_index(target.dtype(), kOp, [&](auto index_tag) {
      using I = typename decltype(index_tag)::type;
      auto* kernel = packed ? cross_entropy_unit_grad_kernel<T, I, true> : cross_entropy_unit_grad_kernel<T, I, false>;
      // Up to 1024 threads a row: an SM then holds two rows of GPT-2's vocabulary at a time, and
      // the rows in flight on the whole GPU stay in L2 for the second pass. With 512 threads, four
      // rows an SM, they did not, and the second pass read its rows from memory again.
      kernel<<<rowwise::row_grid(rows), rowwise::row_block_threads(packed ? classes / N : classes, 1024), 0,
               stream.handle()>>>(static_cast<A*>(loss.data_ptr()), static_cast<A*>(lse.data_ptr()),
                                  static_cast<T*>(logits.data_ptr()), static_cast<const I*>(target.data_ptr()), rows,
                                  classes, ignore_index);
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

void scale_by_loss_grad_cuda(const Tensor& out, const Tensor& in, const Tensor& grad, const Tensor& count,
                             Reduction reduction) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const cuda::Stream stream = cuda::current_stream(out.device().index);
  const int64_t* count_ptr = reduction == Reduction::mean ? static_cast<const int64_t*>(count.data_ptr()) : nullptr;
  dispatch_floating(out.dtype(), kOp, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    auto launch = [&](const auto* x) {
      using In = std::remove_const_t<std::remove_pointer_t<decltype(x)>>;
      scale_by_loss_grad_kernel<T, In><<<cuda::grid_for(n), cuda::kBlockSize, 0, stream.handle()>>>(
          static_cast<T*>(out.data_ptr()), x, static_cast<const A*>(grad.data_ptr()), count_ptr, n);
      MT_CUDA_CHECK_LAUNCH();
    };
    if (in.dtype() == out.dtype()) {
      launch(static_cast<const T*>(in.data_ptr()));
    } else {
      launch(static_cast<const A*>(in.data_ptr()));
    }
  });
}

}  // namespace mt::ops
