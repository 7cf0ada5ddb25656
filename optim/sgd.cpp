#include "optim/sgd.h"

#include "autograd/grad_mode.h"
#include "ops/elementwise/elementwise.h"

namespace mt {

SGD::SGD(std::vector<Tensor> params, const SGDOptions& options)
    : Optimizer({ParamGroup{std::move(params), options.lr(), options.weight_decay()}}), options_(options) {
  MT_CHECK(!options.nesterov() || (options.momentum() > 0 && options.dampening() == 0),
           "SGD: Nesterov momentum needs momentum > 0 and dampening = 0");
  for (const ParamGroup& g : groups_) momentum_buffers_.emplace_back(g.params.size());
}

void SGD::step() {
  NoGradGuard no_grad;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    ParamGroup& group = groups_[gi];
    for (size_t pi = 0; pi < group.params.size(); ++pi) {
      Tensor& p = group.params[pi];
      Tensor g = p.grad();
      if (!g.defined()) continue;  // no gradient this step: nothing to do (as PyTorch)
      if (group.weight_decay != 0) g = g + p * group.weight_decay;
      if (options_.momentum() != 0) {
        Tensor& buf = momentum_buffers_[gi][pi];
        buf = buf.defined() ? buf * options_.momentum() + g * (1.0 - options_.dampening()) : g.clone();
        g = options_.nesterov() ? g + buf * options_.momentum() : buf;
      }
      p.copy_(p - g * group.lr);
    }
  }
}

}  // namespace mt
