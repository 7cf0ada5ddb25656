// cuDNN fused attention (see attention_cudnn.h). Built when CUDA and the cudnn-frontend
// headers (tools/setup.sh fetches them into third_party/) are both present.
#include "ops/attention/attention_cudnn.h"
#include "ops/backends.h"

#include "core/error.h"

#if defined(MT_WITH_CUDA) && defined(MT_WITH_CUDNN_FRONTEND)

#include <cudnn_frontend.h>

#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "core/cuda_context.h"
#include "ops/cuda/cudnn_handle.h"
#include "ops/shape/windows.h"

namespace mt::ops {

namespace {

namespace fe = cudnn_frontend;

// Fixed ids naming each operand in a graph's variant pack.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kSeed, kOffset, kGradO, kGradQ, kGradK, kGradV, kBias };

void check_fe(fe::error_t status, const char* what) {
  if (status.is_bad()) {
    throw VendorError(
        detail::str_cat("cuDNN frontend: ", what, " failed: ", status.get_message(),
                        " (set CUDNN_FRONTEND_LOG_INFO=1 and CUDNN_FRONTEND_LOG_FILE=stderr for details)"));
  }
}

fe::DataType_t fe_dtype(DType dtype) { return dtype == DType::f16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16; }

// A [B, H, T, D] tensor stored as [B, T, H, D]: the layout the heads come from and go back to.
Tensor empty_bthd(const Shape& bhtd, DType dtype, Device device) {
  return empty({bhtd[0], bhtd[2], bhtd[1], bhtd[3]}, TensorOptions().dtype(dtype).device(device)).transpose(1, 2);
}

// An empty [B, H, T, D] tensor laid out as `like`: contiguous when like is (PyTorch's convention
// for the heads), else stored [B, T, H, D] (heads split from one projection, or any other view).
// The output and the gradients take their operands' layout: cuDNN's kernels ran contiguous
// [B, H, T, D] operands with [B, T, H, D] outputs and gradients at half the speed of one layout
// throughout.
Tensor empty_heads_like(const Tensor& like) {
  if (like.is_contiguous()) return empty(like.shape(), TensorOptions().dtype(like.dtype()).device(like.device()));
  return empty_bthd(like.shape(), like.dtype(), like.device());
}

std::shared_ptr<fe::graph::Tensor_attributes> graph_tensor(fe::graph::Graph& g, const char* name, int64_t uid,
                                                           const Tensor& t) {
  return g.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(t.shape()).set_stride(t.strides()));
}

std::shared_ptr<fe::graph::Tensor_attributes> scalar_by_value(fe::graph::Graph& g, const char* name, int64_t uid) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({1, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT64)
                      .set_is_pass_by_value(true));
}

struct BuiltGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
};

// Building a graph costs milliseconds: one per problem (shapes, strides, dtype, options,
// device), built on first use and kept. Never destroyed, like the handles it was built with.
BuiltGraph& cached_graph(const std::string& key, int device,
                         const std::function<std::shared_ptr<fe::graph::Graph>()>& describe) {
  static std::mutex mutex;
  static auto* cache = new std::map<std::string, BuiltGraph>();
  std::lock_guard<std::mutex> lock(mutex);
  BuiltGraph& built = (*cache)[key];
  if (!built.graph) {
    std::shared_ptr<fe::graph::Graph> g = describe();
    CudnnHandle handle(device);
    check_fe(g->validate(), "validating the SDPA graph");
    check_fe(g->build_operation_graph(handle.get()), "building the SDPA operation graph");
    check_fe(g->create_execution_plans({fe::HeurMode_t::A}), "creating SDPA execution plans");
    check_fe(g->check_support(handle.get()), "checking SDPA support");
    check_fe(g->build_plans(handle.get()), "building SDPA plans");
    check_fe(g->get_workspace_size(built.workspace_bytes), "querying the SDPA workspace");
    built.graph = std::move(g);
  }
  return built;
}

std::string problem_key(const char* direction, const std::vector<Tensor>& operands, const CudnnSdpaProblem& p,
                        const Tensor& bias) {
  std::ostringstream key;
  key << direction << " dev" << operands[0].device().index << " " << dtype_name(operands[0].dtype()) << " causal"
      << p.causal << " p" << p.dropout_p << " s" << p.scale;
  for (const Tensor& t : operands) key << " " << shape_str(t.shape()) << shape_str(t.strides());
  if (bias.defined()) key << " bias" << shape_str(bias.shape()) << shape_str(bias.strides());
  return key.str();
}

