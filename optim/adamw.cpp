#include "optim/adamw.h"

#include <map>
#include <set>
#include <utility>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "core/cuda_context.h"
#include "core/view.h"
#include "optim/optim_kernels.h"

namespace mt {

namespace {
DType moment_dtype(const Tensor& p) { return p.dtype() == DType::f64 ? DType::f64 : DType::f32; }

size_t parameter_count(const std::vector<ParamGroup>& groups) {
  size_t n = 0;
  for (const ParamGroup& g : groups) n += g.params.size();
  return n;
}
}  // namespace

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : AdamW({ParamGroup{std::move(params), options.lr(), options.weight_decay()}}, options) {}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options)
    : Optimizer(std::move(groups)),
      options_(options),
      copies_(options.autocast_copies(), static_cast<const Optimizer*>(this), parameter_count(groups_)) {
  MT_CHECK(options.beta1() >= 0 && options.beta1() < 1 && options.beta2() >= 0 && options.beta2() < 1,
           "AdamW: betas must be in [0, 1), got (", options.beta1(), ", ", options.beta2(), ")");
  MT_CHECK(options.eps() >= 0, "AdamW: eps must be >= 0, got ", options.eps());
  size_t slots = 0;
  for (const ParamGroup& g : groups_) {
    first_slot_.push_back(slots);
    slots += g.params.size();
    std::vector<State> states;
    for (const Tensor& p : g.params) {
      MT_CHECK(p.is_contiguous(), "AdamW: parameters must be contiguous");
      const TensorOptions opts = TensorOptions().dtype(moment_dtype(p)).device(p.device());
      State s;
      s.exp_avg = zeros(p.shape(), opts);
      s.exp_avg_sq = zeros(p.shape(), opts);
      s.step = zeros({1}, TensorOptions().dtype(DType::i64).device(p.device()));
      if (options.master_weights() && is_half(p.dtype())) s.master = raw::to(p, DType::f32);
      states.push_back(std::move(s));
    }
    state_.push_back(std::move(states));
  }
}

void AdamW::step() { step_unless(Tensor()); }

std::map<std::string, Tensor> AdamW::state_dict() const {
  std::map<std::string, Tensor> out;
  for (size_t g = 0; g < state_.size(); ++g) {
    for (size_t i = 0; i < state_[g].size(); ++i) {
      const std::string prefix = "g" + std::to_string(g) + ".p" + std::to_string(i) + ".";
      const State& s = state_[g][i];
      out[prefix + "exp_avg"] = s.exp_avg;
      out[prefix + "exp_avg_sq"] = s.exp_avg_sq;
      out[prefix + "step"] = s.step;
      if (s.master.defined()) out[prefix + "master"] = s.master;
    }
  }
  return out;
}

void AdamW::load_state_dict(const std::map<std::string, Tensor>& state) {
  detail::load_optimizer_state("AdamW", state_dict(), state);
}

void AdamW::step_unless(const Tensor& found_inf) {
  NoGradGuard no_grad;
  // Inside a capture, the copies are written only where it serves them: a CudaGraphStep that
  // has this optimizer prepare every replay (Note [Provided copies]).
  const bool prepared_capture = copies_.prepared_capture();
  std::set<int> uploaded;  // devices whose rates this step has written
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& group = groups_[gi];
    optim_kernels::AdamWArgs args;
    args.lr = group.lr;
    args.beta1 = options_.beta1();
    args.beta2 = options_.beta2();
    args.eps = options_.eps();
    args.weight_decay = group.weight_decay;
    args.decoupled = options_.decoupled();
    std::map<int, std::vector<optim_kernels::AdamWTensors>> cuda_lists;  // device -> one fused update
    std::vector<std::pair<size_t, Tensor>> copied;  // (slot, parameter) with an autocast copy, handed over once written
    for (size_t pi = 0; pi < group.params.size(); ++pi) {
      const Tensor& p = group.params[pi];
      Tensor g = p.grad();
      if (!g.defined()) continue;
      MT_CHECK(g.shape() == p.shape() && g.device() == p.device(), "AdamW: gradient ", shape_str(g.shape()), " on ",
               g.device().str(), " does not match its parameter ", shape_str(p.shape()), " on ", p.device().str());
      g = raw::contiguous(g.dtype() == p.dtype() ? g : raw::to(g, p.dtype()));
      State& s = state_[gi][pi];
      const Tensor copy = copies_.for_step(slot(gi, pi), p, prepared_capture);
      const optim_kernels::AdamWTensors tensors{p, g, s.exp_avg, s.exp_avg_sq, s.step, s.master, copy};
      if (p.is_cuda()) {
        cuda_lists[p.device().index].push_back(tensors);
      } else {
        optim_kernels::advance_step_cpu(s.step, found_inf);
        optim_kernels::adamw_cpu(tensors, args, found_inf);
      }
      p.bump_version();
      if (copy.defined()) {
        copies_.updated(slot(gi, pi), p);
        copied.emplace_back(slot(gi, pi), p);
      }
    }
    for (const auto& [device, list] : cuda_lists) {
      MT_CHECK_T(DeviceError, !found_inf.defined() || found_inf.device() == list.front().param.device(),
                 "AdamW: the found-inf flag is on ", found_inf.device().str(), " but parameters are on cuda:", device);
      const Tensor& rates = rates_on(device);
      if (!cuda::capturing() && uploaded.insert(device).second) upload_rates(rates);
      optim_kernels::AdamWArgs device_args = args;
      device_args.lr_on_device = static_cast<const double*>(rates.data_ptr()) + gi;
      optim_kernels::adamw_cuda(list, device_args, found_inf);
    }
    for (const auto& [slot, p] : copied) copies_.hand_over(slot, p);
  }
}

const Tensor& AdamW::rates_on(int device) {
  auto it = rates_on_device_.find(device);
  if (it == rates_on_device_.end()) {
    MT_CHECK(!cuda::capturing(), "AdamW: the first step on cuda:", device,
             " is inside a CUDA Graph capture; run one step eagerly first (its learning rates must be in device "
             "memory before the capture)");
    const auto groups = static_cast<int64_t>(groups_.size());
    // Filled by the caller, which uploads the rates of every step taken outside a capture.
    it =
        rates_on_device_.emplace(device, empty({groups}, TensorOptions().dtype(DType::f64).device(cuda_device(device))))
            .first;
  }
  return it->second;
}

void AdamW::upload_rates(const Tensor& rates) const {
  NoGradGuard no_grad;
  for (size_t g = 0; g < groups_.size(); ++g) rates.narrow(0, static_cast<int64_t>(g), 1).fill_(groups_[g].lr);
}

bool AdamW::prepare_replay() {
  for (const auto& [device, rates] : rates_on_device_) upload_rates(rates);
  for (size_t g = 0; g < state_.size(); ++g) {
    for (size_t i = 0; i < state_[g].size(); ++i) copies_.prepare_replay(slot(g, i), groups_[g].params[i]);
  }
  return !rates_on_device_.empty();
}

void AdamW::after_capture() {
  for (size_t g = 0; g < state_.size(); ++g) {
    for (size_t i = 0; i < state_[g].size(); ++i) copies_.after_capture(slot(g, i), groups_[g].params[i]);
  }
}

int64_t AdamW::steps_taken() const {
  for (const auto& group : state_) {
    if (!group.empty()) return static_cast<int64_t>(group.front().step.item());
  }
  return 0;
}

}  // namespace mt
