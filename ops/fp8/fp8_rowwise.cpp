// FP8 with one scale per row: validation at the boundary, the device dispatch, the GEMM's emulation,
// and the two layer ops with their backward beside their forward (Note [FP8 frozen base]).
#include "ops/fp8/fp8_rowwise.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "core/cuda_context.h"
#include "ops/common.h"
#include "ops/elementwise/elementwise.h"
#include "ops/fp8/fp8_kernels.h"
#include "ops/fp8/fp8_rowwise_kernels.h"
#include "ops/map.h"
#include "ops/matmul/lora_branch.h"
#include "ops/reduction/reduction.h"

namespace mt {

namespace {

bool is_fp8(DType dtype) { return dtype == DType::f8e4m3 || dtype == DType::f8e5m2; }

// The rows the GEMMs run: M rounded up to a multiple of 16, and at least 16 (an empty x gives
// GEMMs of zero rows, which not every FP8 kernel takes). As fp8_linear's.
int64_t padded_rows(int64_t m) { return std::max<int64_t>(16, (m + 15) / 16 * 16); }

// What the GEMMs write for a result wanted in `dtype`: bf16 or f32 (the two FP8 GEMM outputs).
DType gemm_dtype(DType dtype) { return dtype == DType::bf16 ? DType::bf16 : DType::f32; }

// The leading dims of x, flattened.
int64_t leading_rows(const Tensor& x) { return shape_numel(Shape(x.shape().begin(), x.shape().end() - 1)); }

Shape leading_dims_and(const Tensor& x, int64_t last) {
  Shape shape(x.shape().begin(), x.shape().end() - 1);
  shape.push_back(last);
  return shape;
}

#if MT_WITH_CUDA
// Once per device and shape: the unfused path writes the product in f32 and reads it again, which
// costs a GEMM at these sizes much of what FP8 saves; a benchmark should know it ran.
void warn_unfused_once(Device device, int64_t m, int64_t n, int64_t k) {
  static std::mutex mutex;
  static auto* warned = new std::set<std::string>();  // never destroyed: warnings may come at exit
  const std::string key = detail::str_cat(device.str(), " ", m, " ", n, " ", k);
  std::lock_guard<std::mutex> lock(mutex);
  if (!warned->insert(key).second) return;
  std::fprintf(
      stderr,
      "mixtrain: warning: fp8_rowwise_gemm: cuBLASLt offers no FP8 GEMM with outer-vector scales for M = %lld, "
      "N = %lld, K = %lld on %s; the product is written in f32 and scaled in a second pass (slower)\n",
      static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k), device.str().c_str());
}
#endif

// A vector of per-row factors: f32 [n] on `device`.
void check_factors(const char* op, const char* what, const Tensor& t, int64_t n, Device device) {
  ops::check_defined(op, t, what);
  MT_CHECK_T(DTypeError, t.dtype() == DType::f32, op, ": ", what, " must be f32, got ", ops::describe(t));
  MT_CHECK_T(ShapeError, t.dim() == 1 && t.size(0) == n, op, ": ", what, " must be [", n, "], got ", ops::describe(t));
  MT_CHECK_T(DeviceError, t.device() == device, op, ": ", what, " is on ", t.device().str(), " but the data is on ",
             device.str());
}

// x2 [R, C] (contiguous) cast row by row into [rows_out, C], rows_out >= R (padding rows zero).
Fp8RowQuantized cast_rows(const char* op, const Tensor& x2, DType format, const Tensor& column_scale,
                          int64_t rows_out) {
  const Device device = x2.device();
  Fp8RowQuantized q{empty({rows_out, x2.size(1)}, TensorOptions().dtype(format).device(device)),
                    empty({rows_out}, TensorOptions().dtype(DType::f32).device(device))};
  const ops::RowCast c{x2, column_scale.defined() ? raw::contiguous(column_scale) : Tensor(), q.data, q.scale_inv};
  if (device.is_cuda()) {
#if MT_WITH_CUDA
    ops::quantize_rows_cuda(c);
#else
    ops::throw_no_cuda(op);
#endif
  } else {
    ops::quantize_rows_cpu(c);
  }
  return q;
}

// q [N, K] -> [K, N], one byte an element.
Tensor transpose_bytes(const Tensor& q) {
  if (!q.is_cuda()) return raw::contiguous(raw::transpose(q, 0, 1));
  Tensor out = empty({q.size(1), q.size(0)}, ops::options_of(q));
#if MT_WITH_CUDA
  ops::transpose_bytes_cuda(raw::contiguous(q), out);
#endif
  return out;
}

// The frozen FP8 weight of a layer op: q [N, K] f8e4m3 and scale_inv [N] f32 on x's device,
// N and K multiples of 16, neither requiring grad; x [..., K].
void check_fp8_weight(const char* op, const Tensor& x, const Tensor& q, const Tensor& scale_inv) {
  ops::check_floating(op, x);
  ops::check_defined(op, q, "weight_q");
  MT_CHECK_T(DTypeError, q.dtype() == DType::f8e4m3, op, ": weight_q must be f8e4m3 (quantize_fp8_rows), got ",
             ops::describe(q));
  ops::check_same_device(op, x, q);
  MT_CHECK_T(ShapeError, q.dim() == 2, op, ": weight_q must be 2-D [out, in], got ", ops::describe(q));
  const int64_t n = q.size(0), k = q.size(1);
  MT_CHECK_T(ShapeError, n % 16 == 0 && k % 16 == 0, op, ": an FP8 weight needs out and in features that are ",
             "multiples of 16 (cuBLASLt's FP8 GEMMs), got ", shape_str(q.shape()));
  check_factors(op, "weight_scale_inv", scale_inv, n, x.device());
  MT_CHECK(!q.requires_grad() && !scale_inv.requires_grad(), op,
           ": the FP8 weight requires grad, but it is frozen: no gradient is computed for it (requires_grad_(false))");
  MT_CHECK_T(ShapeError, x.dim() >= 1 && x.size(-1) == k, op, ": input ", ops::describe(x), " and weight ",
             shape_str(q.shape()), " cannot be multiplied (x must be [..., ", k, "])");
}

void check_bias(const char* op, const Tensor& x, const Tensor& bias, int64_t n) {
  if (!bias.defined()) return;
  ops::check_floating(op, bias);
  ops::check_same_device(op, x, bias);
  MT_CHECK_T(ShapeError, bias.dim() == 1 && bias.size(0) == n, op, ": bias must be [", n, "], got ",
             ops::describe(bias));
}

// What the FP8 GEMMs read for a bias: bf16 (cuBLASLt's FP8 kernels take a bf16 bias for either output).
Tensor bias_bf16(const Tensor& bias) { return bias.defined() ? raw::to(bias.detach(), DType::bf16) : Tensor(); }

// Note [FP8 input cast reuse]
// Several frozen layers read one tensor: a Llama block's q, k and v projections the same normed x,
// gate and up the same again. The last input cast is therefore kept (one per thread), keyed by the
// input's storage, address, shape, dtype and storage version, and the next layer op that reads the
// same unchanged tensor takes it instead of casting again: one cast where there were three, and
// two. A different input replaces it, so at most one cast (rows x K bytes) outlives its forward.
// A CUDA Graph capture neither reads nor fills it (its replays must cast what they are given). The
// cast is reused on the stream it was made on: every op here runs on the device's current stream.
struct InputCast {
  std::weak_ptr<Storage> storage;
  const void* data = nullptr;
  Shape shape;
  DType dtype = DType::f32;
  uint64_t version = 0;
  Fp8RowQuantized cast;
};

Fp8RowQuantized input_cast(const char* op, const Tensor& x2) {
  // A capture keeps nothing: a tensor it allocated and still held when it ends is refused.
  if (cuda::capturing()) return cast_rows(op, x2, DType::f8e4m3, Tensor(), padded_rows(x2.size(0)));
  thread_local InputCast kept;
  if (kept.cast.data.defined() && kept.storage.lock() == x2.storage() && kept.data == x2.data_ptr() &&
      kept.shape == x2.shape() && kept.dtype == x2.dtype() && kept.version == x2.version()) {
    return kept.cast;
  }
  kept = InputCast{x2.storage(), x2.data_ptr(), x2.shape(),
                   x2.dtype(),   x2.version(),  cast_rows(op, x2, DType::f8e4m3, Tensor(), padded_rows(x2.size(0)))};
  return kept.cast;
}

// y [Mp, N] (`out` dtype) = x2 [M, K] W^T + bias, x cast per row (Note [FP8 input cast reuse]): the
// forward of both layer ops.
Tensor base_forward(const char* op, const Tensor& x2, const Tensor& q, const Tensor& scale_inv, const Tensor& bias,
                    DType out) {
  const Fp8RowQuantized qx = input_cast(op, raw::contiguous(x2));
  return fp8_rowwise_gemm(qx.data, q, qx.scale_inv, scale_inv, out, bias_bf16(bias));
}

// dx [M, K] (`out` dtype) = dy [M, N] W [N, K], W = q * scale_inv by row: Note [FP8 frozen base]'s dgrad.
Tensor base_dgrad(const char* op, const Tensor& dy, const Tensor& q, const Tensor& scale_inv, DType out) {
  const int64_t m = dy.size(0), k = q.size(1);
  const Fp8RowQuantized g = cast_rows(op, raw::contiguous(dy), DType::f8e4m3, scale_inv, padded_rows(m));
  const Tensor ones_k = ones({k}, TensorOptions().dtype(DType::f32).device(dy.device()));
  Tensor dx = fp8_rowwise_gemm(g.data, transpose_bytes(q), g.scale_inv, ones_k, gemm_dtype(out));
  dx = raw::narrow(dx, 0, 0, m);
  return dx.dtype() == out ? dx : raw::to(dx, out);
}

}  // namespace