void execute(const BuiltGraph& built, int device, std::unordered_map<int64_t, void*>& pack) {
  const CudnnWorkspace workspace(static_cast<size_t>(built.workspace_bytes), Device(DeviceType::cuda, device));
  CudnnHandle handle(device);
  check_fe(built.graph->execute(handle.get(), pack, workspace.data()), "running SDPA");
}

void set_common(fe::graph::Graph& g, DType dtype) {
  g.set_io_data_type(fe_dtype(dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
}

}  // namespace

std::string cudnn_sdpa_unsupported(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (!q.is_cuda()) return "not a CUDA tensor";
  if (q.dtype() != DType::f16 && q.dtype() != DType::bf16) {
    return detail::str_cat("dtype ", dtype_name(q.dtype()), " (the fused kernels take f16 and bf16)");
  }
  if (cuda::compute_capability(q.device().index) < 80) return "a GPU older than sm_80";
  const int64_t d = q.size(3);
  if (d != v.size(3) || d % 8 != 0 || d > 128) {
    return detail::str_cat("head sizes D ", d, ", Dv ", v.size(3), " (the fused kernels need D = Dv, a multiple of 8, ",
                           "at most 128)");
  }
  for (const Tensor* t : {&q, &k, &v}) {
    if (t->stride(3) != 1) return "a head dimension that is not contiguous";
  }
  return "";
}

CudnnSdpaForward cudnn_sdpa_forward(const Tensor& q, const Tensor& k, const Tensor& v, const CudnnSdpaProblem& p,
                                    const Tensor& bias) {
  const int device = q.device().index;
  cuda::DeviceGuard on_device(device);
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2);
  CudnnSdpaForward result{empty_heads_like(q),
                          empty({B, H, Tq, 1}, TensorOptions().dtype(DType::f32).device(q.device()))};
  const bool dropout = p.dropout_p > 0.0;
  BuiltGraph& built = cached_graph(problem_key("fwd", {q, k, v, result.out}, p, bias), device, [&] {
    auto g = std::make_shared<fe::graph::Graph>();
    set_common(*g, q.dtype());
    auto options = fe::graph::SDPA_attributes()
                       .set_name("sdpa")
                       .set_generate_stats(true)
                       .set_attn_scale(static_cast<float>(p.scale))
                       .set_causal_mask(p.causal);
    if (bias.defined()) options.set_bias(graph_tensor(*g, "bias", kBias, bias));
    if (dropout) {
      options.set_dropout(static_cast<float>(p.dropout_p), scalar_by_value(*g, "seed", kSeed),
                          scalar_by_value(*g, "offset", kOffset));
    }
    auto [o, stats] =
        g->sdpa(graph_tensor(*g, "q", kQ, q), graph_tensor(*g, "k", kK, k), graph_tensor(*g, "v", kV, v), options);
    o->set_output(true).set_uid(kO).set_dim(result.out.shape()).set_stride(result.out.strides());
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(result.stats.shape())
        .set_stride(result.stats.strides());
    return g;
  });
  int64_t seed = static_cast<int64_t>(p.seed), offset = static_cast<int64_t>(p.offset);
  std::unordered_map<int64_t, void*> pack = {{kQ, q.data_ptr()},
                                             {kK, k.data_ptr()},
                                             {kV, v.data_ptr()},
                                             {kO, result.out.data_ptr()},
                                             {kStats, result.stats.data_ptr()}};
  if (dropout) pack[kSeed] = &seed, pack[kOffset] = &offset;
  if (bias.defined()) pack[kBias] = bias.data_ptr();
  execute(built, device, pack);
  return result;
}

