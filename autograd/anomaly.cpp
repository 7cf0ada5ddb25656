#include "autograd/anomaly.h"

#include <atomic>
#include <cmath>
#include <string>

#include "autograd/node.h"
#include "core/error.h"

namespace mt {

namespace {

std::atomic<bool> g_detect_anomaly{false};

// "NaN" or "inf" for the first non-finite element of a floating tensor (NaN only, when infinities
// are allowed), else nullptr.
const char* first_non_finite(const Tensor& t, bool infinities_allowed = false) {
  if (!t.defined() || !is_floating(t.dtype())) return nullptr;
  for (double v : t.to_vector<double>()) {
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v) && !infinities_allowed) return "inf";
  }
  return nullptr;
}

}  // namespace

bool detect_anomaly_enabled() { return g_detect_anomaly.load(std::memory_order_relaxed); }
void set_detect_anomaly(bool enabled) { g_detect_anomaly.store(enabled, std::memory_order_relaxed); }

namespace autograd::anomaly {

void check_forward_outputs(const Node& node, const std::vector<Tensor>& outputs) {
  if (!detect_anomaly_enabled()) return;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (const char* found = first_non_finite(outputs[i], node.infinite_outputs_by_design)) {
      throw Error(mt::detail::str_cat("anomaly: forward of '", autograd::forward_op_name(node), "' produced ", found,
                                      " in output ", i, " (", shape_str(outputs[i].shape()), " ",
                                      dtype_name(outputs[i].dtype()), ")"));
    }
  }
}

void check_backward_gradients(const Node& node, const std::vector<Tensor>& grads) {
  if (!detect_anomaly_enabled()) return;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (const char* found = first_non_finite(grads[i])) {
      throw Error(mt::detail::str_cat("anomaly: backward of '", node.name(), "' produced ", found,
                                      " in the gradient for input ", i, " (", shape_str(grads[i].shape()), " ",
                                      dtype_name(grads[i].dtype()), ")"));
    }
  }
}

}  // namespace autograd::anomaly

}  // namespace mt
