// fp8_linear: validation, the casts by recipe, the weight cache, and the backward beside the forward.
#include "ops/fp8/fp8_linear.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/checkpoint.h"
#include "autograd/function.h"
#include "core/cuda_context.h"
#include "ops/common.h"
#include "ops/fp8/fp8.h"
#include "ops/fp8/fp8_kernels.h"
#include "ops/matmul/matmul.h"
#include "ops/reduction/reduction.h"

namespace mt {

namespace {

constexpr const char* kOp = "fp8_linear";
constexpr const char* kTensors[] = {"input", "weight", "grad_output"};

void warn_fallback_once(const std::string& reason) {
  static std::mutex mutex;
  static auto* warned = new std::set<std::string>();  // never destroyed: warnings may come at exit
  std::lock_guard<std::mutex> lock(mutex);
  if (!warned->insert(reason).second) return;
  std::fprintf(stderr, "mixtrain: warning: %s: %s; this layer runs linear() instead (bf16 under autocast)\n", kOp,
               reason.c_str());
}

// t [R, C] with zero rows appended up to `rows` (t itself when it has them).
Tensor pad_rows(const Tensor& t, int64_t rows) {
  if (t.size(0) == rows) return t;
  const Tensor padded = zeros({rows, t.size(1)}, ops::options_of(t));
  raw::narrow(padded, 0, 0, t.size(0)).copy_(t);
  return padded;
}

// The rows the GEMMs run: M rounded up to a multiple of 16, and at least 16 (an empty x gives
// GEMMs of zero rows, which not every FP8 kernel takes).
int64_t padded_rows(int64_t m) { return std::max<int64_t>(16, (m + 15) / 16 * 16); }

// What the GEMMs write for a result wanted in `dtype`: bf16 or f32 (fp8_gemm's two outputs).
DType gemm_dtype(DType dtype) { return dtype == DType::bf16 ? DType::bf16 : DType::f32; }

struct Cast {
  Tensor q, q_t;            // [R, C] and [C, R], each only when asked for
  Tensor scale, scale_inv;  // f32 [1]: what the cast used
};

// t [R, C] cast to `format` in the layouts asked for, scaled by the recipe; under delayed scaling
// the state's amax history takes the amax this cast measured (Note [FP8 scaling update points]).
Cast cast(const Tensor& t, const Fp8Recipe& recipe, Fp8TensorState& state, DType format, bool as_is, bool transposed) {
  const bool delayed = recipe.scaling == Fp8Recipe::Scaling::delayed;
  Cast c;
  if (delayed) {
    // Copies: update() rewrites the state's tensors in place, and the GEMMs (the backward's too)
    // must divide by the scale this cast used.
    c.scale = raw::clone(state.scale);
    c.scale_inv = raw::clone(state.scale_inv);
  } else {
    const Fp8Scale s = current_scale(fp8_amax(t), format, recipe.margin);
    c.scale = s.scale;
    c.scale_inv = s.scale_inv;
    // Kept for fp8_health, by reference (no copy per cast). A CUDA Graph capture may neither keep
    // what it allocates nor free what was made before it, so a captured step leaves the scale of the
    // last cast before the capture: its replays report that one.
    if (!cuda::capturing()) state.last_scale = s.scale;
  }
  const Fp8Layout layout = as_is && transposed ? Fp8Layout::both
                           : transposed        ? Fp8Layout::transposed
                                               : Fp8Layout::as_is;
  Fp8Quantized q = quantize_fp8(t, c.scale, format, layout);
  if (layout == Fp8Layout::both) {
    c.q = q.data;
    c.q_t = q.data_t;
  } else {
    (transposed ? c.q_t : c.q) = q.data;
  }
  if (delayed) state.update(q.amax);
  return c;
}

// Note [FP8 weight cache]: q(W), cast again only when the weight has changed. A CUDA Graph
// capture neither reads nor fills the cache: each replay casts the weight as it is then.
Fp8WeightCache cast_weight(Fp8LinearState& state, const Tensor& w, bool want_transposed) {
  Fp8WeightCache uncached;
  Fp8WeightCache& c = cuda::capturing() ? uncached : state.weight_cache;
  const bool valid =
      c.q.defined() && c.source.lock().get() == w.impl() && c.storage.lock() == w.storage() && c.version == w.version();
  if (!valid) {  // both layouts from one pass when the backward will want q(W^T)
    const Cast cw = cast(w, state.recipe, state.weight, DType::f8e4m3, /*as_is=*/true, want_transposed);
    c = Fp8WeightCache{w.impl_ptr(), w.storage(), w.version(), cw.q, cw.q_t, cw.scale, cw.scale_inv, c.casts + 1};
  }
  if (want_transposed && !c.q_t.defined()) c.q_t = quantize_fp8(w, c.scale, DType::f8e4m3, Fp8Layout::transposed).data;
  return c;
}

void check_inputs(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const std::shared_ptr<Fp8LinearState>& state) {
  ops::check_floating(kOp, x);
  ops::check_floating(kOp, weight);
  ops::check_same_device(kOp, x, weight);
  MT_CHECK_T(ShapeError, weight.dim() == 2, kOp, ": weight must be 2-D [out, in], got ", ops::describe(weight));
  MT_CHECK_T(ShapeError, x.dim() >= 1 && x.size(-1) == weight.size(1), kOp, ": input ", ops::describe(x),
             " and weight ", shape_str(weight.shape()), " cannot be multiplied (x must be [..., ", weight.size(1),
             "])");
  if (bias.defined()) {
    ops::check_floating(kOp, bias);
    ops::check_same_device(kOp, x, bias);
    MT_CHECK_T(ShapeError, bias.dim() == 1 && bias.size(0) == weight.size(0), kOp, ": bias must be [", weight.size(0),
               "] for weight ", shape_str(weight.shape()), ", got ", ops::describe(bias));
  }
  MT_CHECK(state != nullptr, kOp, ": no Fp8LinearState (the layer's scaling state) was given");
  MT_CHECK_T(DeviceError, state->device == x.device(), kOp, ": the FP8 state is on ", state->device.str(),
             " but the input is on ", x.device().str());
  MT_CHECK(!in_checkpointed_segment(), kOp,
           ": an FP8 linear layer cannot run inside a gradient-checkpointed segment (mt::checkpoint): its "
           "recomputation could not repeat the scales of the first pass; checkpoint the attention core only "
           "('selective'), turn checkpointing off, or open Fp8AutocastGuard(..., enabled = false) around the segment");
}

// The output dtype: the autocast dtype for f32/f16/bf16 inputs under autocast (linear's policy),
// else the inputs' promoted dtype.
DType output_dtype(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  DType dtype = promote_types(x.dtype(), weight.dtype());
  if (bias.defined()) dtype = promote_types(dtype, bias.dtype());
  const DeviceType type = x.device().type;
  return autocast::is_enabled(type) && dtype != DType::f64 ? autocast::dtype(type) : dtype;
}

}  // namespace

Fp8LinearState::Fp8LinearState(const Fp8Recipe& r, Device d) : recipe(r), device(d) {
  recipe.validate();
  if (recipe.scaling == Fp8Recipe::Scaling::delayed) {
    input = Fp8TensorState(recipe.for_format(DType::f8e4m3), device);
    weight = Fp8TensorState(recipe.for_format(DType::f8e4m3), device);
    grad_output = Fp8TensorState(recipe.for_format(DType::f8e5m2), device);
  }
}

std::map<std::string, Tensor> Fp8LinearState::state_dict() const {
  const bool delayed = recipe.scaling == Fp8Recipe::Scaling::delayed;
  std::map<std::string, Tensor> out;
  out["recipe"] =
      from_vector({delayed ? 0.0 : 1.0, static_cast<double>(recipe.history_len),
                   recipe.amax_compute == DelayedScaling::Amax::max ? 0.0 : 1.0, static_cast<double>(recipe.margin)},
                  {4}, DType::i64);
  if (!delayed) return out;
  const Fp8TensorState* states[] = {&input, &weight, &grad_output};
  for (int i = 0; i < 3; ++i) {
    for (const auto& [key, t] : states[i]->state_dict()) out[std::string(kTensors[i]) + "." + key] = t;
  }
  return out;
}

Fp8Recipe Fp8LinearState::saved_recipe(const std::map<std::string, Tensor>& state) {
  const char* op = "Fp8LinearState::load_state_dict";
  const auto it = state.find("recipe");
  MT_CHECK(it != state.end() && it->second.defined(), op, ": missing key 'recipe'");
  MT_CHECK(it->second.numel() == 4 && !is_floating(it->second.dtype()), op,
           ": 'recipe' must hold 4 integers (scaling, history_len, amax_compute, margin), got ",
           ops::describe(it->second));
  const std::vector<int64_t> v = it->second.to(kCPU).to_vector<int64_t>();
  MT_CHECK((v[0] == 0 || v[0] == 1) && (v[2] == 0 || v[2] == 1), op,
           ": 'recipe' holds an unknown scaling or amax_compute code: [", v[0], ", ", v[1], ", ", v[2], ", ", v[3],
           "]");
  Fp8Recipe r = v[0] == 0
                    ? Fp8Recipe::delayed(static_cast<int>(v[1]),
                                         v[2] == 0 ? DelayedScaling::Amax::max : DelayedScaling::Amax::most_recent,
                                         static_cast<int>(v[3]))
                    : Fp8Recipe::current(static_cast<int>(v[3]));
  r.validate();
  return r;
}

void Fp8LinearState::load_state_dict(const std::map<std::string, Tensor>& state) {
  const char* op = "Fp8LinearState::load_state_dict";
  const Fp8Recipe saved = saved_recipe(state);
  MT_CHECK(saved == recipe, op, ": the state was saved under ", saved.str(), " but this layer follows ", recipe.str());
  const std::map<std::string, Tensor> mine = state_dict();
  for (const auto& [key, value] : state) {
    MT_CHECK(mine.count(key) == 1, op, ": unexpected key '", key, "' for ", recipe.str());
  }
  for (const auto& [key, value] : mine) MT_CHECK(state.count(key) == 1, op, ": missing key '", key, "'");
  Fp8TensorState* states[] = {&input, &weight, &grad_output};
  for (int i = 0; i < 3 && recipe.scaling == Fp8Recipe::Scaling::delayed; ++i) {
    std::map<std::string, Tensor> part;
    for (const char* key : {"amax_history", "scale", "scale_inv"}) {
      part[key] = state.at(std::string(kTensors[i]) + "." + key);
    }
    states[i]->load_state_dict(part);
  }
  weight_cache = Fp8WeightCache();
}

Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const std::shared_ptr<Fp8LinearState>& state) {
  check_inputs(x, weight, bias, state);
  const int64_t n = weight.size(0), k = weight.size(1);
  if (n % 16 != 0 || k % 16 != 0) {
    warn_fallback_once(detail::str_cat("weight ", shape_str(weight.shape()),
                                       ": out and in features must be multiples of 16 for FP8 GEMMs"));
    return linear(x, weight, bias);
  }
  const DType out_dtype = output_dtype(x, weight, bias);
  const Shape out_shape = [&] {
    Shape s(x.shape().begin(), x.shape().end() - 1);
    s.push_back(n);
    return s;
  }();
  const int64_t m = shape_numel(out_shape) / n, mp = padded_rows(m);
  const bool want_dgrad = autograd::needs_grad({x}), want_wgrad = autograd::needs_grad({weight});

  Fp8LinearState& s = *state;
  const Cast cx = cast(pad_rows(raw::reshape(x, {m, k}), mp), s.recipe, s.input, DType::f8e4m3, /*as_is=*/true,
                       /*transposed=*/want_wgrad);
  const Fp8WeightCache cw = cast_weight(s, weight, want_dgrad);
  Tensor bias_bf16;  // what cuBLASLt's FP8 kernels read
  if (bias.defined()) bias_bf16 = raw::to(bias.detach(), DType::bf16);
  Tensor y = fp8_gemm(cx.q, cw.q, cx.scale_inv, cw.scale_inv, gemm_dtype(out_dtype), bias_bf16);  // [Mp, N]
  y = raw::reshape(raw::narrow(y, 0, 0, m), out_shape);
  if (y.dtype() != out_dtype) y = raw::to(y, out_dtype);

  if (autograd::needs_grad({x, weight, bias})) {
    auto node = std::make_shared<autograd::LambdaNode>(
        "Fp8LinearBackward", [state, m, mp, n](const std::vector<Tensor>& g, const autograd::LambdaNode& self) {
          const Tensor dy = raw::reshape(g[0], {m, n});
          const bool want_x = self.needs_input_grad(0), want_w = self.needs_input_grad(1);
          std::vector<Tensor> grads(3);
          if (want_x || want_w) {
            const Cast cdy = cast(pad_rows(dy, mp), state->recipe, state->grad_output, DType::f8e5m2, want_x, want_w);
            if (want_x) {
              const Tensor dx = fp8_gemm(cdy.q, self.saved_tensor("w_t"), cdy.scale_inv,
                                         self.saved_tensor("w_scale_inv"), gemm_dtype(self.input_meta[0].dtype));
              grads[0] = raw::reshape(raw::narrow(dx, 0, 0, m), self.input_meta[0].shape);
            }
            if (want_w) {
              grads[1] = fp8_gemm(cdy.q_t, self.saved_tensor("x_t"), cdy.scale_inv, self.saved_tensor("x_scale_inv"),
                                  gemm_dtype(self.input_meta[1].dtype));
            }
          }
          if (self.needs_input_grad(2)) grads[2] = ops::column_sums_f32(dy);  // [N], in f32
          return grads;
        });
    if (want_wgrad) {
      node->save("x_t", cx.q_t);
      node->save("x_scale_inv", cx.scale_inv);
    }
    if (want_dgrad) {
      node->save("w_t", cw.q_t);
      node->save("w_scale_inv", cw.scale_inv);
    }
    autograd::record(node, {x, weight, bias}, {y});
  }
  return y;
}

}  // namespace mt
