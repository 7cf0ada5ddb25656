// Anomaly mode: stops at the first op whose output holds NaN or inf, forward or backward.
//
//   { mt::AnomalyGuard anomaly;  loss = model.loss(x, y);  loss.backward(); }
//
// While it is on, the outputs of every op recorded for autograd are checked as they are
// recorded, and the gradients every backward node returns as they are returned. The first
// non-finite value raises mt::Error naming the direction, the op ("log" forward, its node
// "logBackward" backward), the output or input index, its shape and dtype, and whether
// NaN or inf was found. An op whose infinities come from its own arguments (masked_fill with -inf,
// attention's causal mask: Node::infinite_outputs_by_design) is checked for NaN only. Each check
// reads the tensor back to the host: a tool for finding where a loss went NaN, not for training
// speed. Off by default; the setting is process-wide.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace mt {

bool detect_anomaly_enabled();
void set_detect_anomaly(bool enabled);

class AnomalyGuard {
 public:
  explicit AnomalyGuard(bool enabled = true) : previous_(detect_anomaly_enabled()) { set_detect_anomaly(enabled); }
  ~AnomalyGuard() { set_detect_anomaly(previous_); }
  AnomalyGuard(const AnomalyGuard&) = delete;
  AnomalyGuard& operator=(const AnomalyGuard&) = delete;

 private:
  bool previous_;
};

namespace autograd {
class Node;
namespace anomaly {
// Called by record() and by the engine; they do nothing unless anomaly mode is on.
void check_forward_outputs(const Node& node, const std::vector<Tensor>& outputs);
void check_backward_gradients(const Node& node, const std::vector<Tensor>& grads);
}  // namespace anomaly
}  // namespace autograd

}  // namespace mt