std::array<Tensor, 3> cudnn_sdpa_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                          const Tensor& grad_out_in, const Tensor& stats, const CudnnSdpaProblem& p,
                                          const Tensor& bias) {
  const int device = q.device().index;
  cuda::DeviceGuard on_device(device);
  // dO in the output's layout (it usually arrives so, from the heads' merge).
  Tensor grad_out = grad_out_in;
  if (grad_out.strides() != out.strides() || grad_out.dtype() != out.dtype()) {
    grad_out = empty_heads_like(out);
    grad_out.copy_(grad_out_in);
  }
  // q, k and v split from one fused projection get their gradients in one buffer laid out
  // as that projection's output, which split's backward then passes on without a copy.
  std::array<Tensor, 3> grads;
  if (std::vector<Tensor> windows = empty_windows_like({q, k, v}); !windows.empty()) {
    grads = {windows[0], windows[1], windows[2]};
  } else {
    grads = {empty_heads_like(q), empty_heads_like(k), empty_heads_like(v)};
  }
  const bool dropout = p.dropout_p > 0.0;
  BuiltGraph& built =
      cached_graph(problem_key(backends::deterministic_algorithms() ? "bwd deterministic" : "bwd",
                               {q, k, v, out, grad_out, grads[0], grads[1], grads[2]}, p, bias),
                   device, [&] {
                     auto g = std::make_shared<fe::graph::Graph>();
                     set_common(*g, q.dtype());
                     auto options = fe::graph::SDPA_backward_attributes()
                                        .set_name("sdpa_backward")
                                        .set_attn_scale(static_cast<float>(p.scale))
                                        .set_causal_mask(p.causal)
                                        .set_deterministic_algorithm(backends::deterministic_algorithms());
                     if (bias.defined()) options.set_bias(graph_tensor(*g, "bias", kBias, bias));
                     if (dropout) {
                       options.set_dropout(static_cast<float>(p.dropout_p), scalar_by_value(*g, "seed", kSeed),
                                           scalar_by_value(*g, "offset", kOffset));
                     }
                     auto stats_in = g->tensor(fe::graph::Tensor_attributes()
                                                   .set_name("stats")
                                                   .set_uid(kStats)
                                                   .set_dim(stats.shape())
                                                   .set_stride(stats.strides())
                                                   .set_data_type(fe::DataType_t::FLOAT));
                     auto [dq, dk, dv] = g->sdpa_backward(graph_tensor(*g, "q", kQ, q), graph_tensor(*g, "k", kK, k),
                                                          graph_tensor(*g, "v", kV, v), graph_tensor(*g, "o", kO, out),
                                                          graph_tensor(*g, "do", kGradO, grad_out), stats_in, options);
                     dq->set_output(true).set_uid(kGradQ).set_dim(grads[0].shape()).set_stride(grads[0].strides());
                     dk->set_output(true).set_uid(kGradK).set_dim(grads[1].shape()).set_stride(grads[1].strides());
                     dv->set_output(true).set_uid(kGradV).set_dim(grads[2].shape()).set_stride(grads[2].strides());
                     return g;
                   });
  int64_t seed = static_cast<int64_t>(p.seed), offset = static_cast<int64_t>(p.offset);
  std::unordered_map<int64_t, void*> pack = {{kQ, q.data_ptr()},
                                             {kK, k.data_ptr()},
                                             {kV, v.data_ptr()},
                                             {kO, out.data_ptr()},
                                             {kGradO, grad_out.data_ptr()},
                                             {kStats, stats.data_ptr()},
                                             {kGradQ, grads[0].data_ptr()},
                                             {kGradK, grads[1].data_ptr()},
                                             {kGradV, grads[2].data_ptr()}};
  if (dropout) pack[kSeed] = &seed, pack[kOffset] = &offset;
  if (bias.defined()) pack[kBias] = bias.data_ptr();
  execute(built, device, pack);
  return grads;
}

}  // namespace mt::ops

#else  // no CUDA or no cudnn-frontend headers: the reference composite always serves

namespace mt::ops {

std::string cudnn_sdpa_unsupported(const Tensor&, const Tensor&, const Tensor&) {
#if defined(MT_WITH_CUDA)
  return "mixtrain was built without the cudnn-frontend headers (run tools/setup.sh, then reconfigure)";
#else
  return "mixtrain was built without CUDA";
#endif
}

CudnnSdpaForward cudnn_sdpa_forward(const Tensor&, const Tensor&, const Tensor&, const CudnnSdpaProblem&,
                                    const Tensor&) {
  MT_INTERNAL_ASSERT(false, "cudnn_sdpa_forward called without cuDNN fused attention built in");
  return {};
}

std::array<Tensor, 3> cudnn_sdpa_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                          const Tensor&, const CudnnSdpaProblem&, const Tensor&) {
  MT_INTERNAL_ASSERT(false, "cudnn_sdpa_backward called without cuDNN fused attention built in");
  return {};
}

}  // namespace mt::ops

#endif
