#include "optim/grad_scaler.h"

#include "core/cuda_context.h"

#include "autograd/grad_mode.h"
#include "core/view.h"
#include "ops/elementwise/elementwise.h"
#include "optim/optim_kernels.h"

namespace mt {

GradScaler::GradScaler(Device device, GradScalerOptions options) : device_(device), options_(options) {
  MT_CHECK(options.init_scale() > 0 && options.growth_factor() > 1 && options.backoff_factor() > 0 &&
               options.backoff_factor() < 1 && options.growth_interval() > 0,
           "GradScaler: need init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and growth_interval > 0; got ",
           options.init_scale(), ", ", options.growth_factor(), ", ", options.backoff_factor(), ", ",
           options.growth_interval());
  const TensorOptions f32 = TensorOptions().dtype(DType::f32).device(device);
  const TensorOptions i32 = TensorOptions().dtype(DType::i32).device(device);
  scale_ = full({1}, options.init_scale(), f32);
  growth_tracker_ = zeros({1}, i32);
  consecutive_skips_ = zeros({1}, i32);
}

Tensor GradScaler::scale(const Tensor& loss) {
  if (!options_.enabled()) return loss;
  MT_CHECK_T(DeviceError, loss.device() == device_, "GradScaler::scale: the loss is on ", loss.device().str(),
             " but the scaler on ", device_.str());
  return mul(loss, raw::to(scale_, loss.dtype()).reshape({}));
}

GradScaler::PerOptimizer& GradScaler::state_for(Optimizer& optimizer) {
  PerOptimizer& s = per_optimizer_[&optimizer];
  if (!s.found_inf.defined()) s.found_inf = zeros({1}, TensorOptions().dtype(DType::f32).device(device_));
  return s;
}

void GradScaler::unscale_(Optimizer& optimizer) {
  if (!options_.enabled()) return;
  PerOptimizer& s = state_for(optimizer);
  MT_CHECK(!s.unscaled, "GradScaler::unscale_: already called for this optimizer since the last update()");
  MT_CHECK(!s.stepped, "GradScaler::unscale_: called after step(); call update() first");
  NoGradGuard no_grad;
  s.found_inf.zero_();
  std::vector<Tensor> grads;
  for (const ParamGroup& group : optimizer.param_groups()) {
    for (const Tensor& p : group.params) {
      const Tensor g = p.grad();
      if (!g.defined()) continue;
      MT_CHECK_T(DeviceError, g.device() == device_, "GradScaler::unscale_: a gradient is on ", g.device().str(),
                 " but the scaler on ", device_.str());
      MT_CHECK(g.is_contiguous(), "GradScaler::unscale_: gradients must be contiguous");
      grads.push_back(g);
    }
  }
  if (device_.is_cuda()) {
    optim_kernels::unscale_cuda(grads, scale_, s.found_inf);  // one multi-tensor launch per dtype
  } else {
    for (const Tensor& g : grads) optim_kernels::unscale_cpu(g, scale_, s.found_inf);
  }
  for (const Tensor& g : grads) g.bump_version();
  s.unscaled = true;
}

void GradScaler::step(Optimizer& optimizer) {
  if (!options_.enabled()) {
    optimizer.step();
    return;
  }
  PerOptimizer& s = state_for(optimizer);
  MT_CHECK(!s.stepped, "GradScaler::step: already called for this optimizer since the last update()");
  if (!s.unscaled) unscale_(optimizer);
  optimizer.step_unless(s.found_inf);
  s.stepped = true;
}

void GradScaler::update() {
  if (!options_.enabled()) return;
  MT_CHECK(!per_optimizer_.empty(), "GradScaler::update: no optimizer was stepped through this scaler");
  // With several optimizers, an inf in any of them backs off the scale.
  Tensor found_inf = per_optimizer_.begin()->second.found_inf;
  for (auto it = std::next(per_optimizer_.begin()); it != per_optimizer_.end(); ++it) {
    found_inf = raw::clone(found_inf);
    raw::accumulate_(found_inf, it->second.found_inf);
  }
  const optim_kernels::ScalerUpdateArgs args{options_.growth_factor(), options_.backoff_factor(),
                                             options_.growth_interval()};
  if (device_.is_cuda()) {
    optim_kernels::scaler_update_cuda(scale_, growth_tracker_, consecutive_skips_, found_inf, args);
  } else {
    optim_kernels::scaler_update_cpu(scale_, growth_tracker_, consecutive_skips_, found_inf, args);
  }
  for (auto& [opt, s] : per_optimizer_) s.unscaled = s.stepped = false;
  ++updates_;
  // Not while a CUDA Graph captures the step: reading the scale would synchronise (a replayed
  // step runs no host code at all; call check_limits() between replays).
  const bool checkable = device_.is_cpu() || !cuda::capturing();
  if (checkable && (device_.is_cpu() || updates_ % options_.check_interval() == 0)) check_limits();
}

void GradScaler::check_limits() {
  const double scale = get_scale();
  const int64_t skips = consecutive_skips();
  MT_CHECK(skips < options_.max_consecutive_skips(), "GradScaler: ", skips,
           " optimizer steps in a row were skipped because gradients held inf or NaN (scale now ", scale,
           "); the model or data produce non-finite values that loss scaling cannot fix");
  MT_CHECK(scale >= options_.min_scale(), "GradScaler: the loss scale fell to ", scale, ", below min_scale ",
           options_.min_scale(), " (", skips, " consecutive skipped steps); gradients are non-finite at every scale");
}

double GradScaler::get_scale() const { return options_.enabled() ? scale_.item() : 1.0; }
int64_t GradScaler::consecutive_skips() const { return static_cast<int64_t>(consecutive_skips_.item()); }

std::map<std::string, double> GradScaler::state_dict() const {
  return {{"scale", get_scale()},
          {"growth_tracker", growth_tracker_.item()},
          {"consecutive_skips", static_cast<double>(consecutive_skips())}};
}

void GradScaler::load_state_dict(const std::map<std::string, double>& state) {
  for (const char* key : {"scale", "growth_tracker", "consecutive_skips"}) {
    MT_CHECK(state.count(key), "GradScaler::load_state_dict: missing '", key, "'");
  }
  MT_CHECK(state.at("scale") > 0, "GradScaler::load_state_dict: scale must be positive, got ", state.at("scale"));
  scale_.fill_(state.at("scale"));
  growth_tracker_.fill_(state.at("growth_tracker"));
  consecutive_skips_.fill_(state.at("consecutive_skips"));
}

}  // namespace mt
