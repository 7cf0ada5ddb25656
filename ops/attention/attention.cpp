// Scaled dot-product attention as a composition of differentiable ops.
#include "ops/attention/attention.h"
#include "autograd/autocast.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "autograd/function.h"
#include "core/random.h"
#include "ops/attention/attention_cudnn.h"
#include "ops/common.h"
#include "ops/dropout/dropout.h"
#include "ops/elementwise/elementwise.h"
#include "ops/matmul/matmul.h"
#include "ops/shape/shape.h"
#include "ops/softmax/softmax.h"
#include "ops/where/where.h"

namespace mt {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

// [Tq, Tk] bool, true above the diagonal (key j > query i): the positions causal attention hides.
// Built on the host once per (Tq, Tk, device), then reused: every layer of every step asks for
// the same mask, and building and copying it each time cost milliseconds. The cache is never
// destroyed (a few masks of Tq*Tk bytes): freeing device memory during static destruction,
// after the CUDA runtime may have shut down, would fail.
Tensor causal_mask(int64_t tq, int64_t tk, Device device) {
  static std::mutex mutex;
  static auto* cache = new std::map<std::tuple<int64_t, int64_t, int, int>, Tensor>();
  std::lock_guard<std::mutex> lock(mutex);
  Tensor& mask = (*cache)[{tq, tk, static_cast<int>(device.type), device.index}];
  if (!mask.defined()) {
    std::vector<double> hidden(static_cast<size_t>(tq * tk));
    for (int64_t i = 0; i < tq; ++i) {
      for (int64_t j = 0; j < tk; ++j) hidden[static_cast<size_t>(i * tk + j)] = j > i ? 1.0 : 0.0;
    }
    mask = raw::to(from_vector(hidden, {tq, tk}, DType::boolean), device);
  }
  return mask;
}

// Printed once per reason: the reference on a GPU holds [B, H, Tq, Tk] scores and is slow.
void warn_reference_once(const std::string& reason) {
  static std::mutex mutex;
  static auto* warned = new std::set<std::string>();
  std::lock_guard<std::mutex> lock(mutex);
  if (!warned->insert(reason).second) return;
  std::fprintf(stderr,
               "mixtrain: warning: %s: cuDNN fused attention cannot serve %s; using the unfused reference, which "
               "keeps the [B, H, Tq, Tk] scores in memory\n",
               kOp, reason.c_str());
}

// cuDNN's flash attention, forward and backward (ops/attention/attention_cudnn.h). The
// backward saves q, k, v, the output and the row statistics: O(T) memory, not O(T^2).
Tensor fused_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double dropout_p, double scale,
                       const Tensor& bias) {
  ops::CudnnSdpaProblem problem{causal, dropout_p, scale, 0, 0};
  if (dropout_p > 0.0) {
    Generator& generator = default_generator(q.device());
    problem.seed = generator.seed();
    problem.offset = generator.advance(static_cast<uint64_t>(q.size(0) * q.size(1) * q.size(2) * k.size(2)));
  }
  ops::CudnnSdpaForward forward = ops::cudnn_sdpa_forward(q, k, v, problem, bias);
  if (autograd::needs_grad({q, k, v})) {
    auto node = std::make_shared<autograd::LambdaNode>(
        "ScaledDotProductAttentionBackward(cuDNN)",
        [problem, bias](const std::vector<Tensor>& grads, const autograd::LambdaNode& self) {
          const auto g =
              ops::cudnn_sdpa_backward(self.saved_tensor("q"), self.saved_tensor("k"), self.saved_tensor("v"),
                                       self.saved_tensor("out"), grads[0], self.saved_tensor("stats"), problem, bias);
          return std::vector<Tensor>{g[0], g[1], g[2]};
        });
    node->save("q", q);
    node->save("k", k);
    node->save("v", v);
    node->save("out", forward.out);
    node->save("stats", forward.stats);
    autograd::record(node, {q, k, v}, {forward.out});
  }
  return forward.out;
}

// The composite: matmul, mask, softmax, dropout, matmul. q, k and v have as many heads.
Tensor reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double dropout_p,
                           double scale, const Tensor& bias) {
  Tensor scores = mul(matmul(q, k.transpose(2, 3)), scale);  // [B, H, Tq, Tk]
  if (bias.defined()) scores = add(scores, bias);
  if (causal) {
    scores =
        masked_fill(scores, causal_mask(q.size(2), k.size(2), q.device()), -std::numeric_limits<double>::infinity());
  }
  Tensor attn = softmax(scores, -1);
  if (dropout_p > 0.0) attn = dropout(attn, dropout_p, /*training=*/true);
  return matmul(attn, v);  // [B, H, Tq, Dv]
}

// [B, Hkv, T, D] -> [B, Hkv * group, T, D], each head repeated for the query heads that share it
// (the reference's grouped-query attention; its backward sums the copies' gradients).
Tensor repeat_heads(const Tensor& x, int64_t group) {
  if (group == 1) return x;
  const int64_t b = x.size(0), h = x.size(1), t = x.size(2), d = x.size(3);
  return reshape(expand(reshape(x, {b, h, 1, t, d}), {b, h, group, t, d}), {b, h * group, t, d});
}

