#include "optim/optimizer.h"

#include "core/error.h"

namespace mt {

Optimizer::Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
  for (const ParamGroup& g : groups_) {
    MT_CHECK(g.lr >= 0, "Optimizer: learning rate must be >= 0, got ", g.lr);
    for (const Tensor& p : g.params) {
      MT_CHECK(p.defined() && p.requires_grad() && p.is_leaf(),
               "Optimizer: every parameter must be a leaf tensor that requires grad");
    }
  }
}

void Optimizer::step_unless(const Tensor& found_inf) {
  if (found_inf.item() == 0.0) step();
}

void Optimizer::zero_grad() {
  for (ParamGroup& g : groups_) {
    for (Tensor& p : g.params) p.set_grad(Tensor());
  }
}

}  // namespace mt
