#include "ops/common.h"

#include "core/error.h"

namespace mt::ops {

void check_defined(const char* op, const Tensor& t, const char* what) {
  MT_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
}

void check_floating(const char* op, const Tensor& t) {
  check_defined(op, t);
  MT_CHECK_T(DTypeError, is_compute_floating(t.dtype()), op, ": expected a floating tensor (f64, f32, f16, bf16), got ",
             describe(t));
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  MT_CHECK_T(DeviceError, a.device() == b.device(), op, ": inputs are on different devices: ", describe(a), " and ",
             describe(b));
}

std::string describe(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + shape_str(t.shape()) + " on " + t.device().str();
}

TensorOptions options_of(const Tensor& t) { return TensorOptions().dtype(t.dtype()).device(t.device()); }

Tensor as_dtype(const Tensor& t, DType dtype) { return t.dtype() == dtype ? t : raw::to(t, dtype); }

[[noreturn]] void throw_no_cuda(const char* op) {
  throw DeviceError(std::string(op) + ": mixtrain was built without CUDA support");
}

}  // namespace mt::ops
