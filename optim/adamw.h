// Adam and AdamW (torch.optim.Adam / AdamW): bias-corrected first and second
// moments kept in f32 (f64 for f64 parameters), optionally f32 master weights. AdamW decays the weights
// directly (p -= lr * wd * p, decoupled); Adam adds wd * p to the gradient.
// On CUDA a whole parameter group is updated by fused multi-tensor launches,
// which also read the GradScaler's found-inf flag on the device and skip the
// update when it is set.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "optim/optimizer.h"
#include "optim/weight_copies.h"

namespace mt {

class AdamWOptions {
 public:
  explicit AdamWOptions(double lr = 1e-3) : lr_(lr) {}
  AdamWOptions& betas(double b1, double b2) {
    beta1_ = b1;
    beta2_ = b2;
    return *this;
  }
  AdamWOptions& eps(double e) {
    eps_ = e;
    return *this;
  }
  AdamWOptions& weight_decay(double wd) {
    weight_decay_ = wd;
    return *this;
  }
  AdamWOptions& decoupled(bool d) {
    decoupled_ = d;
    return *this;
  }  // false: Adam with L2 decay
  double lr() const { return lr_; }
  double beta1() const { return beta1_; }
  double beta2() const { return beta2_; }
  double eps() const { return eps_; }
  double weight_decay() const { return weight_decay_; }
  bool decoupled() const { return decoupled_; }
  // Master-weight mode: f16/bf16 parameters get an f32 master copy inside the
  // optimizer; updates accumulate there and the parameter receives them rounded
  // once per step, so small updates are not lost to the narrow mantissa.
  AdamWOptions& master_weights(bool m) {
    master_weights_ = m;
    return *this;
  }
  bool master_weights() const { return master_weights_; }
  // Writes each f32 parameter rounded to `dtype` (f16 or bf16: the autocast region's) in the
  // same pass as its update, and hands the copy to autocast, which the next forward's GEMMs then
  // take instead of casting the weight (Note [Provided copies] in autograd/autocast.h). Costs
  // one such copy of every f32 parameter, kept between steps; the values are those of the casts.
  // Replays of a captured step go through prepare_replay() (CudaGraphStep calls it).
  AdamWOptions& autocast_copies(DType dtype) {
    autocast_copies_ = dtype;
    return *this;
  }
  const std::optional<DType>& autocast_copies() const { return autocast_copies_; }

 private:
  double lr_;
  double beta1_ = 0.9, beta2_ = 0.999, eps_ = 1e-8, weight_decay_ = 1e-2;
  bool decoupled_ = true;
  bool master_weights_ = false;
  std::optional<DType> autocast_copies_;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, const AdamWOptions& options);
  AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options);
  void step() override;
  // The scaler's step: skip on the device when found_inf (f32 [1]) is non-zero.
  void step_unless(const Tensor& found_inf) override;
  // Steps actually taken (skipped ones not counted); reading it waits for the device.
  int64_t steps_taken() const;
  // CUDA kernels read each group's learning rate from device memory: this writes the
  // current rates there (a fill kernel each, no host synchronisation). It also keeps the
  // autocast copies current for the replay, which reads them and rewrites them beside the
  // parameters: a parameter written since its copy was has the copy cast again, and every
  // parameter with a copy has its version moved (Note [Provided copies]).
  bool prepare_replay() override;
  // Finds the parameters that the captured step writes after their update (their copies are
  // then cast again before every replay).
  void after_capture() override;

  struct State {
    Tensor exp_avg, exp_avg_sq;  // f32 (f64 for f64 params), the parameter's shape
    Tensor step;                 // i64 [1] on the parameter's device: the bias-correction count
    Tensor master;               // f32 copy of an f16/bf16 parameter in master-weight mode, else undefined
  };
  const State& state(size_t group, size_t index) const { return state_[group][index]; }
  // The parameter's autocast copy (AdamWOptions::autocast_copies), undefined before its first
  // step or without copies; not part of the saved state (it is the parameter, rounded).
  const Tensor& autocast_copy(size_t group, size_t index) const { return copies_.copy(slot(group, index)); }
  std::map<std::string, Tensor> state_dict() const override;  // exp_avg, exp_avg_sq, step, master
  void load_state_dict(const std::map<std::string, Tensor>& state) override;

 private:
  // The groups' learning rates on each CUDA device that holds parameters: f64 [groups],
  // refreshed before each step's kernels (not while a CUDA Graph captures: a replay must
  // read the rate of its moment, which prepare_replay() writes).
  const Tensor& rates_on(int device);
  void upload_rates(const Tensor& rates) const;
  size_t slot(size_t group, size_t index) const { return first_slot_[group] + index; }  // the copies' numbering

  AdamWOptions options_;
  std::vector<std::vector<State>> state_;
  std::vector<size_t> first_slot_;  // per group: the slot of its first parameter
  AutocastWeightCopies copies_;
  std::map<int, Tensor> rates_on_device_;
};

}  // namespace mt
