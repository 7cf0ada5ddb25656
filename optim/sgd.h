// Stochastic gradient descent with momentum, Nesterov momentum and (coupled)
// weight decay, following torch.optim.SGD:
//   g = grad + wd * p;  buf = momentum * buf + (1 - dampening) * g  (buf = g at the first step)
//   g = nesterov ? g + momentum * buf : buf;  p -= lr * g
#pragma once

#include <vector>

#include "optim/optimizer.h"

namespace mt {

class SGDOptions {
 public:
  explicit SGDOptions(double lr) : lr_(lr) {}
  SGDOptions& momentum(double m) {
    momentum_ = m;
    return *this;
  }
  SGDOptions& dampening(double d) {
    dampening_ = d;
    return *this;
  }
  SGDOptions& weight_decay(double wd) {
    weight_decay_ = wd;
    return *this;
  }
  SGDOptions& nesterov(bool n) {
    nesterov_ = n;
    return *this;
  }
  double lr() const { return lr_; }
  double momentum() const { return momentum_; }
  double dampening() const { return dampening_; }
  double weight_decay() const { return weight_decay_; }
  bool nesterov() const { return nesterov_; }

 private:
  double lr_;
  double momentum_ = 0.0;
  double dampening_ = 0.0;
  double weight_decay_ = 0.0;
  bool nesterov_ = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, const SGDOptions& options);
  void step() override;
  std::map<std::string, Tensor> state_dict() const override;  // momentum buffers that exist
  void load_state_dict(const std::map<std::string, Tensor>& state) override;

 private:
  SGDOptions options_;
  std::vector<std::vector<Tensor>> momentum_buffers_;  // [group][param], undefined until the first step
};

}  // namespace mt
