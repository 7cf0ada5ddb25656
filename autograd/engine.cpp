#include "autograd/engine.h"

#include <algorithm>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "autograd/anomaly.h"
#include "autograd/autocast.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/profiler.h"
#include "core/view.h"

namespace mt::autograd {

namespace {

// Gradients arriving for one node, one slot per forward output, summed as they come.
using InputBuffer = std::vector<Tensor>;

void add_to_buffer(InputBuffer& buffer, uint32_t slot, Tensor grad) {
  if (!buffer[slot].defined()) {
    buffer[slot] = std::move(grad);
  } else if (owns_whole_storage(buffer[slot]) && buffer[slot].dtype() == grad.dtype()) {
    raw::accumulate_(buffer[slot], grad);  // nobody else sees this buffer: sum in place
  } else {
    // Sum out of place: the first gradient may alias a tensor another node still reads.
    Tensor sum = raw::clone(buffer[slot]);
    raw::accumulate_(sum, grad);
    buffer[slot] = std::move(sum);
  }
}

// For a node that adds into sums (Node::apply_adding): per input, the gradient the engine holds
// for it where the node may add into that in place (nobody else sees it, and it has the input's
// shape, dtype and device), else undefined. Not under anomaly detection, which checks each
// node's own gradients.
std::vector<Tensor> sums_for(const Node& node, const std::unordered_map<Node*, InputBuffer>& buffers) {
  std::vector<Tensor> sums(node.next_edges.size());
  if (detect_anomaly_enabled()) return sums;
  for (size_t i = 0; i < sums.size(); ++i) {
    const Edge& e = node.next_edges[i];
    if (!e.valid()) continue;
    const auto found = buffers.find(e.fn.get());
    if (found == buffers.end() || e.input_nr >= found->second.size()) continue;
    const Tensor& held = found->second[e.input_nr];
    const TensorMeta& want = node.input_meta[i];
    if (!held.defined() || !owns_whole_storage(held) || held.shape() != want.shape || held.dtype() != want.dtype ||
        held.device() != want.device) {
      continue;
    }
    // One input reached twice along the same edge target would be added into twice.
    bool repeated = false;
    for (size_t j = 0; j < i; ++j) repeated |= sums[j].defined() && sums[j].impl_ptr() == held.impl_ptr();
    if (!repeated) sums[i] = held;
  }
  return sums;
}

// Counts, for every node reachable from the roots, how many edges point at it.
std::unordered_map<Node*, int> count_dependencies(const std::vector<Node*>& roots) {
  std::unordered_map<Node*, int> deps;
  std::unordered_set<Node*> seen(roots.begin(), roots.end());
  std::vector<Node*> stack(roots.begin(), roots.end());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.valid()) continue;
      ++deps[e.fn.get()];
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }
  return deps;
}

// Checks (and where harmless, fixes) the gradients a node returned.
void validate_gradients(const Node& node, std::vector<Tensor>& grads) {
  MT_CHECK(grads.size() == node.next_edges.size(), "backward: ", node.name(), " returned ", grads.size(),
           " gradients for ", node.next_edges.size(), " inputs");
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!node.next_edges[i].valid()) continue;
    Tensor& g = grads[i];
    const TensorMeta& want = node.input_meta[i];
    MT_CHECK_T(NotImplementedError, g.defined(), "backward: ", node.name(), " returned no gradient for input ", i,
               ", which requires one");
    MT_CHECK_T(ShapeError, g.shape() == want.shape, "backward: ", node.name(), " returned a gradient of shape ",
               shape_str(g.shape()), " for input ", i, " of shape ", shape_str(want.shape));
    MT_CHECK_T(DeviceError, g.device() == want.device, "backward: ", node.name(), " returned a gradient on ",
               g.device().str(), " for input ", i, " on ", want.device.str());
    if (g.dtype() != want.dtype) g = raw::to(g, want.dtype);  // e.g. an autocast input: its grad in its own dtype
  }
}