void check_mask(const Tensor& q, const Tensor& k, const Tensor& attn_mask) {
  ops::check_same_device(kOp, q, attn_mask);
  MT_CHECK_T(DTypeError, attn_mask.dtype() == DType::boolean || is_floating(attn_mask.dtype()), kOp,
             ": attn_mask must be bool (true: may attend) or floating (added to the scores), got ",
             ops::describe(attn_mask));
  MT_CHECK_T(ShapeError,
             attn_mask.dim() == 4 && (attn_mask.size(0) == q.size(0) || attn_mask.size(0) == 1) &&
                 attn_mask.size(1) == 1 && attn_mask.size(2) == q.size(2) && attn_mask.size(3) == k.size(2),
             kOp, ": attn_mask must be [B or 1, 1, Tq, Tk] = [", q.size(0), " or 1, 1, ", q.size(2), ", ", k.size(2),
             "], got ", ops::describe(attn_mask));
  MT_CHECK(!attn_mask.requires_grad(), kOp, ": attn_mask takes no gradient; detach it");
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, bool causal,
                                    double dropout_p, std::optional<double> scale, const Tensor& attn_mask) {
  const std::vector<Tensor> in = autocast::cast_inputs(kOp, {q_in, k_in, v_in});
  const Tensor& q = in[0];
  const Tensor& k = in[1];
  const Tensor& v = in[2];
  ops::check_floating(kOp, q);
  ops::check_floating(kOp, k);
  ops::check_floating(kOp, v);
  ops::check_same_device(kOp, q, k);
  ops::check_same_device(kOp, q, v);
  MT_CHECK_T(DTypeError, q.dtype() == k.dtype() && q.dtype() == v.dtype(), kOp,
             ": q, k and v must share one dtype, got q ", ops::describe(q), ", k ", ops::describe(k), ", v ",
             ops::describe(v));
  MT_CHECK_T(ShapeError,
             q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(0) == k.size(0) && q.size(0) == v.size(0) &&
                 k.size(1) == v.size(1) && k.size(1) > 0 && q.size(1) % k.size(1) == 0 && q.size(3) == k.size(3) &&
                 k.size(2) == v.size(2),
             kOp, ": expected q [B, H, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv] with H a multiple of Hkv, got q ",
             ops::describe(q), ", k ", ops::describe(k), ", v ", ops::describe(v));
  MT_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, kOp, ": dropout_p must lie in [0, 1], got ", dropout_p);
  MT_CHECK_T(ShapeError, scale.has_value() || q.size(3) > 0, kOp, ": the default scale 1/sqrt(D) needs D > 0, got q ",
             ops::describe(q));
  const double s = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  if (attn_mask.defined()) check_mask(q, k, attn_mask);
  const Tensor bias = attn_mask.defined() ? attention_bias(attn_mask, q.dtype()) : Tensor();

  // One query row per head (a cached generation step) has nothing to fuse: its scores are
  // [B, H, 1, Tk], and a fused graph would be built anew for every cache length.
  const bool single_query = q.size(2) == 1 && dropout_p == 0.0;
  if (q.is_cuda() && !single_query) {
    const std::string unsupported = ops::cudnn_sdpa_unsupported(q, k, v);
    if (unsupported.empty()) return fused_attention(q, k, v, causal, dropout_p, s, bias);
    warn_reference_once(unsupported);
  }

  // The inputs were cast once above; the ops inside keep that dtype, as a fused kernel would:
  // softmax accumulates in f32 but its [B, H, Tq, Tk] output stays in the inputs' dtype
  // (under autocast's own policy it would be f32, twice the memory, then cast back for attn v).
  AutocastGuard keep_dtype(q.device().type, /*enabled=*/false);
  const int64_t group = q.size(1) / k.size(1);  // query heads per key/value head
  if (group > 1 && !causal && dropout_p == 0.0 && !bias.defined()) {
    // Without a mask, a key/value head's query heads are one taller block of rows:
    // [B, Hkv, group * Tq, D] against k [B, Hkv, Tk, D], nothing repeated.
    const int64_t b = q.size(0), tq = q.size(2);
    const Tensor rows = reshape(q, {b, k.size(1), group * tq, q.size(3)});
    const Tensor out = reference_attention(rows, k, v, false, 0.0, s, Tensor());
    return reshape(out, {b, q.size(1), tq, v.size(3)});
  }
  return reference_attention(q, repeat_heads(k, group), repeat_heads(v, group), causal, dropout_p, s, bias);
}

// [B or 1, 1, Tq, Tk], contiguous: cuDNN reads the bias so.
Tensor attention_bias(const Tensor& attn_mask, DType dtype) {
  if (attn_mask.dtype() == DType::boolean) {
    return masked_fill(full(attn_mask.shape(), -std::numeric_limits<double>::infinity(),
                            TensorOptions().dtype(dtype).device(attn_mask.device())),
                       attn_mask, 0.0);
  }
  return ops::as_dtype(attn_mask, dtype).contiguous();
}

}  // namespace mt