Fp8RowQuantized quantize_fp8_rows(const Tensor& x, DType format, const Tensor& column_scale) {
  const char* op = "quantize_fp8_rows";
  ops::check_floating(op, x);
  MT_CHECK_T(DTypeError, is_fp8(format), op, ": the FP8 format must be f8e4m3 or f8e5m2, got ", dtype_name(format));
  MT_CHECK_T(ShapeError, x.dim() == 2, op, ": x must be 2-D [rows, cols], got ", ops::describe(x));
  if (column_scale.defined()) check_factors(op, "column_scale", column_scale, x.size(1), x.device());
  NoGradGuard no_grad;  // a primitive: nothing recorded
  return cast_rows(op, raw::contiguous(x), format, column_scale, x.size(0));
}

Tensor fp8_rowwise_gemm(const Tensor& a_q, const Tensor& b_q, const Tensor& row_scale_inv_a,
                        const Tensor& row_scale_inv_b, DType out_dtype, const Tensor& bias, Fp8Compute compute) {
  const char* op = "fp8_rowwise_gemm";
  ops::check_fp8_gemm(op, a_q, b_q, out_dtype, bias, compute);
  const int64_t m = a_q.size(0), k = a_q.size(1), n = b_q.size(0);
  const Device device = a_q.device();
  check_factors(op, "row_scale_inv_a", row_scale_inv_a, m, device);
  check_factors(op, "row_scale_inv_b", row_scale_inv_b, n, device);
  const bool available = fp8_native_available(device);
  NoGradGuard no_grad;  // a primitive: nothing recorded

  if (compute != Fp8Compute::emulate && available) {
#if MT_WITH_CUDA
    ops::Fp8RowwiseGemmProblem p;
    // cuBLASLt's FP8 kernels read 16-byte aligned operands: a view at an odd offset is copied.
    const auto aligned = [](const Tensor& t) {
      const Tensor c = raw::contiguous(t);
      return reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0 ? c : raw::clone(c);
    };
    p.a = aligned(a_q);
    p.b = aligned(b_q);
    p.scale_inv_a = aligned(row_scale_inv_a);
    p.scale_inv_b = aligned(row_scale_inv_b);
    p.out = empty({m, n}, TensorOptions().dtype(out_dtype).device(device));
    if (bias.defined()) p.bias = aligned(bias);
    if (ops::fp8_rowwise_gemm_cuda(p)) return p.out;
    warn_unfused_once(device, m, n, k);
#endif
  }

  // The emulation, and the native path where cuBLASLt has no outer-vector scales: the product of
  // the exact operands in f32 (fp8_gemm with unit scales), then each factor and the bias in f32, in
  // that order, and one rounding to out_dtype.
  const Tensor one = ones({1}, TensorOptions().dtype(DType::f32).device(device));
  const Tensor acc = fp8_gemm(a_q, b_q, one, one, DType::f32, Tensor(), nullptr, compute);
  Tensor y = mul(mul(acc, raw::view(row_scale_inv_a, {m, 1})), raw::view(row_scale_inv_b, {1, n}));
  if (bias.defined()) y = add(y, bias);  // in f32: the bf16 bias widens exactly
  return out_dtype == DType::f32 ? y : raw::to(y, out_dtype);
}

