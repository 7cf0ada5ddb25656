#include "ops/reduction/reduction.h"

#include <algorithm>

#include "autograd/autocast.h"
#include "autograd/function.h"
#include "ops/common.h"
#include "ops/elementwise/elementwise.h"
#include "ops/map.h"
#include "ops/reduction/reducers.h"
#include "ops/reduction/reduction_kernels.h"

namespace mt {

using autograd::LambdaNode;

namespace {

// Which dims are reduced (all of them when `dims` is empty).
std::vector<bool> reduced_dims(const char* op, const Tensor& x, const std::vector<int64_t>& dims) {
  std::vector<bool> reduced(static_cast<size_t>(x.dim()), dims.empty());
  for (int64_t d : dims) {
    const auto w = static_cast<size_t>(raw::wrap_dim(d, x.dim(), op));
    MT_CHECK_T(ShapeError, !reduced[w], op, ": dimension ", d, " appears twice in the reduced dims");
    reduced[w] = true;
  }
  return reduced;
}

Shape kept_shape(const Tensor& x, const std::vector<bool>& reduced, bool keepdim) {
  Shape shape;
  for (size_t i = 0; i < reduced.size(); ++i) {
    if (!reduced[i]) {
      shape.push_back(x.shape()[i]);
    } else if (keepdim) {
      shape.push_back(1);
    }
  }
  return shape;
}

// The reduction itself, no recording: permutes kept dims first, reduced last.
Tensor reduce(const char* op, const Tensor& x, const std::vector<bool>& reduced, bool keepdim, ops::ReduceKind kind) {
  std::vector<int64_t> order;
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < reduced.size(); ++i) {
    if (!reduced[i]) {
      order.push_back(static_cast<int64_t>(i));
      outer *= x.shape()[i];
    }
  }
  for (size_t i = 0; i < reduced.size(); ++i) {
    if (reduced[i]) {
      order.push_back(static_cast<int64_t>(i));
      inner *= x.shape()[i];
    }
  }
  MT_CHECK_T(ShapeError, kind == ops::ReduceKind::sum || inner > 0, op, ": cannot reduce over zero elements (shape ",
             shape_str(x.shape()), ")");
  const Tensor arranged = raw::permute(x, order);
  Tensor out = empty(kept_shape(x, reduced, keepdim), ops::options_of(x));
  if (x.is_cuda()) {
#if MT_WITH_CUDA
    ops::reduce_cuda(out, arranged, outer, inner, kind);
#else
    ops::throw_no_cuda(op);
#endif
  } else {
    ops::reduce_cpu(out, arranged, outer, inner, kind);
  }
  return out;
}

// A gradient of a reduced result, brought back to the input's shape (a view).
Tensor expand_back(const Tensor& grad, const Shape& input_shape, const std::vector<bool>& reduced) {
  Shape keep_shape = input_shape;
  for (size_t i = 0; i < reduced.size(); ++i) {
    if (reduced[i]) keep_shape[i] = 1;
  }
  return raw::expand(raw::reshape(grad, keep_shape), input_shape);
}

}  // namespace

Tensor sum(const Tensor& input, const std::vector<int64_t>& dims, bool keepdim) {
  const Tensor x = autocast::cast_input("sum", input);
  ops::check_floating("sum", x);
  const std::vector<bool> reduced = reduced_dims("sum", x, dims);
  Tensor out = reduce("sum", x, reduced, keepdim, ops::ReduceKind::sum);
  if (autograd::needs_grad({x})) {
    auto node =
        std::make_shared<LambdaNode>("SumBackward", [reduced](const std::vector<Tensor>& g, const LambdaNode& self) {
          return std::vector<Tensor>{expand_back(g[0], self.input_meta[0].shape, reduced)};
        });
    autograd::record(node, {x}, {out});
  }
  return out;
}

Tensor mean(const Tensor& input, const std::vector<int64_t>& dims, bool keepdim) {
  const Tensor x = autocast::cast_input("mean", input);
  ops::check_floating("mean", x);
  const std::vector<bool> reduced = reduced_dims("mean", x, dims);
  int64_t count = 1;
  for (size_t i = 0; i < reduced.size(); ++i) {
    if (reduced[i]) count *= x.shape()[i];
  }
  MT_CHECK_T(ShapeError, count > 0, "mean: cannot average over zero elements (shape ", shape_str(x.shape()), ")");
  return mul(sum(x, dims, keepdim), 1.0 / static_cast<double>(count));
}

Tensor max(const Tensor& x, int64_t dim, bool keepdim) {
  ops::check_floating("max", x);
  const std::vector<bool> reduced = reduced_dims("max", x, {dim});
  Tensor out = reduce("max", x, reduced, keepdim, ops::ReduceKind::max);
  if (autograd::needs_grad({x})) {
    auto node = std::make_shared<LambdaNode>("MaxBackward", [reduced](const std::vector<Tensor>& g,
                                                                      const LambdaNode& self) {
      const Tensor x = self.saved_tensor("x");
      const Tensor best = expand_back(self.saved_tensor("max"), x.shape(), reduced);
      Tensor mask = empty(x.shape(), ops::options_of(x));
      ops::run_binary(mask, x, best, "max", ops::EqualMask{});
      // Ties share the gradient equally.
      const Tensor ties = reduce("max", mask, reduced, /*keepdim=*/true, ops::ReduceKind::sum);
      return std::vector<Tensor>{div(mul(mask, expand_back(g[0], x.shape(), reduced)), raw::expand(ties, x.shape()))};
    });
    node->save("x", x);
    node->save("max", out.detach());
    autograd::record(node, {x}, {out});
  }
  return out;
}

Tensor max(const Tensor& x) { return max(x.reshape({-1}), 0, /*keepdim=*/false); }

Tensor var(const Tensor& input, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  const Tensor x = autocast::cast_input("var", input);
  ops::check_floating("var", x);
  const std::vector<bool> reduced = reduced_dims("var", x, dims);
  int64_t count = 1;
  for (size_t i = 0; i < reduced.size(); ++i) {
    if (reduced[i]) count *= x.shape()[i];
  }
  MT_CHECK_T(ShapeError, count - correction > 0, "var: ", count, " elements with correction ", correction,
             " leave no degrees of freedom (shape ", shape_str(x.shape()), ")");
  const Tensor centred = sub(x, mean(x, dims, /*keepdim=*/true));
  return mul(sum(mul(centred, centred), dims, keepdim), 1.0 / static_cast<double>(count - correction));
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  MT_CHECK_T(ShapeError, x.shape().size() >= shape.size(), "sum_to: cannot sum shape ", shape_str(x.shape()), " to ",
             shape_str(shape));
  const size_t lead = x.shape().size() - shape.size();
  std::vector<int64_t> dims;
  for (size_t i = 0; i < x.shape().size(); ++i) {
    if (i < lead || (shape[i - lead] == 1 && x.shape()[i] != 1)) dims.push_back(static_cast<int64_t>(i));
  }
  const Tensor summed = dims.empty() ? x : sum(x, dims, /*keepdim=*/true);
  return summed.reshape(shape);
}

}  // namespace mt
