// The backward engine: walks the graph from the roots with dependency counts
// and a work list (no recursion), runs each node once all gradients for its
// outputs have arrived, and accumulates gradients into leaves.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace mt::autograd {

// roots[i] receives gradient grads[i] (an undefined grad means ones for a
// one-element root). Throws with the node's name on any mismatch.
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph);

}  // namespace mt::autograd
