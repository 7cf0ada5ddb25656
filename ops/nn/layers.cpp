#include "ops/nn/layers.h"

#include <cmath>

#include "autograd/autocast.h"
#include "ops/dropout/dropout.h"
#include "ops/elementwise/elementwise.h"
#include "ops/embedding/embedding.h"
#include "ops/fp8/fp8_rowwise.h"
#include "ops/matmul/matmul.h"
#include "ops/nn/parameter_init.h"
#include "ops/norm/norm.h"

namespace mt::nn {

Linear::Linear(const LinearOptions& options, Generator* generator) {
  MT_CHECK(options.in_features() > 0 && options.out_features() > 0, "Linear: features must be positive, got in ",
           options.in_features(), ", out ", options.out_features());
  const double bound = 1.0 / std::sqrt(static_cast<double>(options.in_features()));
  weight = register_parameter("weight",
                              init_uniform({options.out_features(), options.in_features()}, -bound, bound, generator));
  if (options.bias())
    bias = register_parameter("bias", init_uniform({options.out_features()}, -bound, bound, generator));
}

Linear::Linear(const Tensor& weight_, const Tensor& bias_, const Tensor& weight_scale_inv_) {
  MT_CHECK(weight_.defined() && weight_.dim() == 2, "Linear: weight must be a 2-D [out, in] tensor, got ",
           weight_.defined() ? shape_str(weight_.shape()) : std::string("an undefined tensor"));
  MT_CHECK_T(DTypeError, is_floating(weight_.dtype()), "Linear: weight must be floating, got ",
             dtype_name(weight_.dtype()));
  MT_CHECK_T(ShapeError, !bias_.defined() || bias_.shape() == Shape{weight_.size(0)}, "Linear: bias must have shape ",
             shape_str({weight_.size(0)}), " for weight ", shape_str(weight_.shape()), ", got ",
             bias_.defined() ? shape_str(bias_.shape()) : std::string());
  const bool fp8 = weight_scale_inv_.defined();
  MT_CHECK_T(DTypeError, fp8 == (weight_.dtype() == DType::f8e4m3), "Linear: ",
             fp8 ? "with weight_scale_inv the weight must be f8e4m3 (an FP8 weight), got "
                 : "an FP8 weight needs its weight_scale_inv (the f32 scale of each row), got weight ",
             dtype_name(weight_.dtype()));
  if (fp8) {
    MT_CHECK_T(DTypeError,
               weight_scale_inv_.dtype() == DType::f32 && weight_scale_inv_.shape() == Shape{weight_.size(0)},
               "Linear: weight_scale_inv must be f32 [", weight_.size(0), "] for weight ", shape_str(weight_.shape()),
               ", got ", dtype_name(weight_scale_inv_.dtype()), shape_str(weight_scale_inv_.shape()));
    MT_CHECK_T(DeviceError, weight_scale_inv_.device() == weight_.device(), "Linear: weight_scale_inv is on ",
               weight_scale_inv_.device().str(), " but the weight on ", weight_.device().str());
  }
  weight = register_parameter("weight", weight_, /*requires_grad=*/!fp8);
  if (bias_.defined()) bias = register_parameter("bias", bias_);
  if (fp8) weight_scale_inv = register_buffer("weight_scale_inv", weight_scale_inv_, BufferDType::fixed);
}

void Linear::quantize_weight_fp8() {
  MT_CHECK(!has_fp8_weight(), "Linear::quantize_weight_fp8: the weight is FP8 already");
  MT_CHECK_T(DTypeError, is_compute_floating(weight.dtype()),
             "Linear::quantize_weight_fp8: the weight must be f64, f32, f16 or bf16, got ", dtype_name(weight.dtype()));
  MT_CHECK_T(ShapeError, weight.size(0) % 16 == 0 && weight.size(1) % 16 == 0,
             "Linear::quantize_weight_fp8: an FP8 weight needs out and in features that are multiples of 16 "
             "(cuBLASLt's FP8 GEMMs), got ",
             shape_str(weight.shape()));
  const Fp8RowQuantized q = quantize_fp8_rows(weight.detach(), DType::f8e4m3);
  Tensor handle = weight;
  handle.requires_grad_(false);
  handle.set_grad(Tensor());
  set_tensor_data(weight, q.data);
  weight_scale_inv = register_buffer("weight_scale_inv", q.scale_inv, BufferDType::fixed);
  fp8_state.reset();  // FP8 autocast's state, for a weight that no longer trains
}

bool Linear::runs_fp8(const Tensor& x) const {
  return has_fp8_weight() || (!fp8_excluded && x.defined() && fp8_autocast_enabled(x.device().type));
}

Tensor Linear::forward(const Tensor& x) const {
  const auto scope = trace_scope();
  if (has_fp8_weight()) return fp8_rowwise_linear(x, weight, weight_scale_inv, bias);
  if (!runs_fp8(x)) return linear(x, weight, bias);
  const Fp8Recipe& recipe = fp8_autocast_recipe(x.device().type);
  if (!fp8_state) {
    fp8_state = std::make_shared<Fp8LinearState>(recipe, x.device());
  } else if (fp8_state->device != x.device()) {  // the module moved (Module::to): the state follows
    auto moved = std::make_shared<Fp8LinearState>(fp8_state->recipe, x.device());
    moved->load_state_dict(fp8_state->state_dict());
    fp8_state = moved;
  }
  MT_CHECK(fp8_state->recipe == recipe, "Linear: this layer's FP8 state follows ", fp8_state->recipe.str(),
           " but the Fp8AutocastGuard asks for ", recipe.str(), "; reset the layer's fp8_state to start over");
  return fp8_linear(x, weight, bias, fp8_state);
}

Tensor Linear::forward_unread(const Tensor& x) const {
  if (has_fp8_weight() || runs_fp8(x)) return forward(x);
  const auto scope = trace_scope();
  return linear(x, weight, bias, OutputValues::unread);
}

Embedding::Embedding(int64_t num_embeddings, int64_t dim, Generator* generator) {
  MT_CHECK(num_embeddings > 0 && dim > 0, "Embedding: sizes must be positive, got ", num_embeddings, " x ", dim);
  weight = register_parameter("weight", init_normal({num_embeddings, dim}, 1.0, generator));
}

Tensor Embedding::forward(const Tensor& ids) const {
  const auto scope = trace_scope();
  return embedding(weight, ids);
}

LayerNorm::LayerNorm(int64_t dim, double eps_) : eps(eps_) {
  MT_CHECK(dim > 0, "LayerNorm: dim must be positive, got ", dim);
  weight = register_parameter("weight", init_constant({dim}, 1.0));
  bias = register_parameter("bias", init_constant({dim}, 0.0));
}

Tensor LayerNorm::forward(const Tensor& x) const {
  const auto scope = trace_scope();
  return normalize(x);
}

Tensor LayerNorm::normalize(const Tensor& x) const {
  const DeviceType device = x.device().type;
  if (output_in_autocast_dtype && autocast::is_enabled(device)) {
    return layer_norm(x, weight, bias, eps, autocast::dtype(device));
  }
  return layer_norm(x, weight, bias, eps);
}

AddNorm LayerNorm::forward_add(const Tensor& x, const Tensor& delta) const {
  const auto scope = trace_scope();
  if (!fuse_add) {
    const Tensor sum = add(x, delta);
    return {sum, normalize(sum)};
  }
  const DeviceType device = x.device().type;
  if (output_in_autocast_dtype && autocast::is_enabled(device)) {
    return add_layer_norm(x, delta, weight, bias, eps, autocast::dtype(device));
  }
  return add_layer_norm(x, delta, weight, bias, eps);
}

Dropout::Dropout(double p_) : p(p_) { MT_CHECK(p >= 0 && p <= 1, "Dropout: p must lie in [0, 1], got ", p); }

Tensor Dropout::forward(const Tensor& x) const {
  const auto scope = trace_scope();
  return dropout(x, p, is_training());
}

}  // namespace mt::nn
