// How an op records itself for backward. Every differentiable op follows the
// same pattern, forward and backward side by side in its family's file:
//
//   Tensor mul(const Tensor& a, const Tensor& b) {
//     Tensor out = mul_forward(a, b);                       // no recording inside
//     if (autograd::needs_grad({a, b})) {
//       auto node = std::make_shared<MulBackward>();
//       if (node_needs(b)) node->a = SavedTensor(a);          // save only what is used
//       autograd::record(node, {a, b}, {out});
//     }
//     return out;
//   }
#pragma once

#include <initializer_list>
#include <memory>
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

  std::vector<SavedTensor> saved;  // what fn reads; freed after backward
  Tensor unpack(size_t i) const { return saved.at(i).unpack(*this); }

 private:
  std::string name_;
  Fn fn_;
  AddingFn adding_fn_;
};

}  // namespace mt::autograd
