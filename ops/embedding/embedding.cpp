// Embedding: validation, the gather forward and its scatter-add backward.
#include "ops/embedding/embedding.h"

#include "autograd/function.h"
#include "ops/common.h"
#include "ops/embedding/embedding_kernels.h"
#include "ops/map.h"

namespace mt {

using autograd::LambdaNode;

namespace {

// dweight // [V, C]: the rows of grad_out // [N, C] summed into the rows ids // [N] name. Where
// `sum` is defined (the engine's gradient for the weight so far: a tied weight's from the LM
// head), the weight's dtype is the accumulation dtype and the rows are on a GPU, they are added
// into it in place and it is returned; else into zeros of their own. The CUDA kernels add each
// id's total once, so the sum equals the engine's add of the zero-filled gradient bit for bit;
// the CPU adds row by row, which would round differently, and its fill is no hot path.
Tensor embedding_backward(const Tensor& grad_out, const Tensor& ids, const autograd::TensorMeta& weight_meta,
                          const Tensor& sum) {
  const int64_t V = weight_meta.shape[0], C = weight_meta.shape[1];
  const Tensor g = raw::contiguous(raw::reshape(grad_out, {ids.numel(), C}));
  // Accumulate in acc_t of the gradient's dtype, round once to the weight's dtype.
  const DType acc = g.dtype() == DType::f64 ? DType::f64 : DType::f32;
  // A tied weight's [V, C] sum exists already: zero-filling another and adding it would move
  // four times its bytes (GPT-2's f32 embedding: 154 MB each) for the batch's few thousand rows.
  const bool into_sum = sum.defined() && g.is_cuda() && weight_meta.dtype == acc && sum.dtype() == acc;
  Tensor grad_weight = into_sum ? sum : zeros({V, C}, TensorOptions().dtype(acc).device(g.device()));
  if (g.is_cuda()) {
#if MT_WITH_CUDA
    ops::embedding_backward_cuda(grad_weight, g, ids);
#else
    ops::throw_no_cuda("embedding");
#endif
  } else {
    ops::embedding_backward_cpu(grad_weight, g, ids);
  }
  return into_sum ? grad_weight : ops::as_dtype(grad_weight, weight_meta.dtype);
}

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  ops::check_floating("embedding", weight);
  ops::check_defined("embedding", ids, "ids");
  MT_CHECK_T(ShapeError, weight.dim() == 2, "embedding: weight must be 2-D [V, C], got ", ops::describe(weight));
  MT_CHECK_T(DTypeError, ids.dtype() == DType::i64 || ids.dtype() == DType::i32,
             "embedding: ids must be i64 or i32, got ", ops::describe(ids));
  ops::check_same_device("embedding", weight, ids);
  MT_CHECK_T(ShapeError, ids.dim() < kMaxDims, "embedding: ids have ", ids.dim(),
             " dimensions; the output would exceed the ", kMaxDims, "-dimension limit");
  const int64_t N = ids.numel(), C = weight.size(1);
  Shape out_shape = ids.shape();
  out_shape.push_back(C);

  const Tensor flat_ids = raw::reshape(raw::contiguous(ids), {N});
  const Tensor table = raw::contiguous(weight);
  Tensor out = empty({N, C}, ops::options_of(weight));
  if (weight.is_cuda()) {
#if MT_WITH_CUDA
    ops::embedding_forward_cuda(out, table, flat_ids);
#else
    ops::throw_no_cuda("embedding");
#endif
  } else {
    ops::embedding_forward_cpu(out, table, flat_ids);
  }
  out = raw::view(out, out_shape);

  if (autograd::needs_grad({weight})) {
    auto node = std::make_shared<LambdaNode>(
        "EmbeddingBackward",
        LambdaNode::AddingFn([](const std::vector<Tensor>& g, const std::vector<Tensor>& sums, const LambdaNode& self) {
          return std::vector<Tensor>{embedding_backward(g[0], self.saved_tensor("ids"), self.input_meta[0], sums[0])};
        }));
    node->save("ids", flat_ids);  // ids only: the weight's values are not needed
    autograd::record(node, {weight}, {out});
  }
  return out;
}

}  // namespace mt
