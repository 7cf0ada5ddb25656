// How an op records itself for backward. Every differentiable op follows the
// same pattern, forward and backward side by side in its family's file:
//
//   Tensor mul(const Tensor& a, const Tensor& b) {
//     Tensor out = mul_forward(a, b);                         // no recording inside
//     if (autograd::needs_grad({a, b})) {
//       auto node = std::make_shared<LambdaNode>("MulBackward", [](const auto& g, const LambdaNode& self) {
//         return std::vector<Tensor>{mul(g[0], self.saved_tensor("b")), mul(g[0], self.saved_tensor("a"))};
//       });
//       if (autograd::requires_grad(a)) node->save("b", b);  // save only what is used
//       if (autograd::requires_grad(b)) node->save("a", a);
//       autograd::record(node, {a, b}, {out});
//     }
//     return out;
//   }
#pragma once

#include <initializer_list>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/node.h"

namespace mt::autograd {

bool requires_grad(const Tensor& t);
// True when grad mode is on and at least one input requires grad.
bool needs_grad(std::initializer_list<Tensor> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

// The edge a gradient for t flows along: its grad_fn, its leaf accumulator, or none.
Edge gradient_edge(const Tensor& t);

// Wires `node` between `inputs` and `outputs`: sets its edges and metadata and
// makes it the grad_fn of every output. Outputs must not have history yet.
void record(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs);

// A node for an op whose backward is written as a lambda (composite and
// simple ops): `fn(grad_outputs, node)` returns one gradient per input.
class LambdaNode : public Node {
 public:
  using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&, const LambdaNode&)>;
  // fn with the engine's sums (Node::apply_adding); undefined sums where there are none.
  using AddingFn =
      std::function<std::vector<Tensor>(const std::vector<Tensor>&, const std::vector<Tensor>&, const LambdaNode&)>;
  LambdaNode(std::string name, Fn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  // A node whose formula may add into the engine's sums: apply() passes it undefined ones.
  LambdaNode(std::string name, AddingFn fn) : name_(std::move(name)), adding_fn_(std::move(fn)) {}
  std::string name() const override { return name_; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  bool adds_into_sums() const override { return static_cast<bool>(adding_fn_); }
  std::vector<Tensor> apply_adding(std::vector<Tensor>&& grad_outputs, const std::vector<Tensor>& sums) override;
  void release_saved() override;

  // Makes output `output` rebuildable (Node::can_rebuild_output): `fn` computes it again from the
  // node's saved tensors, bit for bit; rebuild_output runs it once, without recording.
  using RebuildFn = std::function<Tensor(const LambdaNode&)>;
  void set_rebuild(uint32_t output, RebuildFn fn) {
    rebuild_output_nr_ = output;
    rebuild_ = std::move(fn);
  }
  bool can_rebuild_output(uint32_t i) const override { return rebuild_ && i == rebuild_output_nr_; }
  Tensor rebuild_output(uint32_t i) const override;

  // Saves t for the backward under `name`, which must outlive the node (a string literal)
  // and be new to it. An undefined t saves nothing: the forward passes one for a tensor that
  // only gradients nobody asked for would read.
  void save(std::string_view name, const Tensor& t);
  // The tensor saved under `name`. Throws, naming this node and `name`, when nothing was saved
  // under it, when it was modified in place since, or when a backward has already freed it.
  Tensor saved_tensor(std::string_view name) const;
  // The same, but an undefined tensor when nothing was saved under `name` (a tensor saved only
  // for some of the gradients).
  Tensor saved_tensor_or_none(std::string_view name) const;

 private:
  const SavedTensor* find_saved(std::string_view name) const;

  std::string name_;
  Fn fn_;
  AddingFn adding_fn_;
  RebuildFn rebuild_;
  uint32_t rebuild_output_nr_ = 0;
  mutable Tensor rebuilt_;  // rebuild_output's result, until this node's backward starts
  // What fn reads, freed after backward; a few entries, searched in order.
  std::vector<std::pair<std::string_view, SavedTensor>> saved_;
};

}  // namespace mt::autograd
