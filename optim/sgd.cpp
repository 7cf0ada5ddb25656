#include "optim/sgd.h"

#include <cstdio>

#include "core/view.h"

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

std::map<std::string, Tensor> SGD::state_dict() const {
  std::map<std::string, Tensor> out;
  for (size_t g = 0; g < momentum_buffers_.size(); ++g) {
    for (size_t i = 0; i < momentum_buffers_[g].size(); ++i) {
      const Tensor& buf = momentum_buffers_[g][i];
      if (buf.defined()) out["g" + std::to_string(g) + ".p" + std::to_string(i) + ".momentum_buffer"] = buf;
    }
  }
  return out;
}

void SGD::load_state_dict(const std::map<std::string, Tensor>& state) {
  std::vector<std::vector<Tensor>> loaded;
  for (const ParamGroup& g : groups_) loaded.emplace_back(g.params.size());
  for (const auto& [name, t] : state) {
    size_t g = 0, i = 0;
    char tail[32] = {};
    const bool parsed = std::sscanf(name.c_str(), "g%zu.p%zu.%31s", &g, &i, tail) == 3 &&
                        std::string(tail) == "momentum_buffer" && g < groups_.size() && i < groups_[g].params.size();
    MT_CHECK(parsed, "SGD::load_state_dict: unexpected entry '", name, "' for ", groups_.size(), " parameter groups");
    const Tensor& p = groups_[g].params[i];
    MT_CHECK_T(ShapeError, t.shape() == p.shape(), "SGD::load_state_dict: '", name, "' has shape ",
               shape_str(t.shape()), " but the parameter has ", shape_str(p.shape()));
    loaded[g][i] = raw::clone(raw::to(raw::to(t, p.device()), p.dtype()));
  }
  momentum_buffers_ = std::move(loaded);
}

}  // namespace mt
