// Softmax and log-softmax: validation, forward on the tensor's device, and the
// backward right after. The kernels work on contiguous rows [rows, C]; another
// dim is handled by permuting it last (a contiguous copy), then back.
#include "ops/softmax/softmax.h"
#include "autograd/autocast.h"

#include <vector>

#include "autograd/function.h"
#include "ops/common.h"
#include "ops/map.h"
#include "ops/softmax/softmax_kernels.h"

namespace mt {

using autograd::LambdaNode;

namespace {

// The permutation that moves `dim` last, keeping the others in order.
std::vector<int64_t> dim_last_order(int64_t ndim, int64_t dim) {
  std::vector<int64_t> order;
  for (int64_t i = 0; i < ndim; ++i) {
    if (i != dim) order.push_back(i);
  }
  order.push_back(dim);
  return order;
}

std::vector<int64_t> inverse_order(const std::vector<int64_t>& order) {
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) inverse[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
  return inverse;
}

// How a tensor of the op's shape maps to contiguous rows over the softmax dim.
struct RowLayout {
  std::vector<int64_t> order;  // permutation putting the softmax dim last
  int64_t rows = 0;
  int64_t cols = 0;

  Tensor to_rows(const Tensor& t) const { return raw::contiguous(raw::permute(t, order)); }  // [rows..., cols]
  Tensor from_rows(const Tensor& r) const { return raw::contiguous(raw::permute(r, inverse_order(order))); }
};

RowLayout row_layout(const Tensor& x, int64_t dim) {
  RowLayout layout;
  layout.order = dim_last_order(x.dim(), dim);
  layout.cols = x.shape()[static_cast<size_t>(dim)];
  layout.rows = layout.cols == 0 ? 0 : x.numel() / layout.cols;
  return layout;
}

using ops::name_of;
using ops::SoftmaxKind;

Tensor softmax_forward(SoftmaxKind kind, const Tensor& x, const RowLayout& layout) {
  const Tensor in = layout.to_rows(x);
  Tensor out = empty(in.shape(), ops::options_of(in));
  if (layout.rows > 0) {
    if (x.is_cuda()) {
#if MT_WITH_CUDA
      ops::softmax_forward_cuda(out, in, layout.rows, layout.cols, kind);
#else
      ops::throw_no_cuda(name_of(kind));
#endif
    } else {
      ops::softmax_forward_cpu(out, in, layout.rows, layout.cols, kind);
    }
  }
  return layout.from_rows(out);
}

Tensor softmax_backward(SoftmaxKind kind, const Tensor& grad, const Tensor& y, const RowLayout& layout) {
  const Tensor dy = layout.to_rows(ops::as_dtype(grad, y.dtype()));
  const Tensor yr = layout.to_rows(y);
  Tensor dx = empty(yr.shape(), ops::options_of(yr));
  if (layout.rows > 0) {
    if (y.is_cuda()) {
#if MT_WITH_CUDA
      ops::softmax_backward_cuda(dx, dy, yr, layout.rows, layout.cols, kind);
#else
      ops::throw_no_cuda(name_of(kind));
#endif
    } else {
      ops::softmax_backward_cpu(dx, dy, yr, layout.rows, layout.cols, kind);
    }
  }
  return layout.from_rows(dx);
}

// softmax and log_softmax share everything but the formulas in the kernels.
Tensor softmax_op(SoftmaxKind kind, const Tensor& input, int64_t dim) {
  const char* op = name_of(kind);
  ops::check_floating(op, input);
  const int64_t d = raw::wrap_dim(dim, input.dim(), op);
  // A 0-dim tensor is one row of one element (dim 0 or -1, as in PyTorch).
  const Tensor x = input.dim() == 0 ? raw::reshape(input, {1}) : input;
  const RowLayout layout = row_layout(x, d);
  Tensor out = softmax_forward(kind, x, layout);
  if (input.dim() == 0) out = raw::reshape(out, {});
  if (autograd::needs_grad({input})) {
    // Both gradients are functions of the output alone, so only y is saved.
    auto node = std::make_shared<LambdaNode>(
        kind == SoftmaxKind::softmax ? "SoftmaxBackward" : "LogSoftmaxBackward",
        [kind, layout](const std::vector<Tensor>& g, const LambdaNode& self) {
          const Tensor y = self.saved_tensor("y");
          const Shape& shape = self.input_meta[0].shape;
          const Tensor yr = shape.empty() ? raw::reshape(y, {1}) : y;
          const Tensor gr = shape.empty() ? raw::reshape(g[0], {1}) : g[0];
          return std::vector<Tensor>{raw::reshape(softmax_backward(kind, gr, yr, layout), shape)};
        });
    node->save("y", out.detach());
    autograd::record(node, {input}, {out});
  }
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  return softmax_op(ops::SoftmaxKind::softmax, autocast::cast_input("softmax", x), dim);
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  return softmax_op(ops::SoftmaxKind::log_softmax, autocast::cast_input("log_softmax", x), dim);
}

}  // namespace mt
