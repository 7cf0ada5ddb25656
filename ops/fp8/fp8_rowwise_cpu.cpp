// The CPU row cast: the reference the CUDA kernel is tested against bit for bit (the same
// conversions from core/float_types.h, the same f32 arithmetic in the same order).
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/cpu_loops.h"
#include "core/dispatch.h"
#include "ops/fp8/fp8_kernels.h"
#include "ops/fp8/fp8_rowwise_kernels.h"

namespace mt::ops {

namespace {

template <typename Format, typename T>
void quantize_rows_typed(const RowCast& c, float format_max) {
  const int64_t rows = c.x.size(0), cols = c.x.size(1), padded = c.out.size(0);
  const T* x = static_cast<const T*>(c.x.data_ptr());
  const float* cs = c.column_scale.defined() ? static_cast<const float*>(c.column_scale.data_ptr()) : nullptr;
  auto* out = static_cast<uint8_t*>(c.out.data_ptr());
  auto* scale_inv = static_cast<float*>(c.scale_inv.data_ptr());
  cpu::parallel_for(padded, cpu::rows_per_task(cols), [&](int64_t begin, int64_t end) {
    std::vector<float> v(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      uint8_t* o = out + r * cols;
      if (r >= rows) {
        std::memset(o, 0, static_cast<size_t>(cols));
        scale_inv[r] = 1.0f;
        continue;
      }
      uint32_t m = 0;
      for (int64_t j = 0; j < cols; ++j) {
        const float value = convert<float>(x[r * cols + j]);
        v[j] = cs != nullptr ? scaled(value, cs[j]) : value;
        m = std::max(m, abs_bits(v[j]));
      }
      const float s = scale_from_amax(bits::u32_to_f32(m), format_max, 1.0f);
      for (int64_t j = 0; j < cols; ++j) o[j] = Format::from_f32(scaled(v[j], s));
      scale_inv[r] = 1.0f / s;
    }
  });
}

}  // namespace

void quantize_rows_cpu(const RowCast& c) {
  dispatch_floating(c.x.dtype(), "quantize_fp8_rows", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (c.out.dtype() == DType::f8e4m3) {
      quantize_rows_typed<F8E4M3Format, T>(c, 448.0f);
    } else {
      quantize_rows_typed<F8E5M2Format, T>(c, 57344.0f);
    }
  });
}

}  // namespace mt::ops
