#include "core/view.h"

#include <algorithm>
#include <numeric>

#include "core/kernels.h"

namespace mt::raw {

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t lo = -std::max<int64_t>(ndim, 1), hi = std::max<int64_t>(ndim, 1) - 1;
  MT_CHECK_T(ShapeError, dim >= lo && dim <= hi, op, ": dimension ", dim, " is out of range for a tensor with ", ndim,
             " dimensions (expected ", lo, "..", hi, ")");
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

Tensor as_strided(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset) {
  MT_INTERNAL_ASSERT(shape.size() == strides.size());
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage();
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = t.dtype();
  return Tensor(std::move(impl));
}

namespace {

Shape infer_size(Shape shape, int64_t numel, const char* op, const Shape& from) {
  int64_t known = 1;
  int infer_at = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      MT_CHECK_T(ShapeError, infer_at < 0, op, ": only one dimension can be -1, got ", shape_str(shape));
      infer_at = static_cast<int>(i);
    } else {
      MT_CHECK_T(ShapeError, shape[i] >= 0, op, ": invalid size in ", shape_str(shape));
      known *= shape[i];
    }
  }
  if (infer_at >= 0) {
    MT_CHECK_T(ShapeError, known != 0 && numel % known == 0, op, ": cannot view shape ", shape_str(from), " (", numel,
               " elements) as ", shape_str(shape));
    shape[static_cast<size_t>(infer_at)] = numel / known;
  }
  MT_CHECK_T(ShapeError, shape_numel(shape) == numel, op, ": cannot view shape ", shape_str(from), " (", numel,
             " elements) as ", shape_str(shape), " (", shape_numel(shape), " elements)");
  return shape;
}

// Strides for viewing `t` as `shape` without a copy, or false when the memory
// layout cannot express it (e.g. a transposed tensor flattened).
bool view_strides(const Tensor& t, const Shape& shape, Shape* out) {
  const Shape& old_shape = t.shape();
  const Shape& old_strides = t.strides();
  out->assign(shape.size(), 0);
  if (t.numel() == 0 || t.dim() == 0) {
    *out = contiguous_strides(shape);
    return true;
  }
  // Walk groups of old dims that are contiguous among themselves; each group must
  // map onto a group of new dims with the same element count.
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[static_cast<size_t>(d)];
    const bool group_ends = d == 0 || (old_shape[static_cast<size_t>(d - 1)] != 1 &&
                                       old_strides[static_cast<size_t>(d - 1)] != tensor_numel * chunk_base_stride);
    if (group_ends) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[static_cast<size_t>(view_d)] == 1)) {
        (*out)[static_cast<size_t>(view_d)] = view_numel * chunk_base_stride;
        view_numel *= shape[static_cast<size_t>(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = old_strides[static_cast<size_t>(d - 1)];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

}  // namespace

Tensor view(const Tensor& t, Shape shape) {
  shape = infer_size(std::move(shape), t.numel(), "view", t.shape());
  Shape strides;
  MT_CHECK_T(ShapeError, view_strides(t, shape, &strides), "view: a tensor of shape ", shape_str(t.shape()),
             " and strides ", shape_str(t.strides()), " cannot be viewed as ", shape_str(shape),
             " without a copy; use reshape");
  return as_strided(t, shape, strides, t.offset());
}

Tensor reshape(const Tensor& t, Shape shape) {
  shape = infer_size(std::move(shape), t.numel(), "reshape", t.shape());
  Shape strides;
  if (view_strides(t, shape, &strides)) return as_strided(t, shape, strides, t.offset());
  return view(contiguous(t), shape);
}

Tensor transpose(const Tensor& t, int64_t d0, int64_t d1) {
  d0 = wrap_dim(d0, t.dim(), "transpose");
  d1 = wrap_dim(d1, t.dim(), "transpose");
  Shape shape = t.shape(), strides = t.strides();
  if (t.dim() == 0) return as_strided(t, shape, strides, t.offset());
  std::swap(shape[static_cast<size_t>(d0)], shape[static_cast<size_t>(d1)]);
  std::swap(strides[static_cast<size_t>(d0)], strides[static_cast<size_t>(d1)]);
  return as_strided(t, shape, strides, t.offset());
}

Tensor permute(const Tensor& t, const std::vector<int64_t>& dims) {
  MT_CHECK_T(ShapeError, static_cast<int64_t>(dims.size()) == t.dim(), "permute: ", dims.size(),
             " dimensions given for a tensor of shape ", shape_str(t.shape()));
  Shape shape(dims.size()), strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const auto d = static_cast<size_t>(wrap_dim(dims[i], t.dim(), "permute"));
    MT_CHECK_T(ShapeError, !seen[d], "permute: dimension ", dims[i], " appears twice in ", shape_str(dims));
    seen[d] = true;
    shape[i] = t.shape()[d];
    strides[i] = t.strides()[d];
  }
  return as_strided(t, shape, strides, t.offset());
}

Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  dim = wrap_dim(dim, t.dim(), "narrow");
  const int64_t size = t.shape()[static_cast<size_t>(dim)];
  MT_CHECK_T(ShapeError, start >= 0 && length >= 0 && start + length <= size, "narrow: range [", start, ", ",
             start + length, ") is out of bounds for dimension ", dim, " of size ", size, " (shape ",
             shape_str(t.shape()), ")");
  Shape shape = t.shape();
  shape[static_cast<size_t>(dim)] = length;
  return as_strided(t, shape, t.strides(), t.offset() + start * t.strides()[static_cast<size_t>(dim)]);
}

