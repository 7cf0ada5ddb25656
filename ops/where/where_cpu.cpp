// CPU select loop. bool and u8 conditions are both one byte; reading either
// through unsigned char is well defined. The joint strided walk (core/cpu_loops.h)
// finds each operand's offset once per run of the innermost dim and splits large
// tensors across the cores; finding every element's offsets by division instead
// would cost several divisions per element, far more than the select itself.
#include "core/cpu_loops.h"
#include "core/dispatch.h"
#include "ops/where/where_kernels.h"

namespace mt::ops {

void where_cpu(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  const auto* c = static_cast<const unsigned char*>(cond.data_ptr());
  dispatch_floating(out.dtype(), "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = static_cast<T*>(out.data_ptr());
    const T* x = static_cast<const T*>(a.data_ptr());
    const T* y = static_cast<const T*>(b.data_ptr());
    cpu::for_each_strided<4>(out.shape(), {&out.strides(), &cond.strides(), &a.strides(), &b.strides()},
                             [&](const auto& off) { o[off[0]] = c[off[1]] != 0 ? x[off[2]] : y[off[3]]; });
  });
}

}  // namespace mt::ops
