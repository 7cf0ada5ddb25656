#include "ops/shape/windows.h"

#include <algorithm>
#include <utility>

#include "core/view.h"

namespace mt::ops {

bool dense_layout(const Shape& shape, const Shape& strides) {
  if (shape.size() != strides.size() || shape_numel(shape) == 0) return false;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims that move
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (strides[d] < 0) return false;
    dims.emplace_back(strides[d], shape[d]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t next = 1;  // the stride the next-slowest dim must have to leave no gap
  for (const auto& [stride, size] : dims) {
    if (stride != next) return false;
    next *= size;
  }
  return true;
}

std::vector<Tensor> empty_windows_like(const std::vector<Tensor>& views) {
  if (views.size() < 2) return {};
  const Tensor& first = views[0];
  const int64_t step = views[1].offset() - first.offset();
  if (step <= 0) return {};
  for (size_t j = 0; j < views.size(); ++j) {
    const Tensor& v = views[j];
    if (!v.shares_storage_with(first) || v.shape() != first.shape() || v.strides() != first.strides() ||
        v.dtype() != first.dtype() || v.offset() != first.offset() + static_cast<int64_t>(j) * step)
      return {};
  }
  // The views, stacked along a new leading dim of stride `step`, must fill their block exactly.
  Shape shape = first.shape(), strides = first.strides();
  shape.insert(shape.begin(), static_cast<int64_t>(views.size()));
  strides.insert(strides.begin(), step);
  if (!dense_layout(shape, strides)) return {};
  const Tensor buffer = empty({shape_numel(shape)}, TensorOptions().dtype(first.dtype()).device(first.device()));
  std::vector<Tensor> out;
  for (size_t j = 0; j < views.size(); ++j) {
    out.push_back(raw::as_strided(buffer, first.shape(), first.strides(), static_cast<int64_t>(j) * step));
  }
  return out;
}

Tensor joined_view(const std::vector<Tensor>& pieces, int64_t dim, const std::vector<int64_t>& starts,
                   const std::vector<int64_t>& lengths, const Shape& shape) {
  const auto d = static_cast<size_t>(dim);
  if (pieces.size() != starts.size() || pieces.size() != lengths.size() || d >= shape.size()) return Tensor();
  const Tensor* first = nullptr;
  int64_t covered = 0;  // the pieces must follow each other from 0 to the end of `dim`
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (starts[i] != covered) return Tensor();
    covered += lengths[i];
    if (lengths[i] == 0) continue;
    if (!pieces[i].defined()) return Tensor();
    if (first == nullptr) first = &pieces[i];
  }
  if (first == nullptr || covered != shape[d]) return Tensor();
  const Shape& strides = first->strides();
  const int64_t base = first->offset() - starts[static_cast<size_t>(first - pieces.data())] * strides[d];
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (lengths[i] == 0) continue;
    const Tensor& p = pieces[i];
    Shape expected = shape;
    expected[d] = lengths[i];
    if (!p.shares_storage_with(*first) || p.dtype() != first->dtype() || p.shape() != expected ||
        p.strides() != strides || p.offset() != base + starts[i] * strides[d])
      return Tensor();
  }
  // Dense: the joined tensor reaches no slot outside the pieces, so it stays inside their storage.
  if (base < 0 || !dense_layout(shape, strides)) return Tensor();
  return raw::as_strided(*first, shape, strides, base);
}

}  // namespace mt::ops