Tensor slice(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step) {
  dim = wrap_dim(dim, t.dim(), "slice");
  MT_CHECK_T(ShapeError, step > 0, "slice: step must be positive, got ", step);
  const int64_t size = t.shape()[static_cast<size_t>(dim)];
  auto clamp = [size](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + size : i, 0, size); };
  start = clamp(start);
  end = std::max(clamp(end), start);
  Shape shape = t.shape(), strides = t.strides();
  shape[static_cast<size_t>(dim)] = (end - start + step - 1) / step;
  const int64_t stride = strides[static_cast<size_t>(dim)];
  strides[static_cast<size_t>(dim)] = stride * step;
  return as_strided(t, shape, strides, t.offset() + start * stride);
}

Tensor expand(const Tensor& t, const Shape& shape) {
  MT_CHECK_T(ShapeError, shape.size() >= t.shape().size(), "expand: cannot expand shape ", shape_str(t.shape()), " to ",
             shape_str(shape), " (fewer dimensions)");
  const size_t lead = shape.size() - t.shape().size();
  Shape out_shape(shape.size()), strides(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      MT_CHECK_T(ShapeError, shape[i] >= 0, "expand: size -1 is not allowed for a new leading dimension in ",
                 shape_str(shape));
      out_shape[i] = shape[i];
      strides[i] = 0;
      continue;
    }
    const int64_t have = t.shape()[i - lead];
    const int64_t want = shape[i] == -1 ? have : shape[i];
    MT_CHECK_T(ShapeError, have == want || have == 1, "expand: cannot expand shape ", shape_str(t.shape()), " to ",
               shape_str(shape), " (dimension ", i, ": ", have, " vs ", want, ")");
    out_shape[i] = want;
    strides[i] = have == want ? t.strides()[i - lead] : 0;
  }
  return as_strided(t, out_shape, strides, t.offset());
}

Tensor squeeze(const Tensor& t, int64_t dim) {
  dim = wrap_dim(dim, t.dim(), "squeeze");
  if (t.dim() == 0 || t.shape()[static_cast<size_t>(dim)] != 1)
    return as_strided(t, t.shape(), t.strides(), t.offset());
  Shape shape = t.shape(), strides = t.strides();
  shape.erase(shape.begin() + dim);
  strides.erase(strides.begin() + dim);
  return as_strided(t, shape, strides, t.offset());
}

Tensor unsqueeze(const Tensor& t, int64_t dim) {
  dim = wrap_dim(dim, t.dim() + 1, "unsqueeze");
  Shape shape = t.shape(), strides = t.strides();
  const int64_t stride =
      dim < t.dim() ? t.shape()[static_cast<size_t>(dim)] * t.strides()[static_cast<size_t>(dim)] : 1;
  shape.insert(shape.begin() + dim, 1);
  strides.insert(strides.begin() + dim, stride);
  return as_strided(t, shape, strides, t.offset());
}

Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : clone(t); }

Tensor clone(const Tensor& t) {
  Tensor out = empty(t.shape(), TensorOptions().dtype(t.dtype()).device(t.device()));
  out.copy_(t);
  return out;
}

Tensor to(const Tensor& t, Device device, DType dtype) {
  if (t.device() == device && t.dtype() == dtype) return t;
  Tensor out = empty(t.shape(), TensorOptions().dtype(dtype).device(device));
  out.copy_(t);
  return out;
}

Tensor to(const Tensor& t, Device device) { return to(t, device, t.dtype()); }
Tensor to(const Tensor& t, DType dtype) { return to(t, t.device(), dtype); }

void accumulate_(const Tensor& dst, const Tensor& src) {
  MT_CHECK_T(DeviceError, dst.device() == src.device(), "accumulate_: destination on ", dst.device().str(),
             " and source on ", src.device().str());
  const Tensor expanded = expand(src, dst.shape());
  if (dst.is_cuda()) {
    kernels::accumulate_cuda(dst, expanded);
  } else {
    kernels::accumulate_cpu(dst, expanded);
  }
  dst.bump_version();
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    MT_CHECK_T(ShapeError, da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
               " cannot be broadcast together (dimension ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace mt::raw