Tensor fp8_rowwise_linear(const Tensor& x_in, const Tensor& weight_q, const Tensor& weight_scale_inv,
                          const Tensor& bias_in) {
  const char* op = "fp8_rowwise_linear";
  const Tensor x = autocast::cast_input(op, x_in);
  const Tensor bias = autocast::operand_copies(op, {bias_in})[0];
  check_fp8_weight(op, x, weight_q, weight_scale_inv);
  const int64_t n = weight_q.size(0), k = weight_q.size(1);
  check_bias(op, x, bias, n);
  const DType dtype = bias.defined() ? promote_types(x.dtype(), bias.dtype()) : x.dtype();
  const int64_t m = leading_rows(x);
  Tensor y = base_forward(op, raw::reshape(x, {m, k}), weight_q, weight_scale_inv, bias, gemm_dtype(dtype));
  y = raw::reshape(raw::narrow(y, 0, 0, m), leading_dims_and(x, n));
  if (y.dtype() != dtype) y = raw::to(y, dtype);

  if (autograd::needs_grad({x, bias_in})) {
    auto node = std::make_shared<autograd::LambdaNode>(
        "Fp8RowwiseLinearBackward", [m, n](const std::vector<Tensor>& g, const autograd::LambdaNode& self) {
          const Tensor dy = raw::reshape(g[0], {m, n});
          std::vector<Tensor> grads(2);
          if (self.needs_input_grad(0)) {
            grads[0] = raw::reshape(base_dgrad("fp8_rowwise_linear", dy, self.saved_tensor("weight_q"),
                                               self.saved_tensor("weight_scale_inv"), self.input_meta[0].dtype),
                                    self.input_meta[0].shape);
          }
          if (self.needs_input_grad(1)) grads[1] = ops::column_sums_f32(dy);  // [N], in f32
          return grads;
        });
    if (autograd::requires_grad(x)) {
      node->save("weight_q", weight_q);
      node->save("weight_scale_inv", weight_scale_inv);
    }
    autograd::record(node, {x, bias_in}, {y});
  }
  return y;
}

