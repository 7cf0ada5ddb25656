// cat / stack / split: validation, copies into narrow windows, and the gradient
// of each input as the matching window of the output gradient.
#include "ops/shape/join.h"
#include "autograd/autocast.h"

#include <algorithm>
#include <string>

#include "autograd/function.h"
#include "ops/common.h"
#include "ops/shape/windows.h"

namespace mt {

using autograd::LambdaNode;

namespace {

std::string describe_all(const std::vector<Tensor>& tensors) {
  std::string s;
  for (size_t i = 0; i < tensors.size(); ++i) s += (i ? ", " : "") + ops::describe(tensors[i]);
  return s;
}

// The pieces of x along d starting at `starts` with `lengths`: views, recorded as
// one node, so backward writes each piece's gradient into one buffer once
// (a piece without a gradient gets zeros there) instead of each piece scattering
// into a full-size zero tensor and the engine adding those up.
std::vector<Tensor> split_views(const Tensor& x, int64_t d, const std::vector<int64_t>& starts,
                                const std::vector<int64_t>& lengths) {
  std::vector<Tensor> pieces;
  for (size_t i = 0; i < starts.size(); ++i) pieces.push_back(raw::narrow(x, d, starts[i], lengths[i]));
  if (autograd::needs_grad({x})) {
    auto node = std::make_shared<LambdaNode>(
        "SplitBackward", [d, starts, lengths](const std::vector<Tensor>& g, const LambdaNode& self) {
          const autograd::TensorMeta& m = self.input_meta[0];
          // Gradients already written as the windows of one tensor (attention's dq, dk, dv
          // of a split qkv): that tensor is x's gradient, with no copy.
          Tensor joined = ops::joined_view(g, d, starts, lengths, m.shape);
          if (joined.defined() && joined.dtype() == m.dtype) return std::vector<Tensor>{joined};
          Tensor dx = empty(m.shape, TensorOptions().dtype(m.dtype).device(m.device));
          for (size_t i = 0; i < starts.size(); ++i) {
            if (lengths[i] > 0) raw::narrow(dx, d, starts[i], lengths[i]).copy_(g[i]);
          }
          return std::vector<Tensor>{dx};
        });
    autograd::record(node, {x}, pieces);
  }
  return pieces;
}

}  // namespace

Tensor cat(const std::vector<Tensor>& inputs, int64_t dim) {
  MT_CHECK(!inputs.empty(), "cat: expected at least one tensor");
  for (size_t i = 0; i < inputs.size(); ++i) ops::check_defined("cat", inputs[i], "an input");
  const std::vector<Tensor> tensors = autocast::cast_inputs("cat", inputs);  // the widest dtype under autocast
  const Tensor& first = tensors[0];
  MT_CHECK_T(ShapeError, first.dim() > 0, "cat: zero-dimensional tensors cannot be concatenated (",
             describe_all(tensors), ")");
  const int64_t d = raw::wrap_dim(dim, first.dim(), "cat");
  Shape shape = first.shape();
  shape[static_cast<size_t>(d)] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    MT_CHECK_T(DTypeError, t.dtype() == first.dtype(), "cat: all tensors must have one dtype; tensor 0 is ",
               ops::describe(first), " but tensor ", i, " is ", ops::describe(t));
    MT_CHECK_T(DeviceError, t.device() == first.device(), "cat: all tensors must be on one device; tensor 0 is ",
               ops::describe(first), " but tensor ", i, " is ", ops::describe(t));
    bool same = t.dim() == first.dim();
    for (int64_t k = 0; same && k < t.dim(); ++k) same = k == d || t.size(k) == first.size(k);
    MT_CHECK_T(ShapeError, same, "cat: shapes must match except along dimension ", d, "; tensor 0 is ",
               ops::describe(first), " but tensor ", i, " is ", ops::describe(t));
    shape[static_cast<size_t>(d)] += t.size(d);
  }

  Tensor out = empty(shape, ops::options_of(first));
  std::vector<int64_t> offsets;  // where each input starts along d
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    offsets.push_back(offset);
    if (t.numel() > 0) raw::narrow(out, d, offset, t.size(d)).copy_(t);
    offset += t.size(d);
  }

  if (autograd::needs_grad(tensors)) {
    auto node =
        std::make_shared<LambdaNode>("CatBackward", [d, offsets](const std::vector<Tensor>& g, const LambdaNode& self) {
          std::vector<Tensor> grads(offsets.size());
          for (size_t i = 0; i < offsets.size(); ++i) {
            if (self.needs_input_grad(i)) {
              grads[i] = raw::narrow(g[0], d, offsets[i], self.input_meta[i].shape[static_cast<size_t>(d)]);
            }
          }
          return grads;
        });
    autograd::record(node, tensors, {out});
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& inputs, int64_t dim) {
  MT_CHECK(!inputs.empty(), "stack: expected at least one tensor");
  for (size_t i = 0; i < inputs.size(); ++i) ops::check_defined("stack", inputs[i], "an input");
  const std::vector<Tensor> tensors = autocast::cast_inputs("stack", inputs);
  const Tensor& first = tensors[0];
  for (size_t i = 1; i < tensors.size(); ++i) {
    MT_CHECK_T(ShapeError, tensors[i].shape() == first.shape(), "stack: all tensors must have one shape; tensor 0 is ",
               ops::describe(first), " but tensor ", i, " is ", ops::describe(tensors[i]));
  }
  const int64_t d = raw::wrap_dim(dim, first.dim() + 1, "stack");
  std::vector<Tensor> expanded;
  expanded.reserve(tensors.size());
  for (const Tensor& t : tensors) expanded.push_back(t.unsqueeze(d));
  return cat(expanded, d);
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  ops::check_defined("split", x);
  MT_CHECK_T(ShapeError, x.dim() > 0, "split: cannot split a zero-dimensional tensor ", ops::describe(x));
  const int64_t d = raw::wrap_dim(dim, x.dim(), "split");
  const int64_t length = x.size(d);
  MT_CHECK(split_size > 0 || (split_size == 0 && length == 0), "split: split_size must be positive, got ", split_size,
           " for ", ops::describe(x), " along dimension ", d);
  if (length == 0) return {x.narrow(d, 0, 0)};
  std::vector<int64_t> starts, lengths;
  for (int64_t start = 0; start < length; start += split_size) {
    starts.push_back(start);
    lengths.push_back(std::min(split_size, length - start));
  }
  return split_views(x, d, starts, lengths);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  ops::check_defined("split", x);
  MT_CHECK_T(ShapeError, x.dim() > 0, "split: cannot split a zero-dimensional tensor ", ops::describe(x));
  const int64_t d = raw::wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  std::string list;
  for (size_t i = 0; i < sizes.size(); ++i) {
    MT_CHECK_T(ShapeError, sizes[i] >= 0, "split: size ", i, " is negative (", sizes[i], ")");
    total += sizes[i];
    list += (i ? ", " : "") + std::to_string(sizes[i]);
  }
  MT_CHECK_T(ShapeError, total == x.size(d), "split: sizes [", list, "] sum to ", total, " but ", ops::describe(x),
             " has ", x.size(d), " along dimension ", d);
  std::vector<int64_t> starts;
  int64_t start = 0;
  for (int64_t s : sizes) {
    starts.push_back(start);
    start += s;
  }
  return split_views(x, d, starts, sizes);
}

}  // namespace mt
