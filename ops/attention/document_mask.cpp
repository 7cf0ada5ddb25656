// document_mask (ops/attention/attention.h): validation, and the CPU loop.
#include "core/cpu_loops.h"
#include "core/dispatch.h"
#include "ops/attention/attention.h"
#include "ops/attention/document_mask_kernels.h"
#include "ops/common.h"
#include "ops/map.h"

namespace mt {

namespace ops {

void document_mask_cpu(const Tensor& out, const Tensor& segments) {
  const int64_t T = segments.size(1);
  bool* mask = static_cast<bool*>(out.data_ptr());
  dispatch_index(segments.dtype(), "document_mask", [&](auto tag) {
    using I = typename decltype(tag)::type;
    const I* ids = static_cast<const I*>(segments.data_ptr());
    cpu::parallel_for(segments.size(0) * T, cpu::rows_per_task(T), [&](int64_t first, int64_t end) {
      for (int64_t row = first; row < end; ++row) {  // row = (b, i)
        const I* keys = ids + (row / T) * T;
        for (int64_t j = 0; j < T; ++j) mask[row * T + j] = ids[row] == keys[j];
      }
    });
  });
}

}  // namespace ops

Tensor document_mask(const Tensor& segments_in) {
  constexpr const char* kOp = "document_mask";
  MT_CHECK_T(DTypeError, segments_in.dtype() == DType::i64 || segments_in.dtype() == DType::i32, kOp,
             ": segments must be i64 or i32 ids, got ", ops::describe(segments_in));
  MT_CHECK_T(ShapeError, segments_in.dim() == 2, kOp, ": segments must be [B, T], got ", ops::describe(segments_in));
  const Tensor segments = segments_in.contiguous();
  const int64_t B = segments.size(0), T = segments.size(1);
  Tensor out = empty({B, 1, T, T}, TensorOptions().dtype(DType::boolean).device(segments.device()));
  if (out.numel() == 0) return out;
  if (segments.is_cuda()) {
#if MT_WITH_CUDA
    ops::document_mask_cuda(out, segments);
#else
    ops::throw_no_cuda(kOp);
#endif
  } else {
    ops::document_mask_cpu(out, segments);
  }
  return out;
}

}  // namespace mt