Tensor fp8_lora_linear(const Tensor& x_in, const Tensor& h_in, const Tensor& weight_q, const Tensor& weight_scale_inv,
                       const Tensor& bias_in, const Tensor& a_in, const Tensor& b_in, double scale,
                       OutputValues requested) {
  const char* op = "fp8_lora_linear";
  const OutputValues values = ops::values_to_write(requested);
  // x and h as any op's inputs; the parameters' copies recorded as nothing (as lora_linear's).
  const std::vector<Tensor> cast = autocast::cast_inputs(op, {x_in, h_in});
  const std::vector<Tensor> copies = autocast::operand_copies(op, {bias_in, a_in, b_in});
  const Tensor &x = cast[0], &h = cast[1], &bias = copies[0], &lora_a = copies[1], &lora_b = copies[2];
  check_fp8_weight(op, x, weight_q, weight_scale_inv);
  const int64_t n = weight_q.size(0), k = weight_q.size(1);
  check_bias(op, x, bias, n);
  ops::check_floating(op, h);
  ops::check_floating(op, lora_a);
  ops::check_floating(op, lora_b);
  ops::check_same_device(op, x, h);
  ops::check_same_device(op, x, lora_a);
  ops::check_same_device(op, x, lora_b);
  MT_CHECK_T(ShapeError, h.shape() == x.shape(), op, ": the adapter's input ", ops::describe(h),
             " must have the shape of x ", ops::describe(x));
  MT_CHECK_T(ShapeError, lora_a.dim() == 2 && lora_a.size(1) == k && lora_a.size(0) >= 1, op, ": lora_a must be [r, ",
             k, "] with r >= 1, got ", ops::describe(lora_a));
  const int64_t r = lora_a.size(0);
  MT_CHECK_T(ShapeError, lora_b.dim() == 2 && lora_b.size(0) == n && lora_b.size(1) == r, op, ": lora_b must be [", n,
             ", ", r, "] for weight ", shape_str(weight_q.shape()), " and lora_a ", shape_str(lora_a.shape()), ", got ",
             ops::describe(lora_b));
  DType dtype = promote_types(promote_types(x.dtype(), h.dtype()), promote_types(lora_a.dtype(), lora_b.dtype()));
  if (bias.defined()) dtype = promote_types(dtype, bias.dtype());
  const int64_t m = leading_rows(x);
  Tensor y;
  if (values == OutputValues::computed) {
    y = base_forward(op, raw::reshape(x, {m, k}), weight_q, weight_scale_inv, bias, gemm_dtype(dtype));
    y = raw::narrow(y, 0, 0, m);  // [M, N], contiguous: the padding rows are the last ones
    if (y.dtype() != dtype) y = raw::to(y, dtype);
  } else {
    y = empty({m, n}, TensorOptions().dtype(dtype).device(x.device()));
  }
  const Tensor t = ops::lora_branch_forward(y, h, lora_a, lora_b, scale, dtype, values);  // adds onto y
  const Tensor out = raw::reshape(y, leading_dims_and(x, n));

  // An adapter reading x itself records no input of its own: its dh is added into dx (lora_linear's).
  const bool h_is_x = ops::adapter_reads_x(x, h);
  const std::vector<Tensor> inputs = {x, h_is_x ? Tensor() : h, bias_in, a_in, b_in};  // what the node records
  if (autograd::needs_grad(inputs)) {
    auto node = std::make_shared<autograd::LambdaNode>(
        "Fp8LoraLinearBackward",
        [m, n, k, scale, h_is_x](const std::vector<Tensor>& g, const autograd::LambdaNode& self) {
          const Tensor dy = raw::reshape(g[0], {m, n});
          Tensor dx, db;
          if (self.needs_input_grad(0)) {  // in dy's dtype, which the dh GEMM adds in; the engine converts
            dx = base_dgrad("fp8_lora_linear", dy, self.saved_tensor("weight_q"), self.saved_tensor("weight_scale_inv"),
                            dy.dtype());
          }
          if (self.needs_input_grad(2)) db = ops::column_sums_f32(dy);  // [N], in f32
          ops::LoraBranchWanted want;
          want.h = self.needs_input_grad(1);
          want.a = self.needs_input_grad(3);
          want.b = self.needs_input_grad(4);
          want.h_shape = self.input_meta[1].shape;
          if (h_is_x && dx.defined()) want.h_into = raw::view(dx, {m, k});
          want.a_dtype = self.input_meta[3].dtype;
          want.b_dtype = self.input_meta[4].dtype;
          const ops::LoraBranchGrads branch = ops::lora_branch_backward(dy, self, want, scale);
          if (dx.defined()) dx = raw::reshape(dx, self.input_meta[0].shape);
          return std::vector<Tensor>{dx, branch.h, db, branch.a, branch.b};
        });
    // Saved: the FP8 weight (dx; the layer's own tensors), and the branch's (t for dB, h for dA,
    // B for dA and dh, A for dh). Nothing of x for the base.
    if (autograd::requires_grad(x)) {
      node->save("weight_q", weight_q);
      node->save("weight_scale_inv", weight_scale_inv);
    }
    ops::save_lora_branch(*node, t, h, lora_a, lora_b, autograd::requires_grad(h), autograd::requires_grad(a_in),
                          autograd::requires_grad(b_in));
    autograd::record(node, inputs, {out});
  }
  return out;
}

}  // namespace mt
