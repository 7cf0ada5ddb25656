// The backward graph. The forward records, for every op output that needs a
// gradient, a Node whose apply() maps the gradients of the op's outputs to the
// gradients of its inputs. Edges point from a node to the nodes that produced
// its inputs (or to a leaf's AccumulateGrad).
//
// Note [Saved tensors hold no history]
// A node saves the data its formula needs as a SavedTensor: a detached alias
// plus the version at save time. It never holds another node through a saved
// tensor, so the only ownership in the graph is node -> next_edges, which the
// destructor unwinds without recursion (a 100k-op chain is freed safely), and an
// in-place write to saved data is caught at backward time instead of silently
// giving wrong gradients.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda_context.h"
#include "core/tensor.h"

namespace mt::autograd {

class Node;

// The gradient flowing along an edge goes to input `input_nr` of `fn`.
struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;
  bool valid() const { return fn != nullptr; }
};

// What a gradient for a tensor must look like.
struct TensorMeta {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
  static TensorMeta of(const Tensor& t) { return TensorMeta{t.shape(), t.dtype(), t.device()}; }
};

//
// Under RebuildSavedGuard (autograd/grad_mode.h) a tensor whose producing node can rebuild it
// (Node::can_rebuild_output) is saved as that node and output number instead: a weak reference,
// so still no ownership; the producer lives while this node does, through this node's edges,
// and runs its backward only after this node's. unpack() asks the producer, which rebuilds it once
// for all the nodes that saved it and keeps it until its own backward starts.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  // The saved data; throws if it was modified in place since it was saved or if
  // the graph has been freed.
  Tensor unpack(const Node& owner) const;
  void reset() {
    data_ = Tensor();
    rebuild_ = false;
    producer_.reset();
  }
  bool defined() const { return data_.defined() || rebuild_; }

 private:
  Tensor data_;
  uint64_t version_ = 0;
  bool rebuild_ = false;
  std::weak_ptr<Node> producer_;
  uint32_t output_nr_ = 0;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  virtual std::string name() const = 0;
  // grad_outputs: one per forward output (zeros where no gradient flowed).
  // Returns one gradient per input (an undefined tensor where none is needed).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) = 0;
  // Frees saved tensors once backward has used them (unless retain_graph).
  virtual void release_saved() {}

  // Some gradients cost less added into a sum than formed whole: an embedding's rows scattered
  // into the dense gradient of a tied weight, where forming its own would zero-fill a [V, C]
  // buffer that the engine then adds. A node that says so here is run through apply_adding: where
  // the engine already holds a gradient for input i that nobody else sees, with input_meta[i]'s
  // shape, dtype and device, sums[i] is that tensor (else undefined), and the node may add its
  // gradient for i into it in place and return sums[i] itself, which the engine keeps as the sum.
  virtual bool adds_into_sums() const { return false; }
  virtual std::vector<Tensor> apply_adding(std::vector<Tensor>&& grad_outputs, const std::vector<Tensor>& sums) {
    (void)sums;
    return apply(std::move(grad_outputs));
  }

  // Whether output i can be made again, bit for bit, from what this node saves for its backward
  // anyway, cheaply (an elementwise pass): SavedTensor then keeps the recipe under
  // RebuildSavedGuard. rebuild_output gives it, made without recording before this node's backward.
  virtual bool can_rebuild_output(uint32_t i) const {
    (void)i;
    return false;
  }
  virtual Tensor rebuild_output(uint32_t i) const;

  // Is a gradient needed for input i? Lets apply() skip work nobody asked for.
  bool needs_input_grad(size_t i) const { return i < next_edges.size() && next_edges[i].valid(); }

  std::vector<Edge> next_edges;         // one per input
  std::vector<TensorMeta> input_meta;   // one per input: what its gradient must look like
  std::vector<TensorMeta> output_meta;  // one per output
  // Hooks on this node's outputs (tensor hooks of non-leaf tensors).
  std::vector<std::pair<uint32_t, std::function<Tensor(const Tensor&)>>> output_hooks;
  uint64_t sequence_nr;  // creation order: later nodes run first in backward
  bool released = false;
  // Set by an op whose infinities come from its own arguments, not from overflow (masked_fill with
  // an infinite value: attention's causal mask): anomaly detection then looks for NaN only.
  bool infinite_outputs_by_design = false;
  bool has_stream = false;
  cuda::Stream stream;  // the stream the forward ran on (CUDA inputs); backward runs there
  // The module scope open when the forward recorded this node (an interned path, see
  // OpProfiler::current_module), set only while an OpProfiler is active: module_rows() charges
  // the node's backward to it. Null otherwise, or outside every module.
  const std::string* profiler_module = nullptr;
};

// The forward op's name from its backward node's ("logBackward" -> "log").
std::string forward_op_name(const Node& node);

// The node at the end of every leaf that requires grad: adds the incoming
// gradient into leaf.grad() (in the leaf's dtype), then runs post-accumulate hooks.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  std::string name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;  // null for leaves
  uint32_t output_nr = 0;
  std::weak_ptr<AccumulateGrad> grad_accumulator;  // leaves: created on first use
  std::vector<std::function<Tensor(const Tensor&)>> leaf_hooks;
  std::vector<std::function<void(const Tensor&)>> post_accumulate_hooks;
  // The first gradient is stored as it arrives, whatever its layout, instead of
  // a copy: set on checkpoint's recompute inputs, whose gradient is handed on at once.
  bool keep_incoming_grad = false;
};

// The autograd meta of t, created on demand.
AutogradMeta& meta(const Tensor& t);
// True when this handle is the only owner of t's data, which is all of its storage
// and contiguous: nobody else can read it, so it may be summed into in place or kept
// as a gradient without a copy.
bool owns_whole_storage(const Tensor& t);
// Null when t has never been touched by autograd.
AutogradMeta* meta_if_exists(const Tensor& t);

}  // namespace mt::autograd
