// FP8 casts and GEMMs: validation at the boundary, the device dispatch, and the GEMM's emulation.
#include "ops/fp8/fp8.h"

#include <cstdint>
#include <string>

#include "autograd/grad_mode.h"
#include "core/cuda_context.h"
#include "ops/common.h"
#include "ops/elementwise/elementwise.h"
#include "ops/fp8/fp8_kernels.h"
#include "ops/map.h"
#include "ops/matmul/matmul_kernels.h"
#include "ops/reduction/reduction.h"
#include "ops/reduction/reduction_kernels.h"

namespace mt {

namespace {

bool is_fp8(DType dtype) { return dtype == DType::f8e4m3 || dtype == DType::f8e5m2; }

void check_format(const char* op, DType format) {
  MT_CHECK_T(DTypeError, is_fp8(format), op, ": the FP8 format must be f8e4m3 or f8e5m2, got ", dtype_name(format));
}

// A per-tensor factor (scale, scale_inv): f32 with one element, on the data's device.
void check_factor(const char* op, const char* what, const Tensor& t, Device device) {
  ops::check_defined(op, t, what);
  MT_CHECK_T(DTypeError, t.dtype() == DType::f32 && t.numel() == 1, op, ": ", what,
             " must be an f32 tensor with one element, got ", ops::describe(t));
  MT_CHECK_T(DeviceError, t.device() == device, op, ": ", what, " is on ", t.device().str(), " but the data is on ",
             device.str());
}

Tensor f32_scalar(Device device) { return empty({1}, TensorOptions().dtype(DType::f32).device(device)); }

// Runs the CPU or the CUDA kernel, as t's device says.
template <typename Cpu, typename Cuda>
void on_device_of(const char* op, const Tensor& t, Cpu&& cpu, Cuda&& cuda) {
  if (t.is_cuda()) {
#if MT_WITH_CUDA
    cuda();
#else
    (void)cuda;
    ops::throw_no_cuda(op);
#endif
  } else {
    cpu();
  }
}

#if MT_WITH_CUDA
// cuBLASLt's FP8 kernels read 16-byte aligned operands: a view at an odd offset is copied.
Tensor aligned_contiguous(const Tensor& t) {
  Tensor c = raw::contiguous(t);
  return reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0 ? c : raw::clone(c);
}
#endif

}  // namespace

float fp8_max(DType format) {
  check_format("fp8_max", format);
  return format == DType::f8e4m3 ? 448.0f : 57344.0f;
}

Fp8Quantized quantize_fp8(const Tensor& x, const Tensor& scale, DType format, Fp8Layout layout) {
  const char* op = "quantize_fp8";
  ops::check_floating(op, x);
  check_format(op, format);
  check_factor(op, "scale", scale, x.device());
  const bool transposed = layout != Fp8Layout::as_is;
  MT_CHECK_T(ShapeError, !transposed || x.dim() == 2, op, ": a transposed cast takes a 2-D x [M, K], got ",
             ops::describe(x));
  // The CUDA kernel gives each 64-column strip of x a grid row, of which there may be 65535.
  MT_CHECK_T(ShapeError, !transposed || !x.is_cuda() || x.size(1) <= int64_t{65535} * 64, op,
             ": a transposed cast on CUDA takes at most ", int64_t{65535} * 64, " columns, got ", ops::describe(x));
  const Tensor in = raw::contiguous(x);
  const TensorOptions options = TensorOptions().dtype(format).device(x.device());
  const Tensor rows = layout != Fp8Layout::transposed ? empty(x.shape(), options) : Tensor();
  const Tensor cols = transposed ? empty({x.size(1), x.size(0)}, options) : Tensor();
  Fp8Quantized q{rows.defined() ? rows : cols, f32_scalar(x.device()), rows.defined() ? cols : Tensor()};
  on_device_of(
      op, x, [&] { ops::quantize_cpu(in, scale, rows, cols, q.amax); },
      [&] { ops::quantize_cuda(in, scale, rows, cols, q.amax); });
  return q;
}

Tensor dequantize_fp8(const Tensor& q, const Tensor& scale, DType out) {
  const char* op = "dequantize_fp8";
  ops::check_defined(op, q);
  MT_CHECK_T(DTypeError, is_fp8(q.dtype()), op, ": q must be f8e4m3 or f8e5m2, got ", ops::describe(q));
  check_factor(op, "scale", scale, q.device());
  MT_CHECK_T(DTypeError, is_compute_floating(out), op, ": the output dtype must be f64, f32, f16 or bf16, got ",
             dtype_name(out));
  const Tensor in = raw::contiguous(q);
  Tensor y = empty(q.shape(), TensorOptions().dtype(out).device(q.device()));
  on_device_of(
      op, q, [&] { ops::dequantize_cpu(in, scale, y); }, [&] { ops::dequantize_cuda(in, scale, y); });
  return y;
}

Tensor fp8_round_trip(const Tensor& x, const Tensor& scale, DType format) {
  ops::check_floating("fp8_round_trip", x);
  return dequantize_fp8(quantize_fp8(x, scale, format).data, scale, x.dtype());
}

Tensor fp8_amax(const Tensor& x) {
  const char* op = "fp8_amax";
  ops::check_floating(op, x);
  const Tensor in = raw::contiguous(x);
  Tensor amax = f32_scalar(x.device());
  on_device_of(
      op, x, [&] { ops::quantize_cpu(in, Tensor(), Tensor(), Tensor(), amax); },
      [&] { ops::quantize_cuda(in, Tensor(), Tensor(), Tensor(), amax); });
  return amax;
}

bool fp8_native_available(Device device) {
  return device.is_cuda() && cuda::is_available() && cuda::compute_capability(device.index) >= 89;
}

namespace ops {

Tensor column_sums_f32(const Tensor& dy) {
  NoGradGuard no_grad;
  const int64_t m = dy.size(0), n = dy.size(1);
#if MT_WITH_CUDA
  if (dy.is_cuda() && dy.dtype() != DType::f64 && dy.is_contiguous() && m >= 2 && n >= 2) {
    Tensor out = empty({n}, TensorOptions().dtype(DType::f32).device(dy.device()));
    // [1, N, M] at unit stride along N: matmul's row sums of dy^T take the same column kernel.
    reduce_cuda(out, raw::unsqueeze(raw::transpose(dy, 0, 1), 0), n, m, ReduceKind::sum);
    return out;
  }
#endif
  return sum(raw::to(dy, DType::f32), {0});
}

void check_fp8_gemm(const char* op, const Tensor& a_q, const Tensor& b_q, DType out_dtype, const Tensor& bias,
                    Fp8Compute compute) {
  check_defined(op, a_q, "a_q");
  check_defined(op, b_q, "b_q");
  MT_CHECK_T(DTypeError, is_fp8(a_q.dtype()) && is_fp8(b_q.dtype()), op, ": a_q and b_q must be f8e4m3 or f8e5m2, got ",
             describe(a_q), " and ", describe(b_q));
  MT_CHECK_T(DTypeError, a_q.dtype() == DType::f8e4m3 || b_q.dtype() == DType::f8e4m3, op,
             ": f8e5m2 x f8e5m2 is not supported (cuBLASLt has no such FP8 kernel; a gradient in f8e5m2 is "
             "multiplied by an f8e4m3 weight or activation), got ",
             describe(a_q), " and ", describe(b_q));
  check_same_device(op, a_q, b_q);
  MT_CHECK_T(ShapeError, a_q.dim() == 2 && b_q.dim() == 2 && a_q.size(1) == b_q.size(1), op,
             ": expected a_q [M, K] and b_q [N, K] (y = a b^T), got ", shape_str(a_q.shape()), " and ",
             shape_str(b_q.shape()));
  const int64_t m = a_q.size(0), k = a_q.size(1), n = b_q.size(0);
  MT_CHECK_T(ShapeError, m % 16 == 0 && n % 16 == 0 && k % 16 == 0, op,
             ": M, N and K must be multiples of 16 (cuBLASLt's FP8 kernels), got M = ", m, ", N = ", n, ", K = ", k,
             " from a_q ", shape_str(a_q.shape()), " and b_q ", shape_str(b_q.shape()));
  MT_CHECK_T(DTypeError, out_dtype == DType::bf16 || out_dtype == DType::f32, op,
             ": the output dtype must be bf16 or f32, got ", dtype_name(out_dtype));
  if (bias.defined()) {
    MT_CHECK_T(DTypeError, bias.dtype() == DType::bf16, op,
               ": the bias must be bf16 (what cuBLASLt's FP8 kernels read for either output), got ", describe(bias));
    MT_CHECK_T(ShapeError, bias.dim() == 1 && bias.size(0) == n, op, ": the bias must be [N] = [", n, "], got ",
               describe(bias));
    check_same_device(op, a_q, bias);
  }
  const Device device = a_q.device();
  if (compute == Fp8Compute::native && !fp8_native_available(device)) {
    const std::string where =
        device.is_cuda() ? detail::str_cat(device.str(), " is ", cuda::device_name(device.index),
                                           " of compute capability ", cuda::compute_capability(device.index) / 10, ".",
                                           cuda::compute_capability(device.index) % 10)
                         : detail::str_cat("the operands are on ", device.str());
    throw DeviceError(detail::str_cat(op, ": native FP8 compute needs a CUDA GPU of compute capability 8.9 or later; ",
                                      where, " (Fp8Compute::emulate or automatic runs the emulation)"));
  }
}

}  // namespace ops

Tensor fp8_gemm(const Tensor& a_q, const Tensor& b_q, const Tensor& scale_inv_a, const Tensor& scale_inv_b,
                DType out_dtype, const Tensor& bias, Tensor* out_amax, Fp8Compute compute) {
  const char* op = "fp8_gemm";
  ops::check_fp8_gemm(op, a_q, b_q, out_dtype, bias, compute);
  check_factor(op, "scale_inv_a", scale_inv_a, a_q.device());
  check_factor(op, "scale_inv_b", scale_inv_b, a_q.device());
  const int64_t m = a_q.size(0), n = b_q.size(0);
  const Device device = a_q.device();
  const bool available = fp8_native_available(device);
  NoGradGuard no_grad;  // primitives: nothing recorded, even for a bias that requires grad

  if (compute != Fp8Compute::emulate && available) {
#if MT_WITH_CUDA
    ops::Fp8GemmProblem p;
    p.a = aligned_contiguous(a_q);
    p.b = aligned_contiguous(b_q);
    p.scale_inv_a = scale_inv_a;
    p.scale_inv_b = scale_inv_b;
    p.out = empty({m, n}, TensorOptions().dtype(out_dtype).device(device));
    if (bias.defined()) p.bias = aligned_contiguous(bias);
    if (out_amax != nullptr) p.amax = f32_scalar(device);
    const bool epilogue_amax = ops::fp8_gemm_cuda(p);
    if (out_amax != nullptr) *out_amax = epilogue_amax ? p.amax : fp8_amax(p.out);
    return p.out;
#endif
  }

  // Emulation. FP8 values are exact in f32, and so are their products (at most 8 significant
  // bits); the GEMM adds them in f32 as the native kernel does, in its own order. The internal
  // gemm, not matmul: autocast must not round this f32 GEMM to a half type.
  Tensor acc = empty({1, m, n}, TensorOptions().dtype(DType::f32).device(device));
  ops::GemmArgs args;
  args.transpose_b = ops::Transpose::yes;
  ops::gemm(acc, raw::unsqueeze(raw::to(a_q, DType::f32), 0), raw::unsqueeze(raw::to(b_q, DType::f32), 0), args);
  Tensor y = mul(raw::view(acc, {m, n}), mul(scale_inv_a, scale_inv_b));
  if (bias.defined()) y = add(y, bias);  // in f32: the bf16 bias widens exactly
  if (out_amax != nullptr) *out_amax = fp8_amax(y);
  return out_dtype == DType::f32 ? y : raw::to(y, out_dtype);
}

}  // namespace mt