Tensor root_gradient(const Tensor& root, const Tensor& grad) {
  if (!grad.defined()) {
    MT_CHECK(root.numel() == 1, "backward: a gradient can be created implicitly only for a one-element output; ",
             "this output has shape ", shape_str(root.shape()), ", so pass a gradient of that shape");
    return ones(root.shape(), TensorOptions().dtype(root.dtype()).device(root.device()));
  }
  MT_CHECK_T(ShapeError, grad.shape() == root.shape(), "backward: gradient has shape ", shape_str(grad.shape()),
             " but the output has shape ", shape_str(root.shape()));
  MT_CHECK_T(DeviceError, grad.device() == root.device(), "backward: gradient is on ", grad.device().str(),
             " but the output is on ", root.device().str());
  return grad.dtype() == root.dtype() ? grad : raw::to(grad, root.dtype());
}

}  // namespace

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph) {
  MT_INTERNAL_ASSERT(roots.size() == grads.size());
  NoGradGuard no_grad;  // backward formulas are not recorded (no double backward)
  // Backward formulas run in the precision of their saved tensors, never re-autocast.
  AutocastGuard no_autocast_cpu(DeviceType::cpu, /*enabled=*/false);
  AutocastGuard no_autocast_cuda(DeviceType::cuda, /*enabled=*/false);

  std::unordered_map<Node*, InputBuffer> buffers;
  std::vector<Node*> root_nodes;
  std::vector<std::shared_ptr<Node>> keep_alive;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    MT_CHECK(requires_grad(root), "backward: the output does not require grad and has no grad_fn ",
             "(no input of the computation requires grad, or it ran under NoGradGuard)");
    const Edge edge = gradient_edge(root);
    Node* n = edge.fn.get();
    keep_alive.push_back(edge.fn);
    InputBuffer& buffer = buffers[n];
    if (buffer.empty()) buffer.resize(std::max<size_t>(n->output_meta.size(), 1));
    add_to_buffer(buffer, edge.input_nr, root_gradient(root, grads[i]));
    // Two outputs of one node (or one output twice) make it a root once: its edges are then
    // counted once, as it runs once.
    if (std::find(root_nodes.begin(), root_nodes.end(), n) == root_nodes.end()) root_nodes.push_back(n);
  }

  std::unordered_map<Node*, int> deps = count_dependencies(root_nodes);
  auto later_first = [](Node* a, Node* b) { return a->sequence_nr < b->sequence_nr; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(later_first)> ready(later_first);
  std::unordered_set<Node*> queued;
  for (Node* n : root_nodes) {
    if (deps[n] == 0 && queued.insert(n).second) ready.push(n);
  }

  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    InputBuffer inputs = std::move(buffers[node]);
    buffers.erase(node);
    // Outputs nobody used get zero gradients, so every formula sees full inputs.
    for (size_t i = 0; i < node->output_meta.size(); ++i) {
      if (!inputs[i].defined()) {
        const TensorMeta& m = node->output_meta[i];
        inputs[i] = zeros(m.shape, TensorOptions().dtype(m.dtype).device(m.device));
      }
    }
    for (const auto& [slot, hook] : node->output_hooks) {
      Tensor replaced = hook(inputs[slot]);
      if (replaced.defined()) inputs[slot] = std::move(replaced);
    }

    const bool profiling = OpProfiler::active();
    if (profiling) OpProfiler::mark("backward (between nodes)");
    std::vector<Tensor> sums;  // apply_adding's: the buffers it may have added into
    const auto run = [&] {
      if (!node->adds_into_sums()) return node->apply(std::move(inputs));
      sums = sums_for(*node, buffers);
      return node->apply_adding(std::move(inputs), sums);
    };
    std::vector<Tensor> out;
    if (node->has_stream) {
      cuda::StreamGuard on_forward_stream(node->stream);
      out = run();
    } else {
      out = run();
    }
    if (profiling) OpProfiler::mark("backward " + node->name(), node->profiler_module);
    if (!retain_graph) {
      node->release_saved();
      if (dynamic_cast<AccumulateGrad*>(node) == nullptr) node->released = true;
    }
    validate_gradients(*node, out);
    anomaly::check_backward_gradients(*node, out);

    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.valid()) continue;
      Node* next = e.fn.get();
      InputBuffer& buffer = buffers[next];
      if (buffer.empty()) buffer.resize(std::max<size_t>(next->output_meta.size(), 1));
      const bool added_into_sum = i < sums.size() && sums[i].defined() && out[i].impl_ptr() == sums[i].impl_ptr();
      if (i < sums.size()) sums[i] = Tensor();  // the buffer's only handle again
      if (!added_into_sum) add_to_buffer(buffer, e.input_nr, std::move(out[i]));
      out[i] = Tensor();
      if (--deps[next] == 0 && queued.insert(next).second) ready.push(next);
    }
  }
}

}  // namespace mt::autograd
