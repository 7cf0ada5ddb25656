// CPU FP8 casts and scale updates: the reference the CUDA kernels are tested against bit for bit
// (the same conversions from core/float_types.h, the same f32 arithmetic).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/cpu_loops.h"
#include "core/dispatch.h"
#include "ops/fp8/fp8_kernels.h"

namespace mt::ops {

namespace {

template <typename Format, typename T>
void quantize_typed(const T* x, uint8_t* out, uint8_t* out_t, int64_t rows, int64_t cols, float scale,
                    uint32_t* amax_bits) {
  const int64_t n = rows * cols;
  const int64_t grain = cpu::kParallelGrain;
  // One partial maximum per chunk (parallel_for numbers its chunks begin / grain), combined below.
  std::vector<uint32_t> partial(static_cast<size_t>((n + grain - 1) / grain), 0u);
  cpu::parallel_for(n, grain, [&](int64_t begin, int64_t end) {
    uint32_t m = 0;
    for (int64_t i = begin; i < end; ++i) {
      const float v = convert<float>(x[i]);
      m = std::max(m, abs_bits(v));
      if (out == nullptr && out_t == nullptr) continue;
      const uint8_t q = Format::from_f32(scaled(v, scale));
      if (out != nullptr) out[i] = q;
      // Element (r, c) of x [rows, cols] goes to (c, r) of the [cols, rows] transpose.
      if (out_t != nullptr) out_t[(i % cols) * rows + i / cols] = q;
    }
    partial[static_cast<size_t>(begin / grain)] = m;
  });
  *amax_bits = partial.empty() ? 0u : *std::max_element(partial.begin(), partial.end());
}

template <typename Format>
void dequantize_typed(const Tensor& q, float scale, const Tensor& out) {
  const auto* in = static_cast<const uint8_t*>(q.data_ptr());
  dispatch_floating(out.dtype(), "dequantize_fp8", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = static_cast<T*>(out.data_ptr());
    cpu::for_each_dense(q.numel(), [&](int64_t i) { o[i] = convert<T>(Format::to_f32(in[i]) / scale); });
  });
}

float read_scalar(const Tensor& t) { return *static_cast<const float*>(t.data_ptr()); }
void write_scalar(const Tensor& t, float v) { *static_cast<float*>(t.data_ptr()) = v; }

}  // namespace

void quantize_cpu(const Tensor& x, const Tensor& scale, const Tensor& out, const Tensor& out_t, const Tensor& amax) {
  const int64_t cols = x.dim() == 0 ? 1 : x.size(-1);
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  uint8_t* o = out.defined() ? static_cast<uint8_t*>(out.data_ptr()) : nullptr;
  uint8_t* o_t = out_t.defined() ? static_cast<uint8_t*>(out_t.data_ptr()) : nullptr;
  const Tensor& format = out.defined() ? out : out_t;
  const float s = format.defined() ? read_scalar(scale) : 0.0f;  // the amax alone needs no scale
  uint32_t bits = 0;
  dispatch_floating(x.dtype(), "quantize_fp8", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = static_cast<const T*>(x.data_ptr());
    if (!format.defined() || format.dtype() == DType::f8e4m3) {
      quantize_typed<F8E4M3Format>(in, o, o_t, rows, cols, s, &bits);
    } else {
      quantize_typed<F8E5M2Format>(in, o, o_t, rows, cols, s, &bits);
    }
  });
  write_scalar(amax, bits::u32_to_f32(bits));
}

void dequantize_cpu(const Tensor& q, const Tensor& scale, const Tensor& out) {
  const float s = read_scalar(scale);
  if (q.dtype() == DType::f8e4m3) {
    dequantize_typed<F8E4M3Format>(q, s, out);
  } else {
    dequantize_typed<F8E5M2Format>(q, s, out);
  }
}

void delayed_update_cpu(const DelayedUpdate& u) {
  float* h = static_cast<float*>(u.history.data_ptr());
  const int64_t len = u.history.numel();
  const float newest = read_scalar(u.new_amax);
  // The same roll and fmaxf as the CUDA kernel: NaN entries drop out of the max.
  float m = 0.0f;
  for (int64_t i = len - 1; i >= 0; --i) {
    h[i] = i > 0 ? h[i - 1] : newest;
    m = std::fmax(m, h[i]);
  }
  const float amax = u.most_recent ? newest : m;
  const float used = read_scalar(u.scale);
  if (saturated(newest, used, u.saturation_bound)) ++*static_cast<int64_t*>(u.overflows.data_ptr());
  const float scale = scale_from_amax(amax, u.scaled_max, used);
  write_scalar(u.scale, scale);
  write_scalar(u.scale_inv, 1.0f / scale);
}

void current_scale_cpu(const Tensor& amax, const Tensor& scale, const Tensor& scale_inv, float scaled_max) {
  const float s = scale_from_amax(read_scalar(amax), scaled_max, 1.0f);
  write_scalar(scale, s);
  write_scalar(scale_inv, 1.0f / s);
}

}  // namespace mt::ops
