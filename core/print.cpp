// Readable tensor printing, PyTorch-like:
//   tensor([[1.0000, 2.0000],
//           [3.0000, 4.0000]], dtype=f32, device=cpu)
// Large tensors show the first and last three entries of each dimension.
#include <cmath>
#include <cstdio>
#include <ostream>
#include <sstream>

#include "core/dispatch.h"
#include "core/view.h"

namespace mt {

namespace {

constexpr int64_t kSummaryThreshold = 1000;  // elements; above it each dim shows its edges only
constexpr int64_t kEdgeItems = 3;

std::string format_value(double v, bool floating) {
  char buf[64];
  if (!floating) {
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
  } else if (std::isnan(v) || std::isinf(v)) {
    std::snprintf(buf, sizeof buf, "%s", std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf"));
  } else if (v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-4)) {
    std::snprintf(buf, sizeof buf, "%.4e", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.4f", v);
  }
  return buf;
}

void print_dim(std::ostream& out, const std::vector<double>& values, const Shape& shape, const Shape& strides,
               size_t dim, int64_t base, bool summarise, bool floating, int indent) {
  out << "[";
  const int64_t n = shape[dim];
  for (int64_t i = 0; i < n; ++i) {
    if (summarise && n > 2 * kEdgeItems && i == kEdgeItems) {
      out << (dim + 1 == shape.size() ? "..., " : "...,\n" + std::string(static_cast<size_t>(indent + 1), ' '));
      i = n - kEdgeItems;
    }
    const int64_t at = base + i * strides[dim];
    if (dim + 1 == shape.size()) {
      out << format_value(values[static_cast<size_t>(at)], floating);
    } else {
      print_dim(out, values, shape, strides, dim + 1, at, summarise, floating, indent + 1);
    }
    if (i + 1 < n) out << (dim + 1 == shape.size() ? ", " : ",\n" + std::string(static_cast<size_t>(indent + 1), ' '));
  }
  out << "]";
}

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::ostringstream out;
  const std::vector<double> values = to_vector<double>();  // contiguous, row-major
  const bool floating = is_floating(dtype());
  out << "tensor(";
  if (dim() == 0) {
    out << format_value(values[0], floating);
  } else if (numel() == 0) {
    out << "[], shape=" << shape_str(shape());
  } else {
    print_dim(out, values, shape(), contiguous_strides(shape()), 0, 0, numel() > kSummaryThreshold, floating,
              /*indent=*/7);
  }
  out << ", dtype=" << dtype_name(dtype()) << ", device=" << device().str() << ")";
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const Tensor& t) { return out << t.str(); }

}  // namespace mt
