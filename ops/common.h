// Checks and helpers shared by the op families (validation at the public
// boundary: name the op, the shapes, the dtypes, the devices).
#pragma once

#include <string>
#include <vector>

#include "autograd/function.h"
#include "core/tensor.h"
#include "core/view.h"

namespace mt::ops {

void check_defined(const char* op, const Tensor& t, const char* what = "input");
void check_floating(const char* op, const Tensor& t);
void check_same_device(const char* op, const Tensor& a, const Tensor& b);
std::string describe(const Tensor& t);  // "f32[2, 3] on cpu"

TensorOptions options_of(const Tensor& t);  // same dtype and device, no grad
// t converted to dtype without recording (its gradient is cast back by the engine).
Tensor as_dtype(const Tensor& t, DType dtype);

}  // namespace mt::ops
